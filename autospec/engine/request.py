"""A request's own state, and the values that pass between the engine and its callers.

`Request` is one generation in flight: its tokens, its row of the engine's KV cache, its
drafters and its steps. `Round` is one request's part of a step between propose and observe.
A controller (controller/interface.py) decides (drafter, k) for each row before the step; the
step decides nothing.
"""
from __future__ import annotations

import atexit
import gc
import time
from dataclasses import dataclass, field

import torch

from autospec.confidence import StopRule
from autospec.drafters.base import Draft, Drafter
from autospec.models.sampling import SamplingParams
from autospec.telemetry import RequestRecord, StepRecord


_heap_collected = False


def freeze_heap() -> None:
    """Move every object alive now out of the cyclic garbage collector's reach (gc.freeze),
    after one full collection per process. Called once the models are loaded (the CLI's
    engines, `autospec.load`): a full collection otherwise walks the models' modules,
    parameters, tokenizer and the libraries' own objects (~470k on the reference pair) and
    took 10-160 ms, seven times in a three-run bench at 16 rows — a pause in some step's
    inter-token latency. Frozen objects are still freed by reference counting."""
    global _heap_collected
    if not _heap_collected:
        gc.collect()
        # thawed at exit, so the interpreter's last collection still frees them (nanobind's
        # extensions, triton's, report what is left as leaks)
        atexit.register(gc.unfreeze)
        _heap_collected = True
    gc.freeze()


@dataclass
class Proposal:
    """A draft made before the step that uses it: a controller's look-up (Engine.peek), a
    model drafter's batched drafting (Engine._draft_batched)."""
    at: int  # len(request.tokens) when it was made: stale once a token is added
    k: int  # tokens asked for (the step may use fewer)
    draft: Draft
    seconds: float
    # made by the engine (a batched drafting: the step's draft seconds) or looked up by a
    # controller inside its decision (charged to draft seconds, taken out of the controller's)
    by_engine: bool


@dataclass
class Request:
    """One generation in flight: its tokens, its cache row, its drafters, its steps."""
    request_id: str
    tokens: list[int]  # prompt + output; the target's cache row holds all but the last
    prompt_len: int
    max_new_tokens: int
    sampling: SamplingParams
    generator: torch.Generator  # a sampling drafter's draws (the target's: `seed`, accept.py)
    slot: int | None = None  # its row of the engine's RowCache while it runs
    workload: str | None = None
    method: str | None = None  # as the caller named it (serve: the request's), for telemetry
    drafters: dict[str, Drafter] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    finish_reason: str | None = None
    started: float = field(default_factory=time.perf_counter)
    queue_seconds: float = 0.0  # from when it was sent to when it got its row (Engine.run)
    # drafter options for this request in place of the engine's, set before its first step: a
    # server's tenant (its own suffix index) shares one batch with the other tenants
    drafter_options: dict[str, dict] | None = None
    # the target's log-probabilities of each output token and its `top_logprobs` most likely
    # alternatives (None: not kept); what the step's verify forward scored, TokenLogprob each
    top_logprobs: int | None = None
    logprobs: list["TokenLogprob"] = field(default_factory=list)
    seed: int = 0  # the target's samples: output position t draws position_uniform(seed, t)
    # this step's StopRule for a model drafter (the controller's Decision.stop; None: draft K)
    stop: StopRule | None = None

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def clamp(self, k: int, max_positions: int) -> int:
        """k cut to what the request may still emit (the target adds one) and still fits."""
        room = min(self.max_new_tokens - len(self.output) - 1, max_positions - len(self.tokens) - 1)
        return max(0, min(k, room))

    def append(self, tokens: list[int], eos_ids, max_positions: int) -> list[int]:
        """Append tokens one by one, honouring EOS, max_new_tokens and the position limit:
        the tokens appended."""
        emitted = []
        for token in tokens:
            self.tokens.append(token)
            emitted.append(token)
            if token in eos_ids:
                self.finish_reason = "stop"
            elif len(self.output) >= self.max_new_tokens or len(self.tokens) >= max_positions:
                self.finish_reason = "length"
            if self.done:
                break
        return emitted


@dataclass(frozen=True)
class TokenLogprob:
    """An output token's log-probability under the target (its raw distribution: temperature
    1, before top-k / top-p, as vLLM's default) and the `top` most likely tokens' at that
    position, most likely first."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Generation:
    text: str
    token_ids: list[int]  # the output only
    telemetry: RequestRecord
    logprobs: list[TokenLogprob] | None = None  # one per output token when asked for (start)


@dataclass
class Job:
    """One request for `Engine.run`: what Engine.start takes."""
    prompt: str | list[int]
    max_new_tokens: int = 64
    sampling: SamplingParams = SamplingParams()
    seed: int = 0
    workload: str | None = None
    request_id: str | None = None


@dataclass
class Round:
    """One request's step in flight, between propose and observe (a step holds one per row)."""
    request: Request
    drafter_name: str  # "none" for a plain step
    k: int  # after clamping
    drafter: Drafter | None
    draft: Draft
    draft_tokens: list[int]  # draft.tokens[:k]
    context: int  # tokens in the target's cache row before the step
    draft_seconds: float
