"""Does each knob and constant earn its place? (`autospec replay TRACE --knobs`)

For every knob of ControllerSettings that shapes the adaptive controller's choices, replay the
trace with the knob at its default and at its neutral value (the setting that switches the
mechanism off); for each module constant replay can judge (CONSTANTS), at its value and at
each value tried in its place. Replay is deterministic, so the noise a knob's effect is judged against is the
workload's: the trace's requests resampled (drawn with replacement, as many, kept in the
trace's order, so a trace that drifts still drifts), each resample replayed with the knob on and off. A knob's effect is the change in
replayed tokens/s (default ÷ off − 1) on each resample; it is beyond noise only where every
resample moves the same way (the range of its effects excludes 0). A knob beyond noise on no
trace has not shown it pays and goes.

Knobs not audited here, and why: drafters, k_min and k_max set the controller's range, not a
mechanism; step_cap is off by default (a latency bound, policies/latency.yaml);
cost_stale_steps guards against locking into plain decoding after slow first forwards, which
a trace's recorded costs never show (tests/controller/test_controller_robust.py shows it).
"""
from __future__ import annotations

import dataclasses
import importlib
import random
import statistics
from contextlib import contextmanager

from autospec.bench.recorded import replay_batch
from autospec.controller.adaptive import AdaptiveController
from autospec.controller.settings import ControllerSettings

# the value of each audited knob that switches its mechanism off
NEUTRAL = {
    "prior_strength": 0.1,  # the pooled per-workload prior worth a tenth of an observation
    "confidence": False,  # every token priced by its drafter's mean at its position
}


def resample(trace, seed: int) -> list:
    """The trace's requests drawn with replacement, as many as it has, in the trace's order,
    each draw under its own id: another run of the same workload."""
    n = len(trace.requests)
    picks = sorted(random.Random(seed).choices(range(n), k=n))
    return [dataclasses.replace(trace.requests[i], id=f"{trace.requests[i].id}#{at}")
            for at, i in enumerate(picks)]


def tokens_per_second(trace, settings: ControllerSettings, rows: int = 1,
                      requests: list | None = None) -> float:
    """Replayed tokens/s of the whole run: `rows` closed-loop clients over the trace's
    requests (or `requests`)."""
    records, seconds = replay_batch(trace, AdaptiveController(settings),
                                    rows, requests)
    return sum(r.output_tokens for r in records) / seconds


# module constants replay can judge, each with the values tried in its place (a constant
# must have some value: one whose alternatives move nothing beyond noise says "any of these
# serves" where it is defined). Not here, because replay cannot judge them: StepCost's
# forgetting, smoothing and SIZE_PRIOR (a trace's step costs sit on its plane, so every
# estimator converges), SWITCH_HORIZON (a trace records no drafter's start-up) and MIN_CHUNK
# (only with step_cap, and a replay joins prompts whole)
CONSTANTS = {
    ("autospec.controller.learning", "POOLED_PRIOR_STRENGTH"): (0.5, 8.0),
    ("autospec.controller.estimates", "POOL_STRENGTH"): (0.5, 32.0),
    ("autospec.controller.cost", "MIN_STEPS"): (1.0, 16.0),
    ("autospec.controller.cost", "UNMEASURED_PRIOR"): (0.01, 0.25),
    ("autospec.confidence", "CALIBRATION_STRENGTH"): (1.0, 16.0),
    ("autospec.confidence", "BINS"): (10, 40),
}


@contextmanager
def constant(module: str, name: str, value):
    """The controller's module constant `name` set to `value` for the block."""
    target = importlib.import_module(module)
    kept = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, kept)


def audit(trace, resamples: int = 10, rows: int = 1) -> list[dict]:
    """One row per audited knob (its neutral value) and per constant (each value tried in its
    place): the replayed tokens/s at each (mean over `resamples` resampled runs of the trace,
    `rows` clients), the effect (ours ÷ other − 1, mean over the resamples) and its range over
    them, and whether that range excludes 0 (beyond noise)."""
    base = ControllerSettings()
    runs = [resample(trace, r) for r in range(resamples)]
    ours = [tokens_per_second(trace, base, rows, run) for run in runs]

    def row(name: str, value, other, figures: list[float]) -> dict:
        effects = [d / o - 1 for d, o in zip(ours, figures)]
        low, high = min(effects), max(effects)
        return {"name": name, "value": value, "other": other,
                "tokens_per_s": statistics.fmean(ours),
                "tokens_per_s_other": statistics.fmean(figures),
                "effect": statistics.fmean(effects), "effect_low": low, "effect_high": high,
                "beyond_noise": low > 0 or high < 0}

    audited = []
    for name, neutral in NEUTRAL.items():
        settings = dataclasses.replace(base, **{name: neutral})
        audited.append(row(name, getattr(base, name), neutral,
                           [tokens_per_second(trace, settings, rows, run) for run in runs]))
    for (module, name), others in CONSTANTS.items():
        for other in others:
            with constant(module, name, other):
                figures = [tokens_per_second(trace, base, rows, run) for run in runs]
            audited.append(row(name, getattr(importlib.import_module(module), name), other,
                               figures))
    return audited


def format_audit(rows: list[dict]) -> str:
    lines = ["| knob or constant | ours | other | tok/s ours | tok/s other | effect | range over "
             "resamples | beyond noise |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['value']} | {r['other']} | "
                     f"{r['tokens_per_s']:.1f} | {r['tokens_per_s_other']:.1f} | "
                     f"{r['effect']:+.1%} | {r['effect_low']:+.1%} .. {r['effect_high']:+.1%} | "
                     f"{'yes' if r['beyond_noise'] else 'no'} |")
    return "\n".join(lines)
