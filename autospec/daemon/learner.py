"""The daemon's slow path: what every request of every serving process taught, per workload.

The daemon feeds each ingested RequestRecord's steps into a `Learner` (one per model pair and
hardware): a slowly discounted acceptance estimate per (workload, drafter) — and per drafter
pooled over workloads, under `telemetry.POOLED` — plus one cost model. These are what the store
persists (as `autospec.store.Estimate` rows) and what a new serving process starts from
(`AdaptiveController.warm_start`), so a restart does not begin from the uninformed prior.

Only steps that ran a drafter inform its acceptance here: the counterfactual n-gram scoring
stays in the serving process's fast path (it needs the tokens, which telemetry does not carry).
The same steps' confidences (StepRecord.confidences) teach each (workload, drafter)'s
calibration (autospec/confidence.py), by the controller's own update, so a new process starts
with each token priced as the fleet has learnt to price it.

A fleet (several daemons on one store) merges what each daemon persisted, `fleet_estimates`:
acceptance evidence (accepted / rejected counts per position) adds up across daemons, so a
merged estimate is the one a daemon would hold had it seen every daemon's steps itself (up to
the discount: each daemon's evidence ages with its own traffic, not the fleet's). Costs are
measurements of one hardware, so daemons' figures are averaged; the batch cost's sufficient
statistics add up, like the evidence.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from autospec.confidence import Calibration
from autospec.controller.batch import BatchCost
from autospec.controller.estimates import (DEFAULT_PRIOR_MEAN, POOLED_PRIOR_STRENGTH,
                                           AcceptanceEstimate, CostModel)
from autospec.store.queries import Estimate
from autospec.telemetry import POOLED, RequestRecord

SLOW_DISCOUNT = 0.995  # per observed step: ~200 steps of memory per (workload, drafter)


class Learner:
    def __init__(self, k_max: int = 16, discount: float = SLOW_DISCOUNT):
        self.k_max = k_max
        self.discount = discount
        self.acceptance: dict[str, dict[str, AcceptanceEstimate]] = {}
        self.calibration: dict[str, dict[str, Calibration]] = {}  # workload -> drafter ->
        self.costs = CostModel(k_max)
        self.batch = BatchCost()  # s(B, P) of batched steps (persisted as batch_costs)
        self.steps_seen = 0

    def _estimate(self, workload: str, drafter: str) -> AcceptanceEstimate:
        per_drafter = self.acceptance.setdefault(workload, {})
        if drafter not in per_drafter:
            per_drafter[drafter] = AcceptanceEstimate(self.k_max, DEFAULT_PRIOR_MEAN, POOLED_PRIOR_STRENGTH,
                                                         self.discount)
        return per_drafter[drafter]

    def _calibration(self, workload: str, drafter: str) -> Calibration:
        per_drafter = self.calibration.setdefault(workload, {})
        if drafter not in per_drafter:
            per_drafter[drafter] = Calibration()
        return per_drafter[drafter]

    def observe(self, record: RequestRecord) -> None:
        """Fold one request's steps in (its workload's estimates and the pooled ones).
        Vectorised per drafter: a busy daemon folds tens of thousands of steps a second."""
        steps = record.step_records
        if not steps:
            return
        # a batched step's verify seconds are the whole batch's forward: they fit the batch
        # cost (each row reports the batch, with 1 / rows of its weight), not the single-row line
        single = [s for s in steps if s.batch_size == 1]
        for s in steps:
            if s.batch_size > 1:
                self.batch.observe(s.batch_size, s.batch_tokens, s.verify_seconds,
                                   1 / s.batch_size, s.batch_width)
        self.costs.observe_verify_many([s.verify_tokens for s in single],
                                       [s.verify_seconds for s in single])
        # an unlabelled request informs the pooled estimates only
        workloads = {POOLED, record.workload} if record.workload else {POOLED}
        by_drafter: dict[str, list] = {}
        for step in steps:
            if step.drafter != "none" and step.k > 0:
                by_drafter.setdefault(step.drafter, []).append(step)
        for drafter, ran in by_drafter.items():
            # a drafter's first step in a request prefills its cache: a one-off, not per token
            for step in ran[1:]:
                self.costs.observe_draft(drafter, step.draft_seconds, step.proposed)
            proposed = [max(s.proposed, 1) for s in ran]
            accepted = [s.accepted for s in ran]
            for workload in workloads:
                estimate = self._estimate(workload, drafter)
                calibration = self._calibration(workload, drafter)
                for step in ran:  # before the estimate takes them, as the controller does
                    if step.confidences:
                        calibration.update(step.confidences, step.accepted, estimate.mean_list())
                estimate.update_many(proposed, accepted)
        self.steps_seen += len(steps)

    def estimates(self) -> list[Estimate]:
        """Everything learned, as store rows (cost fields repeated on each drafter's rows)."""
        line = self.costs.line()
        base, slope = line if line else (None, None)
        out = []
        for workload, per_drafter in sorted(self.acceptance.items()):
            for drafter, est in sorted(per_drafter.items()):
                calibration = self.calibration.get(workload, {}).get(drafter)
                out.append(Estimate(drafter, workload, tuple(est.rates()),
                                    tuple(est.observations()), self.costs.draft.get(drafter),
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
                self._estimate(workload, drafter).restore(saved.conditional_acceptance,
                                                          saved.observations)
                if saved.calibration:
                    self.calibration.setdefault(workload, {})[drafter] = \
                        Calibration.from_state(saved.calibration)
                if saved.draft_seconds_per_token is not None:
                    self.costs.draft[drafter] = saved.draft_seconds_per_token
                if saved.verify_base_seconds is not None and saved.verify_slope_seconds is not None:
                    line = (saved.verify_base_seconds, saved.verify_slope_seconds)
        if line:
            self.costs.seed(*line)
        return self

    def snapshot(self) -> dict:
        """JSON for GET /v1/params: {workload: {drafter: {...}}} and the verify line."""
        line = self.costs.line()
        return {
            "acceptance": {w: {d: {"rates": [round(float(r), 6) for r in e.rates()],
                                   "observations": [round(float(o), 4) for o in e.observations()]}
                               for d, e in per.items()}
                           for w, per in self.acceptance.items()},
            "calibration": {w: {d: c.state() for d, c in per.items() if c.tokens()}
                            for w, per in self.calibration.items()},
            "draft_seconds_per_token": dict(self.costs.draft),
            "verify_line": list(line) if line else None,
            "batch_cost": self.batch.state() if self.batch.observed else None,
        }


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


def fleet_batch_cost(states: Iterable[dict]) -> dict | None:
    """Several daemons' BatchCost.state() as one: the sufficient statistics add up."""
    # each in today's layout first (a daemon of an older version kept fewer features)
    states = [BatchCost().restore(s).state() for s in states if s and s["observed"] > 0]
    if not states:
        return None
    return {name: np.sum([np.asarray(s[name], float) for s in states], axis=0).tolist()
            for name in ("xtx", "xty", "plain_xtx", "plain_xty")} | {
        "observed": float(sum(s["observed"] for s in states))}
