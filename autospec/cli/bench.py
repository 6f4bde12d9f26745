"""`autospec bench`: the one harness every speed figure comes from."""
from __future__ import annotations

import json
import importlib
from pathlib import Path

import click

from autospec.cli.options import (check_pair_args, draft_option, drafter_options_option,
                                  load_engines, pair_option, parse_formats, prefill_chunk_option,
                                  target_option, write_report)
from autospec.method import AUTOSPEC, VLLM, known
from autospec.models import AUTO, FORMATS

DEFAULT_METHODS = ("plain,static:ngram:1,static:ngram:2,static:ngram:4,static:ngram:8,"
                   "static:draft-model:1,static:draft-model:2,static:draft-model:4,"
                   "static:draft-model:8,static:early-exit:1,static:early-exit:2,"
                   "static:early-exit:4,static:early-exit:8,hf:generate,hf:assisted:4,"
                   "hf:prompt-lookup:4,hf:early-exit:4,adaptive,oracle,oracle-per-category")


def _parsed(module: str, parse: str):
    """A click callback: the option's value through `module.parse` (imported when used), or
    click's error naming the bad entry."""
    def callback(ctx, param, value: str | None):
        if value is None:
            return None
        try:
            return getattr(importlib.import_module(module), parse)(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return callback


@click.command()
@click.option("--methods", default=DEFAULT_METHODS, show_default=True,
              help=f"Comma-separated: {known(AUTOSPEC)} (--engine vllm: its own, below).")
@click.option("--prompts", "prompts_path", type=click.Path(path_type=Path), default=None,
              help="Workload JSONL ({id, prompt | messages, category[, max_new_tokens]} per "
                   "line; messages: a chat, rendered with the target's chat template). "
                   "Default: the pair's (reference: configs/workloads/reference.jsonl; "
                   "smollm2: chat.jsonl).")
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--limit", default=None, type=click.IntRange(min=1),
              help="Use only the first N prompts of each category.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Write the full report here.")
@click.option("--record", "record_path", type=click.Path(path_type=Path), default=None,
              help="Also record a replay trace (greedy): every drafter's agreement at every "
                   "output position, and the measured costs. See `autospec replay`.")
@click.option("--record-k-max", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--concurrency", default=None, callback=_parsed("autospec.bench.load", "parse_concurrency"),
              help="Also run each method under N closed-loop clients through the batched "
                   "engine, for each N of a comma-separated list (e.g. 1,4,16): throughput, "
                   "inter-token latency and time to first token, in the JSON's by_concurrency.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --concurrency: write a PNG of throughput and inter-token latency "
                   "(p50, p99 dashed) against concurrency, one line per method.")
@click.option("--arrivals", "schedule", default=None, metavar="SCHEDULE",
              callback=_parsed("autospec.bench.arrivals", "parse_schedule"),
              help="Also run each method under open-loop load: RATE:SECONDS,... (requests per "
                   "second for so many seconds, Poisson from --seed; e.g. 0.2:60,2:60,0.2:60) "
                   "or @FILE (send times in seconds, one per line). Per phase and overall: "
                   "throughput, TTFT, ITL, queue wait, completed, refused; the JSON's arrivals.")
@click.option("--rows", default=16, show_default=True, type=click.IntRange(min=1),
              help="With --arrivals: the engine's rows (requests decoded at once; the rest queue).")
@click.option("--engine", "engine_name", default="autospec", show_default=True,
              type=click.Choice([AUTOSPEC, VLLM]),
              help=f"vllm: decode with vLLM (pip install -e '.[vllm]'); methods {known(VLLM)} "
                   f"(adaptive: autospec's proposer inside vLLM; ours:METHOD: autospec's engine "
                   f"beside it). docs/vllm.md.")
@click.option("--num-speculative-tokens", "k_limit", default=8, show_default=True,
              type=click.IntRange(min=1),
              help="With --engine vllm: the K limit vLLM gives autospec's proposer (adaptive).")
@pair_option
@target_option
@draft_option
@prefill_chunk_option
@click.option("--weights", default=AUTO, show_default=True, callback=parse_formats,
              metavar="FORMAT[,FORMAT...]",
              help=f"Weight format ({AUTO}: the target's own; {', '.join(FORMATS)}) of the "
                   f"target and every drafter; a list runs every method at each, interleaved, "
                   f"keyed METHOD@FORMAT, each compared with plain at its own format "
                   f"(docs/weights.md).")
@drafter_options_option
@click.option("--profile", is_flag=True,
              help="Also say where the target's one-token forward goes, at the first prompt's "
                   "context: its products, attention and the rest, timed apart; the share that "
                   "is weight reads at the copy peak; a verify's forward of 3 and 5 tokens over "
                   "one token's (the JSON's step_profile).")
