"""The driving loop and what it drives: `Host`, the abstract base of the engine (engine/loop.py:
`Engine`) and of replay's recorded target (bench/recorded.py: `RecordedEngine`), so that replay
runs this very loop. Its methods are the loop — `advance`, one step over the rows in flight
(each controller's decision, one `step_batch`, every controller told), and `run`, the loop over
many requests (closed: N clients; open: requests sent at given times), an `advance` a step —
and what both keep of their requests besides the step (each controller bound once; finish,
abandon, peek; their drafters and look-ups, one `Lookups`: drafters/lookups.py). What a host supplies is declared here, abstract: its requests'
start and prefill (`start`, `unfilled`, `fill`), the step (`step_batch`), its clock (`clock`,
`idle`: a recorded target's is simulated, so the loop never reads the time module), the
drafters it runs (`runnable_drafters`) and freeing a row (`_release`)."""
from __future__ import annotations

import functools
import weakref
from abc import ABC, abstractmethod
from collections import deque
from typing import Callable, Iterable, Sequence

from autospec.controller.interface import Controller, Outcome, StaticController, Step
from autospec.drafters.base import Draft, DraftContext, Drafter
from autospec.drafters.lookups import Lookups
from autospec.engine.request import Generation, Job, Proposal, Request
from autospec.models.sampling import SamplingParams
from autospec.telemetry import summarise


