"""Continuous batching: every active request advances in ONE target forward per step.

Each row of the verify forward is one request's [newest] + draft, with its own drafter and k
(k = 0 allowed), right-padded to the longest row, in a RowCache (engine/row_cache.py: a KV
length per row, roll-back by setting it).

Choices:
- a joining request is prefilled by a forward of its own (batch 1, into its slot): simplest
  correct; a long prompt then delays the other rows' step once, as in a non-chunked server.
- drafting: the draft model drafts for all its rows in one forward per draft position
  (engine/batch_draft.py: a RowCache of its own, slot for slot); look-up drafters (n-gram,
  suffix) and the early exit per row through their drafter objects.
- a request must fit its row: prompt + max_new_tokens <= max_len, checked when it joins.
- telemetry: each row gets its own StepRecord, as Engine.step writes it; verify_seconds is the
  batch's verify phase (every row waited for all of it), batch_size and batch_tokens say what
  the forward held, and each row is charged 1/batch_size of the weight bytes.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

from autospec.engine.batch_draft import BatchDraftModel, DraftRow
from autospec.engine.loop import Controller, Engine, Generation, Request, StaticController
from autospec.engine.row_cache import RowCache  # noqa: F401 (engine.batch.RowCache, as before)
from autospec.models.kv import cached_forward
from autospec.models.pair import ModelPair
from autospec.models.sampling import SamplingParams

DEFAULT_MAX_LEN = 2048  # per row, when the caller gives none (and the target allows it)


def decide_batch(controller: Controller, requests: Sequence[Request]) -> list[tuple[str | None, int]]:
    """What `run` asks each step: a (drafter or None, k) per row. A controller may decide for
    the whole batch (`decide_batch(requests)`, e.g. a batch size -> K table); one without is
    asked row by row (`decide`), so every per-request controller works unchanged."""
    batch = getattr(controller, "decide_batch", None)
    return batch(requests) if batch else [controller.decide(r) for r in requests]


@dataclass
class Job:
    """One request for `BatchEngine.run`: what Engine.start takes."""
    prompt: str | list[int]
    max_new_tokens: int = 64
    sampling: SamplingParams = SamplingParams()
    seed: int = 0
    workload: str | None = None
    request_id: str | None = None


class BatchEngine(Engine):
    """An Engine whose requests share one RowCache and advance together (`step_batch`, `run`).
    start / step / finish / generate work as on Engine: a request takes a row at start (its
    prefill) and gives it back at finish."""

    def __init__(self, models: ModelPair, max_batch: int, max_len: int | None = None,
                 drafter_options: dict[str, dict] | None = None):
        super().__init__(models, drafter_options)
        max_len = max_len or min(models.max_positions, DEFAULT_MAX_LEN)
        if max_len > models.max_positions:
            raise ValueError(f"max_len {max_len} exceeds the target's {models.max_positions} positions")
        self.cache = RowCache(models.target, max_batch, max_len)
        # the draft model drafts for all its rows at once (engine/batch_draft.py)
        self.batch_draft = None
        if models.draft is not None:
            self.batch_draft = BatchDraftModel(models.draft, max_batch, max_len)

    @property
    def max_batch(self) -> int:
        return self.cache.max_batch

    @property
    def max_positions(self) -> int:
        return self.cache.max_len

    # -- rows join and leave ------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, request: Request) -> None:
        """Check the request fits a row, take a free one, prefill all its tokens but the last
        into it (a forward of its own)."""
        need = request.prompt_len + request.max_new_tokens
        if need > self.cache.max_len:
            raise ValueError(f"request needs {need} positions (prompt {request.prompt_len} + "
                             f"max_new_tokens {request.max_new_tokens}); a batch row holds "
                             f"{self.cache.max_len} (max_len)")
        request.cache = self.cache.claim()
        if self.batch_draft is not None:
            self.batch_draft.reset(request.cache)
        if request.prompt_len > 1:
            try:
                self._forward([request.cache], [request.tokens[:-1]], last=1)
            except BaseException:
                self.cache.release(request.cache)
                raise
        self.cache.lengths[request.cache] = request.prompt_len - 1

    def finish(self, request: Request) -> Generation:
        """Free the request's row (at once: the next request may join it) and summarise."""
        self.abandon(request)
        return super().finish(request)

    def abandon(self, request: Request) -> None:
        """Free the request's row with no result (its run or its server step failed)."""
        if isinstance(request.cache, int):
            self.cache.release(request.cache)
            request.cache = None

    # -- the loop -----------------------------------------------------------------------
    def step(self, request: Request, drafter_name: str | None, k: int) -> list[int]:
        return self.step_batch([(request, drafter_name, k)])[0]

    @torch.inference_mode()
    def step_batch(self, decisions: Sequence[tuple[Request, str | None, int]]) -> list[list[int]]:
        """One speculative round for every (request, drafter, k) in one target forward.
        Returns the tokens appended to each request."""
        slots = [request.cache for request, _, _ in decisions]
        if len(set(slots)) != len(slots) or not all(isinstance(s, int) for s in slots):
            raise ValueError("step_batch needs distinct requests, each started on this engine")
        if slots != sorted(slots):
            # rows in slot order: where they hold consecutive slots the forward reads a view of
            # the cache, not a gather of every layer's K and V (RowCache's Bound.first)
            order = sorted(range(len(slots)), key=slots.__getitem__)
            emitted = self.step_batch([decisions[i] for i in order])
            out: list[list[int]] = [[] for _ in slots]
            for j, i in enumerate(order):
                out[i] = emitted[j]
            return out
        # 1. propose: each row asks its own drafter for its own k (the draft model's rows
        # all at once, one forward per draft position: _draft_model_rows)
        self._draft_model_rows(decisions)
        rounds = [self.propose(request, name, k) for request, name, k in decisions]
        t1 = time.perf_counter()

        # 2. verify: one target forward over every row's [newest token] + draft, (n, T, V)
        inputs = [[rnd.request.tokens[-1], *rnd.draft_tokens] for rnd in rounds]
        target_logits, at = self._verify_forward(slots, inputs)

        emitted, accepted = [], []
        for i, rnd in enumerate(rounds):
            # 3. accept, row by row (each with its own generator when sampling)
            n_accepted, next_token = self.accept(rnd, target_logits[at[i], :len(inputs[i])])
            # 4. roll back: the row's length is its context (all but next_token)
            self.cache.lengths[rnd.request.cache] = rnd.context + 1 + n_accepted
            accepted.append(n_accepted)
            emitted.append(self._append(rnd.request, rnd.draft_tokens[:n_accepted] + [next_token]))

        # 5. record telemetry, tell the drafters
        verify_seconds = time.perf_counter() - t1
        batch_tokens, width = sum(map(len, inputs)), max(map(len, inputs))
        for rnd, n_accepted, tokens in zip(rounds, accepted, emitted):
            self.observe(rnd, n_accepted, tokens, verify_seconds, len(rounds), batch_tokens, width)
        return emitted

    def _draft_model_rows(self, decisions: Sequence[tuple[Request, str | None, int]]) -> None:
        """The draft for every row that chose the draft model, in one batched drafting; each
        row's draft is left where `propose` takes a look-up drafter's (Request.peeked), and
        each is charged the whole drafting's seconds (every row waited for all of it)."""
        if self.batch_draft is None:
            return
        rows, requests = [], []
        for request, name, k in decisions:
            k = self.clamp_k(request, k) if name == "draft-model" else 0
            if k > 0:
                rows.append(DraftRow(request.cache, self._context(request), k))
                requests.append(request)
        if not rows:
            return
        drafts, seconds = self.batch_draft.propose(rows)
        for request, row, draft in zip(requests, rows, drafts):
            request.peeked["draft-model"] = (len(request.tokens), row.k, draft, seconds, True)

    def _verify_forward(self, slots: list[int], inputs: list[list[int]]
                        ) -> tuple[torch.Tensor, list[int]]:
        """`_forward` over rows in slot order, and where each row's logits are. Slots with a
        gap between them (a row left and no request took its slot) get a filler row each —
        one token into the free slot, its logits unused — so the forward still reads a view of
        the cache rather than gathering every layer's K and V: at 14 of 16 rows the gather
        took a step from ~30 to ~70 ms, the filler costs what a row does."""
        first, last = slots[0], slots[-1]
        if last - first + 1 == len(slots):
            return self._forward(slots, inputs), list(range(len(slots)))
        given = dict(zip(slots, inputs))
        full = list(range(first, last + 1))
        logits = self._forward(full, [given.get(slot, [0]) for slot in full])
        return logits, [slot - first for slot in slots]

    def _forward(self, slots: list[int], inputs: list[list[int]], last: int | None = None):
        """Logits (n, T, V) of the rows' token lists, right-padded, each at its own offset."""
        width = max(map(len, inputs))
        input_ids = torch.tensor([ids + [0] * (width - len(ids)) for ids in inputs],
                                 device=self.cache.device)
        position_ids, mask = self.cache.bind(slots, [len(ids) for ids in inputs],
                                             self.models.max_positions)
        try:
            return cached_forward(self.models.target, input_ids, self.cache, self.kwarg, last,
                                  position_ids=position_ids, attention_mask=mask)
        finally:
            self.cache.bound = None

    def advance(self, rows: Sequence[tuple[Request, Controller]]) -> list[list[int]]:
        """One step of continuous batching over the active rows: each controller decides for
        all its rows at once (`decide_batch`; rows may have different controllers, as a server's
        requests do), one `step_batch`, every row's controller told its step, the controllers'
        seconds shared among the rows. Returns the tokens appended to each row."""
        t0 = time.perf_counter()
        for request, _ in rows:
            request.step_started = t0  # a controller learns a batch-1 step's overhead from it
        groups: dict[int, list[int]] = {}  # controller -> its rows, in row order
        for i, (_, controller) in enumerate(rows):
            groups.setdefault(id(controller), []).append(i)
        choices: list[tuple[str | None, int]] = [(None, 0)] * len(rows)
        for indices in groups.values():
            decided = decide_batch(rows[indices[0]][1], [rows[i][0] for i in indices])
            for i, choice in zip(indices, decided):
                choices[i] = choice
        t1 = time.perf_counter()
        emitted = self.step_batch([(request, *choice) for (request, _), choice in zip(rows, choices)])
        t2 = time.perf_counter()
        for request, controller in rows:
            controller.update(request.steps[-1], request)
        # less the drafters' look-ups the controllers made (charged as draft seconds)
        share = ((t1 - t0) + (time.perf_counter() - t2)
                 - sum(request.lookup_seconds for request, _ in rows)) / len(rows)
        for request, _ in rows:
            request.steps[-1].controller_seconds = share
        return emitted

    def run(self, jobs: Iterable[Job], controller: Controller | None = None,
            max_batch: int | None = None,
            on_tokens: Callable[[Request, list[int]], None] | None = None) -> list[Generation]:
        """Continuous batching over `jobs`, in order, with up to max_batch rows (default: the
        cache's). Between steps finished rows leave and the next jobs join their slots.
        Closed loop: max_batch clients, each submitting its next job when its last one ends,
        so a request's `started` (hence its wall time and time to first token) is when its
        client sent it. Returns the generations in job order."""
        max_batch = self.max_batch if max_batch is None else max_batch
        if not 1 <= max_batch <= self.max_batch:
            raise ValueError(f"max_batch must be in 1..{self.max_batch} (the cache's rows), "
                             f"got {max_batch}")
        controller = controller or StaticController(None, 0)
        pending = deque(enumerate(jobs))
        results: list[Generation | None] = [None] * len(pending)
        submitted = deque([time.perf_counter()] * max_batch)  # when each client sent its next job
        active: dict[int, Request] = {}
        try:
            while pending or active:
                while pending and len(active) < max_batch:
                    i, job = pending.popleft()
                    request = self.start(job.prompt, job.max_new_tokens, job.sampling, job.seed,
                                         job.request_id, job.workload)
                    request.started = submitted.popleft()
                    active[i] = request
                rows = list(active.items())
                emitted = self.advance([(request, controller) for _, request in rows])
                for (i, request), tokens in zip(rows, emitted):
                    if on_tokens:
                        on_tokens(request, tokens)
                    if request.done:
                        results[i] = self.finish(active.pop(i))
                        submitted.append(time.perf_counter())
        finally:  # a job that cannot start (too long) ends the run: free the rows in flight
            for request in active.values():
                self.abandon(request)
        return results
