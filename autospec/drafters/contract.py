"""The drafter contract: what a drafter is (`Drafter`), what it proposes (`Draft`), what it
may look at (`DraftContext`), what it is told (`Verified`), and `register`, the class decorator
a drafter names itself with. The built-in drafters import this module; the registry that
creates them by name (and loads them, and the plugins) is drafters/base.py, above them."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from autospec.confidence import StopRule
from autospec.models.sampling import SamplingParams


def agreeing_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences — how many drafted tokens
    the target's own tokens confirm. The one definition: greedy acceptance, the controller's
    n-gram counterfactual, trace recording, a drafter's cache against the context."""
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    if a == b:  # the usual case for a cache, one C-level compare
        return n
    if n <= 64:  # a draft: a Python loop beats building arrays
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return i
        return n  # equal elements in sequences of different types (a tuple and a list)
    diff = np.flatnonzero(np.asarray(a) != np.asarray(b))
    return int(diff[0]) if len(diff) else n


@dataclass
class Draft:
    """What a drafter proposes: at most k token ids, and (when it has them) the distribution
    each was drawn from. draft_probs: (len(tokens), V) float32, or None = point mass.
    confidences: one per token in [0, 1], the drafter's own belief in it (a model drafter's
    probability of the token, a look-up's evidence score: autospec/confidence.py), made where
    the proposal is; None: the drafter has none (the controller then uses per-position means)."""
    tokens: list[int]
    draft_probs: torch.Tensor | None = None
    bytes_read: int = 0  # weights + KV the drafter read, for bandwidth accounting
    confidences: list[float] | None = None

    @classmethod
    def empty(cls) -> "Draft":
        return cls([])


@dataclass
class DraftContext:
    """What the drafter may look at: every token so far (prompt + output; the last one is the
    target's newest and not yet verified-from), and the request's sampling settings."""
    tokens: list[int]
    sampling: SamplingParams
    generator: torch.Generator | None = None
    prompt_len: int = 0
    # the target's last hidden state at each cached position (len(tokens) - 1, D), where the
    # engine keeps them (its pair has a feature head): what a feature-level drafter reads
    hidden: torch.Tensor | None = None
    # where a model drafter stops this row's drafting by its tokens' confidences (the
    # controller's Decision.stop; None: at k)
    stop: StopRule | None = None


@dataclass
class Verified:
    """What the target decided about the last draft (passed to `observe`)."""
    proposed: int
    accepted: int
    emitted: list[int] = field(default_factory=list)  # accepted drafts + bonus/recovered token


class Drafter(ABC):
    name: str = "?"
    # propose() is a look-up (no model forward, the tokens alone: its context carries no
    # features): a controller may see the proposal before it decides (Engine.peek), and the
    # step reuses it
    peekable: bool = False
    # Guess of (seconds per drafted token) / (seconds per target step), before measurements.
    cost_hint: float = 0.1

    @classmethod
    def runs_on(cls, models) -> bool:
        """Whether this pair has what the drafter needs (a draft model, a feature head)."""
        return True

    @classmethod
    def batch_drafting(cls, models, max_batch: int, max_len: int, **options):
        """What drafts for many rows of a step at once — `propose(rows) -> (drafts, seconds)`
        and `reset(slot)`, rows by engine slot (drafters/draft_model.py's BatchDraftModel) — or
        None: the engine then asks each row's own drafter. `options` as the constructor's."""
        return None

    def reset(self) -> None:
        """Forget per-request state (called once before a request's first step)."""

    @abstractmethod
    def propose(self, ctx: DraftContext, k: int) -> Draft:
        """At most k next tokens after ctx.tokens. An empty draft is legal."""

    def observe(self, result: Verified) -> None:
        """Told what the target kept; drafters with caches roll back here or lazily."""

    def finish(self, ctx: DraftContext) -> None:
        """The request has ended with ctx.tokens (Engine.finish calls it on every drafter the
        request used; it has seen only the steps it drafted): publish what should outlive the
        request. Default: nothing to do."""


# name -> factory(models, **options) -> Drafter: read by the registry (drafters/base.py)
_REGISTRY: dict[str, type] = {}


def register(name: str):
    """Class decorator: `@register("ngram")`."""
    def wrap(cls):
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return wrap
