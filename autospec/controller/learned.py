"""The slow path's state: what every request of every serving process taught, per workload.

The daemon feeds each ingested RequestRecord's steps into a `Learner` (one per model pair and
hardware): a slowly discounted acceptance estimate per (workload, drafter) — and per drafter
pooled over workloads, under `telemetry.POOLED` — plus one cost model. These are what the store
persists (as `autospec.store.Estimate` rows) and what a new serving process starts from
(`AdaptiveController.warm_start`), so a restart does not begin from the uninformed prior.

Only steps that ran a drafter inform its acceptance here: the counterfactual n-gram scoring
stays in the serving process's fast path (it needs the tokens, which telemetry does not carry).
"""
from __future__ import annotations

import numpy as np

from autospec.controller.estimates import DEFAULT_PRIOR_MEAN, AcceptanceEstimate, CostModel
from autospec.store.queries import Estimate
from autospec.telemetry import POOLED, RequestRecord

SLOW_DISCOUNT = 0.995  # per observed step: ~200 steps of memory per (workload, drafter)


class Learner:
    def __init__(self, k_max: int = 16, discount: float = SLOW_DISCOUNT):
        self.k_max = k_max
        self.discount = discount
        self.acceptance: dict[str, dict[str, AcceptanceEstimate]] = {}
        self.costs = CostModel(k_max)
        self.steps_seen = 0

    def _estimate(self, workload: str, drafter: str) -> AcceptanceEstimate:
        per_drafter = self.acceptance.setdefault(workload, {})
        if drafter not in per_drafter:
            per_drafter[drafter] = AcceptanceEstimate(self.k_max, DEFAULT_PRIOR_MEAN, 2.0, self.discount)
        return per_drafter[drafter]

    def observe(self, record: RequestRecord) -> None:
        """Fold one request's steps in (its workload's estimates and the pooled ones).
        Vectorised per drafter: a busy daemon folds tens of thousands of steps a second."""
        steps = record.step_records
        if not steps:
            return
        self.costs.observe_verify_many([s.verify_tokens for s in steps],
                                       [s.verify_seconds for s in steps])
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
                self._estimate(workload, drafter).update_many(proposed, accepted)
        self.steps_seen += len(steps)

    def estimates(self) -> list[Estimate]:
        """Everything learned, as store rows (cost fields repeated on each drafter's rows)."""
        line = self.costs.line()
        base, slope = line if line else (None, None)
        out = []
        for workload, per_drafter in sorted(self.acceptance.items()):
            for drafter, est in sorted(per_drafter.items()):
                out.append(Estimate(drafter, workload, tuple(est.rates()),
                                    tuple(est.observations()), self.costs.draft.get(drafter),
                                    base, slope))
        return out

    def restore(self, estimates: dict[str, dict[str, Estimate]]) -> "Learner":
        """Continue from persisted estimates ({workload: {drafter: Estimate}}). Returns self."""
        line = None
        for workload, per_drafter in estimates.items():
            for drafter, saved in per_drafter.items():
                self._estimate(workload, drafter).restore(saved.conditional_acceptance,
                                                          saved.observations)
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
            "draft_seconds_per_token": dict(self.costs.draft),
            "verify_line": list(line) if line else None,
        }


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
    seconds per `window` output tokens, averaged over the runs (seeds). The first window
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


def warm_vs_cold(trace, window: int = 16, seeds: int = 10) -> dict:
    """The warm-start figure on a trace, over `seeds` Thompson seeds.

    steady: a controller that has already decoded the whole trace once, decoding it again.
    cold:   a new process with no history.
    warm:   a new process started from a Learner that folded in one earlier run (what the
            daemon persisted and serves on GET /v1/params).
    Returns the steps each needs before it decodes within 5 % of steady state."""
    from autospec.controller.adaptive import AdaptiveController, ControllerSettings
    from autospec.controller.trace import replay
    drafters = tuple(trace.draft_seconds_per_token)

    def controller(seed: int) -> AdaptiveController:
        return AdaptiveController(ControllerSettings(drafters=drafters, seed=seed),
                                  available=drafters)

    learner = Learner(k_max=max(trace.k_max, 1))
    for record in replay(trace, controller(seeds)):  # "yesterday's traffic"
        learner.observe(record)
    snapshot = learner.snapshot()
    cold, warm, steady = [], [], []
    for seed in range(seeds):
        cold.append(replay(trace, controller(seed)))
        warm_ctl = controller(seed)
        warm_ctl.warm_start(snapshot)
        warm.append(replay(trace, warm_ctl))
        seasoned = controller(seed)
        replay(trace, seasoned)
        steady.append(replay(trace, seasoned))
    rate = lambda runs: float(np.mean([sum(r.output_tokens for r in run)  # noqa: E731
                                       / sum(r.wall_seconds for r in run) for run in runs]))
    return {"window_tokens": window, "seeds": seeds,
            "tokens_per_s": {"cold": rate(cold), "warm": rate(warm), "steady": rate(steady)},
            "cold_steps_to_steady": steps_to_steady(cold, steady, window),
            "warm_steps_to_steady": steps_to_steady(warm, steady, window)}
