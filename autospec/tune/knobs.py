"""Does each knob earn its place? (`autospec replay TRACE --knobs`)

For every knob of ControllerSettings that shapes the adaptive controller's choices, replay the
trace with the knob at its default and at its neutral value (the setting that switches the
mechanism off), each over the same Thompson-sampling seeds. A knob's effect is the change in
replayed tokens/s; the noise it is judged against is the spread of the default's figure over
those seeds (replay is otherwise deterministic). A knob whose effect does not exceed the
spread on any trace has not shown it pays.

Knobs not audited here, and why: drafters, k_min, k_max and seed set the controller's range,
not a mechanism; step_cap is off by default (a latency bound, policies/latency.yaml);
cost_stale_steps guards against locking into plain decoding after slow first forwards, which
a trace's recorded costs never show (tests/controller/test_controller_robust.py shows it).
"""
from __future__ import annotations

import dataclasses
import statistics

from autospec.controller.adaptive import AdaptiveController
from autospec.controller.settings import ControllerSettings

# the value of each audited knob that switches its mechanism off
NEUTRAL = {
    "discount": 1.0,  # a request's evidence never decays
    "prior_strength": 0.1,  # the pooled per-workload prior worth a tenth of an observation
    "prior_discount": 1.0,  # the pooled estimates never decay
    "thompson": False,  # posterior means, no sampling
    "counterfactual": False,  # look-ups scored only when they ran
    "regimes": False,  # one estimate whatever the last draft did
    "explore_pooled": 0.0,  # a request's own posterior alone for the drafter choice
}


def tokens_per_second(trace, settings: ControllerSettings, rows: int = 1) -> float:
    """Replayed tokens/s of the whole run: `rows` closed-loop clients over the trace."""
    from autospec.bench.trace import replay_batch
    drafters = tuple(trace.draft_seconds_per_token)
    records, seconds = replay_batch(trace, AdaptiveController(settings, available=drafters), rows)
    return sum(r.output_tokens for r in records) / seconds


def audit(trace, seeds: int = 5, rows: int = 1) -> list[dict]:
    """One row per audited knob: its default and neutral values, the replayed tokens/s at each
    (mean over `seeds` seeds, `rows` clients), the effect (default ÷ neutral - 1) and the
    default's spread over the seeds ((max - min) ÷ mean), and whether the effect exceeds it."""
    base = ControllerSettings()

    def mean_over_seeds(settings) -> tuple[float, float]:
        figures = [tokens_per_second(trace, dataclasses.replace(settings, seed=s), rows)
                   for s in range(seeds)]
        mean = statistics.fmean(figures)
        return mean, (max(figures) - min(figures)) / mean

    default, spread = mean_over_seeds(base)
    audited = []
    for name, neutral in NEUTRAL.items():
        off, _ = mean_over_seeds(dataclasses.replace(base, **{name: neutral}))
        effect = default / off - 1
        audited.append({"knob": name, "default": getattr(base, name), "neutral": neutral,
                        "tokens_per_s_default": default, "tokens_per_s_neutral": off,
                        "effect": effect, "spread": spread, "exceeds_spread": abs(effect) > spread})
    return audited


def format_audit(rows: list[dict]) -> str:
    lines = ["| knob | default | neutral | tok/s default | tok/s neutral | effect | seeds' "
             "spread | beyond noise |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['knob']} | {r['default']} | {r['neutral']} | "
                     f"{r['tokens_per_s_default']:.1f} | {r['tokens_per_s_neutral']:.1f} | "
                     f"{r['effect']:+.1%} | {r['spread']:.1%} | "
                     f"{'yes' if r['exceeds_spread'] else 'no'} |")
    return "\n".join(lines)
