"""`autospec replay`: evaluate controllers on a recorded trace, deterministically."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import click

from autospec.cli.options import trace_pair_option

HINDSIGHT = "hindsight"  # bench/recorded.py HindsightController: not a Method (it needs the trace)
DEFAULT_CONTROLLERS = ("plain", "adaptive", "ctl:hf-heuristic", "ctl:ema", HINDSIGHT)


@click.command()
@click.argument("trace_path", type=click.Path(path_type=Path))
@click.option("--controller", "controllers", multiple=True,
              help="Repeatable: plain, static:DRAFTER:K, adaptive, ctl:fixed[:DRAFTER:K], "
                   "ctl:hf-heuristic[:DRAFTER], ctl:ema[:DRAFTER], ctl:batch-table[:DRAFTER], "
                   "hindsight[:DRAFTER[+DRAFTER...]] (knows the outputs: the ceiling; of "
                   "those drafters only). Default: plain, adaptive, the "
                   "ctl: baselines, hindsight, and static:D:K for every recorded drafter and K in "
                   "1,2,4,8.")
@click.option("--rows", default=1, show_default=True, type=click.IntRange(min=1),
              help="Closed-loop clients decoded at once: each step is charged the trace's "
                   "batch line (recorded with it); throughput over the whole run.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
@click.option("--warm-start", is_flag=True,
              help="Instead: steps the adaptive controller needs to reach steady state, cold "
                   "(a new process) vs warm (started from what the daemon learnt).")
@click.option("--knobs", is_flag=True,
              help="Instead: each controller knob at its default and switched off, and each "
                   "constant replay can judge at other values (the adaptive controller at "
                   "--rows clients, over --resamples resampled runs of the trace): the effect "
                   "on replayed tokens/s, beyond noise where every resample moves the same way.")
@click.option("--resamples", default=20, show_default=True, type=click.IntRange(min=2),
              help="Resampled runs of the trace's requests (drawn with replacement) for --knobs.")
@trace_pair_option
def replay(trace_path, controllers, rows, json_path, warm_start, knobs, resamples, pair):
    """Simulated tokens/s per controller and category, from the trace's recorded costs."""
    from autospec.bench.trace import Trace
    from autospec.method import parse_methods
    try:
        trace = Trace.load(trace_path)
        if pair:
            check_trace_pair(trace, trace_path, pair)
        if knobs:
            from autospec.tune.knobs import audit, format_audit
            audited = audit(trace, resamples, rows)
            click.echo(format_audit(audited))
            if json_path:
                json_path.write_text(json.dumps(audited, indent=2) + "\n")
            return
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
        texts = [c.strip() for spec in controllers for c in spec.split(",")]
        ceilings = [t for t in texts if t.split(":")[0] == HINDSIGHT]
        methods = parse_methods(",".join(t for t in texts if t not in ceilings) or "plain")
        methods += ceilings
        results = run_replay(trace, methods, drafters, rows)
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


def run_replay(trace, methods, drafters, rows: int = 1) -> dict:
    """{method: {category: figures}} for each Method (autospec.method) or HINDSIGHT[:D+D..]
    on the trace; over `rows` clients at once, only "overall" (categories share the steps)."""
    from autospec.bench.recorded import HindsightController, replay as replay_trace, replay_batch
    from autospec.controller.factory import make_controller
    out = {}
    for method in methods:
        if isinstance(method, str):  # hindsight[:DRAFTER+DRAFTER...]
            _, _, only = method.partition(":")
            controller = HindsightController(trace, tuple(only.split("+")) if only else None)
            spec = method
        else:
            for d in method.needs_drafters:
                if d not in trace.draft_seconds_per_token:
                    raise ValueError(f"controller '{method}' needs drafter '{d}', which the trace "
                                     f"did not record (recorded: {', '.join(drafters)})")
            controller, spec = make_controller(method), method.spec
        by_cat = defaultdict(lambda: [0, 0.0, 0])
        if rows > 1:
            records, elapsed = replay_batch(trace, controller, rows)
            by_cat["overall"] = [sum(r.output_tokens for r in records), elapsed,
                                 sum(r.steps for r in records)]
        else:
            for r in replay_trace(trace, controller):
                for key in (r.workload, "overall"):
                    by_cat[key][0] += r.output_tokens
                    by_cat[key][1] += r.wall_seconds
                    by_cat[key][2] += r.steps
        out[spec] = {c: {"tokens_per_s": t / s, "tokens": t, "simulated_s": s,
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
