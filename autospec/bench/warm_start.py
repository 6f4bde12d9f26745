"""Warm vs cold start, on a recorded trace: how many steps a new serving process needs before
it decodes like a seasoned one, started cold or from what the daemon learnt (`autospec replay
--warm-start`)."""
from __future__ import annotations

import numpy as np

from autospec.bench.recorded import replay
from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.daemon.learner import Learner
from autospec.telemetry import RequestRecord


def token_seconds(records: list[RequestRecord]) -> np.ndarray:
    """(output tokens,) seconds charged to each output token, in order: a step's draft +
    verify seconds spread evenly over the tokens it emitted."""
    out = []
    for r in records:
        for s in r.step_records:
            out += [(s.draft_seconds + s.verify_seconds) / s.emitted] * s.emitted
    return np.array(out)


def steps_to_steady(runs: list[list[RequestRecord]], steady_runs: list[list[RequestRecord]],
                    window: int = 16, tolerance: float = 0.05) -> float:
    """Steps before `runs` decode within `tolerance` of `steady_runs` on the same tokens.

    Both sets decode the same output (a greedy trace), so they are compared token by token:
    seconds per `window` output tokens, averaged over the runs. The first window
    where runs are within tolerance of steady state (and every later one, on average over
    the remaining windows) gives a token position; the answer is the mean number of steps
    `runs` took to reach it (0 = steady from the first token)."""
    mine = np.mean([token_seconds(r) for r in runs], axis=0)  # (tokens,)
    ref = np.mean([token_seconds(r) for r in steady_runs], axis=0)
    kernel = np.ones(window)
    ratio = np.convolve(ref, kernel, "valid") / np.convolve(mine, kernel, "valid")  # rate / steady
    ok = ratio >= 1 - tolerance
    # the first position after which the runs are not slower than steady by more than the
    # tolerance, window by window (a later dip to noise does not reset the clock: averaged)
    tail_mean = np.cumsum(ratio[::-1])[::-1] / np.arange(len(ratio), 0, -1)
    start = next((i for i in range(len(ratio)) if ok[i] and tail_mean[i] >= 1 - tolerance),
                 len(ratio))
    steps = []
    for records in runs:
        emitted = np.cumsum([s.emitted for r in records for s in r.step_records])
        steps.append(int(np.searchsorted(emitted, start, side="right")))
    return float(np.mean(steps))


def warm_vs_cold(trace, window: int = 16, yesterday=None) -> dict:
    """The warm-start figure on a trace (replay is deterministic: one run of each), after
    `yesterday`'s traffic (another trace of the same workload; default: the trace itself).

    steady: a controller that has already decoded yesterday's traffic, decoding the trace.
    cold:   a new process with no history.
    warm:   a new process started from a Learner that folded in yesterday's traffic (what
            the daemon persisted and serves on GET /v1/params).
    Returns the steps each needs before it decodes within 5 % of steady state."""
    drafters = tuple(trace.draft_seconds_per_token)

    def controller() -> AdaptiveController:
        return AdaptiveController(ControllerSettings(drafters=drafters))

    learner = Learner(k_max=max(trace.k_max, 1))
    yesterday = yesterday or trace
    for record in replay(yesterday, controller()):
        learner.observe(record)
    warm_ctl = controller()
    warm_ctl.warm_start(learner.snapshot())
    seasoned = controller()
    replay(yesterday, seasoned)
    cold, warm, steady = ([replay(trace, ctl)] for ctl in (controller(), warm_ctl, seasoned))
    rate = lambda runs: float(np.mean([sum(r.output_tokens for r in run)  # noqa: E731
                                       / sum(r.wall_seconds for r in run) for run in runs]))
    return {"window_tokens": window,
            "tokens_per_s": {"cold": rate(cold), "warm": rate(warm), "steady": rate(steady)},
            "cold_steps_to_steady": steps_to_steady(cold, steady, window),
            "warm_steps_to_steady": steps_to_steady(warm, steady, window)}
