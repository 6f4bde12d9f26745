"""The speculative decoding loop: propose -> verify -> accept -> roll back -> observe.

One request at a time (requests may be interleaved step by step: each carries its own caches
and drafters). The target's KV cache holds every token but the newest; a step feeds
[newest] + draft (k+1 tokens) in one forward, keeps the accepted prefix plus one target token,
and crops the cache back. k = 0 is plain decoding through the very same code.

Which drafter and which k are *arguments* of `step`; a `Controller` (static here, the
adaptive one in autospec/controller/) decides them between steps.
"""
from __future__ import annotations

import atexit
import functools
import gc
import itertools
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from autospec.drafters.base import Draft, DraftContext, Drafter, Verified, create_drafter
from autospec.engine.accept import fused_greedy_accept, greedy_accept, rejection_accept
from autospec.models.kv import cache_kwarg, cached_forward, new_cache, rollback
from autospec.models.pair import ModelPair, kv_bytes_per_token, weight_bytes
from autospec.models.sampling import SamplingParams, probs_from_logits
from autospec.telemetry import RequestRecord, StepRecord, summarise


class Controller(Protocol):
    """Chooses (drafter name or None, k) before each step; told each step's record after."""
    def decide(self, request: "Request") -> tuple[str | None, int]: ...
    def update(self, record: StepRecord, request: "Request") -> None: ...


_heap_collected = False


def freeze_heap() -> None:
    """Move every object alive now out of the cyclic garbage collector's reach (gc.freeze),
    after one full collection per process. Called once the models are loaded (the CLI's
    engines, `autospec.load`): a full collection otherwise walks the models' modules,
    parameters, tokenizer and the libraries' own objects (~470k on the reference pair) and
    took 10-160 ms, seven times in a three-run bench at 16 rows — a pause in some step's
    inter-token latency and in whichever phase it fell (once a whole run's controller share).
    Frozen objects are still freed by reference counting; only cycles among them wait."""
    global _heap_collected
    if not _heap_collected:
        gc.collect()
        # thawed at exit, so the interpreter's last collection still frees them (nanobind's
        # extensions, triton's, report what is left as leaks)
        atexit.register(gc.unfreeze)
        _heap_collected = True
    gc.freeze()


@dataclass
class StaticController:
    """The same (drafter, k) every step; (None, 0) is plain decoding."""
    drafter: str | None
    k: int

    def decide(self, request: "Request") -> tuple[str | None, int]:
        return self.drafter, self.k

    def update(self, record: StepRecord, request: "Request") -> None:
        pass


Policy = Controller  # deprecated name (one release): "policy" now means a policy file only
StaticPolicy = StaticController  # deprecated name (one release)


@dataclass
class Request:
    """One generation in flight: its tokens, the target's cache, its drafters, its steps."""
    request_id: str
    tokens: list[int]  # prompt + output; the target's cache holds all but the last
    prompt_len: int
    max_new_tokens: int
    sampling: SamplingParams
    generator: torch.Generator
    cache: object
    workload: str | None = None
    method: str | None = None  # as the caller named it (serve: the request's), for telemetry
    drafters: dict[str, Drafter] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    finish_reason: str | None = None
    started: float = field(default_factory=time.perf_counter)
    # a look-up drafter's proposal taken before the decision (Engine.peek): drafter ->
    # (context length, k asked, draft, seconds it took, by the engine); the step then drafts
    # no second time. By the engine (True): the batched engine's draft-model drafts, made
    # outside any decision (engine/batch_draft.py); False: a controller's peek
    peeked: dict[str, tuple[int, int, Draft, float, bool]] = field(default_factory=dict)
    # seconds of the controller's peeked look-ups this step (the one its draft used and any it
    # did not): charged to its draft seconds, so taken out of the controller's (the
    # controller looked them up, but indexing and matching are the drafters' work)
    lookup_seconds: float = 0.0
    # when this step's decision began (perf_counter): the controller learns the step's
    # overhead from it (wall time less draft and verify); None outside a live loop (replay)
    step_started: float | None = None
    # Engine.peek bound to this request, for a controller that decides from the proposal
    peek: Callable[[str, int], Draft | None] | None = field(default=None, repr=False)
    # drafter options for this request in place of the engine's, set before its first step: a
    # server's tenant (its own suffix index) shares one batch with the other tenants
    drafter_options: dict[str, dict] | None = None

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Generation:
    text: str
    token_ids: list[int]  # the output only
    telemetry: RequestRecord


@dataclass
class Round:
    """One request's step in flight, between propose and observe (a batch holds one per row)."""
    request: Request
    drafter_name: str  # "none" for a plain step
    k: int  # after clamping
    drafter: Drafter | None
    draft: Draft
    draft_tokens: list[int]  # draft.tokens[:k]
    context: int  # tokens in the target's cache before the step
    draft_seconds: float


