"""The speculative decoding engine: propose -> verify -> accept -> roll back -> observe.

One engine, one step. Every request holds a row of one preallocated KV cache (RowCache,
models/kv.py: a length per row, roll-back = setting it, as gpt-fast does), and every step
advances all the rows it is given in ONE target forward: row i feeds its [newest token] +
draft (k_i + 1 tokens, k_i = 0 is plain decoding); rows of unequal widths are packed, so the
forward computes their real tokens only. One request is a batch of one; `generate` is the
loop over one row, `run` the loop over many (closed: N clients; open: requests sent at given
times), a server's decode thread calls `advance` — the same step underneath. Which drafter
and which k are *arguments* of the step; a Controller decides them between steps.

Choices: a joining request is prefilled by forwards of its own (batch 1, into its row), and
must fit it (prompt + max_new_tokens <= max_len). With `prefill_chunk` set, a prompt is
prefilled a chunk per step inside the decode step's own forward (packed: the chunk attends on
its own, no row is padded to it; its logits are not computed), whole when no row decodes.
A model drafter (draft model, early exit,
eagle) drafts all its rows in one forward per draft position (`Drafter.batch_drafting`);
look-up drafters (n-gram, suffix) row by row. A StepRecord per row: verify_seconds is the
step's verify phase (every row waited for it), batch_tokens the positions the forward
computed; a row is charged 1/B of the weights.
"""
from __future__ import annotations

import itertools
import time
import uuid
from typing import Callable, Sequence

import torch

from autospec.drafters.base import Draft, Verified, check_draft, drafter_class, runnable_drafters
from autospec.drafters.draft_model import DraftRow
from autospec.engine.accept import MAX_TOP_LOGPROBS, accept_rows, token_logprobs
from autospec.engine.jobs import Host
from autospec.controller.interface import Controller, StaticController
from autospec.engine.request import Generation, Proposal, Request, Round
from autospec.models.attention import pack_rows
from autospec.models.kv import RowCache, cache_kwarg, kv_bytes_per_token
from autospec.models.pair import ModelPair, weight_bytes
from autospec.models.sampling import SamplingParams
from autospec.telemetry import StepRecord

AUTO = "auto"  # generate's default drafter: the adaptive controller chooses

