"""The decode-time forward of a Llama model over a RowCache: its own loop, oneDNN's products.

transformers' forward of a decode step is not only its matrix products: per layer it builds
kwargs, checks masks, dispatches the attention interface, and the model around it makes masks
and output records — on a CPU at 1-16 rows a large part of a step. And its products go through
F.linear, whose BLAS call for a few rows (a verify of K + 1 tokens, a batch of 16) reads the
weight at a third to a half of the speed it reads it for one (SmolLM2's head: 13 GB/s at one
token, 3.5-5.5 at 2-9). `llama_forward` computes the same function (the same modules'
weights; the same norm, rotary and attention arithmetic, `rows_attention` for the rows) in a
plain loop: a layer's Q, K and V in one product, its gate and up in one (their weights
stacked), Q and K rotated together; products by a large weight by oneDNN over the weight
reordered once into a blocked layout (`Product`, models/products.py). One forward against
transformers' on the same RowCache: SmolLM2 one row 61 against 70 ms, a 3-token verify 58-71
against 120-143, 16 rows 117-122 against 165-177. What it reads of the model
(modules, weights, head counts) it looks up once (`_Plan`), checked each forward in one pass;
a one-token step at one row attends without a mask (`grouped_attention`), and in float32
the norm is torch's rms_norm (both the same bits): a one-row one-token forward of the
reference pair 10.4 -> 8.6 ms, SmolLM2 53 -> 46.5 (alternated in one process).

For the models whose function it computes (`fits`); every other model goes through
transformers as before. Plain and speculative decoding both run it. Its logits differ from
transformers' in the last bits (another product order), as a verify's already differ from a
one-token step's.
"""
from __future__ import annotations

import operator
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from autospec.models.attention import ROWS_ATTENTION, Packing, grouped_attention, rows_attention
from autospec.models.compiled import one_row_graph
from autospec.models.plan import ForwardBatch
from autospec.models.products import Product
from autospec.models.shared_draft import SubsetHead


def fits(model: nn.Module) -> bool:
    """Whether `llama_forward` computes `model`'s function: transformers' LlamaForCausalLM with
    no biases (the head's included), a SiLU MLP, unscaled rotary, attention by sdpa or by
    rows (the reference pair, SmolLM2, an early-exit view of either). The structure's check
    is cached on the model."""
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if attention not in ("sdpa", ROWS_ATTENTION):
        return False  # read each time: a model's attention can be switched after loading
    cached = getattr(model, "_autospec_fits", None)
    if cached is not None:
        return cached
    try:
        from transformers import LlamaForCausalLM
        cfg = model.config
        ok = (type(model) is LlamaForCausalLM and _llama_layers_fit(cfg, model.model.rotary_emb)
              and getattr(cfg, "pretraining_tp", 1) == 1
              and getattr(model.lm_head, "bias", None) is None)
    except (ImportError, AttributeError):
        ok = False
    model._autospec_fits = ok
    return ok


def _llama_layers_fit(cfg, rotary: nn.Module) -> bool:
    """Whether `_decoder_layer` computes the function of a Llama config's layers: no
    attention or MLP biases, a SiLU MLP, unscaled rotary (`fits`, `head_fits`)."""
    return (not cfg.attention_bias and not getattr(cfg, "mlp_bias", False)
            and cfg.hidden_act == "silu" and getattr(rotary, "attention_scaling", 1.0) == 1.0)


