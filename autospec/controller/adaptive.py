"""The fast path of the controller: every step, (drafter, k) for every row from the estimates.

Per request: a Beta per drafter and draft position, seeded from the pooled estimate of the
request's workload (the per-workload prior). Per workload and drafter: the calibration of
each drafted token's confidence into its chance of being kept (autospec/confidence.py).
Shared by all requests of one engine: the step's cost (controller/cost.py: the step at every
batch size, each drafter's seconds) and the priors.

Each step, one decision for the step's B >= 1 rows (`decide`, docs/controller.md): look-ups
first (a look-up drafter's proposal bounds its K, and its tokens' confidences price them; no
match, not that drafter this step); each row's drafter by the chance of keeping each token it
would draft, at its share of the step (a switch to a drafter with a cache priced by its
prefill); then the step's tokens that pay, ranked by survival, every row's K together for the
step's goodput (controller/batch.py); a model drafter that gives confidences stops each row
where its own tokens stop paying (a StopRule). A decision is a function of the evidence: the
same steps decide the same way. After each step: the chosen drafter's estimate and
calibration and, counterfactually, every look-up drafter's: once the target has verified the
tokens, what a look-up drafter (`Drafter.peekable`: n-gram, suffix, a registered one)
proposed at decide costs microseconds to score, so it learns even when it is not chosen.
Drafters are known by what their classes declare (`peekable`, `cost_hint`), never by name.
No I/O here, ever: the slow path (daemon) hands new settings in from outside.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autospec.confidence import Calibration, StopRule
from autospec.controller.batch import best_batch
from autospec.controller.cost import Prices, StepCost
from autospec.controller.decide import NO_DRAFTER, choose_drafter
from autospec.controller.estimates import AcceptanceEstimate
from autospec.controller.interface import Controller, Decision, Outcome, Step
from autospec.controller.interface import PLAIN as PLAIN_DECISION
from autospec.controller.learning import Learning, Snapshot
from autospec.controller.request_state import _RequestState, _score
from autospec.controller.settings import ControllerSettings
from autospec.drafters.base import drafter_class
from autospec.telemetry import POOLED, UNLABELLED, StepRecord

# rounds over which a drafter's start-up (its cache prefill) is spread: a drafter is expected to
# serve a few rounds once switched to. A trace records no start-ups, so replay cannot judge
# it: chosen, not measured
SWITCH_HORIZON = 8
MIN_CHUNK = 8  # prompt tokens a capped step carries at least: 150 join in <= 19 steps


@dataclass
class AdaptiveController(Controller):
    """The Controller (controller/interface.py) every host runs by default."""
    settings: ControllerSettings = field(default_factory=ControllerSettings)

    def __post_init__(self):
        s = self.settings
        self._choose_drafters(s.drafters)
        # what outlives a request, by the daemon's own rule (controller/learning.py): per
        # workload the pooled acceptance (a request's prior) and each drafter's confidence
        # calibration; the step's costs
        self.learning = Learning(s.k_max, s.prior_means, stale_after=s.cost_stale_steps)
        self._requests: dict[str, _RequestState] = {}
        # model drafters seen to give confidences: those draft to a StopRule, not to K alone
        self._confident: set[str] = set()

    @property
    def cost(self) -> StepCost:
        return self.learning.cost

    @cost.setter
    def cost(self, cost: StepCost) -> None:
        self.learning.cost = cost

    @property
    def priors(self) -> dict[str, dict[str, AcceptanceEstimate]]:
        """workload -> drafter -> the pooled acceptance a request of that workload starts from."""
        return self.learning.acceptance

    def _choose_drafters(self, drafters: tuple[str, ...]) -> None:
        self.drafters = drafters
        self.hints = {d: drafter_class(d).cost_hint for d in self.drafters}
        # look-up drafters: their proposal is seen before deciding (the host's peek), its
        # length is evidence, and it is scored counterfactually when another drafter ran
        self.peeking = tuple(d for d in self.drafters if drafter_class(d).peekable)
        # drafters that run a model (not look-ups, whose proposal decide has already made)
        self.costly = tuple(d for d in self.drafters if not drafter_class(d).peekable)

    def bind(self, drafters: tuple[str, ...]) -> None:
        """The drafters the host can run: the controller keeps those of its own that are
        among them. Before its first decision only (each host binds once; a controller
        driven by a second host keeps what it chose)."""
        bound = tuple(d for d in self.drafters if d in drafters)
        if bound != self.drafters and not self._requests:
            self._choose_drafters(bound)

    # -- state ---------------------------------------------------------------------------
    def _state(self, request) -> _RequestState:
        state = self._requests.get(request.request_id)
        if state is None:
            s, key = self.settings, request.workload or UNLABELLED
            acceptance = {d: AcceptanceEstimate(s.k_max, self.learning.estimate(key, d).mean_list(),
                                                s.prior_strength)
                          for d in self.drafters}
            state = self._requests[request.request_id] = _RequestState(acceptance)
        return state

    def warm_start(self, snapshot: Snapshot | dict, only_if_richer: bool = True) -> int:
        """Take learned estimates from the slow path (a `Learner.snapshot()`, as GET /v1/params
        serves it: a Snapshot, or its JSON). A (workload, drafter)'s acceptance and
        calibration are each replaced only where the snapshot holds more evidence than this
        controller has gathered itself (`only_if_richer`), so a fresh process starts from the
        fleet's knowledge and a busy one keeps its own. Costs seed the cost model only before
        it has measured anything. Unlabelled requests start from the estimate pooled over
        every workload (the Learner keeps none of their own). Returns the acceptance
        estimates taken; a ValueError names a malformed field."""
        if not isinstance(snapshot, Snapshot):
            snapshot = Snapshot.from_dict(snapshot)
        return self.learning.absorb(snapshot, only_if_richer, pooled_as=UNLABELLED,
                                    drafters=self.drafters)

    def reliability(self) -> dict[str, dict[str, list[dict]]]:
        """{workload: {drafter: reliability table}}: per confidence bin, the tokens verified,
        the mean P(accepted) predicted for them before each was learnt from, and the rate
        observed (Calibration.reliability)."""
        out: dict[str, dict[str, list[dict]]] = {}
        for workload, per in sorted(self.learning.calibration.items()):
            if workload == POOLED:  # the workloads' prior, not a workload
                continue
            for drafter, calibration in sorted(per.items()):
                if calibration.tokens():
                    out.setdefault(workload, {})[drafter] = calibration.reliability()
        return out

    # -- the fast path -------------------------------------------------------------------
    def chunk_budget(self, rows: int, default: int) -> int:
        """Prompt tokens that may ride in the next step of `rows` rows (Engine.advance): with a
        `step_cap`, what fits above a plain step within it at the per-token price, at least
        MIN_CHUNK (the rows speculate in what is left: the Step's `chunk`)."""
        cap = self.settings.step_cap
        prices = self.cost.prices(rows) if cap else None
        token = prices.token if prices is not None else 0.0
        if token <= 0.0:
            return default
        return max(MIN_CHUNK, min(default, int((cap - 1.0) * prices.step(0) / token)))

    def decide(self, step: Step) -> list[Decision]:
        """(drafter, K) for every row of a step, B >= 1 alike:
        1. each row's look-ups (`step.peek(row, drafter, k)`, which the step reuses): what
           each look-up drafter proposes, and each proposed token's confidence;
        2. each row's drafter at its share of the step (`Prices.shares`), by the chance of
           each token it would draft being kept: a look-up's own tokens calibrated
           (`_alphas`), a model drafter's posterior means;
        3. every row's K together for the step's goodput (controller/batch.py `best_batch`):
           the tokens of the step that pay, ranked by survival, a confident row speculating
           while the others decode plain; a row whose drafter gets K = 0 there drafts a
           look-up drafter's proposal where one has any;
        4. a model drafter known to give confidences drafts to a `StopRule` at the step's
           goodput, up to k_max: it stops a row where its next token cannot pay.
        The prices are the step's at this batch size (StepCost.prices); `chunk` prompt tokens riding
        in the step (`chunk_budget`) take their price out of a `step_cap`'s bound."""
        requests, peek, chunk = step.rows, step.peek, step.chunk
        rows = len(requests)
        states = [self._state(request) for request in requests]
        looked = [self._look_up(state, request, peek) for state, request in zip(states, requests)]
        prices = self.cost.prices(rows)
        if prices is None:
            # the host's first steps: plain ones measured first (the look-ups made all the
            # same: indexing the prompt is their work, and the counterfactual scores these
            # steps from them)
            return [PLAIN_DECISION] * rows
        drafters, chances, trying = [], [], set()
        for state, request, proposals in zip(states, requests, looked):
            drafter, alphas = self._choose(state, request, proposals, prices, trying)
            if drafter in self.costly and drafter not in self.cost.prefill:
                # a model drafter nobody has run yet: one row per step tries it (a batch
                # waits for its cache prefill), and what that costs prices it for the rest
                trying.add(drafter)
            drafters.append(drafter)
            chances.append(alphas)
        cap = self.settings.step_cap
        # a bounded step: none whose forward and drafting exceed cap x a plain step
        max_step = cap * prices.step(0) - chunk * prices.token if cap else None
        rate, ks = self._ks(chances, drafters, prices, max_step, chunk)
        # a row whose drafter does not pay in this step (an exploring draw of a costly
        # drafter, say) drafts with a look-up drafter that has a proposal (n-gram, suffix:
        # the first in the policy's order), rather than decoding plain
        fallback = [d if k or d is None else
                    next((name for name in self.peeking
                          if name in proposals and proposals[name].tokens), d)
                    for d, k, proposals in zip(drafters, ks, looked)]
        if fallback != drafters:
            for state, request, proposals, d, alphas in zip(states, requests, looked, fallback,
                                                           chances):
                if d is not None and d not in alphas:
                    alphas[d] = self._alphas(state, request, d, proposals.get(d))
            drafters = fallback
            rate, ks = self._ks(chances, drafters, prices, max_step, chunk)
        k_min = self.settings.k_min
        out = []
        for state, request, drafter, k in zip(states, requests, drafters, ks):
            if drafter is None or not k:
                out.append(PLAIN_DECISION)
            elif drafter in self._confident and self.settings.confidence and not cap:
                out.append(Decision(drafter, self.settings.k_max,
                                    self._stop_rule(state, request, drafter, rate, prices)))
            else:
                out.append(Decision(drafter, max(k, k_min)))
        return out

    def _stop_rule(self, state: _RequestState, request, drafter: str, rate: float,
                   prices: Prices) -> StopRule:
        """Where a model drafter stops this row (autospec/confidence.py): a token is verified
        while its survival pays for its verify at the step's goodput `rate`, and drafting goes
        on while it could pay for the next one's drafting and verify too."""
        verify = prices.token
        draft = self._draft_seconds(drafter, prices)
        return StopRule(self._calibration(request.workload, drafter),
                        self._estimate(state, drafter).mean_list(), rate * verify,
                        rate * (verify + draft))

    def _look_up(self, state: _RequestState, request, peek) -> dict[str, object]:
        """Each look-up drafter's proposal now (a Draft; absent: none, so not that drafter
        this step), kept for the counterfactual."""
        proposals = {}
        for drafter in self.peeking:
            draft = peek(request, drafter, self.settings.k_max)
            if draft is not None:
                proposals[drafter] = draft
                state.looked[drafter] = (len(request.tokens), draft.tokens, draft.confidences)
        return proposals

    def _calibration(self, workload: str | None, drafter: str) -> Calibration:
        return self.learning.calibration_of(workload or UNLABELLED, drafter)

    def _alphas(self, state: _RequestState, request, drafter: str, draft) -> list[float]:
        """The chance of each token the row's `drafter` would draft being kept given the ones
        before it were: a look-up's proposal (`draft`) token by token, calibrated from its
        confidences where it has them (and `confidence` is on), else the drafter's posterior
        means per position, as far as the proposal reaches."""
        means = self._estimate(state, drafter).mean_list()
        if draft is None:
            return means
        confidences = draft.confidences
        if confidences is None or not self.settings.confidence:
            return means[:len(draft.tokens)]
        return self._calibration(request.workload, drafter).alphas(confidences, means)

    def _choose(self, state: _RequestState, request, proposals: dict, prices: Prices,
                skip=()) -> tuple[str | None, dict[str, list[float]]]:
        """The row's drafter (None: plain) by the chance of each token it would draft being
        kept (`_alphas`) at its share of the step, none of `skip`; and those chances, by
        drafter."""
        names, shares, peeking, used = self.drafters, prices.shares, self.peeking, state.used
        alphas = [self._alphas(state, request, d, proposals.get(d)) for d in names]
        k_max = self.settings.k_max
        draft_s = [self._draft_seconds(d, prices) for d in names]
        limits = [0 if d in skip or (d in peeking and d not in proposals) else
                  min(len(row), k_max, self._cap_k(d_s, shares))
                  for d, d_s, row in zip(names, draft_s, alphas)]
        # a drafter's first run in a request prefills its cache: spread over SWITCH_HORIZON
        context = len(request.tokens)
        switch_s = [0.0 if d in used else
                    self.cost.prefill_seconds(d, context) / SWITCH_HORIZON for d in names]
        index = choose_drafter(alphas, draft_s, shares, limits, switch_s)
        if index == NO_DRAFTER:
            return None, dict(zip(names, alphas))
        # as far as it may draft (its proposal, the cap)
        alphas[index] = alphas[index][:limits[index]]
        return names[index], dict(zip(names, alphas))

    def _estimate(self, state: _RequestState, drafter: str) -> AcceptanceEstimate:
        """The drafter's acceptance per position in this request."""
        return state.acceptance[drafter]

    def _observe(self, state: _RequestState, drafter: str, proposed: int, accepted: int) -> None:
        state.acceptance[drafter].update(proposed, accepted)

    def _draft_seconds(self, drafter: str, prices: Prices) -> float:
        """A drafted token's measured seconds; before any, the drafter's cost hint times a
        one-row plain step (a drafter's forward does not shrink with the batch's rows)."""
        return self.cost.draft.get(drafter, self.hints[drafter] * prices.single)

    def _cap_k(self, draft_seconds: float, steps: list[float]) -> int:
        """The longest K whose step is predicted within `step_cap` plain steps (k_max without
        a cap; 0 where even K = 1 is over it)."""
        cap, k_max = self.settings.step_cap, self.settings.k_max
        if not cap:
            return k_max
        bound, k = cap * steps[0], 0
        while k < k_max and steps[k + 1] + draft_seconds * (k + 1) <= bound:
            k += 1
        return k

    def _ks(self, chances: list[dict[str, list[float]]], drafters: list[str | None],
            prices: Prices, max_step: float | None, chunk: int = 0) -> tuple[float, list[int]]:
        """(the step's goodput, every row's K) of best_batch over each row's drafter's
        tokens (`_choose`'s chances; None: plain), `chunk` prompt tokens riding in the step."""
        alphas = [[] if d is None else row[d] for d, row in zip(drafters, chances)]
        draft_s = [0.0 if d is None else self._draft_seconds(d, prices) for d in drafters]
        return best_batch(alphas, draft_s, prices, max_step, riding=chunk)

    def observe(self, outcome: Outcome) -> None:
        """The step's records of this controller's rows, each folded by the one rule
        (Learning.fold: the step's costs, the drafter's seconds, its workload's pooled
        acceptance and calibration), then the row's own estimates."""
        records, requests = outcome.records, outcome.rows
        for record, request in zip(records, requests):
            self._update(record, request)

    def _update(self, record: StepRecord, request) -> None:
        state = self._state(request)
        before = len(request.tokens) - record.emitted
        key = request.workload or UNLABELLED
        drafter = record.drafter
        if drafter not in self.drafters or record.k <= 0:
            self.learning.fold(record, (), False)  # its costs only
        else:
            confidences = None
            if record.confidences is None:  # a look-up's, as decide saw it (the step drafted it)
                at, _, seen = state.looked.get(drafter, (None, None, None))
                confidences = seen[:record.proposed] if at == before and seen else None
            elif drafter in self.costly:
                self._confident.add(drafter)
            # the calibration predicts at this request's means (before it takes the step)
            self.learning.fold(record, (key,), drafter not in state.used,
                               self._estimate(state, drafter).mean_list(), confidences)
            state.used.add(drafter)
            self._observe(state, drafter, max(record.proposed, 1), record.accepted)
        # the look-up drafters' proposals seen at decide, scored against what was verified:
        # every verified token teaches the calibration, a look-up's that did not run included
        for name, (at, proposal, confidences) in state.looked.items():
            if name != drafter and at == before and proposal:
                proposed, accepted = _score(proposal, request.tokens[before:])
                self.learning.learn(key, name, proposed, accepted,
                                    confidences[:proposed] if confidences else None,
                                    self._estimate(state, name).mean_list())
                self._observe(state, name, proposed, accepted)
        state.looked.clear()
        if request.done:
            self.release(request)

    def release(self, request) -> None:
        self._requests.pop(request.request_id, None)
