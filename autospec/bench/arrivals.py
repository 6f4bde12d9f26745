"""`autospec bench --arrivals SCHEDULE`: each method under open-loop load whose rate changes.

Where `--concurrency` keeps N clients busy (closed loop: a client sends its next request when
its last one ends), here requests are sent at fixed times whatever the engine does, the way
`vllm bench serve --request-rate` drives a server: a request that finds every row taken waits
in the queue. SCHEDULE is `RATE:SECONDS,...` (requests per second for so many seconds, e.g.
`0.2:60,2:60,0.2:60`: low, high, low), the send times Poisson with `--seed` (exponential gaps
within each phase); or `@FILE`, a recorded trace of send times (seconds from the start, one
per line, or a JSON list), one phase. Request i is the workload's prompt i (cycling). Every
method gets the same send times and prompts, through one Engine of `rows` rows.

STATS per method, overall and per phase (the schedule entry during which a request was
sent): throughput_tokens_per_s (output tokens emitted within the phase's window over its
seconds; the last window runs until the queue has drained; overall: all tokens over the
run's wall), ttft_p50/p99_ms (from the send time: queue and prefill in), itl_p50/p99_ms (as
under --concurrency), queue_p50/p99_ms (send to row), completed, refused (requests that
cannot fit a row: counted, never silently dropped), identical_to_plain.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from autospec.bench.load import _ms
from autospec.bench.methods import fresh_history
from autospec.bench.prompts import Prompt, prompt_ids
from autospec.bench.runlog import RunLog, latency_stats, log_run
from autospec.controller.factory import make_controller
from autospec.engine.loop import Engine
from autospec.engine.request import Job
from autospec.method import Method
from autospec.models.sampling import SamplingParams
from autospec.models.ties import verdict


@dataclass(frozen=True)
class Phase:
    rate: float  # requests per second
    seconds: float


@dataclass(frozen=True)
class Schedule:
    text: str
    phases: list[Phase]
    trace: list[float] | None = None  # recorded send times (seconds), instead of Poisson

    def send_times(self, seed: int) -> list[tuple[float, int]]:
        """(send time, phase) of every request, in order."""
        if self.trace is not None:
            return [(t, 0) for t in self.trace]
        rng = np.random.default_rng(seed)
        times, start = [], 0.0
        for index, phase in enumerate(self.phases):
            t = start + rng.exponential(1.0 / phase.rate)
            while t < start + phase.seconds:
                times.append((float(t), index))
                t += rng.exponential(1.0 / phase.rate)
            start += phase.seconds
        return times

    def windows(self, end: float) -> list[tuple[float, float]]:
        """Each phase's [start, stop) in seconds; the last one runs until `end`."""
        if self.trace is not None:
            return [(0.0, end + 1e-9)]
        out, start = [], 0.0
        for phase in self.phases:
            out.append((start, start + phase.seconds))
            start += phase.seconds
        out[-1] = (out[-1][0], max(out[-1][1], end) + 1e-9)  # the drain, to the last token
        return out


def parse_schedule(text: str) -> Schedule:
    """`RATE:SECONDS,...` or `@FILE`; ValueError naming the bad entry."""
    text = text.strip()
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            raw = path.read_text()
        except OSError as exc:
            raise ValueError(f"--arrivals: cannot read the trace file '{path}': "
                             f"{exc.strerror or exc}") from None
        try:
            times = json.loads(raw) if raw.lstrip().startswith("[") else \
                [float(line) for line in raw.split() if line]
            times = [float(t) for t in times]
        except (ValueError, TypeError):
            raise ValueError(f"--arrivals: the trace file '{path}' must hold send times in "
                             f"seconds, one number per line or a JSON list") from None
        if not times or any(t < 0 for t in times) or times != sorted(times):
            raise ValueError(f"--arrivals: the trace file '{path}' must hold at least one send "
                             f"time, none negative, in order")
        return Schedule(text, [Phase(len(times) / max(times[-1], 1e-9), times[-1])], times)
    phases = []
    for entry in text.split(","):
        entry = entry.strip()
        rate, colon, seconds = entry.partition(":")
        if not colon:
            raise ValueError(f"--arrivals entry '{entry}' has no colon: give RATE:SECONDS "
                             f"(e.g. 0.2:60,2:60,0.2:60) or @FILE")
        try:
            phase = Phase(float(rate), float(seconds))
        except ValueError:
            raise ValueError(f"--arrivals entry '{entry}': RATE and SECONDS must be numbers") from None
        if not (phase.rate > 0 and phase.seconds > 0) or not np.isfinite([phase.rate, phase.seconds]).all():
            raise ValueError(f"--arrivals entry '{entry}': rate and duration must be positive")
        phases.append(phase)
    return Schedule(text, phases)


