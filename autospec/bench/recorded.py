"""A recorded target: what the engine's driving loop (engine/jobs.py: `Host.run`, `advance`)
steps when it replays a trace instead of running a model. Replay is that loop: the same
controller calls (bind, chunk budget, decide with a peek, observe, release), the same closed
and open loops, the same StepRecords; only the step's verify and accept come from the trace.

`RecordedEngine` is a `Host` (engine/jobs.py) and implements its abstract hooks (start,
unfilled, fill, step_batch, clock, idle, runnable_drafters, _release) over a Trace
(bench/trace.py):
- a row's draft agrees with the target for `match[drafter][t]` tokens of the `proposed`
  length the trace recorded at its output position t, so a step that drafts K accepts
  min(match, proposed, K) and appends the recorded output: under greedy decoding exactly
  what the live step appends;
- time is simulated: each step advances the clock by its forward, priced as a decision reads
  it (`Prices.step` at the step's rows: the recorded forwards at one row, the recorded batch
  line past one), and by its drafting at the recorded seconds per drafted token; a look-up
  a controller makes before the step (`peek`: the real look-up drafter on the row's tokens)
  is charged when made, as the live loop's clock sees it; and each step the loop's own
  overhead the recording measured (Trace.overhead_seconds);
- a request's start is charged what its live plain run spent outside its steps (its
  prefill, TraceRequest.prefill_seconds), whole, as the live engine prefills without
  `prefill_chunk`;
- not simulated: chunked prefill, and the controller's own seconds (0: a replay is
  deterministic).
The loop itself (`run`, `advance`) and what it keeps of its requests besides the step (each
controller bound once, their look-up drafters, finish, abandon, peek) are `Host`'s, as the
engine's are; here only the hooks: its rows, its clock, the step, and what a look-up costs
(`_lookup_seconds`, in place of Host's wall-clock default).

Replay itself (`replay`, `replay_batch`, `autospec replay --rows N`): N closed-loop clients
over the trace's requests, every step charged the trace's prices (`trace_prices`: the
recorded plane s(B, P, W) of the one step cost, controller/cost.py, its one-row sizes the
recorded forwards exactly); and
a controller that knows the future (`HindsightController`): the ceiling of what any
controller that learns from evidence can reach at those costs.
"""
from __future__ import annotations

from typing import Sequence

import torch

from autospec.bench.trace import Trace, TraceRequest
from autospec.controller.batch import batch_ks
from autospec.controller.cost import Prices, recorded_prices
from autospec.controller.interface import Controller, Decision, RowController, Step
from autospec.drafters.base import Draft
from autospec.engine.jobs import Host
from autospec.engine.request import Job, Proposal, Request
from autospec.models.sampling import SamplingParams
from autospec.telemetry import StepRecord


