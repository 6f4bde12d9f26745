"""`autospec bench --concurrency 1,4,16`: each method under N closed-loop clients.

At each level N, every method decodes the whole workload (same prompts, same order) through
one Engine with N rows: N clients, each sending its next prompt as soon as its last one
finished, so N requests are in flight until the workload runs dry (engine/loop.py, `Engine.run`).
Methods take turns (the order rotates from repeat to repeat) and the repeat with the median
wall time is reported. Measured under load: the methods that run on our engine (plain,
static:, adaptive, ctl:) and `hf:generate`, transformers' own batched generate() (below); the
other hf: peers (assisted generation runs one sequence at a time) and the oracles are left out
and named in the report.

hf:generate under load is a static batch, the way a user calls generate(): the workload in
consecutive groups of N prompts, each group left-padded into one batch (attention_mask, pad =
the EOS id generate pads with), one generate() call per group with the group's largest
max_new_tokens (each row cut to its own). A group ends when its longest member does, and the
next group starts only then: every row waits for the slowest. throughput = output tokens / the
summed walls of all groups. identical_to_plain compares each request's tokens with plain's at
the same concurrency, as for every method (left padding and the batch shape can change float
rounding: reported, not enforced). No stream: all of a request's tokens arrive when its
group's call returns, so its TTFT is the group's wall (sent at the group's start: the previous
group's end) and ITL is None — there is no interval between tokens a reader would see.

What each STATS adds to bench's keys (harness.cell_stats):
- throughput_tokens_per_s: output tokens / wall seconds of the whole run (for a category: its
  requests' tokens over the same run's wall seconds); speedup_vs_plain is the ratio of these
  to plain's at the same concurrency, identical_to_plain compares with that plain run.
- ttft_p50_ms / ttft_p99_ms, itl_p50_ms / itl_p99_ms: time to first token from when the client
  sent the request, and inter-token latency per token (bench/runlog.py, the one run log that
  the open loop and vLLM's runs keep too).
- tokens_per_s and wall_s: per client — tokens over the summed request latencies.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Callable

import torch

from autospec.bench.harness import OVERALL, Cell, cell_stats
from autospec.bench.methods import fresh_history, hf_generate
from autospec.bench.prompts import Prompt, prompt_ids
from autospec.bench.roofline import format_roofline, peaks, roofline
from autospec.bench.runlog import RunLog, latency_stats, log_run
from autospec.bench.runner import RunResult
from autospec.controller.factory import make_controller
from autospec.engine.loop import Engine
from autospec.engine.request import Job
from autospec.method import Method
from autospec.models.ties import logprob_verdict, verdict
from autospec.models.sampling import SamplingParams

def parse_concurrency(text: str) -> list[int]:
    """'1,4,16' -> [1, 4, 16]; ValueError naming an entry that is not a positive integer."""
    levels = []
    for entry in text.split(","):
        try:
            level = int(entry.strip())
        except ValueError:
            level = 0
        if level < 1 or str(level) != entry.strip():
            raise ValueError(f"concurrency entry '{entry.strip()}' is not a positive integer "
                             f"(give e.g. 1,4,16)")
        levels.append(level)
    return list(dict.fromkeys(levels))


def runs_under_load(method: Method) -> bool:
    """Whether `autospec bench --concurrency` measures `method` (the module docstring)."""
    return method.is_controller or (method.kind == "hf" and method.baseline == "generate")


def run_load(engine: Engine, prompts: list[Prompt], methods: list[Method], levels: list[int],
             max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
             repeats: int = 1, progress: Callable[[str], None] | None = None,
             prefill_chunk: int | None = None) -> dict:
    """{"N": {"methods": {METHOD: {"overall": STATS, "by_category": {...}}}}} per level
    (`prefill_chunk`: Engine's)."""
    methods = [m for m in methods if runs_under_load(m)]
    encoded = [prompt_ids(engine, p) for p in prompts]
    limits = [p.max_new_tokens or max_new_tokens for p in prompts]
    jobs = [Job(ids, n, SamplingParams(temperature), seed, p.category)
            for ids, n, p in zip(encoded, limits, prompts)]
    max_len = max(len(ids) + n for ids, n in zip(encoded, limits))
    categories = sorted({p.category for p in prompts})
    out = {}
    for level in levels:
        batch = Engine(engine.models, engine.drafter_options, max_batch=level, max_len=max_len,
                       prefill_chunk=prefill_chunk)
        runs: dict[Method, list[RunLog]] = defaultdict(list)
        for m in methods:  # warm-up: lazy init, allocator, the drafters' first calls
            warm = [Job(job.prompt, 4, job.sampling, seed) for job in jobs[:level]]
            if m.is_controller:
                batch.run(warm, make_controller(m))
            else:
                _run_generate(engine, warm, level)
        for r in range(repeats):
            for m in methods[r % len(methods):] + methods[:r % len(methods)]:
                if not m.is_controller:
                    runs[m].append(_run_generate(engine, jobs, level))
                else:
                    # cross-request history (suffix) starts empty per level, method and repeat
                    batch.drafter_options = fresh_history(engine.drafter_options,
                                                          f"load {level} {m} #{r}")
                    runs[m].append(log_run(batch, jobs, make_controller(m)))
                if progress:
                    progress(f"concurrency {level}, repeat {r + 1}/{repeats}: {m} "
                             f"{runs[m][-1].wall_s:.1f} s")
        median = {m: sorted(rs, key=lambda run: run.wall_s)[len(rs) // 2] for m, rs in runs.items()}
        plain = next((run for m, run in median.items() if m.kind == "plain"), None)
        steps = [s for run in median.values() for r in run.results for s in r.step_records or []]
        out[str(level)] = {"methods": {
            m.spec: method_stats(run, prompts, categories, plain, temperature == 0,
                                 engine.models.target, encoded)
            for m, run in median.items()},
            "roofline": roofline(steps, engine.models.target, *peaks(engine.models.target))}
    return out


def merge_formats(by_format: dict[str, dict]) -> dict:
    """run_load's results at several weight formats as one, methods keyed METHOD@FORMAT (each
    compared with plain at its own format); a level's roofline is the first format's."""
    out: dict = {}
    for w, levels in by_format.items():
        for level, entry in levels.items():
            merged = out.setdefault(level, {"methods": {}, "roofline": entry["roofline"]})
            merged["methods"].update({f"{spec}@{w}": stats for spec, stats in entry["methods"].items()})
    return out


def _run_generate(engine: Engine, jobs: list[Job], level: int) -> RunLog:
    """hf:generate as a static batch: consecutive groups of `level` jobs, one left-padded
    generate() call each (module docstring). TTFT = the group's wall; no ITL (no stream)."""
    log = RunLog([None] * len(jobs))
    pad = engine.models.tokenizer.eos_token_id  # what hf_generate pads finished rows with
    for start in range(0, len(jobs), level):
        group = jobs[start:start + level]
        width = max(len(job.prompt) for job in group)
        # [B, width]: what the tokenizer's padding_side="left" gives, without a pad token
        input_ids = torch.tensor([[pad] * (width - len(job.prompt)) + list(job.prompt)
                                  for job in group])
        attention_mask = torch.tensor([[0] * (width - len(job.prompt)) + [1] * len(job.prompt)
                                       for job in group])
        t0 = time.perf_counter()
        out = hf_generate(engine, input_ids, attention_mask,
                          max(job.max_new_tokens for job in group),
                          group[0].sampling.temperature, group[0].seed)
        wall = time.perf_counter() - t0
        log.wall_s += wall
        for i, job in enumerate(group, start):
            tokens = out[i - start, width:].tolist()[:job.max_new_tokens]
            # a row that stopped early is padded to the group's length: cut after its EOS
            stop = next((j + 1 for j, t in enumerate(tokens) if t in engine.eos_ids), len(tokens))
            log.results[i] = RunResult(tokens[:stop], wall)
            log.ttft_s[i] = wall
    return log


def method_stats(run: RunLog, prompts: list[Prompt], categories: list[str],
                  plain: RunLog | None, greedy: bool, target=None,
                  encoded: list[list[int]] | None = None) -> dict:
    """identical_to_plain: True, "near-tie" or False (models/ties.py) where `target` and the
    prompts' `encoded` ids are given, or both runs reported their log-probabilities
    (`logprob_verdict`: vLLM's), else whether every output equals plain's. The overall
    entry lists each parting (`divergences`: prompt, position, plain's margin, the limit)."""
    scopes = {OVERALL: range(len(prompts))}
    scopes.update({c: [i for i, p in enumerate(prompts) if p.category == c] for c in categories})
    stats, parted = {}, []
    for scope, indices in scopes.items():
        same = None
        if greedy and plain:
            got = [run.results[i].token_ids for i in indices]
            want = [plain.results[i].token_ids for i in indices]
            if target is not None:
                same, found = verdict(target, [encoded[i] for i in indices], got, want)
            elif all(run.results[i].logprobs is not None and plain.results[i].logprobs is not None
                     for i in indices):
                same, found = logprob_verdict(got, want, [run.results[i].logprobs for i in indices],
                                              [plain.results[i].logprobs for i in indices])
            else:
                same, found = got == want, []
            if scope == OVERALL:
                parted = [{**d, "prompt": prompts[indices[d["prompt"]]].id} for d in found]
        stats[scope] = _stats(run, indices, same)
        if plain:
            base = _stats(plain, indices, None)["throughput_tokens_per_s"]
            stats[scope]["speedup_vs_plain"] = stats[scope]["throughput_tokens_per_s"] / base if base else None
    overall = stats.pop(OVERALL)
    if parted:
        overall["divergences"] = parted
    return {OVERALL: overall, "by_category": stats}


def _stats(run: RunLog, indices, same: bool | None) -> dict:
    cell = Cell()
    for i in indices:
        cell.add(run.results[i])
    return {**cell_stats([cell], same), **latency_stats(run, indices),
            "controller_share": cell.controller_s / run.wall_s,  # of the run, not of the clients
            "run_wall_s": run.wall_s}


def format_load_table(by_concurrency: dict) -> str:
    """Markdown: per concurrency and method, throughput, ITL and TTFT percentiles."""
    lines = ["| concurrency | method | throughput tok/s (x plain) | ITL p50 / p99 ms | "
             "TTFT p50 / p99 ms | accept | identical |", "|" + "---|" * 7]
    for level, entry in by_concurrency.items():
        for name, stats in entry["methods"].items():
            s = stats[OVERALL]
            sp = s["speedup_vs_plain"]
            acc, same = s["acceptance_rate"], s["identical_to_plain"]
            lines.append(
                f"| {level} | {name} | {s['throughput_tokens_per_s']:.1f}"
                f"{f' ({sp:.2f}x)' if sp else ''} | {_ms(s['itl_p50_ms'])} / {_ms(s['itl_p99_ms'])} | "
                f"{_ms(s['ttft_p50_ms'])} / {_ms(s['ttft_p99_ms'])} | "
                f"{'' if acc is None else f'{acc:.2f}'} | {'' if same is None else same} |")
    for level, entry in by_concurrency.items():
        shares = [f"{name} {stats[OVERALL]['controller_share']:.1%}"
                  for name, stats in entry["methods"].items()
                  if stats[OVERALL].get("controller_share", 0) > 0]
        if shares:
            lines += ["", f"controller decide + update at N = {level}, share of wall time: "
                          + ", ".join(shares)]
        line = format_roofline(entry.get("roofline") or [], f" at N = {level}")
        lines += ["", line] if line else []
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"
