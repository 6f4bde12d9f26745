"""autospec's feature head as a vLLM EAGLE checkpoint (`autospec models export --format
vllm-eagle`), and the check that an exported head is run against the target it was made for.

Why `EagleMistralForCausalLM` (vLLM 0.32, model_executor/models/mistral_eagle.py): its
`EagleMistralModel.forward` is

    hidden_states = self.fc(torch.cat((inputs_embeds, hidden_states), dim=-1))
    for layer in self.layers: hidden_states, residual = layer(positions, hidden_states, residual)
    hidden_states, _ = self.norm(hidden_states, residual)

with ordinary decoder layers (input norm included) and a final norm: our head's
`norm(layer(fc([embed(x_{t+1}); f_t])))` term for term, on the target's last hidden state
(after its final norm, as vLLM hands it over). It has no LM head and no embedding of its own:
vLLM's EAGLE proposer shares the target's (`_maybe_share_embeddings`/`_maybe_share_lm_head`,
v1/spec_decode/llm_base_proposer.py), as the head does. `EagleLlamaForCausalLM`
(llama_eagle.py) cannot hold it: layer 0 there has no input norm (`disable_input_layernorm`)
and its output is `hidden_states + residual`, with no final norm.

vLLM picks the class from `architectures` (its EAGLEConfig keeps a name that starts with
"Eagle"); the weights load under their Hugging Face names (`MistralForCausalLM.load_weights`
remaps only Mistral-format names: wq, attention_norm, ...), so the export renames

    fc.weight -> model.fc.weight,  layer.* -> model.layers.0.*,  norm.weight -> model.norm.weight

and drops `lm_head.token_ids`. The head's token subset (FR-Spec) cannot be expressed: the
class scores over the target's whole head (vLLM's draft-vocabulary mapping, `d2t`, belongs to
`Eagle3LlamaForCausalLM`, whose layer is EAGLE-3's, not this one). So vLLM's head drafts over
the full vocabulary: the same logits on the subset's tokens, but it may propose a token
outside it, and each draft token scores every row of the target's head.

vLLM does not check that a head belongs to its target (same shapes load silently). The export
records its target under `autospec_export` in config.json; `check_vllm_eagle(head, target)`
(and `speculative_config`, which calls it) refuses another target with one line naming the
field. Run it before starting vLLM.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

FORMATS = ("vllm-eagle",)
ARCHITECTURE = "EagleMistralForCausalLM"
EXPORT_KEY = "autospec_export"
# what identifies a target beyond its weights: the shape of everything the head plugs into
CONFIG_FIELDS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                 "rms_norm_eps", "rope_parameters", "rope_theta", "rope_scaling",
                 "tie_word_embeddings")
# checked in this order: the first that differs is the one the refusal names
CHECKED = ("vocab_size", "hidden_size", "target_config_sha256", "target_embedding_sha256")
HEAD_LAYER_KEYS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                   "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                   "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                   "input_layernorm.weight", "post_attention_layernorm.weight")


class ExportError(ValueError):
    """A head, target or export that cannot be used; the message (one line) names it."""


def vllm_name(name: str) -> str | None:
    """The name vLLM's EagleMistralForCausalLM loads a head tensor under; None: not shipped."""
    if name == "lm_head.token_ids":
        return None  # the subset: not expressible in vLLM's EAGLE-1 classes (see above)
    if name in ("fc.weight", "norm.weight"):
        return f"model.{name}"
    if name.startswith("layer."):
        return "model.layers.0." + name[len("layer."):]
    raise ExportError(f"feature head tensor '{name}' has no place in {ARCHITECTURE}")


def rename(state: dict) -> dict:
    """The head's own tensors (models/eagle_head.py `own_state`) under vLLM's names."""
    out = {}
    for name, tensor in state.items():
        new = vllm_name(name)
        if new is not None:
            out[new] = tensor.contiguous()
    expected = {"model.fc.weight", "model.norm.weight",
                *(f"model.layers.0.{k}" for k in HEAD_LAYER_KEYS)}
    if not expected <= set(out):
        raise ExportError(f"feature head lacks {sorted(expected - set(out))[:3]}: "
                          "not an EAGLE-1 head of one Llama decoder layer")
    return out


def _config(path: Path) -> dict:
    file = Path(path) / "config.json"
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ExportError(f"'{file}' is not a readable model config ({exc})") from None


def target_config_sha256(config: dict) -> str:
    shape = {k: config[k] for k in CONFIG_FIELDS if k in config}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def target_embedding_sha256(target_dir: str | Path) -> str:
    """sha256 of the target's input embedding, rounded to bf16 (so a float32 target and its
    bf16 copy are the same target): its weights, read from its safetensors alone."""
    import torch
    from safetensors import safe_open
    files = sorted(Path(target_dir).glob("*.safetensors"))
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            names = [k for k in f.keys() if k.endswith("embed_tokens.weight")]
            if names:
                tensor = f.get_tensor(sorted(names, key=len)[0])
                data = tensor.to(torch.bfloat16).contiguous().view(torch.int16).numpy()
                return hashlib.sha256(data.tobytes()).hexdigest()
    raise ExportError(f"target '{target_dir}' has no embed_tokens.weight in "
                      f"{[f.name for f in files] or 'any *.safetensors file'}")