class Engine(Host):
    """Speculative decoding over a ModelPair, up to `max_batch` requests at once, each in a row
    of `max_len` positions (default: the target's limit; the cache grows as rows reach
    further). Thread-compatible, not thread-safe. What it keeps of its requests besides the
    step (finish, abandon, peek, their drafters) and the driving loop (`run`, `advance`) are
    its abstract base's, `Host` (engine/jobs.py), whose hooks it implements."""

    def __init__(self, models: ModelPair, drafter_options: dict[str, dict] | None = None, *,
                 max_batch: int = 1, max_len: int | None = None,
                 prefill_chunk: int | None = None):
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 tokens, got {prefill_chunk}")
        super().__init__()
        self.prefill_chunk = prefill_chunk  # None: a prompt prefills whole when it joins
        self.models = models
        self.drafter_options = drafter_options or {}
        self.kwarg = cache_kwarg(models.target)
        self.target_weight_bytes = weight_bytes(models.target)
        self.target_kv_bytes = kv_bytes_per_token(models.target)
        self.eos_ids = models.eos_ids
        self._ids = itertools.count()
        max_len = max_len or models.max_positions
        if max_len > models.max_positions:
            raise ValueError(f"max_len {max_len} exceeds the target's {models.max_positions} positions")
        # with a feature head on the pair, the cache keeps the target's last hidden states too
        self.cache = RowCache(models.target, max_batch, max_len,
                              keep_hidden=models.eagle is not None)
        self.max_batch, self.max_positions = max_batch, max_len  # a request reaches a row's
        self.packed = pack_rows(models.target)  # rows of unequal widths: their real tokens only
        # the drafters that draft all their rows of a step at once (draft model, early exit,
        # eagle: a cache of their own, slot for slot), made when a row first chooses one
        self.batch_drafting: dict[str, object | None] = {}
        self._auto: Controller | None = None  # generate's default: one controller, learning

    # -- requests join and leave ----------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        ids = self.models.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("empty prompt: give at least one token")
        return ids

    def start(self, prompt: str | list[int], max_new_tokens: int = 64,
              sampling: SamplingParams = SamplingParams(), seed: int = 0,
              request_id: str | None = None, workload: str | None = None,
              method: str | None = None, logprobs: int | None = None) -> Request:
        """Tokenise, check, take a row and prefill all prompt tokens but the last into it
        (with `prefill_chunk`, `advance` does, a chunk a step). `method` is only recorded (in the telemetry): the caller's controller decides.
        `logprobs`: keep each output token's log-probability and its `logprobs` most likely
        alternatives' (0: the token's own only; None: nothing) — `Generation.logprobs`."""
        ids = self.encode(prompt)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {logprobs}")
        request = Request(
            request_id=request_id or f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}",
            tokens=ids, prompt_len=len(ids), max_new_tokens=max_new_tokens, sampling=sampling,
            generator=torch.Generator().manual_seed(seed), workload=workload, method=method,
            top_logprobs=logprobs, seed=seed)
        self.prefill(request)
        return request

    def prefill(self, request: Request) -> None:
        """Check it fits a row, take the lowest free one, prefill all its tokens but the last
        (with `prefill_chunk`, none yet: `advance` does, a chunk a step)."""
        need = request.prompt_len + request.max_new_tokens
        if need > self.cache.max_len:
            raise ValueError(f"request needs {need} positions (prompt {request.prompt_len} + "
                             f"max_new_tokens {request.max_new_tokens}); a row holds "
                             f"{self.cache.max_len} positions (max_len)")
        request.slot = slot = self._claim()
        for drafting in self.batch_drafting.values():
            if drafting is not None:
                drafting.reset(slot)
        if self.prefill_chunk is not None:
            return
        try:
            self.fill(request)
        except BaseException:
            self.abandon(request)
            raise

    def unfilled(self, request: Request) -> int:
        """Prompt tokens not yet in the request's row (0 once it can decode)."""
        return max(0, request.prompt_len - 1 - self.cache.lengths[request.slot])

    @torch.inference_mode()
    def fill(self, request: Request, budget: int | None = None) -> None:
        """Prefill up to `budget` more of the request's prompt into its row (None: the rest)."""
        start = self.cache.lengths[request.slot]
        end = request.prompt_len - 1
        if budget is not None:
            end = min(end, start + budget)
        if end > start:
            self._forward([request.slot], [request.tokens[start:end]], last=1)
            self.cache.lengths[request.slot] = end

    # its rows (taken by prefill; freed by Host's finish and abandon, engine/jobs.py), its text
    def _claim(self) -> int:
        return self.cache.claim()

    def _release(self, slot: int) -> None:
        self.cache.release(slot)

    def _text(self, output: list[int]) -> str:
        return self.models.tokenizer.decode(output, skip_special_tokens=True)

    # -- the step -------------------------------------------------------------------------
    def step(self, request: Request, drafter_name: str | None, k: int) -> list[int]:  # B = 1
        return self.step_batch([(request, drafter_name, k)])[0]

    @torch.inference_mode()
    def step_batch(self, decisions: Sequence[tuple[Request, str | None, int]],
                   looked: dict[int, dict[str, Proposal]] | None = None,
                   chunk: tuple[Request, int] | None = None) -> list[list[int]]:
        """One speculative round for every (request, drafter, k) in one target forward, `looked`
        the controllers' look-ups for it (`peek`), by slot: the tokens appended to each row.
        `chunk` (request, tokens): that many more of a joining request's prompt ride in the
        same forward (chunked prefill, `advance`), its logits not computed."""
        slots = [request.slot for request, _, _ in decisions]
        if len(set(slots)) != len(slots) or None in slots:
            raise ValueError("step_batch needs distinct requests, each started on this engine")
        if any(self.unfilled(request) and k for request, _, k in decisions):
            raise ValueError("a row still prefilling decodes plain (k = 0) in the step that "
                             "completes its prompt")
        if slots != sorted(slots):
            # rows in slot order: where they hold consecutive slots the forward reads a view of
            # the cache, not a gather of every layer's K and V (ForwardBatch.first, models/plan.py)
            order = sorted(range(len(slots)), key=slots.__getitem__)
            emitted = self.step_batch([decisions[i] for i in order], looked, chunk)
            return [emitted[j] for j in sorted(range(len(order)), key=order.__getitem__)]
        # 1. propose: each row asks its own drafter for its own k (a model drafter's rows all
        # at once, one forward per draft position: _draft_batched)
        ready = self._draft_batched(decisions, looked or {})
        rounds = [self.propose(request, name, k, ready.get(request.slot))
                  for request, name, k in decisions]
        t1 = time.perf_counter()

        # 2. verify: one target forward over every row's [newest token] + draft, (n, T, V)
        # (a row whose prompt is not all in its row yet feeds the rest of it first)
        inputs = [rnd.request.tokens[self.cache.lengths[rnd.request.slot]:-1]
                  + [rnd.request.tokens[-1], *rnd.draft_tokens] for rnd in rounds]
        scored = [len(rnd.draft_tokens) + 1 for rnd in rounds]
        filled = 0
        if chunk is not None:  # a chunk of a joining prompt: one more row, nothing scored
            filling, budget = chunk
            start = self.cache.lengths[filling.slot]
            filled = min(filling.prompt_len - 1, start + budget) - start
            at = next((i for i, slot in enumerate(slots) if slot > filling.slot), len(slots))
            slots = slots[:at] + [filling.slot] + slots[at:]
            inputs = inputs[:at] + [filling.tokens[start:start + filled]] + inputs[at:]
            scored = scored[:at] + [0] + scored[at:]
        target_logits = self._forward(slots, inputs, scored=scored)
        if chunk is not None:
            self.cache.lengths[filling.slot] = start + filled

        # 3. accept: greedy rows together (one argmax, one kernel launch on CUDA), sampled
        # rows one by one, each by its own seed
        results = accept_rows(rounds, target_logits)

        emitted = []
        for rnd, (n_accepted, next_token) in zip(rounds, results):
            # 4. roll back: the row's length is its context (all but next_token)
            self.cache.lengths[rnd.request.slot] = rnd.context + 1 + n_accepted
            emitted.append(rnd.request.append(rnd.draft_tokens[:n_accepted] + [next_token], self.eos_ids,
                                               self.max_positions))
            if rnd.request.top_logprobs is not None:
                # position j of the row's logits scored its j-th emitted token
                rnd.request.logprobs += token_logprobs(target_logits[len(emitted) - 1],
                                                       emitted[-1], rnd.request.top_logprobs)

        # 5. record telemetry, tell the drafters
        verify_seconds = time.perf_counter() - t1
        # the positions the forward computed: the real tokens packed, rows x width padded
        # (a prompt's tokens in the forward count: every row waited for them)
        width = max(scored)
        batch_tokens = sum(map(len, inputs)) if self.packed else width * len(inputs)
        for rnd, (n_accepted, _), tokens in zip(rounds, results, emitted):
            self.observe(rnd, n_accepted, tokens, verify_seconds, len(rounds), batch_tokens, width)
        return emitted

    def propose(self, request: Request, drafter_name: str | None, k: int,
                ready: dict[str, Proposal] | None = None) -> Round:
        """Step 1 for one row: clamp k, ask the drafter (or take its draft from `ready`, the
        proposals made before the step by drafter), time it."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        context = len(request.tokens) - 1  # tokens in the target's cache row
        k = request.clamp(k, self.max_positions) if drafter_name else 0
        t0 = time.perf_counter()
        drafter = self.drafter_for(request, drafter_name) if k else None
        ready = ready or {}
        made = ready.get(drafter_name) if drafter else None
        # a controller's look-ups ran inside its decision but are the drafters' work (indexing,
        # matching), whether this step drafts from them or not (another drafter's, a plain
        # step's): they count as the step's draft seconds (and leave the controller's: advance)
        seconds = sum(p.seconds for p in ready.values() if not p.by_engine)
        if made is not None and made.at == len(request.tokens) and made.k >= k:
            draft = made.draft
            seconds += made.seconds if made.by_engine else 0.0
        else:
            draft = drafter.propose(self._context(request), k) if drafter else Draft.empty()
        if drafter:
            check_draft(drafter_name, draft)
        return Round(request, drafter_name if drafter else "none", k, drafter, draft,
                     draft.tokens[:k], context, time.perf_counter() - t0 + seconds)

    def observe(self, rnd: Round, accepted: int, emitted: list[int], verify_seconds: float,
                batch_size: int = 1, batch_tokens: int | None = None,
                batch_width: int | None = None) -> StepRecord:
        """Step 5 for one row: its StepRecord (a share of the weights' bytes), the drafter told."""
        request = rnd.request
        verify_tokens = len(rnd.draft_tokens) + 1
        moved = (self.target_weight_bytes // batch_size + self.target_kv_bytes * rnd.context
                 + rnd.draft.bytes_read)
        record = StepRecord(
            request_id=request.request_id, step=len(request.steps), drafter=rnd.drafter_name,
            k=rnd.k, proposed=len(rnd.draft_tokens), accepted=accepted, emitted=len(emitted),
            draft_seconds=rnd.draft_seconds, verify_seconds=verify_seconds,
            verify_tokens=verify_tokens, context_tokens=rnd.context, bytes_moved=moved,
            bandwidth_gbs=moved / (rnd.draft_seconds + verify_seconds) / 1e9,
            batch_size=batch_size, batch_tokens=batch_tokens or verify_tokens,
            batch_width=batch_width or verify_tokens,
            confidences=(rnd.draft.confidences[:len(rnd.draft_tokens)]
                         if rnd.draft.confidences is not None and rnd.draft_tokens else None))
        request.steps.append(record)
        if rnd.drafter:
            rnd.drafter.observe(Verified(len(rnd.draft_tokens), accepted, emitted))
        return record

    def _hidden(self, request: Request):  # Host._context: what a feature-level drafter reads
        return self.cache.hidden_of(request.slot)

    def _draft_batched(self, decisions: Sequence[tuple[Request, str | None, int]],
                       looked: dict[int, dict[str, Proposal]]) -> dict[int, dict[str, Proposal]]:
        """One batched drafting per drafter that has one (`Drafter.batch_drafting`): each row's
        draft, by slot and drafter, beside the rows' `looked` ones, for `propose`; each charged
        its share of the drafting's seconds (by its tokens)."""
        made = {slot: dict(proposals) for slot, proposals in looked.items()}
        chosen: dict[str, list[tuple[Request, int]]] = {}
        for request, name, k in decisions:
            k = request.clamp(k, self.max_positions) if name else 0
            if k > 0:
                chosen.setdefault(name, []).append((request, k))
        for name, picks in chosen.items():
            if name not in self.batch_drafting:
                self.batch_drafting[name] = drafter_class(name).batch_drafting(
                    self.models, self.max_batch, self.max_positions,
                    **self.drafter_options.get(name, {}))
            drafting = self.batch_drafting[name]
            if drafting is None:
                continue
            rows = [DraftRow(request.slot, self._context(request), k) for request, k in picks]
            requests = [request for request, _ in picks]
            drafts, seconds = drafting.propose(rows)
            # each row charged its share, by the tokens it asked for: the rows' draft seconds
            # add up to the drafting's. Charged the whole to every row, a drafter that batches
            # was priced per drafted token as if each row drafted alone (SmolLM2's feature head
            # at 16 rows: ~10 ms a token where the step's forward priced one at ~2)
            total = sum(row.k for row in rows)
            for request, row, draft in zip(requests, rows, drafts):
                made.setdefault(request.slot, {})[name] = Proposal(
                    len(request.tokens), row.k, draft, seconds * row.k / total, by_engine=True)
        return made

    @torch.inference_mode()
    def trial_forward(self, slots: list[int], inputs: list[list[int]]) -> None:
        """One target forward over the rows' inputs, rolled back after (the rows keep their
        lengths): what a cost calibration times (bench/record.py)."""
        kept = [self.cache.lengths[slot] for slot in slots]
        try:
            self._forward(slots, inputs)
        finally:
            for slot, length in zip(slots, kept):
                self.cache.lengths[slot] = length

    @torch.inference_mode()
    def features(self, tokens: list[int]) -> torch.Tensor | None:
        """The target's last hidden state at every position but the last of `tokens`, where
        the engine keeps them (a pair with a feature head: what `eagle` drafts from); None
        otherwise. A row of its own, given back after."""
        if self.cache.hidden is None:
            return None
        request = self.start(tokens, max_new_tokens=1)
        try:
            return self.cache.hidden_of(request.slot).clone()
        finally:
            self.abandon(request)

    def _forward(self, slots: list[int], inputs: list[list[int]], last: int | None = None,
                 scored: list[int] | None = None):
        """Logits (n, T, V) of the rows' token lists, right-padded, each at its own offset
        (with `scored`, the rows' last positions that many, RowCache.forward)."""
        return self.cache.forward(self.models.target, self.kwarg, slots, inputs,
                                  self.models.max_positions, last, scored)

    # -- Host's other hooks (engine/jobs.py: the driving loop) -------------------------------
    def clock(self) -> float:  # a recorded target's is simulated (bench/recorded.py)
        return time.perf_counter()

    def idle(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def runnable_drafters(self) -> tuple[str, ...]:
        return runnable_drafters(self.models)

    # advance (one step over the rows in flight, a chunk of a joining prompt in it) and run
    # (the closed / open loop over many requests): Host, engine/jobs.py

    def generate(self, prompt: str | list[int], *, drafter: str | None = AUTO, k: int = 4,
                 controller: Controller | None = None, max_new_tokens: int = 64,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 workload: str | None = None,
                 on_tokens: Callable[[list[int]], None] | None = None) -> Generation:
        """Generate one completion (a row of its own). `drafter`: "auto" (the default: the
        adaptive controller picks drafter and K each step, one controller per engine that
        learns across calls), a drafter's name at a fixed `k`, or None (plain decoding). A
        `controller` overrides both."""
        if controller is None and drafter == AUTO:
            if self._auto is None:
                from autospec.controller.adaptive import AdaptiveController
                self._auto = AdaptiveController()
            controller = self._auto
        elif controller is None:
            if drafter is not None:
                drafter_class(drafter)  # unknown names fail before any work
                if k <= 0:
                    raise ValueError(f"k must be >= 1 with drafter '{drafter}', got {k} "
                                     f"(for plain decoding pass drafter=None)")
            controller = StaticController(drafter, k)
        request = self.start(prompt, max_new_tokens, SamplingParams(temperature, top_k, top_p),
                             seed, workload=workload)
        try:
            while not request.done:
                emitted = self.advance([(request, controller)])[0]
                if on_tokens:
                    on_tokens(emitted)
        except BaseException:
            self.abandon(request)
            raise
        return self.finish(request)
