"""What is learnt from verified steps, by one rule, in the controller and in the daemon alike.

`Learning` holds what outlives a request, per workload and drafter: the pooled acceptance per
position (AcceptanceEstimate, a request's prior), the confidence calibration
(autospec/confidence.py), and the step's cost (controller/cost.py: one model at every batch
size).
`fold` takes one StepRecord — its costs, then what its drafter's tokens taught — and is the
whole of what the daemon's Learner does with a request's steps and what the controller does
with each step's (besides what it keeps per request: controller/adaptive.py). `learn` is the
acceptance-and-calibration half, which the controller also applies to the look-ups that did
not run (the daemon never sees those: telemetry carries no tokens).

`Snapshot` is what one hands the other, typed: the daemon serves it (GET /v1/params'
"estimates", JSON by `to_dict` / `from_dict`), a controller takes it (`absorb`, through
`AdaptiveController.warm_start`) where it holds more evidence than it has itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from autospec.confidence import Calibration
from autospec.controller.cost import StepCost
from autospec.controller.estimates import (DEFAULT_PRIOR_MEAN, POOLED_PRIOR_STRENGTH,
                                           AcceptanceEstimate)
from autospec.telemetry import POOLED, StepRecord


@dataclass
class Snapshot:
    """What a Learning has learnt, as one process hands it to another. Workloads are the
    daemon's keys (POOLED: over every workload)."""
    # workload -> drafter -> {"rates": [k_max], "observations": [k_max]}
    acceptance: dict[str, dict[str, dict]] = field(default_factory=dict)
    # workload -> drafter -> Calibration.state()
    calibration: dict[str, dict[str, dict]] = field(default_factory=dict)
    draft_seconds_per_token: dict[str, float] = field(default_factory=dict)
    # (base, slope): one row's verify as a line (StepCost.line), seeded by a taker over
    # step_cost (an older version's snapshot: its only one-row cost)
    verify_line: tuple[float, float] | None = None
    step_cost: dict | None = None  # StepCost.state()

    def to_dict(self) -> dict:
        return {"acceptance": self.acceptance, "calibration": self.calibration,
                "draft_seconds_per_token": self.draft_seconds_per_token,
                "verify_line": list(self.verify_line) if self.verify_line else None,
                "step_cost": self.step_cost}

    @classmethod
    def from_dict(cls, raw: Mapping | None) -> "Snapshot":
        """A snapshot back from JSON (a missing key: nothing learnt there); a ValueError names
        the first field that is not what `to_dict` writes."""
        raw = raw or {}
        if not isinstance(raw, Mapping):
            raise ValueError(f"estimates: expected an object, got {raw!r}")
        out = cls()
        for name in ("acceptance", "calibration"):
            nested = raw.get(name) or {}
            if not isinstance(nested, Mapping) or not all(
                    isinstance(per, Mapping) and all(isinstance(v, Mapping) for v in per.values())
                    for per in nested.values()):
                raise ValueError(f"estimates.{name}: expected {{workload: {{drafter: {{...}}}}}}, "
                                 f"got {nested!r}")
            setattr(out, name, {w: dict(per) for w, per in nested.items()})
        for workload, per in out.acceptance.items():
            for drafter, saved in per.items():
                rates, seen = saved.get("rates"), saved.get("observations")
                if not isinstance(rates, list) or not isinstance(seen, list) \
                        or len(rates) != len(seen):
                    raise ValueError(f"estimates.acceptance.{workload}.{drafter}: expected rates "
                                     f"and observations, one per position, got {saved!r}")
        for workload, per in out.calibration.items():
            for drafter, saved in per.items():
                try:
                    Calibration.from_state(saved)
                except (ValueError, TypeError, AttributeError) as exc:
                    raise ValueError(f"estimates.calibration.{workload}.{drafter}: {exc}") from None
        draft = raw.get("draft_seconds_per_token") or {}
        if not isinstance(draft, Mapping) or not all(isinstance(v, (int, float)) for v in draft.values()):
            raise ValueError(f"estimates.draft_seconds_per_token: expected {{drafter: seconds}}, "
                             f"got {draft!r}")
        out.draft_seconds_per_token = {d: float(v) for d, v in draft.items()}
        line = raw.get("verify_line")
        if line is not None:
            if not isinstance(line, (list, tuple)) or len(line) != 2:
                raise ValueError(f"estimates.verify_line: expected [base, slope], got {line!r}")
            out.verify_line = (float(line[0]), float(line[1]))
        # "batch_cost": an older version's name for it (its plane learnt past one row only)
        name = "step_cost" if "step_cost" in raw else "batch_cost"
        state = raw.get(name)
        if state is not None and not (isinstance(state, Mapping) and "xtx" in state
                                      and "xty" in state and "observed" in state):
            raise ValueError(f"estimates.{name}: expected StepCost.state()'s object, got {state!r}")
        out.step_cost = dict(state) if state else None
        return out


