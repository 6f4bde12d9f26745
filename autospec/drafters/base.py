"""The drafter contract, and the registry every drafter is created through.

A drafter is per request (the engine makes one for each request from a factory, so
interleaved requests never share state). The engine never branches on drafter type.

Third-party drafters register through the entry-point group `autospec.drafters`:
    [project.entry-points."autospec.drafters"]
    my-drafter = "my_pkg.drafter:MyDrafter"
where MyDrafter(models: ModelPair, **options) is a Drafter subclass.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Sequence

import numpy as np
import torch

from autospec.confidence import StopRule, check_confidences
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


# The built-in drafters a controller may pick, in its default order (synthetic is for tests).
DEFAULT_DRAFTERS = ("ngram", "eagle", "draft-model", "early-exit")


class Drafter(ABC):
    name: str = "?"
    # propose() is a look-up (no model forward): a controller may see the proposal before it
    # decides (Engine.peek), and the step reuses it
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


# name -> factory(models, **options) -> Drafter
_REGISTRY: dict[str, type] = {}
_entry_points_loaded = False


def register(name: str):
    """Class decorator: `@register("ngram")`."""
    def wrap(cls):
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return wrap


def _load_builtin_and_plugins() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:  # every look-up asks (drafter_class): once is enough
        return
    from autospec.drafters import draft_model, eagle, early_exit, ngram, suffix, synthetic  # noqa: F401
    _entry_points_loaded = True
    for ep in entry_points(group="autospec.drafters"):
        if ep.name not in _REGISTRY:
            cls = ep.load()
            cls.name = ep.name
            _REGISTRY[ep.name] = cls


def check_drafter(where: str, value) -> str:
    """A config field naming one drafter (configcheck's contract: ConfigError naming `where`)."""
    from autospec.configcheck import ConfigError
    known = known_drafters()
    if value not in known:
        raise ConfigError(where, f"unknown drafter {value!r} (known: {', '.join(known)})")
    return value


def check_drafters(where: str, value) -> tuple[str, ...]:
    """A config field listing distinct drafters, in priority order ([] = plain decoding only)."""
    from autospec.configcheck import ConfigError, expected
    if not isinstance(value, (list, tuple)):
        raise expected(where, f"a list of drafters from {', '.join(known_drafters())} "
                              f"([] = plain decoding only)", value)
    names = tuple(check_drafter(f"{where}[{i}]", v) for i, v in enumerate(value))
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"{where}[{i}]", f"drafter {name!r} listed twice")
    return names


def known_drafters() -> list[str]:
    _load_builtin_and_plugins()
    return sorted(_REGISTRY)


def drafter_class(name: str) -> type:
    _load_builtin_and_plugins()
    if name not in _REGISTRY:
        raise ValueError(f"unknown drafter '{name}' (known: {', '.join(sorted(_REGISTRY))})")
    return _REGISTRY[name]


def check_draft(name: str, draft: Draft) -> Draft:
    """A drafter's proposal as a host takes it: its confidences one per token in [0, 1] or
    None (a ValueError names the drafter otherwise). Returns the draft."""
    check_confidences(name, draft.tokens, draft.confidences)
    return draft


def create_drafter(name: str, models, **options) -> Drafter:
    """A fresh per-request drafter. `models` is the engine's ModelPair."""
    return drafter_class(name)(models, **options)