def fingerprint(target_dir: str | Path, name: str | None = None) -> dict:
    """What an export records of its target (under `autospec_export`)."""
    config = _config(Path(target_dir))
    return {"target": name or str(Path(target_dir).resolve()),
            "target_path": str(Path(target_dir).resolve()),
            "vocab_size": config.get("vocab_size"), "hidden_size": config.get("hidden_size"),
            "target_config_sha256": target_config_sha256(config),
            "target_embedding_sha256": target_embedding_sha256(target_dir)}


def resolve(head_dir_or_pair: str | Path, target: str | Path | None = None,
            head: str | Path | None = None) -> tuple[Path, Path, str | None]:
    """(head dir, target dir, pair name or None) for a pair name (its shipped head, or `head`)
    or a head directory (with `target`)."""
    from autospec.models.pairs import PAIRS, named_pair
    text = str(head_dir_or_pair)
    if text in PAIRS:
        spec = named_pair(text)
        head = Path(head) if head is not None else spec.eagle_dir()
        if head is None:
            raise ExportError(f"pair '{text}' has no feature head to export (pairs with one: "
                              f"{', '.join(n for n, p in PAIRS.items() if p.eagle) or 'none'})")
        target_dir = Path(target) if target else spec.target()
        if not (target_dir / "config.json").is_file():
            raise ExportError(f"pair '{text}' needs its target, which is not in {target_dir}"
                              + (f": run `{spec.fetch}` first" if spec.fetch else ""))
        return head, target_dir, text
    head = Path(head_dir_or_pair)
    if target is None:
        raise ExportError(f"exporting the head '{head}' needs its target (a pair name instead "
                          f"of a directory knows it: {', '.join(sorted(PAIRS))})")
    return head, Path(target), None


def export_vllm_eagle(head_dir_or_pair: str | Path, out_dir: str | Path,
                      target: str | Path | None = None, head: str | Path | None = None) -> Path:
    """Write the feature head of a pair (a name: 'smollm2'; `head`: another head directory
    for its target than the shipped one) or of a head directory (with `target`, its target's
    directory) as a vLLM EAGLE checkpoint in `out_dir`, for
    speculative_config={"method": "eagle", "model": out_dir, "num_speculative_tokens": K}."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file
    from autospec.models.eagle_head import CONFIG_KEY, is_eagle_head
    head_dir, target_dir, pair = resolve(head_dir_or_pair, target, head)
    if not is_eagle_head(head_dir):
        raise ExportError(f"'{head_dir}' is not an autospec feature head (no "
                          f"{CONFIG_KEY} in its config.json)")
    config, target_config = _config(head_dir), _config(target_dir)
    for field in ("vocab_size", "hidden_size"):
        if config.get(field) != target_config.get(field):
            raise ExportError(f"feature head '{head_dir}' was made for another target: "
                              f"{field} {config.get(field)}, target's {target_config.get(field)}")
    weights = head_dir / "model.safetensors"
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise ExportError(f"'{weights}' is not a readable safetensors file ({exc})") from None
    tensors = rename(state)
    subset = config.pop(CONFIG_KEY, {}).get("vocab_subset")
    config["architectures"] = [ARCHITECTURE]
    config["num_hidden_layers"] = 1
    config[EXPORT_KEY] = {
        "format": "vllm-eagle", "pair": pair, **fingerprint(target_dir, pair),
        # the subset the head drafts over in autospec; vLLM scores the target's whole head
        "head_vocab_subset": subset, "draft_vocab": "full (the target's LM head)",
    }
    out = Path(out_dir)
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def check_vllm_eagle(head_dir: str | Path, target_dir: str | Path) -> dict:
    """Refuse (ExportError, one line naming the field) an exported head whose recorded target
    is not `target_dir`; returns what the export recorded. The embedding's hash reads the
    target's embedding once (~0.2 s for SmolLM2)."""
    head_dir = Path(head_dir)
    config = _config(head_dir)
    recorded = config.get(EXPORT_KEY)
    if not isinstance(recorded, dict):
        raise ExportError(f"'{head_dir}' has no {EXPORT_KEY} in its config.json: not exported "
                          "by `autospec models export --format vllm-eagle`")
    if config.get("architectures") != [ARCHITECTURE]:
        raise ExportError(f"'{head_dir}': architectures is {config.get('architectures')}, "
                          f"expected ['{ARCHITECTURE}']")
    target_config = _config(Path(target_dir))
    ours = {"vocab_size": target_config.get("vocab_size"),
            "hidden_size": target_config.get("hidden_size"),
            "target_config_sha256": target_config_sha256(target_config)}
    for field in CHECKED:
        if field not in ours:
            ours[field] = target_embedding_sha256(target_dir)  # last: the only costly one
        if recorded.get(field) != ours[field]:
            raise ExportError(f"head '{head_dir}' was exported for another target "
                              f"('{recorded.get('target')}'): {EXPORT_KEY}.{field} is "
                              f"{_short(recorded.get(field))}, target '{target_dir}' has "
                              f"{_short(ours[field])}")
    return recorded


def speculative_config(head_dir: str | Path, target_dir: str | Path, k: int) -> dict:
    """vLLM's speculative_config for an exported head, after `check_vllm_eagle`."""
    check_vllm_eagle(head_dir, target_dir)
    return {"method": "eagle", "model": str(head_dir), "num_speculative_tokens": int(k)}


def _short(value) -> str:
    return value[:12] + "…" if isinstance(value, str) and len(value) == 64 else str(value)