def bench(methods, prompts_path, repeats, max_new_tokens, temperature, seed, limit, json_path,
          record_path, record_k_max, concurrency, plot_path, schedule, rows, engine_name, k_limit,
          prefill_chunk, pair, target, draft, weights, drafter_options, profile):
    """Measure methods side by side on a workload; print a table, optionally write JSON."""
    from autospec.bench.harness import run_bench
    from autospec.bench.prompts import load_prompts
    from autospec.bench.table import format_table
    from autospec.method import parse_methods
    from autospec.models.pairs import DEFAULT_PAIR, named_pair
    check_pair_args(pair, target, draft)
    if plot_path and not concurrency:
        raise click.UsageError("--plot draws the figures under load: give --concurrency too "
                               "(e.g. --concurrency 1,4,16)")
    if engine_name == "vllm" and methods == DEFAULT_METHODS:
        from autospec.cli.bench_vllm import DEFAULT_VLLM_METHODS
        methods = DEFAULT_VLLM_METHODS
    try:
        method_list = parse_methods(methods, engine_name)
        prompts = load_prompts(prompts_path or named_pair(pair or DEFAULT_PAIR).workload("bench"))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if limit:
        seen: dict[str, int] = {}
        prompts = [p for p in prompts if seen.setdefault(p.category, 0) < limit
                   and not seen.__setitem__(p.category, seen[p.category] + 1)]
    if len(weights) > 1 and (engine_name == "vllm" or schedule or record_path):
        raise click.UsageError("a list of --weights runs our engine's methods at each format; "
                               "--engine vllm, --arrivals and --record take one format")
    engines = load_engines(target, draft, weights, pair, drafter_options)
    weights = list(engines)
    engine = engines[weights[0]]
    if engine_name == "vllm":
        from autospec.cli.bench_vllm import bench_vllm
        return bench_vllm(engine, prompts, method_list, k_limit, concurrency or [1],
                          repeats, max_new_tokens, temperature, seed,
                          "bfloat16" if weights[0] == "int4" else weights[0], pair, target,
                          prompts_path, schedule, rows, record_path, plot_path, json_path)
    from autospec.drafters.base import available_drafters
    available = available_drafters(engine.models)
    skipped = [m for m in method_list if not set(m.needs_drafters) <= set(available)]
    if skipped and methods == DEFAULT_METHODS:
        # a target-only pair (e.g. smollm2 before its draft ships): the default set without
        # the methods that need a draft model
        method_list = [m for m in method_list if m not in skipped]
        click.echo(f"{engine.models.key} has no draft model: skipping "
                   f"{', '.join(map(str, skipped))}", err=True)
    try:
        report = run_bench(engines if len(engines) > 1 else engine, prompts, method_list,
                           repeats, max_new_tokens, temperature, seed,
                           progress=lambda m: click.echo(m, err=True))
        report["settings"].update(pair=engine.models.key, workload=Path(
            prompts_path or named_pair(pair or DEFAULT_PAIR).workload("bench")).stem)
        if concurrency:
            from autospec.bench.load import merge_formats, run_load, runs_under_load
            by_format = {w: run_load(e, prompts, method_list, concurrency, max_new_tokens,
                                     temperature, seed, repeats,
                                     progress=lambda m: click.echo(m, err=True),
                                     prefill_chunk=prefill_chunk or None)
                         for w, e in engines.items()}
            report["by_concurrency"] = (by_format[weights[0]] if len(weights) == 1
                                        else merge_formats(by_format))
            report["settings"]["concurrency"] = concurrency
            report["settings"]["not_under_load"] = [m.spec for m in method_list
                                                    if not runs_under_load(m)]
        if schedule:
            from autospec.bench.arrivals import run_arrivals
            report["arrivals"] = run_arrivals(engine, prompts, method_list, schedule, rows,
                                              max_new_tokens, temperature, seed,
                                              progress=lambda m: click.echo(m, err=True),
                                              prefill_chunk=prefill_chunk or None)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(format_table(report))
    if concurrency:
        from autospec.bench.load import format_load_table
        click.echo("\n" + format_load_table(report["by_concurrency"]))
    if schedule:
        from autospec.bench.arrivals import format_arrivals_table
        click.echo("\n" + format_arrivals_table(report["arrivals"]))
    if profile:
        from autospec.bench.prompts import prompt_ids
        from autospec.bench.roofline import format_step_profile, peaks, step_profile
        report["step_profile"] = {}
        for w, e in engines.items():
            found = report["step_profile"][w] = step_profile(
                e, prompt_ids(e, prompts[0]), peaks(e.models.target)[0])
            click.echo("\n" + format_step_profile(found, f" of {e.models.key}'s target"))
    measured = report["measured"]
    click.echo(f"\nv(K) = {json.dumps({k: round(v, 3) for k, v in measured['v'].items()})}")
    click.echo(f"c    = {json.dumps({k: round(v, 3) for k, v in measured['c'].items()})}")
    for drafter, by_category in measured["alpha"].items():
        for category, alphas in by_category.items():
            click.echo(f"alpha[{drafter}][{category}] = {[round(a, 2) for a in alphas]}")
    if record_path:
        if temperature > 0:
            raise click.ClickException("--record needs greedy decoding (--temperature 0)")
        from autospec.bench.record import record
        trace = record(engine, prompts, list(available), record_k_max, max_new_tokens,
                       progress=lambda m: click.echo(m, err=True))
        trace.save(record_path)
        click.echo(f"wrote trace {record_path}", err=True)
    write_report(report, plot_path, json_path)

