"""How far a forward is from what this machine can do: the roofline, per forward shape.

A forward of `rows` rows feeding `tokens` tokens each, over `context` cached tokens a row,
reads every weight once and each row's K and V (and writes its new ones); its arithmetic is
2 FLOPs per weight per token in the matrix products, and 4 per head dimension per query per
cached key in attention. It cannot take less than

    bound = max(bytes / copy peak, FLOPs / matmul peak)

with both peaks measured on this machine (engine/bandwidth.py: a 256 MiB copy, a 1024^3
float32 product). `autospec bench` reports, for each forward shape its runs measured, the
median measured seconds against that bound and bound / measured: 1.0 would be a forward at
the machine's limit, memory- or compute-bound as `limit` says.

`step_profile` (bench --profile) says where a one-token forward's time goes: the forward timed
at one context, then its own products (each called alone, as the forward calls it: the int4
kernel, oneDNN, F.linear; one pass over them all, as a forward streams them; a quantized one
by its kernel called directly, as the compiled forward calls it) and its attention (each
layer's, over that context) timed apart; what is left is everything else (norms, rotary, cache
writes, the calls between them). Beside it, the weights' bytes at the copy peak: the share of
the forward that is reading them, the floor a step at this machine's limit would reach; and a
verify's forward of 3 and 5 tokens over a one-token forward's.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Iterable

import torch
from torch import nn

from autospec.models.kv import kv_bytes_per_token, kv_shape
from autospec.models.pair import weight_bytes

SHAPES = 8  # the most frequent forward shapes reported


def forward_bound(model: nn.Module, rows: int, tokens: int, context: int, copy_gbs: float,
                  matmul_gflops: float) -> dict:
    """The roofline of one forward (module docstring): its bytes, FLOPs and bound seconds."""
    weights = weight_bytes(model)  # as stored: 4, 2 or ~0.6 bytes a weight (models/weights.py)
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    products = sum(p.numel() for p in model.parameters())  # each multiplied once per query
    if embedding is not None and getattr(head, "weight", None) is not embedding.weight:
        products -= embedding.weight.numel()
    kv = kv_bytes_per_token(model)
    moved = weights + rows * (context + tokens) * kv
    layers, _, head_dim = kv_shape(model)
    heads = model.config.num_attention_heads
    queries = rows * tokens
    flops = 2 * products * queries + 4 * layers * heads * head_dim * queries * (context + tokens)
    memory_s, compute_s = moved / (copy_gbs * 1e9), flops / (matmul_gflops * 1e9)
    return {"bytes": moved, "flops": flops, "bound_s": max(memory_s, compute_s),
            "limit": "memory" if memory_s >= compute_s else "compute"}


def roofline(steps: Iterable, model: nn.Module, copy_gbs: float, matmul_gflops: float) -> list[dict]:
    """Per forward shape (rows x tokens a row, from StepRecords: batch_size, batch_width; a
    shape of rows of unequal widths is keyed by its widest), the SHAPES most frequent: median
    measured verify seconds, median context, the bound at that context, bound / measured."""
    by_shape: dict[tuple[int, int], list] = defaultdict(list)
    for s in steps:
        by_shape[s.batch_size, s.batch_width].append(s)
    out = []
    for (rows, width), group in sorted(by_shape.items(), key=lambda kv: -len(kv[1]))[:SHAPES]:
        measured = statistics.median(s.verify_seconds for s in group)
        context = int(statistics.median(s.context_tokens for s in group))
        tokens = statistics.median(s.batch_tokens for s in group) / rows  # packed: real tokens
        bound = forward_bound(model, rows, max(1, round(tokens)), context, copy_gbs, matmul_gflops)
        out.append({"rows": rows, "width": width, "steps": len(group), "context": context,
                    "measured_s": measured, "bound_s": bound["bound_s"], "limit": bound["limit"],
                    "of_bound": bound["bound_s"] / measured if measured > 0 else None})
    return sorted(out, key=lambda r: (r["rows"], r["width"]))


def peaks(model: nn.Module | None = None) -> tuple[float, float]:
    """The (copy GB/s, matmul GFLOP/s) of the device `model` runs on (default: the CPU),
    measured once and cached."""
    from autospec.engine.bandwidth import peak_bandwidth_gbs, peak_matmul_gflops
    device = "cpu" if model is None else str(next(model.parameters()).device)
    return peak_bandwidth_gbs(device), peak_matmul_gflops(device)


def format_roofline(rows: list[dict], label: str = "") -> str:
    """One report line: each shape's measured forward, its bound, bound / measured."""
    cells = ", ".join(f"{r['rows']}x{r['width']} {1e3 * r['measured_s']:.1f} / "
                      f"{1e3 * r['bound_s']:.2f} ms {r['limit']} ({r['of_bound']:.0%})"
                      for r in rows if r["of_bound"] is not None)
    return f"roofline{label} (rows x widest: measured forward / bound, bound / measured): {cells}" \
        if cells else ""


PROFILE_ROUNDS = 7  # medians of this many rounds of PROFILE_CALLS each
PROFILE_CALLS = 10


def _seconds(call, rounds: int = PROFILE_ROUNDS, calls: int = PROFILE_CALLS) -> float:
    """Median over rounds of one call's mean seconds (after a round of warm-up)."""
    for _ in range(calls):
        call()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


