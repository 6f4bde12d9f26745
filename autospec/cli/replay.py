"""`autospec replay`: evaluate controllers on a recorded trace, deterministically."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import click

from autospec.cli.options import trace_pair_option

DEFAULT_CONTROLLERS = ("plain", "adaptive", "ctl:hf-heuristic", "ctl:ema")


@click.command()
@click.argument("trace_path", type=click.Path(path_type=Path))
@click.option("--controller", "controllers", multiple=True,
              help="Repeatable: plain, static:DRAFTER:K, adaptive, ctl:fixed[:DRAFTER:K], "
                   "ctl:hf-heuristic[:DRAFTER], ctl:ema[:DRAFTER]. Default: plain, adaptive, the "
                   "ctl: baselines, and static:D:K for every recorded drafter and K in 1,2,4,8.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
@click.option("--warm-start", is_flag=True,
              help="Instead: steps the adaptive controller needs to reach steady state, cold "
                   "(a new process) vs warm (started from what the daemon learnt).")
@trace_pair_option
def replay(trace_path, controllers, json_path, warm_start, pair):
    """Simulated tokens/s per controller and category, from the trace's recorded costs."""
    from autospec.bench.trace import Trace
    from autospec.method import parse_methods
    try:
        trace = Trace.load(trace_path)
        if pair:
            check_trace_pair(trace, trace_path, pair)
        if warm_start:
            from autospec.bench.warm_start import warm_vs_cold
            figures = warm_vs_cold(trace)
            click.echo(json.dumps(figures, indent=2))
            if json_path:
                json_path.write_text(json.dumps(figures, indent=2) + "\n")
            return
        drafters = tuple(trace.draft_seconds_per_token)
        if not controllers:
            controllers = DEFAULT_CONTROLLERS + tuple(
                f"static:{d}:{k}" for d in drafters for k in (1, 2, 4, 8) if k <= trace.k_max)
        results = run_replay(trace, parse_methods(",".join(controllers)), drafters)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(format_replay(results))
    if json_path:
        json_path.write_text(json.dumps(results, indent=2) + "\n")


def check_trace_pair(trace, path, pair: str) -> None:
    """Refuse a trace recorded on another pair than `pair` (when the trace says which)."""
    recorded = trace.pair
    if recorded is not None and recorded != pair:
        raise ValueError(f"trace '{path}' was recorded on pair '{recorded}', not '{pair}'")


def run_replay(trace, methods, drafters) -> dict:
    """{method: {category: figures}} for each Method (autospec.method) on the trace."""
    from autospec.controller.factory import make_controller
    from autospec.bench.trace import replay as replay_trace
    out = {}
    for method in methods:
        for d in method.needs_drafters:
            if d not in trace.draft_seconds_per_token:
                raise ValueError(f"controller '{method}' needs drafter '{d}', which the trace did "
                                 f"not record (recorded: {', '.join(drafters)})")
        records = replay_trace(trace, make_controller(method, drafters))
        by_cat = defaultdict(lambda: [0, 0.0, 0])
        for r in records:
            for key in (r.workload, "overall"):
                by_cat[key][0] += r.output_tokens
                by_cat[key][1] += r.wall_seconds
                by_cat[key][2] += r.steps
        out[method.spec] = {c: {"tokens_per_s": t / s, "tokens": t, "simulated_s": s,
                                "mean_accepted_length": t / n} for c, (t, s, n) in by_cat.items()}
    plain = out.get("plain")
    if plain:
        for stats in out.values():
            for c, s in stats.items():
                s["speedup_vs_plain"] = s["tokens_per_s"] / plain[c]["tokens_per_s"]
    return out


def format_replay(results: dict) -> str:
    cats = sorted({c for stats in results.values() for c in stats} - {"overall"}) + ["overall"]
    lines = ["| controller | " + " | ".join(f"{c} tok/s (x plain)" for c in cats) + " |",
             "|" + "---|" * (len(cats) + 1)]
    for name, stats in results.items():
        cells = [f"{stats[c]['tokens_per_s']:.1f} ({stats[c].get('speedup_vs_plain', 0):.2f}x)"
                 for c in cats]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
