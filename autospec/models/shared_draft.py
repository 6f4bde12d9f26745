"""A draft that reads the target's input embedding and scores a subset of the vocabulary.

Why both (measured on SmolLM2-135M, whose vocabulary is 49,152 × 576):
- the embedding is 28M of the target's 134M parameters: a draft that keeps its own copy at the
  target's width cannot ship in 40 MB, and one at a smaller width must learn the token
  geometry again. Borrowing the target's (frozen, looked up one row a token) costs nothing.
- the LM head over the whole vocabulary is most of a small draft's cost. FR-Spec (Zhao et al.
  2025) scores only the most frequent few thousand tokens: a draft can then never propose a
  rare token (its probability there is zero, which rejection sampling handles exactly), and
  the head shrinks six-fold.

The draft is an ordinary `LlamaForCausalLM` whose `embed_tokens` and `rotary_emb` are the
target's modules (shared, as `early_exit_view` shares them) and whose `lm_head` is a
`SubsetHead`: logits outside the subset are the dtype's minimum, so argmax, softmax and every
drafter's code see a full-vocabulary distribution unchanged.

A trained early exit is the same object with its first `borrowed_layers` decoder layers also
the target's own (self-speculation: the target's first L layers, then a small trained exit —
one or more layers, a norm and a subset head — in place of its other layers; LayerSkip's exit
without touching the target).

On disk: `config.json` (a Llama config with `autospec_draft = {"shares_target_embedding":
true, "vocab_subset": N, "borrowed_layers": L}`), `model.safetensors` without the embedding
or the borrowed layers, with the subset's token ids as `lm_head.token_ids`; the target's
tokenizer beside it.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

CONFIG_KEY = "autospec_draft"


class SubsetHead(nn.Module):
    """An LM head over `token_ids` only; forward returns full-vocabulary logits (…, V)."""

    def __init__(self, weight: torch.Tensor, token_ids: torch.Tensor, vocab_size: int):
        super().__init__()
        self.weight = nn.Parameter(weight)  # (N, hidden)
        self.register_buffer("token_ids", token_ids.long())  # (N,) ids in the full vocabulary
        self.vocab_size = vocab_size

    def subset_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(…, N) logits in subset order (training scores these alone)."""
        return F.linear(hidden, self.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.widen(self.subset_logits(hidden))

    def widen(self, small: torch.Tensor) -> torch.Tensor:
        """(…, N) subset logits as (…, V): the dtype's minimum outside the subset."""
        full = small.new_full((*small.shape[:-1], self.vocab_size), torch.finfo(small.dtype).min)
        return full.index_copy_(-1, self.token_ids, small)


def subset_lookup(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(V,) position of each full-vocabulary id in the subset, -1 outside it."""
    lookup = torch.full((vocab_size,), -1, dtype=torch.long)
    lookup[token_ids.long()] = torch.arange(len(token_ids))
    return lookup


def is_shared_draft(path: str | Path) -> bool:
    config = Path(path) / "config.json"
    return config.is_file() and f'"{CONFIG_KEY}"' in config.read_text()


def _shell(target, layers: int, borrowed: int = 0):
    """A draft-shaped Llama (on the meta device, to be assigned) with the target's embedding,
    rotary embedding and first `borrowed` decoder layers."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    config.tie_word_embeddings = False
    for attr in ("layer_types", "quantization_config"):
        if hasattr(config, attr):
            delattr(config, attr)
    with torch.device("meta"):
        draft = type(target)(config)
    base, draft_base = getattr(target, target.base_model_prefix), getattr(draft, target.base_model_prefix)
    draft_base.embed_tokens = target.get_input_embeddings()
    draft_base.rotary_emb = base.rotary_emb
    for i in range(borrowed):  # layer i of both: the cache index (layer_idx) already agrees
        draft_base.layers[i] = base.layers[i]
    return draft


def draft_from_target(target, keep_layers: list[int], token_ids: torch.Tensor,
                      borrowed: int = 0):
    """A new draft initialised from the target: its decoder layers `keep_layers` (copied, then
    trained), its final norm, and its head's rows for `token_ids` (the head is tied to the
    embedding on SmolLM2, so these are embedding rows). With `borrowed` = L, keep_layers
    starts 0..L-1 and those layers are the target's own modules, frozen: a trained exit."""
    if list(keep_layers[:borrowed]) != list(range(borrowed)):
        raise ValueError(f"a trained exit borrows the target's first {borrowed} layers: "
                         f"keep_layers must start {list(range(borrowed))}, got {list(keep_layers)}")
    base = getattr(target, target.base_model_prefix)
    draft = _shell(target, len(keep_layers), borrowed)
    draft_base = getattr(draft, draft.base_model_prefix)
    for i, source in enumerate(keep_layers[borrowed:], start=borrowed):
        layer = copy.deepcopy(base.layers[source])
        layer.self_attn.layer_idx = i  # the draft's own cache is indexed 0..n-1
        draft_base.layers[i] = layer
    draft_base.norm = copy.deepcopy(base.norm)
    head = target.get_output_embeddings().weight.detach()[token_ids.long()].clone()
    draft.lm_head = SubsetHead(head, token_ids, target.config.vocab_size)
    draft.config.__dict__[CONFIG_KEY] = {"shares_target_embedding": True,
                                         "vocab_subset": int(len(token_ids)),
                                         "borrowed_layers": borrowed,
                                         "initial_layers": list(keep_layers)}
    for module in (draft.get_input_embeddings(), *draft_base.layers[:borrowed]):
        for p in module.parameters():
            p.requires_grad_(False)
    _check_materialised(draft)
    return draft


def borrowed_layers(draft) -> int:
    return int(getattr(draft.config, CONFIG_KEY, {}).get("borrowed_layers", 0))


def own_state(draft, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """What the draft ships: every tensor but the borrowed embedding, rotary buffers and
    layers."""
    skip = ("embed_tokens.", "rotary_emb.",
            *(f"layers.{i}." for i in range(borrowed_layers(draft))))
    out = {}
    for name, tensor in draft.state_dict().items():
        if any(s in name for s in skip):
            continue
        out[name] = tensor if name.endswith("token_ids") else tensor.detach().to(dtype)
    return {k: v.contiguous() for k, v in out.items()}


def save_shared_draft(draft, out_dir: Path) -> None:
    from safetensors.torch import save_file
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(own_state(draft), str(out_dir / "model.safetensors"))
    draft.config.save_pretrained(out_dir)


def load_shared_draft(path: str | Path, target, dtype: torch.dtype):
    """The draft saved at `path`, wired to `target`'s embedding (which must be loaded)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(path)
    spec = getattr(config, CONFIG_KEY)
    if config.vocab_size != target.config.vocab_size or config.hidden_size != target.config.hidden_size:
        raise ValueError(f"draft '{path}' was made for another target: vocabulary x width "
                         f"{config.vocab_size} x {config.hidden_size}, target's "
                         f"{target.config.vocab_size} x {target.config.hidden_size}")
    from safetensors import SafetensorError
    weights = Path(path) / "model.safetensors"
    try:
        state = load_file(str(weights))
    except SafetensorError as exc:
        raise ValueError(f"'{weights}' is not a readable safetensors file ({exc})") from None
    token_ids = state.pop("lm_head.token_ids")
    borrowed = int(spec.get("borrowed_layers", 0))
    draft = _shell(target, config.num_hidden_layers, borrowed)
    draft.lm_head = SubsetHead(state.pop("lm_head.weight").to(dtype), token_ids, config.vocab_size)
    state = {k: v.to(dtype) for k, v in state.items()}
    missing, unexpected = draft.load_state_dict(state, strict=False, assign=True)
    shared = ("embed_tokens", "lm_head", *(f"layers.{i}." for i in range(borrowed)))
    missing = [m for m in missing if not any(s in m for s in shared)]
    if missing or unexpected:
        raise ValueError(f"draft '{path}' does not match its config: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    draft.config.__dict__[CONFIG_KEY] = spec
    _check_materialised(draft)
    return draft.eval()


def _check_materialised(draft) -> None:
    left = [n for n, t in list(draft.named_parameters()) + list(draft.named_buffers()) if t.is_meta]
    if left:
        raise ValueError(f"shared draft has unset tensors: {left[:3]}")