class Learning:
    """Acceptance, calibration and costs per workload and drafter, folded from StepRecords
    (the module docstring). `discount`: what each update leaves of the evidence before it (1:
    kept whole, the controller's; the daemon ages its own); `prior_means`: each drafter's
    acceptance mean before any evidence."""

    def __init__(self, k_max: int, prior_means: Mapping[str, float] | None = None,
                 discount: float = 1.0, stale_after: int = 0):
        self.k_max = k_max
        self.prior_means = dict(prior_means or {})
        self.discount = discount
        self.acceptance: dict[str, dict[str, AcceptanceEstimate]] = {}
        self.calibration: dict[str, dict[str, Calibration]] = {}
        self.cost = StepCost(k_max, stale_after=stale_after)

    def estimate(self, workload: str, drafter: str) -> AcceptanceEstimate:
        per = self.acceptance.setdefault(workload, {})
        if drafter not in per:
            per[drafter] = AcceptanceEstimate(
                self.k_max, self.prior_means.get(drafter, DEFAULT_PRIOR_MEAN),
                POOLED_PRIOR_STRENGTH, self.discount)
        return per[drafter]

    def calibration_of(self, workload: str, drafter: str) -> Calibration:
        """The drafter's calibration for a workload, its prior the drafter's over every
        workload (POOLED; autospec/confidence.py)."""
        per = self.calibration.setdefault(workload, {})
        mine = per.get(drafter)
        if mine is None:
            mine = per[drafter] = Calibration()
        if mine.parent is None and workload != POOLED:  # linked once (absorb unlinks)
            mine.parent = self.calibration_of(POOLED, drafter)
        return mine

    # -- the one rule ------------------------------------------------------------------------
    def fold(self, record: StepRecord, workloads: tuple[str, ...], first_use: bool,
             means: list[float] | None = None, confidences: list[float] | None = None) -> None:
        """One verified step of one row: its forward's cost (with 1 / rows of its weight: every
        row of a batch reports it; the step's overhead per row), its drafter's seconds (a
        drafter's first step in a request is its cache's prefill, learnt apart), and what its
        tokens taught each of `workloads` (`learn`). `confidences`: the drafted tokens' where
        the record has none (a look-up's, as the controller saw it)."""
        rows, cost = record.batch_size, self.cost
        cost.observe(rows, record.batch_tokens, record.verify_seconds, 1.0 / rows,
                     record.batch_width)
        if record.overhead_seconds is not None:
            cost.observe_overhead(record.overhead_seconds / rows, 1.0 / rows)
        if record.drafter == "none" or record.k <= 0:
            return
        if first_use:
            cost.observe_prefill(record.drafter, record.draft_seconds, record.proposed,
                                 record.context_tokens)
        else:
            # per token kept: a drafting whose StopRule dropped its first token kept none and
            # still ran a forward, charged as one (its seconds are what drafting there costs)
            cost.observe_draft(record.drafter, record.draft_seconds, max(record.proposed, 1))
        # an empty proposal counts as a rejection at position 0: it bought nothing
        pooled_too = POOLED not in workloads  # the daemon folds POOLED itself
        for workload in workloads:
            self.learn(workload, record.drafter, max(record.proposed, 1), record.accepted,
                       record.confidences or confidences, means, pooled_too)

    def learn(self, workload: str, drafter: str, proposed: int, accepted: int,
              confidences: list[float] | None = None, means: list[float] | None = None,
              pooled_too: bool = True) -> None:
        """A verified draft of `drafter`: its tokens' confidences into the workload's
        calibration (before the acceptance takes it: the calibration's prediction stays out of
        sample; `means` the per-position means it predicts at, default the pooled ones) and,
        `pooled_too`, into the drafter's over every workload (the workloads' prior), then the
        workload's pooled acceptance."""
        estimate = self.estimate(workload, drafter)
        if confidences:
            means = means if means is not None else estimate.mean_list()
            if pooled_too and workload != POOLED:
                self.calibration_of(POOLED, drafter).update(confidences, accepted, means)
            self.calibration_of(workload, drafter).update(confidences, accepted, means)
        estimate.update(proposed, accepted)

    # -- handing it over ---------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        line = self.cost.line()
        return Snapshot(
            {w: {d: {"rates": [round(float(r), 6) for r in e.rates()],
                     "observations": [round(float(o), 4) for o in e.observations()]}
                 for d, e in per.items()} for w, per in self.acceptance.items()},
            {w: {d: c.state() for d, c in per.items() if c.tokens()}
             for w, per in self.calibration.items()},
            dict(self.cost.draft), tuple(line) if line else None,
            self.cost.state() if self.cost.observed else None)

    def absorb(self, snapshot: Snapshot, only_if_richer: bool = True, pooled_as: str = POOLED,
               drafters: tuple[str, ...] | None = None) -> int:
        """Take another's learning: a (workload, drafter)'s acceptance and calibration each
        where the snapshot holds more evidence than this one (`only_if_richer`); costs only
        before any was measured here. The snapshot's POOLED workload is kept as `pooled_as`;
        only `drafters` (None: all). Returns the acceptance estimates taken."""
        taken = 0
        for workload, per in snapshot.acceptance.items():
            key = pooled_as if workload == POOLED else workload
            for drafter, saved in per.items():
                if drafters is not None and drafter not in drafters:
                    continue
                mine = self.estimate(key, drafter)
                if only_if_richer and sum(saved["observations"]) <= mine.observations().sum():
                    continue
                mine.restore(saved["rates"], saved["observations"])
                taken += 1
        for workload, per in snapshot.calibration.items():
            # the POOLED one is also every workload's prior here (calibration_of)
            keys = {pooled_as, POOLED} if workload == POOLED else {workload}
            for drafter, saved in per.items():
                if drafters is not None and drafter not in drafters:
                    continue
                for key in keys:
                    learnt = Calibration.from_state(saved)
                    own = self.calibration.get(key, {}).get(drafter)
                    if own is None or not only_if_richer or learnt.tokens() > own.tokens():
                        self.calibration.setdefault(key, {})[drafter] = learnt
                        if key == POOLED:  # the workloads' prior replaced: linked anew
                            for others in self.calibration.values():
                                if drafter in others:
                                    others[drafter].parent = None
        if self.cost.observed == 0:  # a restarted server's step cost
            for drafter, seconds in snapshot.draft_seconds_per_token.items():
                self.cost.draft.setdefault(drafter, seconds)
            if snapshot.step_cost:
                self.cost.restore(snapshot.step_cost)
            if snapshot.verify_line:  # one row's end of it (an older snapshot's only one)
                self.cost.seed(*snapshot.verify_line)
        return taken