class RecordedEngine(Host):
    """Up to `max_batch` rows over `requests` (default: the trace's), each started by its id,
    at `trace`'s costs."""

    packed = True  # its forward is priced over the rows' real tokens
    prefill_chunk = None  # prompts join whole (charged at start)

    def __init__(self, trace, max_batch: int = 1, requests=None,
                 drafter_options: dict[str, dict] | None = None):
        super().__init__()
        self.trace, self.max_batch = trace, max_batch
        self.prices = {rows: trace_prices(trace, rows) for rows in range(1, max_batch + 1)}
        self.drafter_options = drafter_options or {}
        self.requests = list(requests or trace.requests)
        self.recorded = {r.id: r for r in self.requests}
        self.free = list(range(max_batch))
        self.max_positions = max((len(r.prompt) + len(r.output) for r in self.requests),
                                 default=0) + 1
        self.now = 0.0  # simulated seconds since the engine was made

    # -- Host's hooks (engine/jobs.py) besides the step -------------------------------------
    def clock(self) -> float:
        return self.now

    def idle(self, seconds: float) -> None:
        self.now += max(0.0, seconds)

    def runnable_drafters(self) -> tuple[str, ...]:
        """The drafters the requests recorded: all a controller may choose here."""
        return tuple(self.requests[0].match) if self.requests else ()

    def start(self, prompt: list[int], max_new_tokens: int = 64,
              sampling: SamplingParams = SamplingParams(), seed: int = 0,
              request_id: str | None = None, workload: str | None = None) -> Request:
        recorded = self.recorded.get(request_id)
        if recorded is None or list(prompt) != recorded.prompt:
            raise ValueError(f"request {request_id!r} is not in the trace with that prompt")
        request = Request(request_id, list(prompt), len(prompt),
                          min(max_new_tokens, len(recorded.output)), sampling,
                          torch.Generator(), workload=workload, seed=seed, started=self.now)
        request.slot = self._claim()
        self.now += recorded.prefill_seconds  # as Engine.start prefills before it returns
        return request

    def unfilled(self, request: Request) -> int:
        return 0

    def fill(self, request: Request, budget: int | None = None) -> None:
        pass

    # -- what Host's bookkeeping (finish, abandon, peek) reads ---------------------------------
    def _claim(self) -> int:
        if not self.free:
            raise ValueError(f"no free row: all {self.max_batch} are decoding")
        return self.free.pop(0)

    def _release(self, slot: int) -> None:
        self.free.append(slot)
        self.free.sort()

    def _lookup_seconds(self, name: str, draft: Draft, timed: float) -> float:
        """A look-up (`peek`: the look-up drafter's real proposal on the row's tokens) is
        charged its recorded seconds per drafted token, now (Host.peek's contract)."""
        seconds = self.trace.draft_seconds_per_token.get(name, 0.0) * len(draft.tokens)
        self.now += seconds
        return seconds

    # -- the step --------------------------------------------------------------------------
    def step_batch(self, decisions: Sequence[tuple[Request, str | None, int]],
                   looked: dict[int, dict[str, Proposal]] | None = None,
                   chunk=None) -> list[list[int]]:
        looked = looked or {}
        plan = []  # per row: (drafter, k, tokens drafted, agreeing, draft seconds, confidences)
        for request, name, k in decisions:
            recorded = self.recorded[request.request_id]
            at = len(request.output)
            k = min(request.clamp(k, self.max_positions), self.trace.k_max) if name else 0
            made = _proposal(recorded, name, k, at) if k else 0
            ready = looked.get(request.slot, {})
            seconds = sum(p.seconds for p in ready.values())  # the look-ups, charged already
            peeked = ready.get(name) if k else None
            confidences = None
            if k and peeked is not None and peeked.at == len(request.tokens) and peeked.k >= k:
                confidences = peeked.draft.confidences
            elif k:
                # a model drafter: its recorded confidences, cut by the decision's StopRule
                # as the live drafting cuts it, charged what it drafts (a dropped token's
                # forward too)
                confidences = (recorded.confidence or {}).get(name, {})
                confidences = confidences[at][:made] if confidences else None
                forwards = made
                if confidences is not None and request.stop is not None:
                    made, forwards = request.stop.run(confidences)
                drafted = self.trace.draft_seconds_per_token.get(name, 0.0) * forwards
                self.now += drafted
                seconds += drafted
            # (a look-up that proposes less than the trace recorded: a trace made by hand)
            confidences = confidences[:made] if confidences and len(confidences) >= made > 0 else None
            agree = min(recorded.match[name][at], made) if k else 0
            plan.append((name if k else None, k, made, agree, seconds, confidences))
        drafted = [made for _, _, made, _, _, _ in plan]
        forward = self.prices[len(decisions)].step(sum(drafted), max(drafted))
        self.now += forward + self.trace.overhead_seconds  # the loop's own (jobs.py reads it)
        emitted = []
        for (request, _, _), (name, k, made, agree, seconds, confidences) in zip(decisions, plan):
            recorded = self.recorded[request.request_id]
            at, context = len(request.output), len(request.tokens) - 1
            tokens = request.append(recorded.output[at:at + agree + 1], (), self.max_positions)
            request.steps.append(StepRecord(
                request.request_id, len(request.steps), name or "none", k, made, agree,
                len(tokens), seconds, forward, made + 1, context, 0, 0.0,
                batch_size=len(decisions), batch_tokens=len(decisions) + sum(drafted),
                batch_width=1 + max(drafted), overhead_seconds=0.0, confidences=confidences))
            emitted.append(tokens)
        return emitted


