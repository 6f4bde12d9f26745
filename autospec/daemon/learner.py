"""The daemon's slow path: what every request of every serving process taught, per workload.

The daemon feeds each ingested RequestRecord's steps into a `Learner` (one per model pair and
hardware): the controller's own `Learning` (controller/learning.py), folded step by step by
the same rule — a slowly discounted acceptance estimate and confidence calibration per
(workload, drafter), and per drafter pooled over workloads under `telemetry.POOLED`; the step's
costs, its overhead and each drafter's seconds (a first step's prefill apart). These are what
the store persists (as `autospec.store.Estimate` rows, and the batch cost's) and what a new
serving process starts from (`AdaptiveController.warm_start`), so a restart does not begin
from the uninformed prior.

Only steps that ran a drafter inform it here: the counterfactual look-up scoring stays in the
serving process's fast path (it needs the tokens, which telemetry does not carry).

A fleet (several daemons on one store) merges what each daemon persisted, `fleet_estimates`:
acceptance evidence (accepted / rejected counts per position) adds up across daemons, so a
merged estimate is the one a daemon would hold had it seen every daemon's steps itself (up to
the discount: each daemon's evidence ages with its own traffic, not the fleet's). Costs are
measurements of one hardware, so daemons' figures are averaged; the step cost's sufficient
statistics add up, like the evidence.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from autospec.confidence import Calibration
from autospec.controller.cost import StepCost, merged_state
from autospec.controller.estimates import AcceptanceEstimate
from autospec.controller.learning import Learning
from autospec.store.queries import Estimate
from autospec.telemetry import POOLED, RequestRecord

SLOW_DISCOUNT = 0.995  # per observed step: ~200 steps of memory per (workload, drafter)


class Learner:
    """A daemon's learning for one model pair and hardware: `Learning`, the controller's own
    (controller/learning.py), aged by SLOW_DISCOUNT, folded from whole requests, and its
    store rows."""

    def __init__(self, k_max: int = 16, discount: float = SLOW_DISCOUNT):
        self.k_max = k_max
        self.learning = Learning(k_max, discount=discount)
        self.steps_seen = 0

    @property
    def acceptance(self) -> dict[str, dict[str, AcceptanceEstimate]]:
        return self.learning.acceptance

    @property
    def calibration(self) -> dict[str, dict[str, Calibration]]:
        return self.learning.calibration

    @property
    def cost(self) -> StepCost:
        return self.learning.cost

    def observe(self, record: RequestRecord) -> None:
        """Fold one request's steps in, each by Learning.fold, into its workload's estimates
        and the pooled ones (an unlabelled request: the pooled ones only)."""
        workloads = (record.workload, POOLED) if record.workload else (POOLED,)
        used: set[str] = set()
        for step in record.step_records:
            self.learning.fold(step, workloads, step.drafter not in used)
            if step.k > 0:
                used.add(step.drafter)
        self.steps_seen += len(record.step_records)

    def estimates(self) -> list[Estimate]:
        """Everything learned, as store rows (cost fields repeated on each drafter's rows)."""
        line = self.cost.line()
        base, slope = line if line else (None, None)
        out = []
        for workload, per_drafter in sorted(self.acceptance.items()):
            for drafter, est in sorted(per_drafter.items()):
                calibration = self.calibration.get(workload, {}).get(drafter)
                out.append(Estimate(drafter, workload, tuple(est.rates()),
                                    tuple(est.observations()), self.cost.draft.get(drafter),
                                    base, slope, calibration=calibration.state()
                                    if calibration is not None and calibration.tokens() else None))
        return out

    def by_workload(self) -> dict[str, dict[str, Estimate]]:
        """estimates() as {workload: {drafter: Estimate}}, the shape `restore` takes."""
        out: dict[str, dict[str, Estimate]] = {}
        for est in self.estimates():
            out.setdefault(est.workload, {})[est.drafter] = est
        return out

    def restore(self, estimates: dict[str, dict[str, Estimate]]) -> "Learner":
        """Continue from persisted estimates ({workload: {drafter: Estimate}}). Returns self."""
        line = None
        for workload, per_drafter in estimates.items():
            for drafter, saved in per_drafter.items():
                self.learning.estimate(workload, drafter).restore(saved.conditional_acceptance,
                                                                  saved.observations)
                if saved.calibration:
                    self.calibration.setdefault(workload, {})[drafter] = \
                        Calibration.from_state(saved.calibration)
                if saved.draft_seconds_per_token is not None:
                    self.cost.draft[drafter] = saved.draft_seconds_per_token
                if saved.verify_base_seconds is not None and saved.verify_slope_seconds is not None:
                    line = (saved.verify_base_seconds, saved.verify_slope_seconds)
        if line:
            self.cost.seed(*line)
        return self

    def snapshot(self) -> dict:
        """JSON for GET /v1/params (Learning.snapshot's Snapshot.to_dict)."""
        return self.learning.snapshot().to_dict()


def fleet_estimates(members: Iterable[dict[str, dict[str, Estimate]]]) -> dict[str, dict[str, Estimate]]:
    """Several daemons' {workload: {drafter: Estimate}} as one: per (workload, drafter) the
    evidence adds up (accepted = rate x observations, per position, zero-padded to the
    longest), draft seconds per token and the verify line are the mean over the daemons that
    measured them."""
    evidence: dict[tuple[str, str], list[np.ndarray]] = {}  # -> [accepted, observations]
    calibrations: dict[tuple[str, str], Calibration] = {}  # the daemons' evidence, added
    draft: dict[str, list[float]] = {}
    lines: list[tuple[float, float]] = []
    for member in members:
        member_line = None
        for workload, per_drafter in member.items():
            for drafter, est in per_drafter.items():
                seen = np.asarray(est.observations, float)
                kept = seen * np.asarray(est.conditional_acceptance, float)
                acc = evidence.setdefault((workload, drafter), [np.zeros(0), np.zeros(0)])
                for i, add in enumerate((kept, seen)):
                    n = max(len(acc[i]), len(add))
                    acc[i] = np.pad(acc[i], (0, n - len(acc[i]))) + np.pad(add, (0, n - len(add)))
                if est.calibration:
                    calibrations.setdefault((workload, drafter), Calibration()).merge(
                        Calibration.from_state(est.calibration))
                if est.draft_seconds_per_token is not None and workload == POOLED:
                    draft.setdefault(drafter, []).append(est.draft_seconds_per_token)
                if est.verify_base_seconds is not None and est.verify_slope_seconds is not None:
                    member_line = (est.verify_base_seconds, est.verify_slope_seconds)
        if member_line:
            lines.append(member_line)
    base, slope = (tuple(float(v) for v in np.mean(lines, axis=0)) if lines else (None, None))
    out: dict[str, dict[str, Estimate]] = {}
    for (workload, drafter), (kept, seen) in sorted(evidence.items()):
        rates = np.divide(kept, seen, out=np.zeros_like(seen), where=seen > 0).clip(0.0, 1.0)
        costs = draft.get(drafter)
        out.setdefault(workload, {})[drafter] = Estimate(
            drafter, workload, tuple(rates), tuple(seen),
            float(np.mean(costs)) if costs else None, base, slope,
            calibration=calibrations[workload, drafter].state()
            if (workload, drafter) in calibrations else None)
    return out


# several daemons' StepCost.state() as one: the sufficient statistics add up
fleet_step_cost = merged_state