class Engine:
    """Speculative decoding over a ModelPair. Thread-compatible, not thread-safe."""

    def __init__(self, models: ModelPair, drafter_options: dict[str, dict] | None = None):
        self.models = models
        self.drafter_options = drafter_options or {}
        self.kwarg = cache_kwarg(models.target)
        self.target_weight_bytes = weight_bytes(models.target)
        self.target_kv_bytes = kv_bytes_per_token(models.target)
        self.eos_ids = models.eos_ids
        self._ids = itertools.count()

    # -- requests -----------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        ids = self.models.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("empty prompt: give at least one token")
        return ids

    @property
    def max_positions(self) -> int:
        """Positions a request may reach: the target's limit (a batch engine's cache may hold fewer)."""
        return self.models.max_positions

    def start(self, prompt: str | list[int], max_new_tokens: int = 64,
              sampling: SamplingParams = SamplingParams(), seed: int = 0,
              request_id: str | None = None, workload: str | None = None,
              method: str | None = None) -> Request:
        """Tokenise, check, and prefill all prompt tokens but the last into the target cache.
        `method` is only recorded (in the telemetry): the caller's controller decides."""
        ids = self.encode(prompt)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        limit = self.models.max_positions
        if len(ids) >= limit:
            raise ValueError(f"prompt has {len(ids)} tokens; the target's limit is {limit} positions")
        request = Request(
            request_id=request_id or f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}",
            tokens=ids, prompt_len=len(ids), max_new_tokens=max_new_tokens, sampling=sampling,
            generator=torch.Generator().manual_seed(seed), cache=None, workload=workload,
            method=method)
        request.peek = functools.partial(self.peek, request)
        self.prefill(request)
        return request

    def peek(self, request: Request, name: str, k: int) -> Draft | None:
        """The proposal drafter `name` would make now, for a controller deciding before the
        step — only from a look-up drafter (`Drafter.peekable`: ngram, suffix; None from the
        others, whose proposal is a model's forward). The step that follows at this context
        uses it (cut to its k) instead of drafting again, and is charged its seconds."""
        drafter = self.drafter_for(request, name)
        if not drafter.peekable:
            return None
        t0 = time.perf_counter()
        draft = drafter.propose(self._context(request), k)
        request.peeked[name] = (len(request.tokens), k, draft, time.perf_counter() - t0, False)
        return draft

    @torch.inference_mode()
    def prefill(self, request: Request) -> None:
        """Give the request its own target cache, holding all its tokens but the last."""
        request.cache = new_cache(self.models.target)
        if len(request.tokens) > 1:
            cached_forward(self.models.target, torch.tensor([request.tokens[:-1]]), request.cache,
                           self.kwarg, last=1)

    def drafter_for(self, request: Request, name: str) -> Drafter:
        if name not in request.drafters:
            options = self.drafter_options if request.drafter_options is None else request.drafter_options
            request.drafters[name] = create_drafter(name, self.models, **options.get(name, {}))
        return request.drafters[name]

    # -- the loop -----------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, request: Request, drafter_name: str | None, k: int) -> list[int]:
        """One speculative round. Returns the tokens it appended."""
        # 1. propose (k clamped to what the request may still emit)
        rnd = self.propose(request, drafter_name, k)
        t1 = time.perf_counter()

        # 2. verify: one target forward over [newest token] + draft, (k+1, V) logits
        verify_input = torch.tensor([[request.tokens[-1], *rnd.draft_tokens]])
        target_logits = cached_forward(self.models.target, verify_input, request.cache, self.kwarg)[0]

        # 3. accept
        accepted, next_token = self.accept(rnd, target_logits)

        # 4. roll back the target's cache to what is now the context (all but next_token)
        rollback(request.cache, rnd.context + 1 + accepted)
        emitted = self._append(request, rnd.draft_tokens[:accepted] + [next_token])

        # 5. record telemetry, tell the drafter
        self.observe(rnd, accepted, emitted, verify_seconds=time.perf_counter() - t1)
        return emitted

    def clamp_k(self, request: Request, k: int) -> int:
        """k cut to what the request may still emit (the target adds one) and still fits."""
        room = min(request.max_new_tokens - len(request.output) - 1,
                   self.max_positions - len(request.tokens) - 1)
        return max(0, min(k, room))

    def propose(self, request: Request, drafter_name: str | None, k: int) -> "Round":
        """Step 1 for one request: clamp k, ask the drafter, time it."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        context = len(request.tokens) - 1  # tokens in the target's cache
        k = self.clamp_k(request, k) if drafter_name else 0
        t0 = time.perf_counter()
        drafter = self.drafter_for(request, drafter_name) if k else None
        peeked = request.peeked.pop(drafter_name, None) if drafter else None
        # a controller's look-ups ran inside its decision but are the drafters' work (indexing,
        # matching), whether this step drafts from them or not (another drafter's, a plain
        # step's): they count as the step's draft seconds and leave the controller's
        looked = [p for p in (*request.peeked.values(), peeked) if p is not None and not p[4]]
        request.lookup_seconds = sum(p[3] for p in looked)
        request.peeked.clear()  # looked up at an older context, or for another drafter
        drafted = 0.0  # seconds of the engine's own draft made before the step (batch_draft)
        if peeked is not None and peeked[0] == len(request.tokens) and peeked[1] >= k:
            draft = peeked[2]
            drafted = peeked[3] if peeked[4] else 0.0
        else:
            draft = drafter.propose(self._context(request), k) if drafter else Draft.empty()
        return Round(request, drafter_name if drafter else "none", k, drafter, draft,
                     draft.tokens[:k], context,
                     time.perf_counter() - t0 + request.lookup_seconds + drafted)

    @staticmethod
    def accept(rnd: "Round", target_logits: torch.Tensor) -> tuple[int, int]:
        """Step 3 for one request: target_logits (len(draft_tokens) + 1, V) -> (accepted, next_token)."""
        request, draft_tokens = rnd.request, rnd.draft_tokens
        if request.sampling.greedy:
            # on CUDA the fused Triton verification kernel; on CPU the pure function
            accept = fused_greedy_accept if target_logits.is_cuda else greedy_accept
            return accept(draft_tokens, target_logits)
        target_probs = probs_from_logits(target_logits, request.sampling)
        draft_probs = rnd.draft.draft_probs
        draft_probs = draft_probs[:len(draft_tokens)] if draft_probs is not None else None
        return rejection_accept(draft_tokens, draft_probs, target_probs, request.generator)

    def observe(self, rnd: "Round", accepted: int, emitted: list[int], verify_seconds: float,
                batch_size: int = 1, batch_tokens: int | None = None,
                batch_width: int | None = None) -> StepRecord:
        """Step 5 for one request: its StepRecord, and the drafter told what was kept. In a
        batch the weights are read once for all rows: each row is charged its share."""
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
            batch_width=batch_width or verify_tokens)
        request.steps.append(record)
        if rnd.drafter:
            rnd.drafter.observe(Verified(len(rnd.draft_tokens), accepted, emitted))
        return record

    def _context(self, request: Request) -> DraftContext:
        return DraftContext(request.tokens, request.sampling, request.generator, request.prompt_len)

    def _append(self, request: Request, tokens: list[int]) -> list[int]:
        """Append tokens one by one, honouring EOS, max_new_tokens and the position limit."""
        emitted = []
        for token in tokens:
            request.tokens.append(token)
            emitted.append(token)
            if token in self.eos_ids:
                request.finish_reason = "stop"
            elif (len(request.output) >= request.max_new_tokens
                  or len(request.tokens) >= self.max_positions):
                request.finish_reason = "length"
            if request.done:
                break
        return emitted

    def finish(self, request: Request) -> Generation:
        """The request's result and telemetry. Its drafters are told it ended (`finish`), here
        and not in a finalizer: what they publish (the suffix drafter's output, to the shared
        index) is then there before the caller's next request starts."""
        for drafter in request.drafters.values():
            drafter.finish(self._context(request))
        record = summarise(request.request_id, request.prompt_len, request.steps,
                           time.perf_counter() - request.started, request.workload,
                           request.finish_reason or "length", request.method)
        text = self.models.tokenizer.decode(request.output, skip_special_tokens=True)
        return Generation(text, list(request.output), record)

    def generate(self, prompt: str | list[int], *, drafter: str | None = "ngram", k: int = 4,
                 controller: Controller | None = None, max_new_tokens: int = 64,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 workload: str | None = None,
                 on_tokens: Callable[[list[int]], None] | None = None,
                 policy: Controller | None = None) -> Generation:
        """Generate one completion. A `controller` overrides the static (drafter, k)
        (`policy=` is its deprecated name)."""
        controller = controller or policy
        if controller is None:
            if drafter is not None:
                self.check_drafter(drafter, k)
            controller = StaticController(drafter, k)
        sampling = SamplingParams(temperature, top_k, top_p)
        request = self.start(prompt, max_new_tokens, sampling, seed, workload=workload)
        while not request.done:
            t0 = request.step_started = time.perf_counter()
            name, step_k = controller.decide(request)
            t1 = time.perf_counter()
            emitted = self.step(request, name, step_k)
            t2 = time.perf_counter()
            controller.update(request.steps[-1], request)
            request.steps[-1].controller_seconds = (t1 - t0) + (time.perf_counter() - t2) \
                - request.lookup_seconds  # the drafter's look-up, charged as draft seconds
            if on_tokens:
                on_tokens(emitted)
        return self.finish(request)

    def check_drafter(self, drafter: str, k: int) -> None:
        """Fail before any work on an unknown drafter or k <= 0 (k = 0 means drafter=None)."""
        from autospec.drafters.base import drafter_class
        drafter_class(drafter)
        if k <= 0:
            raise ValueError(f"k must be >= 1 with drafter '{drafter}', got {k} "
                             f"(for plain decoding pass drafter=None)")
