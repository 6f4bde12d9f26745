"""Step records -> per (drafter, k) sums: what the store keeps of a request's steps.

A request has hundreds of steps; the slow path needs only their sums per (drafter, k) to
update acceptance and cost estimates, so the store keeps those and drops the steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from autospec.telemetry import StepRecord


@dataclass(frozen=True)
class StepAggregate:
    """Sums over the steps of one request that ran `drafter` with this `k`."""
    drafter: str  # "none" for plain steps (k = 0)
    k: int
    steps: int
    proposed: int
    accepted: int
    emitted: int
    verify_tokens: int
    draft_seconds: float
    verify_seconds: float


def step_aggregates(steps: Iterable[StepRecord]) -> list[StepAggregate]:
    """One StepAggregate per (drafter, k) seen in `steps`, sorted by (drafter, k)."""
    sums: dict[tuple[str, int], list] = {}
    for s in steps:
        acc = sums.setdefault((s.drafter, s.k), [0, 0, 0, 0, 0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += s.proposed
        acc[2] += s.accepted
        acc[3] += s.emitted
        acc[4] += s.verify_tokens
        acc[5] += s.draft_seconds
        acc[6] += s.verify_seconds
    return [StepAggregate(drafter, k, *acc) for (drafter, k), acc in sorted(sums.items())]