@torch.inference_mode()
def step_profile(engine, prompt_ids: list[int], copy_gbs: float) -> dict | None:
    """Where a one-token forward of the engine's target goes, at the context of `prompt_ids`
    (module docstring): seconds of the forward, its products (layers', head's), its attention,
    the rest; the weights' bytes and their seconds at `copy_gbs`; verify / one-token forward
    for 3 and 5 tokens. None for a target whose forward is transformers' (no products to
    time apart)."""
    from autospec.models.attention import grouped_attention
    from autospec.models.forward import ran_compiled, step_products
    from autospec.models.weights import format_of
    model = engine.models.target
    products = step_products(model)
    if not products:
        return None
    request = engine.start(prompt_ids, max_new_tokens=8)
    cache, slot = engine.cache, request.slot
    context = cache.lengths[slot]
    try:
        def forward(width: int):
            cache.lengths[slot] = context
            cache.forward(model, engine.kwarg, [slot], [prompt_ids[-width:]],
                          engine.models.max_positions, scored=[width])
        widths = {w: _seconds(lambda w=w: forward(w)) for w in (1, 3, 5)}
    finally:
        cache.lengths[slot] = context
        engine.abandon(request)
    dtype = next(model.parameters()).dtype if format_of(model) == "float32" else torch.bfloat16
    spent = _product_seconds(products, dtype)
    layers, kv_heads, head_dim = kv_shape(model)
    heads = model.config.num_attention_heads
    query = torch.randn(1, heads, 1, head_dim).to(dtype)
    kv = torch.randn(1, kv_heads, context + 1, head_dim).to(dtype)
    attention = layers * _seconds(lambda: grouped_attention(query, kv, kv, None, head_dim ** -0.5),
                                  rounds=3)
    step = widths[1]
    weights = weight_bytes(model)  # as stored, an untied embedding's one row left out
    return {"format": format_of(model), "context": context, "threads": torch.get_num_threads(),
            "forward_s": step, "layers_s": spent["layers"], "head_s": spent["head"],
            "attention_s": attention, "rest_s": step - spent["layers"] - spent["head"] - attention,
            "weight_bytes": weights, "copy_gbs": copy_gbs, "weights_s": weights / (copy_gbs * 1e9),
            "verify_3": widths[3] / step, "verify_5": widths[5] / step,
            "compiled": ran_compiled(model)}


def _product_seconds(products: list, dtype: torch.dtype) -> dict[str, float]:
    """Seconds of a forward's products by part (layers, head): each called once a pass, in the
    forward's order, so that each weight streams from memory as the forward reads it (one
    product called over and over reads its weight from the cache: SmolLM2's layers at int4
    measured so 2.7 ms where a forward spends 3.5), the median pass of PROFILE_ROUNDS. A
    quantized product is its kernel called alone (`_kernel`), as a compiled forward calls it."""
    inputs = [(part, _kernel(product, dtype), torch.randn(1, width).to(dtype))
              for part, product, width in products]
    passes = []
    for _ in range(PROFILE_ROUNDS + 1):  # the first a warm-up
        spent = {"layers": 0.0, "head": 0.0}
        for part, product, x in inputs:
            t0 = time.perf_counter()
            product(x)
            spent[part] += time.perf_counter() - t0
        passes.append(spent)
    return {part: statistics.median(p[part] for p in passes[1:]) for part in ("layers", "head")}


def _kernel(product, dtype: torch.dtype):
    """What a one-token forward runs for `product` (models/products.py Product): the 4- or
    8-bit kernel itself where Product runs one (one call into C++, as a compiled forward makes
    it, not the Python of Product's choice), else the Product."""
    from autospec.models import quantized
    forms = product.quantized(dtype, 1)
    return product if forms is None else (lambda x: quantized.mm(x, forms))


def format_step_profile(profile: dict | None, label: str = "") -> str:
    """The step profile's lines (`step_profile`)."""
    if profile is None:
        return f"step profile{label}: none (the target runs transformers' own forward)"
    step = profile["forward_s"]
    def ms(seconds: float) -> str:
        return f"{1e3 * seconds:.1f} ms, {seconds / step:.0%}"
    how = "compiled" if profile["compiled"] else "eager"
    return "\n".join([
        f"one-token forward{label} ({profile['format']}, {how}, {profile['threads']} threads, "
        f"context {profile['context']}): {1e3 * step:.1f} ms",
        f"  products {ms(profile['layers_s'] + profile['head_s'])} (layers "
        f"{1e3 * profile['layers_s']:.1f}, head {1e3 * profile['head_s']:.1f} ms); attention "
        f"{ms(profile['attention_s'])}; the rest {ms(profile['rest_s'])} (norms, rotary, cache "
        f"writes, the calls between them)",
        f"  weight reads: {profile['weight_bytes'] / 1e6:.0f} MB at the copy peak "
        f"({profile['copy_gbs']:.1f} GB/s) {ms(profile['weights_s'])} of the forward",
        f"  a verify's forward over one token's: 3 tokens {profile['verify_3']:.2f}, "
        f"5 tokens {profile['verify_5']:.2f}"])
