"""One run's log and its latency statistics: what a closed loop (`--concurrency`, load.py), an
open loop (`--arrivals`, arrivals.py) and vLLM's runs of either (vllm/bench.py) record of
each request, by its job's index, and the one function that turns a log into figures.

Inter-token latency is per token: an emission of m tokens g seconds after the request's
previous one gives m intervals of g/m (what a reader of the stream sees on average;
speculation bunches tokens). A request's first emission gives its time to first token, from
when it was sent (queueing and prefill included), and none of its tokens an interval.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from autospec.bench.runner import RunResult
from autospec.engine.request import Generation, Job, Request


@dataclass
class RunLog:
    """One method's run over jobs 0..n-1 (by index): each job's result (None: refused, or
    never finished), the timings of its emissions, and when tokens were emitted at all."""
    results: list[RunResult | None]
    ttft_s: dict[int, float] = field(default_factory=dict)
    itl_s: dict[int, list[float]] = field(default_factory=dict)
    queue_s: dict[int, float] = field(default_factory=dict)  # open loop: the wait for a row
    emitted_at: list[tuple[float, int]] = field(default_factory=list)  # (s from start, tokens)
    refused: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    start: float = 0.0  # perf_counter at the run's start
    _last: dict[int, float] = field(default_factory=dict, repr=False)

    def emit(self, i: int, tokens: int, sent: float, now: float | None = None,
             queue_s: float | None = None) -> None:
        """Job i emitted `tokens` tokens at `now` (default: now), sent at `sent`
        (perf_counter); `queue_s`, its wait for a row, with its first emission."""
        now = time.perf_counter() if now is None else now
        self.emitted_at.append((now - self.start, tokens))
        if i in self._last:
            self.itl_s.setdefault(i, []).extend([(now - self._last[i]) / tokens] * tokens)
        else:
            self.ttft_s[i] = now - sent
            if queue_s is not None:
                self.queue_s[i] = queue_s
        self._last[i] = now


def log_run(batch, jobs: Sequence[Job], controller,
            arrivals: Sequence[float] | None = None,
            result: Callable[[Generation], RunResult] | None = None) -> RunLog:
    """`batch.run` (Engine.run: closed loop, or open at `arrivals`) over `jobs`, logged: each
    request known by its job's index (its request id is made for it, never parsed back),
    each generation's RunResult by `result` (default: tokens and telemetry)."""
    index = {f"job-{i}": i for i in range(len(jobs))}
    jobs = [Job(j.prompt, j.max_new_tokens, j.sampling, j.seed, j.workload, rid)
            for j, rid in zip(jobs, index)]
    log = RunLog([None] * len(jobs), start=time.perf_counter())

    def on_tokens(request: Request, tokens: list[int]) -> None:
        log.emit(index[request.request_id], len(tokens), request.started,
                 queue_s=request.queue_seconds)

    generations = batch.run(jobs, controller, on_tokens=on_tokens, arrivals=arrivals,
                            on_refused=None if arrivals is None else
                            lambda i, why: log.refused.append(i))
    log.wall_s = time.perf_counter() - log.start
    log.results = [None if g is None else (result or run_result)(g) for g in generations]
    return log


def run_result(generation: Generation) -> RunResult:
    t = generation.telemetry
    return RunResult(generation.token_ids, t.wall_seconds, t.proposed, t.accepted, t.steps,
                     t.step_records)


def latency_stats(log: RunLog, indices: Sequence[int],
                  window: tuple[float, float] | None = None, queue: bool = False) -> dict:
    """The figures of the jobs at `indices` that finished: throughput_tokens_per_s (their
    tokens over the run's wall seconds; with a `window`, every token emitted in it over its
    length), TTFT and ITL p50 / p99 in ms, and with `queue` the wait for a row."""
    done = [i for i in indices if log.results[i] is not None]
    if window is None:
        throughput = sum(len(log.results[i].token_ids) for i in done) / log.wall_s
    else:
        start, stop = window
        throughput = (sum(n for t, n in log.emitted_at if start <= t < stop)
                      / max(stop - start, 1e-9))
    itl = [x for i in done for x in log.itl_s.get(i, [])]
    ttft = [log.ttft_s[i] for i in done if i in log.ttft_s]
    out = {"throughput_tokens_per_s": throughput,
           "ttft_p50_ms": percentile_ms(ttft, 50), "ttft_p99_ms": percentile_ms(ttft, 99),
           "itl_p50_ms": percentile_ms(itl, 50), "itl_p99_ms": percentile_ms(itl, 99)}
    if queue:
        waits = [log.queue_s[i] for i in done if i in log.queue_s]
        out |= {"queue_p50_ms": percentile_ms(waits, 50), "queue_p99_ms": percentile_ms(waits, 99)}
    return out


def percentile_ms(seconds: list[float], q: float) -> float | None:
    return float(np.percentile(seconds, q)) * 1e3 if seconds else None