class Host(ABC):
    """A host of the driving loop (the engine, engine/loop.py; the recorded target,
    bench/recorded.py): the loop (`run`, `advance`) and the bookkeeping of its requests both
    share, over the hooks each supplies (the abstract methods below) and these attributes."""

    max_batch: int  # the rows it holds: `run` steps at most this many at once
    prefill_chunk: int | None  # a joining prompt's tokens a step (None: prompts join whole)
    packed: bool  # a chunk rides in the step's own forward, no row padded to it

    def __init__(self) -> None:
        # the controllers this host has bound (Controller.bind: once, before their first step),
        # by id while each is alive
        self._bound: dict[int, weakref.ref] = {}
        # its requests' drafters and the controllers' look-ups (drafters/lookups.py)
        self.lookups = Lookups(clock=self.clock)

    @property
    def models(self):
        """What a drafter is made with (None: look-up drafters only)."""
        return self.lookups.models

    @models.setter
    def models(self, models) -> None:
        self.lookups.models = models

    @property
    def drafter_options(self) -> dict[str, dict]:
        """A drafter's options, by name (a request may carry its own: Request.drafter_options)."""
        return self.lookups.options

    @drafter_options.setter
    def drafter_options(self, options: dict[str, dict]) -> None:
        self.lookups.options = options

    # -- the driving loop ----------------------------------------------------------------------
    def run(self, jobs: Iterable[Job], controller: Controller | None = None,
            max_batch: int | None = None,
            on_tokens: Callable[[Request, list[int]], None] | None = None,
            arrivals: Sequence[float] | None = None,
            on_refused: Callable[[int, str], None] | None = None) -> list[Generation | None]:
        """Continuous batching over `jobs` in order, up to max_batch rows (default: all), the
        generations in job order. Closed loop (no `arrivals`): max_batch clients, each sending
        its next job when its last one ends; a job that cannot start (too long) ends the run.
        Open loop: job i is sent `arrivals[i]` s after the start and queues for a row
        (Request.queue_seconds); one that cannot start is refused (`on_refused(i, why)`, its
        generation None). A request's `started`, hence its TTFT, is when it was sent."""
        max_batch = self.max_batch if max_batch is None else max_batch
        if not 1 <= max_batch <= self.max_batch:
            raise ValueError(f"max_batch must be in 1..{self.max_batch} (the cache's rows), "
                             f"got {max_batch}")
        controller = controller or StaticController(None, 0)
        pending = deque(enumerate(jobs))
        results: list[Generation | None] = [None] * len(pending)
        t0 = self.clock()
        submitted = deque([t0] * max_batch)  # closed loop: when each client sent its next job
        sends = None if arrivals is None else [t0 + t for t in arrivals]  # open loop
        active: dict[int, Request] = {}
        try:
            while pending or active:
                while pending and len(active) < max_batch:
                    i, job = pending[0]
                    sent = submitted[0] if sends is None else sends[i]
                    if sent > self.clock():
                        break  # not sent yet
                    pending.popleft()
                    if sends is None:
                        submitted.popleft()
                    try:
                        request = self.start(job.prompt, job.max_new_tokens, job.sampling,
                                             job.seed, job.request_id, job.workload)
                    except ValueError as exc:
                        if sends is None:
                            raise
                        if on_refused:
                            on_refused(i, str(exc))
                        continue
                    request.queue_seconds = request.started - sent
                    request.started = sent
                    active[i] = request
                if not active:  # open loop, idle: until the next job is sent
                    self.idle(sends[pending[0][0]] - self.clock())
                    continue
                rows = list(active.items())
                emitted = self.advance([(request, controller) for _, request in rows])
                for (i, request), tokens in zip(rows, emitted):
                    if on_tokens and tokens:  # none while it prefills (prefill_chunk)
                        on_tokens(request, tokens)
                    if request.done:
                        results[i] = self.finish(active.pop(i))
                        submitted.append(self.clock())
        finally:  # a run that fails (a job that cannot start, closed loop): free the rows
            for request in active.values():
                self.abandon(request)
                controller.release(request)
        return results

    def advance(self, rows: Sequence[tuple[Request, Controller]]) -> list[list[int]]:
        """One step of the loop: each controller decides for all its rows at once (a server's
        rows may have different ones), one `step_batch`, every controller told its rows' steps,
        the controllers' seconds shared among the rows. The tokens appended to each row. A row
        still prefilling emits none while a chunk of its prompt rides in the step's forward (the
        first such row: as many tokens as every controller's `chunk_budget` allows, up to
        `prefill_chunk`); the step in which the rest of its prompt fits, it decodes plain after
        it, in the same forward. When no row is decoding yet, every prompt goes in whole."""
        waiting = [i for i, (request, _) in enumerate(rows) if self.unfilled(request)]
        if not waiting:
            return self._decode(rows)
        joining = None
        if len(waiting) == len(rows):
            for i in waiting:
                self.fill(rows[i][0])
        elif self.packed:  # in the step's own forward (packed: no row padded to it)
            joining = rows[waiting[0]][0]
        else:
            self.fill(rows[waiting[0]][0], self.prefill_chunk)
        ready = [i for i, (request, _) in enumerate(rows) if not self.unfilled(request)]
        emitted = self._decode([rows[i] for i in ready], joining)
        out: list[list[int]] = [[] for _ in rows]
        for i, tokens in zip(ready + [waiting[0]], emitted):
            out[i] = tokens
        return out

    def _decode(self, rows: Sequence[tuple[Request, Controller]],
                joining: Request | None = None) -> list[list[int]]:
        """`advance`'s step over rows that all decode, and a chunk of `joining`'s prompt riding
        along — or, where the rest of it fits the chunk, `joining` decoding plain after it (its
        tokens then last in the list returned)."""
        t0 = self.clock()
        groups: dict[int, tuple[Controller, list[int]]] = {}  # each controller's rows, in order
        for i, (_, controller) in enumerate(rows):
            groups.setdefault(id(controller), (controller, []))[1].append(i)
        looked: dict[int, dict[str, Proposal]] = {}  # the controllers' look-ups, by slot
        peek = functools.partial(self.peek, looked)
        choices: list[tuple] = [(None, 0)] * len(rows)
        chunk, budget = None, 0
        for controller, _ in groups.values():
            self.bind(controller)  # the drafters it may choose, the first time it meets this host
        if joining is not None:  # what the controllers let ride beside their rows
            budget = min([self.prefill_chunk] + [
                controller.chunk_budget(len(rows), self.prefill_chunk)
                for controller, _ in groups.values()])
            budget = min(budget, self.unfilled(joining))
            if budget < self.unfilled(joining):
                chunk = (joining, budget)
        for controller, indices in groups.values():
            decided = controller.decide(Step([rows[i][0] for i in indices], peek, budget))
            for i, choice in zip(indices, decided):
                choices[i] = choice
        t1 = self.clock()
        decisions = []
        for (request, _), choice in zip(rows, choices):
            # a model drafter's stop, by its drafts' confidences
            request.stop = choice.stop if len(choice) > 2 else None
            decisions.append((request, choice[0], choice[1]))
        if joining is not None and chunk is None:
            decisions.append((joining, None, 0))
        emitted = self.step_batch(decisions, looked, chunk) if decisions else []
        t2 = self.clock()
        records = [request.steps[-1] for request, _, _ in decisions]
        if not records:
            return emitted
        # the step's wall time outside its forward and drafting: what every row waited for
        # besides those (a row's draft seconds: the look-ups made for it and its share of a
        # batched drafting, Engine._draft_batched — together, the step's drafting)
        overhead = max(0.0, t2 - t0 - records[0].verify_seconds
                       - sum(record.draft_seconds for record in records))
        for record in records:
            record.overhead_seconds = overhead
        for controller, indices in groups.values():
            controller.observe(Outcome([records[i] for i in indices],
                                       [rows[i][0] for i in indices]))
        # less the drafters' look-ups the controllers made (charged as draft seconds)
        lookups = sum(p.seconds for proposals in looked.values() for p in proposals.values())
        share = ((t1 - t0) + (self.clock() - t2) - lookups) / len(records)
        for record in records:
            record.controller_seconds = share
        return emitted

    # -- its requests' bookkeeping -------------------------------------------------------------
    def bind(self, controller: Controller) -> None:
        """Tell `controller` the drafters this host can run, the first time it meets it."""
        key = id(controller)
        known = self._bound.get(key)
        if known is not None and known() is controller:
            return
        controller.bind(self.runnable_drafters())
        bound = self._bound  # the entry goes with the controller (an id is reused only after)
        bound[key] = weakref.ref(controller, lambda _, key=key: bound.pop(key, None))

    def finish(self, request: Request) -> Generation:
        """Free the request's row and summarise. Its drafters are told (`finish`) here, not in
        a finalizer: what they publish (suffix: to the shared index) precedes the next request."""
        self.abandon(request)
        self.lookups.release(request, self._context(request))
        record = summarise(request.request_id, request.prompt_len, request.steps,
                           self.clock() - request.started, request.workload,
                           request.finish_reason or "length", request.method)
        return Generation(self._text(request.output), list(request.output), record,
                          None if request.top_logprobs is None else list(request.logprobs))

    def abandon(self, request: Request) -> None:
        """Free the request's row with no result (its run or its server step failed)."""
        if request.slot is not None:
            self._release(request.slot)
            request.slot = None

    def peek(self, looked: dict[int, dict[str, Proposal]], request: Request, name: str,
             k: int) -> Draft | None:
        """The proposal look-up drafter `name` (`Drafter.peekable`: ngram, suffix; else None)
        would make now, for a controller deciding before the step (`_decode` binds `looked`):
        kept in looked[slot][name], the step's draft at this context (cut to its k)."""
        # a look-up reads the row's tokens, not its features (`Drafter.peekable`): none made
        draft = self.lookups.peek(request, name, k, self._context(request, features=False))
        if draft is not None:
            timed = self.lookups.take_seconds()
            looked.setdefault(request.slot, {})[name] = Proposal(
                len(request.tokens), k, draft, self._lookup_seconds(name, draft, timed),
                by_engine=False)
        return draft

    def drafter_for(self, request: Request, name: str) -> Drafter:
        """The request's drafter `name`, made on first use (drafters/lookups.py)."""
        return self.lookups.drafter(request, name)

    def _context(self, request: Request, features: bool = True) -> DraftContext:
        return DraftContext(request.tokens, request.sampling, request.generator,
                            request.prompt_len, self._hidden(request) if features else None,
                            request.stop)

    # -- what a host supplies ------------------------------------------------------------------
    @abstractmethod
    def start(self, prompt: str | list[int], max_new_tokens: int, sampling: SamplingParams,
              seed: int, request_id: str | None, workload: str | None) -> Request:
        """A request for `prompt` in a free row (ValueError where it cannot start)."""

    @abstractmethod
    def unfilled(self, request: Request) -> int:
        """Prompt tokens not yet in the request's row (0 once it can decode)."""

    @abstractmethod
    def fill(self, request: Request, budget: int | None = None) -> None:
        """Prefill up to `budget` more of the request's prompt into its row (None: the rest)."""

    @abstractmethod
    def step_batch(self, decisions: Sequence[tuple[Request, str | None, int]],
                   looked: dict[int, dict[str, Proposal]] | None = None,
                   chunk: tuple[Request, int] | None = None) -> list[list[int]]:
        """One step over the rows (request, drafter, k): the tokens each appends, its StepRecord."""

    @abstractmethod
    def clock(self) -> float:
        """Seconds on this host's clock (the loop reads no other)."""

    @abstractmethod
    def idle(self, seconds: float) -> None:
        """Let `seconds` pass on this host's clock (open loop: no request sent yet)."""

    @abstractmethod
    def runnable_drafters(self) -> tuple[str, ...]:
        """The drafters this host can run: what a controller is bound to."""

    @abstractmethod
    def _release(self, slot: int) -> None:
        """Free row `slot` for the next request."""

    def _lookup_seconds(self, name: str, draft: Draft, timed: float) -> float:
        """What the look-up that made `draft` cost: `timed`, as this host's clock timed it."""
        return timed

    def _text(self, output: list[int]) -> str:
        """An output's text (none: a host without a tokenizer)."""
        return ""

    def _hidden(self, request: Request):
        """The row's features a drafter may read (none: a host without them)."""
        return None