def _proposal(recorded, drafter: str, k: int, at: int) -> int:
    """Tokens `drafter` proposes at output position `at` when asked for k: k, or fewer where
    the trace recorded a shorter proposal (a look-up drafter's short match, or none)."""
    lengths = (recorded.proposed or {}).get(drafter)
    return k if lengths is None else min(k, lengths[at])


def trace_prices(trace: Trace, rows: int) -> Prices:
    """The step's prices the trace's costs give at `rows` rows (controller/cost.py)."""
    return recorded_prices(rows, trace.k_max, trace.verify_seconds, trace.batch_line)


class HindsightController(RowController):
    """Knows every request's future (the trace's outputs): each row drafts, with the drafter
    whose agreement there is worth most (its kept tokens per second, the row alone: the one
    that agrees longest, unless its drafting costs more than its extra tokens), only tokens
    the target keeps, and every row's K is chosen for the step's goodput over those certain
    tokens (batch_ks at the trace's prices). No controller that learns from evidence passes
    it by much at the same costs (at several rows its one-row pick of a drafter is a proxy):
    its figure is the ceiling a live one is measured against (`autospec replay --controller
    hindsight`).
    `drafters`: foresight of those only (`hindsight:ngram`: what knowing n-gram's agreement
    alone would buy); None: every drafter the trace recorded."""

    def __init__(self, trace: Trace, drafters: tuple[str, ...] | None = None):
        self.trace = trace
        self.requests = {r.id: r for r in trace.requests}
        recorded = tuple(trace.draft_seconds_per_token)
        for drafter in drafters or ():
            if drafter not in recorded:
                raise ValueError(f"hindsight over drafter '{drafter}': the trace recorded "
                                 f"{', '.join(recorded)}")
        self.drafters = drafters or recorded

    def decide_row(self, request) -> Decision:
        return self.decide(Step([request], None))[0]

    def decide(self, step: Step) -> list[Decision]:
        costs, verify = self.trace.draft_seconds_per_token, self.trace.verify_seconds
        last = len(verify) - 1

        def worth(pick):  # a row alone: its certain tokens per second (ties: the cheaper)
            drafter, agree = pick
            seconds = costs.get(drafter, 0.0)
            return (1 + agree) / (seconds * agree + verify[min(agree, last)]), -seconds

        picks = []
        for request in step.rows:
            recorded = self.requests[request.request_id]
            at = len(request.tokens) - request.prompt_len
            picks.append(max(((d, matches[at]) for d, matches in recorded.match.items()
                              if d in self.drafters), key=worth))
        ks = batch_ks([[1.0] * agree for _, agree in picks],
                      [costs.get(d, 0.0) for d, _ in picks],
                      trace_prices(self.trace, len(step.rows)))
        return [Decision(d, k) if k else Decision(None, 0) for (d, _), k in zip(picks, ks)]


def replay(trace: Trace, controller: Controller, requests: list[TraceRequest] | None = None):
    """Run `controller` over the trace, one request at a time: one RequestRecord per request
    (simulated seconds)."""
    return replay_batch(trace, controller, 1, requests)[0]


def replay_batch(trace: Trace, controller: Controller, rows: int,
                 requests: list[TraceRequest] | None = None) -> tuple[list, float]:
    """`rows` closed-loop clients over the trace's requests (each sends the next when its last
    ends): the live loop, `Engine.run`, over the recorded target (bench/recorded.py). (one
    RequestRecord per request in order, simulated seconds of the whole run)"""
    engine = RecordedEngine(trace, rows, requests)
    jobs = [Job(r.prompt, len(r.output), request_id=r.id, workload=r.category)
            for r in engine.requests]
    generations = engine.run(jobs, controller)
    return [g.telemetry for g in generations], engine.now
