"""A feature-level draft head (EAGLE-1, Li et al. 2024) that borrows the target's embedding,
rotary embedding and head rows.

At pair t the head reads f_t, the target's last hidden state at position t (after its final
norm: what the target's head reads), and the embedding of token x_{t+1}; it predicts f_{t+1}:

    f̂_{t+1} = norm(layer(fc([embed(x_{t+1}); f_t])))        one decoder layer at the target's width

and scores it with the target's own head rows over a vocabulary subset (`SubsetHead`,
FR-Spec), so its token at t+1 is what the target's head would say over the predicted feature.
Drafting K tokens feeds its own predictions back: (f̂_{t+1}, d_1) -> f̂_{t+2}, and so on.
The head attends over all earlier pairs through a one-layer KV cache (a RowCache of its own).

Why the target's head and embedding: they are 28M of SmolLM2's 134M parameters and already
map features to tokens; the head's own weights (fc 2D x D, one decoder layer, one norm) are
~4M — a third of the shipped 3-layer draft, read from the target's features instead of
recomputing them.

On disk: `config.json` (the target's config, one layer, with `autospec_eagle = {"vocab_subset":
N}`), `model.safetensors` with the head's own tensors and the subset's ids as
`lm_head.token_ids` (the rows themselves are the target's, taken at load).
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from autospec.models.forward import head_forward, head_fits
from autospec.models.kv import cache_kwarg
from autospec.models.shared_draft import SubsetHead

CONFIG_KEY = "autospec_eagle"


class EagleHead(nn.Module):
    """fc + one decoder layer + norm over (token, feature) pairs; `lm_head` scores features."""

    def __init__(self, target, token_ids: torch.Tensor):
        super().__init__()
        base = getattr(target, target.base_model_prefix)
        config = copy.deepcopy(target.config)
        config.num_hidden_layers = 1
        for attr in ("layer_types", "quantization_config"):
            if hasattr(config, attr):
                delattr(config, attr)
        config.__dict__[CONFIG_KEY] = {"vocab_subset": int(len(token_ids))}
        self.config = config
        width = config.hidden_size
        self.fc = nn.Linear(2 * width, width, bias=False)
        # the target's last layer and final norm as the start (a layer that already maps
        # late features to late features); layer_idx 0: the head's own cache has one layer
        self.layer = copy.deepcopy(base.layers[-1])
        self.layer.self_attn.layer_idx = 0
        self.norm = copy.deepcopy(base.norm)
        # borrowed, frozen, never saved: a plain attribute list keeps them out of state_dict
        self._borrowed = [target.get_input_embeddings(), base.rotary_emb]
        head = target.get_output_embeddings().weight.detach()[token_ids.long()]
        self.lm_head = SubsetHead(head, token_ids, config.vocab_size)
        self.lm_head.weight.requires_grad_(False)
        with torch.no_grad():  # start as "the feature of the embedding alone"-ish: fc = [I, I]/2
            eye = torch.eye(width)
            self.fc.weight.copy_(torch.cat([eye, eye], 1) * 0.5)

    @property
    def embed(self) -> nn.Module:
        return self._borrowed[0]

    @property
    def rotary(self) -> nn.Module:
        return self._borrowed[1]

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor,
                position_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache=None) -> torch.Tensor:
        """Predicted features (n, T, D) for pairs (features[:, t] = f_t, input_ids[:, t] =
        x_{t+1}) at `position_ids` (n, T) = t + 1. Without a mask: causal over the T pairs.
        Drafting (over a RowCache, no autograd): the same function by models/forward.py's
        `head_forward` (oneDNN's products, the rows' grouped attention)."""
        if cache is not None and not torch.is_grad_enabled() and head_fits(self):
            return head_forward(self, input_ids, features, position_ids, attention_mask, cache)
        return self.transformers_forward(input_ids, features, position_ids, attention_mask, cache)

    def transformers_forward(self, input_ids: torch.Tensor, features: torch.Tensor,
                             position_ids: torch.Tensor,
                             attention_mask: torch.Tensor | None = None,
                             cache=None) -> torch.Tensor:
        """`forward` through transformers' decoder layer (training; any other layer)."""
        x = self.fc(torch.cat([self.embed(input_ids).to(features.dtype), features], -1))
        cos_sin = self.rotary(x, position_ids)
        # the layer's cache argument is `cache` from transformers 5.20, `past_key_values` before
        x = self.layer(x, attention_mask=attention_mask, position_ids=position_ids,
                       **{cache_kwarg(self.layer): cache}, use_cache=cache is not None,
                       position_embeddings=cos_sin)
        return self.norm(x)


def own_state(head: EagleHead, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """What ships: every tensor but the borrowed head rows (their ids stay)."""
    out = {}
    for name, tensor in head.state_dict().items():
        if name == "lm_head.weight":
            continue
        out[name] = (tensor if name.endswith("token_ids") else tensor.detach().to(dtype)).contiguous()
    return out


def is_eagle_head(path: str | Path) -> bool:
    config = Path(path) / "config.json"
    return config.is_file() and f'"{CONFIG_KEY}"' in config.read_text()


def save_eagle_head(head: EagleHead, out_dir: Path) -> None:
    from safetensors.torch import save_file
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(own_state(head), str(out_dir / "model.safetensors"))
    head.config.save_pretrained(out_dir)


def load_eagle_head(path: str | Path, target, dtype: torch.dtype = torch.float32) -> EagleHead:
    """The head saved at `path`, wired to `target`'s embedding, rotary embedding and head rows.
    A head made for another target is refused, naming both shapes."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(path)
    theirs = (config.vocab_size, config.hidden_size)
    ours = (target.config.vocab_size, target.config.hidden_size)
    if theirs != ours:
        raise ValueError(f"feature head '{path}' was made for another target: vocabulary x "
                         f"width {theirs[0]} x {theirs[1]}, target's {ours[0]} x {ours[1]}")
    weights = Path(path) / "model.safetensors"
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"'{weights}' is not a readable safetensors file ({exc})") from None
    if "lm_head.token_ids" not in state:
        raise ValueError(f"'{weights}' has no lm_head.token_ids: not a feature head")
    head = EagleHead(target, state["lm_head.token_ids"])
    head.lm_head.weight.data = head.lm_head.weight.data.to(dtype)
    state = {k: v if k.endswith("token_ids") else v.to(dtype) for k, v in state.items()}
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"feature head '{path}' does not match its config: missing "
                         f"{missing[:3]}, unexpected {unexpected[:3]}")
    return head.to(dtype).eval().requires_grad_(False)
