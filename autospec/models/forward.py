"""The decode-time forward of a Llama model over a RowCache, without transformers' plumbing.

transformers' forward of a 1-token step is mostly not its matrix products: per layer it builds
kwargs, checks masks, dispatches the attention interface, casts for the norms, and the model
around it makes masks and output records. On a CPU at batch sizes of 1-16 that is a large part
of a step (SmolLM2, 30 layers, one row: ~15-20 ms of Python and small ops around ~50 ms of
products). `llama_forward` computes the same function (the same modules' weights, the same
norm, rotary and attention arithmetic, `rows_attention` for the rows) in a plain loop, for the
models it is exact for (`fits`); every other model goes through transformers unchanged.

Plain and speculative decoding both run it, so greedy identity between them holds as before;
against transformers' own forward a logit can differ in the last bits (what a different
product order gives), as between any two BLAS calls of a different shape.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autospec.models.attention import ROWS_ATTENTION, rows_attention


def fits(model: nn.Module) -> bool:
    """Whether `llama_forward` computes `model` exactly: transformers' LlamaForCausalLM with
    no biases, SiLU MLP, default-scaled rotary, every layer alike (the reference pair, SmolLM2,
    an early-exit view of either). Cached on the model."""
    cached = getattr(model, "_autospec_fits", None)
    if cached is not None:
        return cached
    ok = False
    try:
        from transformers import LlamaForCausalLM
        cfg = model.config
        ok = (type(model) is LlamaForCausalLM and not cfg.attention_bias
              and not getattr(cfg, "mlp_bias", False) and cfg.hidden_act == "silu"
              and getattr(cfg, "pretraining_tp", 1) == 1
              and getattr(model.model.rotary_emb, "attention_scaling", 1.0) == 1.0
              and cfg._attn_implementation in ("sdpa", ROWS_ATTENTION))
    except (ImportError, AttributeError):
        ok = False
    model._autospec_fits = ok
    return ok


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm's arithmetic, float32 inside, as transformers computes it."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def llama_forward(model: nn.Module, input_ids: torch.Tensor, cache, position_ids: torch.Tensor,
                  attention_mask: torch.Tensor, logits_to_keep=None,
                  output_hidden_states: bool = False):
    """Logits (B, T', V) of input_ids (B, T) written into `cache` (a bound RowCache) — and,
    with output_hidden_states, the last hidden state (B, T, D) after the final norm — as
    transformers' LlamaForCausalLM forward returns them for the same arguments."""
    base, cfg = model.model, model.config
    eps = cfg.rms_norm_eps
    x = base.embed_tokens(input_ids)
    cos, sin = base.rotary_emb(x, position_ids)
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D): broadcast over heads
    batch, width = input_ids.shape
    for index, layer in enumerate(base.layers):
        attn, mlp = layer.self_attn, layer.mlp
        h = _norm(x, layer.input_layernorm.weight, eps)
        q = F.linear(h, attn.q_proj.weight).view(batch, width, -1, attn.head_dim).transpose(1, 2)
        k = F.linear(h, attn.k_proj.weight).view(batch, width, -1, attn.head_dim).transpose(1, 2)
        v = F.linear(h, attn.v_proj.weight).view(batch, width, -1, attn.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k, v = cache.layers[index].update(k, v)
        out, _ = rows_attention(attn, q, k, v, attention_mask, scaling=attn.scaling, dropout=0.0)
        x = x + F.linear(out.reshape(batch, width, -1), attn.o_proj.weight)
        h = _norm(x, layer.post_attention_layernorm.weight, eps)
        x = x + F.linear(F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight),
                         mlp.down_proj.weight)
    hidden = _norm(x, base.norm.weight, eps)
    if isinstance(logits_to_keep, int) and logits_to_keep:
        logits = model.lm_head(hidden[:, -logits_to_keep:])
    elif isinstance(logits_to_keep, torch.Tensor):
        logits = model.lm_head(hidden[:, logits_to_keep])
    else:
        logits = model.lm_head(hidden)
    return (logits, hidden) if output_hidden_states else logits
