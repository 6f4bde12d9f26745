"""The one-setting table: is there one fixed setting a deployment could pick once?

Over every cell (pair x workload x concurrency, and x category with `by_category`) of some
`autospec bench --json` reports, each method's throughput as a fraction of the best fixed
method in that cell — fixed: plain, a `static:` drafter and K, a `ctl:` baseline (a rule a
person writes once, like a batch-size table), and in a `--engine vllm` report vLLM's own
(`vllm:`); not the transformers peers (`hf:`), the other engine beside vLLM (`ours:`) nor the
oracles (hindsight) — and adaptive's. The claim it checks: the best single fixed setting's worst cell against
adaptive's worst cell, no setting chosen per deployment (`autospec report --bench A.json ...`).
"""
from __future__ import annotations

import json
from pathlib import Path

from autospec.method import is_adaptive, kind_of

Cell = tuple[str, str, str]  # pair, workload (· category), concurrency ("1": one at a time)


def cells(report: dict, by_category: bool = False) -> dict[Cell, dict[str, float]]:
    """tokens/s per method in each cell of one bench report: the batch-1 table (concurrency
    "1") unless the run measured 1 under load too, then every --concurrency level; with
    `by_category`, each category of each, by its requests' own speed (tokens over their
    summed latencies: under load a category's share of the run's throughput says nothing of
    it)."""
    settings = report.get("settings", {})
    pair, workload = settings.get("pair", "?"), settings.get("workload", "?")
    out: dict[Cell, dict[str, float]] = {}
    load = report.get("by_concurrency") or {}
    tables = [] if "1" in load else [("1", report["methods"], "tokens_per_s")]
    tables += [(level, by["methods"], "throughput_tokens_per_s") for level, by in load.items()]
    for level, methods, key in tables:
        if not by_category:
            out[pair, workload, level] = {spec: m["overall"][key] for spec, m in methods.items()}
            continue
        for category in settings.get("categories", []):
            out[pair, f"{workload} · {category}", level] = {
                spec: m["by_category"][category]["tokens_per_s"] for spec, m in methods.items()}
    return out


def is_fixed(spec: str) -> bool:
    """A report key (METHOD or METHOD@FORMAT) that names a fixed setting (the docstring)."""
    return kind_of(spec) in ("plain", "static", "ctl", "vllm")


def one_setting_table(paths: list[Path], by_category: bool = False) -> str:
    """The markdown table of the reports at `paths` and the line that answers the question."""
    table: dict[Cell, dict[str, float]] = {}
    for path in paths:
        try:
            table.update(cells(json.loads(Path(path).read_text()), by_category))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}: not an `autospec bench --json` report ({exc})") from None
    keys = sorted(table, key=lambda c: (c[0], c[1], int(c[2]) if c[2].isdigit() else 0))
    methods = list(dict.fromkeys(spec for c in keys for spec in table[c]
                                 if is_fixed(spec) or is_adaptive(spec)))
    ratios = {spec: [] for spec in methods}
    for c in keys:
        best = max((v for spec, v in table[c].items() if is_fixed(spec)), default=None)
        for spec in methods:
            value = table[c].get(spec)
            ratios[spec].append(None if value is None or not best else value / best)
    lines = ["| method | " + " | ".join(f"{p} · {w} · N={n}" for p, w, n in keys) + " | worst cell |",
             "|---" * (len(keys) + 2) + "|"]
    for spec in methods:
        row = ratios[spec]
        worst = min(row) if None not in row else None
        lines.append(f"| {spec} | " + " | ".join("–" if r is None else f"{r:.2f}" for r in row)
                     + f" | {'–' if worst is None else f'{worst:.2f}'} |")
    complete = {spec: min(r) for spec, r in ratios.items() if None not in r}
    fixed = {spec: w for spec, w in complete.items() if is_fixed(spec)}
    summary = []
    if fixed:
        spec, worst = max(fixed.items(), key=lambda kv: kv[1])
        summary.append(f"best single fixed setting: {spec}, worst cell {worst:.2f} of that cell's best")
    for spec, worst in complete.items():
        if is_adaptive(spec):
            summary.append(f"{spec}: worst cell {worst:.2f}")
    return "\n".join(lines) + "\n\n" + "; ".join(summary) + "\n"