def run_arrivals(engine: Engine, prompts: list[Prompt], methods: list[Method], schedule: Schedule,
                 rows: int, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
                 progress: Callable[[str], None] | None = None,
                 prefill_chunk: int | None = None) -> dict:
    """{"schedule", "rows", "requests", "methods": {METHOD: {"overall": STATS, "by_phase":
    {"0": STATS, ...}}}} for the controller methods (plain, static:, adaptive, ctl:);
    `prefill_chunk`: Engine's."""
    methods = [m for m in methods if m.is_controller]
    sends = schedule.send_times(seed)
    if not sends:
        raise ValueError(f"--arrivals {schedule.text}: the schedule sends no request "
                         f"(raise a rate or a duration)")
    jobs = arrival_jobs(engine, prompts, len(sends), max_new_tokens, temperature, seed)
    fits = [len(job.prompt) + job.max_new_tokens for job in jobs
            if len(job.prompt) + job.max_new_tokens <= engine.models.max_positions]
    batch = Engine(engine.models, engine.drafter_options, max_batch=rows,
                   max_len=max(fits) if fits else None, prefill_chunk=prefill_chunk)
    runs: dict[str, RunLog] = {}
    for m in methods:
        warm = [Job(job.prompt, 4, job.sampling, seed) for job in jobs[:rows]]  # lazy init
        batch.run([j for j in warm if len(j.prompt) + 4 <= batch.max_positions],
                  make_controller(m))
        batch.drafter_options = fresh_history(engine.drafter_options, f"arrivals {m}")
        runs[m.spec] = log_run(batch, jobs, make_controller(m), arrivals=[t for t, _ in sends])
        if progress:
            progress(f"arrivals {schedule.text}: {m.spec} {runs[m.spec].wall_s:.1f} s")
    return arrivals_report(runs, schedule, sends, rows, len(jobs), temperature == 0,
                           engine.models.target, [job.prompt for job in jobs])


def arrival_jobs(engine: Engine, prompts: list[Prompt], count: int, max_new_tokens: int,
                 temperature: float, seed: int) -> list[Job]:
    """Request i is the workload's prompt i (cycling)."""
    encoded = [prompt_ids(engine, p) for p in prompts]
    jobs = []
    for i in range(count):
        p = i % len(prompts)
        jobs.append(Job(encoded[p], prompts[p].max_new_tokens or max_new_tokens,
                        SamplingParams(temperature), seed, prompts[p].category))
    return jobs


def arrivals_report(runs: dict[str, RunLog], schedule: Schedule, sends, rows: int, requests: int,
                    greedy: bool, target=None, prompts: list[list[int]] | None = None) -> dict:
    """The report's `arrivals` from each method's open-loop run (identical_to_plain against
    the run keyed "plain": True, "near-tie" or False by models/ties.py where `target` and the
    requests' `prompts` are given)."""
    plain = runs.get("plain")
    phases = [phase for _, phase in sends]
    out = {}
    for spec, run in runs.items():
        windows = schedule.windows(run.wall_s)
        scopes = {"overall": (range(requests), (0.0, run.wall_s + 1e-9))}
        by_phase = {str(k): ([i for i, ph in enumerate(phases) if ph == k], window)
                    for k, window in enumerate(windows)}
        stats = {name: _stats(run, indices, window, plain, greedy, target, prompts)
                 for name, (indices, window) in {**scopes, **by_phase}.items()}
        out[spec] = {"overall": stats.pop("overall"), "by_phase": stats}
    return {"schedule": schedule.text, "rows": rows, "requests": requests, "methods": out}


def _stats(run: RunLog, indices, window: tuple[float, float], plain: RunLog | None,
           greedy: bool, target=None, prompts: list[list[int]] | None = None) -> dict:
    done = [i for i in indices if run.results[i] is not None]
    refused = set(run.refused)
    same = None
    if greedy and plain:
        both = [i for i in done if plain.results[i] is not None]
        got = [run.results[i].token_ids for i in both]
        want = [plain.results[i].token_ids for i in both]
        same = (verdict(target, [prompts[i] for i in both], got, want)[0]
                if target is not None else got == want)
    return {**latency_stats(run, indices, window, queue=True),
            "completed": len(done), "refused": sum(1 for i in indices if i in refused),
            "identical_to_plain": same}


def format_arrivals_table(report: dict) -> str:
    """Markdown: per method and phase, throughput (x plain), TTFT, ITL, queue, completed."""
    lines = [f"open loop `{report['schedule']}`, {report['requests']} requests, "
             f"{report['rows']} rows", "",
             "| method | phase | throughput tok/s (x plain) | TTFT p50 / p99 ms | "
             "ITL p50 / p99 ms | queue p50 / p99 ms | completed | refused | identical |",
             "|" + "---|" * 9]
    plain = report["methods"].get("plain")
    for name, entry in report["methods"].items():
        for phase, s in [("all", entry["overall"]), *entry["by_phase"].items()]:
            base = (plain["overall"] if phase == "all" else plain["by_phase"][phase]) if plain else None
            ratio = s["throughput_tokens_per_s"] / base["throughput_tokens_per_s"] \
                if base and base["throughput_tokens_per_s"] else None
            lines.append(
                f"| {name} | {phase} | {s['throughput_tokens_per_s']:.1f}"
                f"{f' ({ratio:.2f}x)' if ratio else ''} | {_ms(s['ttft_p50_ms'])} / "
                f"{_ms(s['ttft_p99_ms'])} | {_ms(s['itl_p50_ms'])} / {_ms(s['itl_p99_ms'])} | "
                f"{_ms(s['queue_p50_ms'])} / {_ms(s['queue_p99_ms'])} | {s['completed']} | "
                f"{s['refused']} | {'' if s['identical_to_plain'] is None else s['identical_to_plain']} |")
    return "\n".join(lines)
