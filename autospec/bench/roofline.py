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
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable

from torch import nn

from autospec.models.pair import kv_bytes_per_token, kv_shape, weight_bytes

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