class _Layer:
    """One decoder layer as llama_forward reads it; `members` gathers what was read."""

    def __init__(self, layer: nn.Module, members: list):
        attn, mlp = _read(members, layer, "self_attn"), _read(members, layer, "mlp")
        self.attn, self.head_dim, self.scaling = attn, attn.head_dim, attn.scaling
        q, k, v, o = (_read(members, attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj"))
        gate, up, down = (_read(members, mlp, name) for name in ("gate_proj", "up_proj", "down_proj"))
        for module in (q, k, v, o, gate, up, down):
            _read(members, module, "weight")
        self.heads, self.kv_heads = q.out_features // attn.head_dim, k.out_features // attn.head_dim
        self.input_norm = _read(members, layer, "input_layernorm", "weight")
        self.post_norm = _read(members, layer, "post_attention_layernorm", "weight")
        self.qkv, self.o = Product(q, k, v), Product(o)
        self.gate_up, self.down = Product(gate, up), Product(down)
        self.split = gate.out_features


class _Plan:
    """What llama_forward reads of a model, looked up once: per layer its norms' weights, its
    products and head counts, the final norm, the head. Read through nn.Module attributes
    (~1 us each) and checked per product (products.py `_weights`, 3-8 us) every step, they
    cost about a tenth of the reference pair's one-token step. `current` says whether the plan still
    holds: every module and weight it read is where it was (the same object in its parent's
    dict), each weight at the same address and version (an in-place change, a move)."""

    def __init__(self, model: nn.Module):
        members: list = []
        base = _read(members, model, "model")
        self.embed, self.rotary = _read(members, base, "embed_tokens"), _read(members, base, "rotary_emb")
        _read(members, self.embed, "weight")
        layers = _read(members, base, "layers")
        self.layers = [_Layer(_read(members, layers, str(i)), members) for i in range(len(layers))]
        self.norm = _read(members, base, "norm", "weight")
        self.head = Product(_read(members, model, "lm_head"))
        _read(members, model.lm_head, "weight")
        # a shared draft's head scores a subset (its weight's rows): widened to the vocabulary
        self.subset = model.lm_head if isinstance(model.lm_head, SubsetHead) else None
        self.eps = model.config.rms_norm_eps
        self._track(members)
        self.depth, self.layer_list = len(layers), layers
        # the decoder loop of one row compiled (models/compiled.py), where it computes it
        self.graph = one_row_graph(self, "/".join(Path(model.config.name_or_path).parts[-2:])
                                   or type(model).__name__)

    def _track(self, members: list) -> None:
        """Note what was read (`_read`'s `members`) and each weight's address and version."""
        self.parents, self.names, self.members = (list(column) for column in zip(*members))
        self.weights = [w for w in self.members if isinstance(w, torch.Tensor)]
        self.addresses, self.versions = self._state()

    def _state(self) -> tuple[list[int], list[int]]:
        return [w.data_ptr() for w in self.weights], [w._version for w in self.weights]

    def current(self) -> bool:
        return (all(map(operator.is_, map(dict.get, self.parents, self.names), self.members))
                and self._state() == (self.addresses, self.versions)
                and len(self.layer_list) == self.depth)


class _HeadPlan(_Plan):
    """What head_forward reads of a feature head (models/eagle_head.py): its fc, its one
    decoder layer, its norm and subset head (scores over the subset: `head_scores`); the
    embedding and rotary embedding it borrows."""

    def __init__(self, head: nn.Module):
        members: list = []
        self.fc = Product(_read(members, head, "fc"))
        _read(members, head.fc, "weight")
        self.layer = _Layer(_read(members, head, "layer"), members)
        self.norm = _read(members, head, "norm", "weight")
        self.head = Product(_read(members, head, "lm_head"))
        _read(members, head.lm_head, "weight")
        self.embed, self.rotary = head.embed, head.rotary
        self.eps = head.config.rms_norm_eps
        self._track(members)
        self.depth, self.layer_list = 0, ()
        # its one layer for one row compiled (models/compiled.py): the library of the
        # target's layers where the shapes agree (SmolLM2's feature head: the same one)
        self.layers = [self.layer]
        self.graph = one_row_graph(self, "feature head")


def _read(members: list, module: nn.Module, *path: str):
    """module.path[0].path[1]..., each step noted in `members` as (its parent's dict, name,
    object) for _Plan.current."""
    for name in path:
        where = module._parameters if name in module._parameters else module._modules
        module = where[name]
        members.append((where, name, module))
    return module


def _plan(model: nn.Module, kind: type = _Plan) -> _Plan:
    plan = _PLANS.get(model)
    if plan is None or not plan.current():
        plan = _PLANS[model] = kind(model)
    return plan


# model -> its _Plan; beside the model, as products.py's _PRODUCTS is (a plan holds oneDNN
# tensors)
_PLANS: "weakref.WeakKeyDictionary[nn.Module, _Plan]" = weakref.WeakKeyDictionary()


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm's arithmetic, float32 inside, as transformers computes it (for float32
    torch's rms_norm: the same bits, measured on both pairs' shapes; on the CPU a composite of
    the same kernels, not a fused one, ~7 us a call sooner in a loop; for bfloat16 it measured
    no faster over a SmolLM2 int4 token: 66.9 against 67.3 tok/s)."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def llama_forward(model: nn.Module, batch: ForwardBatch, cache, output_hidden_states: bool = False):
    """Logits (B, T', V) of the batch's input (B, T) written into `cache` (a RowCache holding
    `batch`) — and, with output_hidden_states, the last hidden state (B, T, D) after the final
    norm — as transformers' LlamaForCausalLM forward returns them for the same arguments."""
    plan = _plan(model)
    x, graph = None, plan.graph
    # one row of a plain step's or a verify's width (batch 1): the compiled decoder loop
    if (batch.window is not None and graph is not None and graph.takes(batch.input_ids.shape[-1])
            and not torch.is_grad_enabled()):
        slot, start, _ = batch.window
        x = graph(plan.embed(batch.input_ids), start, cache.layers, slot)
    hidden = _layers(plan, batch, cache) if x is None else _norm(x, plan.norm, plan.eps)
    keep = batch.logits_to_keep
    if isinstance(keep, int) and keep:
        scored = hidden[:, -keep:]
    elif isinstance(keep, torch.Tensor):
        scored = hidden[:, keep]
    else:
        scored = hidden
    logits = plan.head(scored)
    if plan.subset is not None:
        logits = plan.subset.widen(logits)
    return (logits, hidden) if output_hidden_states else logits


def step_products(model: nn.Module) -> list[tuple[str, "Product", int]]:
    """The products a one-token forward of `model` runs, as it runs them: ("layers" or "head",
    the product, its input width) — for bench's step profile (bench/roofline.py); [] for a
    model this forward does not compute."""
    if not fits(model):
        return []
    plan = _plan(model)
    out = [("layers", product, product.modules[0].in_features) for layer in plan.layers
           for product in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    return out + [("head", plan.head, plan.head.modules[0].in_features)]


def prepare_compiled(*models: nn.Module | None, head: nn.Module | None = None) -> None:
    """Load (or compile, the first time) the compiled one-row libraries of each model this
    forward computes, and of a feature head's layer (`head`), now rather than in its first
    step (a draft model's first use would otherwise compile inside a timed run). Nothing
    where compiling is off."""
    plans = [_plan(model) for model in models if model is not None and fits(model)]
    if head is not None and head_fits(head):
        plans.append(_plan(head, _HeadPlan))
    for plan in plans:
        if plan.graph is not None:
            plan.graph.prepare(plan.embed.weight.dtype)


def ran_compiled(model: nn.Module) -> bool:
    """Whether `model`'s one-row forwards have run compiled (models/compiled.py)."""
    graph = _plan(model).graph if fits(model) else None
    return bool(graph is not None and graph.runners)


def _layers(plan: _Plan, batch: ForwardBatch, cache) -> torch.Tensor:
    """The decoder layers and the final norm, op by op: the last hidden state (B, T, D)."""
    eps = plan.eps
    x = plan.embed(batch.input_ids)
    cos, sin = plan.rotary(x, batch.position_ids)
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D): broadcast over heads
    # one row, one token (a plain step at batch 1): its mask hides nothing
    one = batch.input_ids.shape == (1, 1)
    for index, layer in enumerate(plan.layers):
        x = _decoder_layer(layer, x, cos, sin, cache.layers[index], batch.mask, batch.packing,
                           one, eps)
    return _norm(x, plan.norm, eps)


def _decoder_layer(layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   cache_layer, attention_mask, packing: Packing | None, one: bool,
                   eps: float) -> torch.Tensor:
    """One Llama decoder layer over x (B, T, D), its K and V written into `cache_layer` (a
    bound RowCache's); `packing`: x holds rows packed (rows_attention); `one`: a single row's
    single token, attended without a mask."""
    batch, width = x.shape[:2]
    heads, kv_heads = layer.heads, layer.kv_heads
    h = _norm(x, layer.input_norm, eps)
    qkv = layer.qkv(h).view(batch, width, -1, layer.head_dim).transpose(1, 2)  # (B, H + 2 H_kv, T, D)
    qk = _rotate(qkv[:, :heads + kv_heads], cos, sin)  # Q's heads and K's, rotated at once
    k, v = cache_layer.update(qk[:, heads:], qkv[:, heads + kv_heads:])
    if one:
        out = grouped_attention(qk[:, :heads], k, v, None, layer.scaling)
    else:
        out, _ = rows_attention(layer.attn, qk[:, :heads], k, v, attention_mask, packing,
                                scaling=layer.scaling, dropout=0.0)
    x = x + layer.o(out.reshape(batch, width, -1))
    h = _norm(x, layer.post_norm, eps)
    gate, up = layer.gate_up(h).split(layer.split, -1)
    return x + layer.down(F.silu(gate) * up)


def head_fits(head: nn.Module) -> bool:
    """Whether `head_forward` computes a feature head's function: its layer a bias-free Llama
    decoder layer with a SiLU MLP, unscaled rotary (the target's, as `fits` asks of it)."""
    cached = getattr(head, "_autospec_fits", None)  # checked once: it asks every draft position
    if cached is not None:
        return cached
    cfg = head.config
    try:
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
        ok = type(head.layer) is LlamaDecoderLayer and _llama_layers_fit(cfg, head.rotary)
    except (ImportError, AttributeError):
        ok = False
    head._autospec_fits = ok
    return ok


def head_forward(head: nn.Module, input_ids: torch.Tensor, features: torch.Tensor,
                 position_ids: torch.Tensor, attention_mask: torch.Tensor, cache) -> torch.Tensor:
    """A feature head's predicted features (B, T, D), as EagleHead.forward computes them over a
    bound RowCache of its own, by llama_forward's layer (its products by oneDNN, its rows'
    attention grouped). At 16 SmolLM2 rows drafting one token took ~19 ms through transformers'
    layer (F.linear's products at 16 rows, sdpa with K and V copied to every query head)."""
    plan = _plan(head, _HeadPlan)
    x = plan.fc(torch.cat([plan.embed(input_ids).to(features.dtype), features], -1))
    cos, sin = plan.rotary(x, position_ids)
    x = _decoder_layer(plan.layer, x, cos[:, None], sin[:, None], cache.layers[0],
                       attention_mask, None, input_ids.shape == (1, 1), plan.eps)
    return _norm(x, plan.norm, plan.eps)


def head_one_row(head: nn.Module, tokens: list[int], features: torch.Tensor, cache,
                 slot: int) -> torch.Tensor | None:
    """One row's predicted features (T, D) for its pairs (features (T, D) = f_t, tokens =
    x_{t+1}) written into slot `slot` of the head's RowCache from its length on, by the
    compiled one-row layer (models/compiled.py); None where that does not run (compiling
    off, the width not one it takes): head_forward then. The pair in cache position p is
    rotated at p, not at p + 1 as in training: attention sees only the difference of two
    positions, and every drafting forward (this one and head_forward's) places them alike.
    SmolLM2's head drafting one token: 0.49 ms eager against 0.24 compiled (its layer's
    ~40 small ops and the cache's mask dispatched from Python)."""
    if torch.is_grad_enabled() or not head_fits(head):
        return None
    plan = _plan(head, _HeadPlan)
    graph, width = plan.graph, len(tokens)
    if graph is None or not graph.takes(width):
        return None
    start = cache.lengths[slot]
    cache.reserve(start + width)
    ids = torch.tensor([tokens], device=features.device)
    x = plan.fc(torch.cat([plan.embed(ids).to(features.dtype), features[None]], -1))
    x = graph(x, start, cache.layers, slot)
    return None if x is None else _norm(x[0], plan.norm, plan.eps)


def head_scores(head: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """A feature head's logits of `features` over its vocabulary subset, (…, N) in subset
    order (SubsetHead.subset_logits; the product by oneDNN where head_forward's plan holds it)."""
    if torch.is_grad_enabled() or not head_fits(head):
        return head.lm_head.subset_logits(features)
    return _plan(head, _HeadPlan).head(features)
