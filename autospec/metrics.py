"""What the controller did, as Prometheus series: both `autospec serve` (serve/metrics.py) and
the daemon (daemon/metrics.py) export them, each in its own registry (one per app, so two apps
in one process, as in the tests, never share a count).

Per drafter ('none' = a plain step, K = 0):
    PREFIX_draft_k                           histogram: the K chosen, one observation a step
    PREFIX_accepted_length                   histogram: draft tokens accepted in a drafting
                                             step (the target's own token not counted)
    PREFIX_draft_position_tokens_total       counter, by position (1 = the first draft token)
                                             and result (proposed, accepted): acceptance at
                                             position j = accepted / proposed there, the
                                             series vLLM calls num_accepted_tokens_per_pos

Positions stop at the K a step drafted, so a label set is bounded by the largest K allowed."""
from __future__ import annotations

import collections
from typing import Iterable

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from autospec.telemetry import StepRecord

# K and accepted lengths are small integers: a bucket per value up to 8, then coarser up to
# controller/settings.py's K_LIMIT (64), the largest K a policy may allow
K_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# no PREFIX_created series beside every counter and histogram: a start time per label set
# doubles the page (the per-position series most) and no dashboard of ours reads it
prometheus_client.disable_created_metrics()


class StepSeries:
    """The three families above under `prefix`, with the app's own labels (`labels`) before
    `drafter`."""

    def __init__(self, registry: CollectorRegistry, prefix: str, labels: tuple[str, ...]):
        by_drafter = [*labels, "drafter"]
        self.k = Histogram(f"{prefix}draft_k", "K chosen per decode step, by drafter "
                           "('none' = plain decoding, K 0).", by_drafter,
                           buckets=K_BUCKETS, registry=registry)
        self.accepted = Histogram(f"{prefix}accepted_length", "Draft tokens accepted per "
                                  "drafting step, by drafter (the target's own token not "
                                  "counted).", by_drafter, buckets=K_BUCKETS, registry=registry)
        self.positions = Counter(f"{prefix}draft_position_tokens", "Draft tokens proposed and "
                                 "accepted at each draft position (1 = the first), by drafter.",
                                 [*by_drafter, "position", "result"], registry=registry)

    def observe(self, steps: Iterable[StepRecord], **labels: str) -> None:
        """A request's steps. Counted first, then one labelled increment per series: the
        daemon ingests every step of every request, and a `labels()` lookup per draft token
        would cost it more than the counting."""
        positions: collections.Counter = collections.Counter()
        for step in steps:
            self.k.labels(**labels, drafter=step.drafter).observe(step.k)
            if not step.proposed:
                continue
            self.accepted.labels(**labels, drafter=step.drafter).observe(step.accepted)
            for position in range(1, step.proposed + 1):
                positions[(step.drafter, position, "proposed")] += 1
                if position <= step.accepted:
                    positions[(step.drafter, position, "accepted")] += 1
        for (drafter, position, result), n in positions.items():
            self.positions.labels(**labels, drafter=drafter, position=str(position),
                                  result=result).inc(n)


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format (CONTENT_TYPE)."""
    return generate_latest(registry)
