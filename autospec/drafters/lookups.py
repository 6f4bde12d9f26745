"""A host's drafters per row, and the look-up a controller makes before a step: one component
for every host — the engine and replay (engine/jobs.py `Host`, which charges a look-up on its
own clock), the vLLM proposer (autospec/vllm/proposer.py) and a caller that decides one row on
its own (`decide_one`'s default peek, controller/interface.py: tests, simple scripts).

A row's drafters are made from the registry on first use, with the row's options where it has
its own (`drafter_options`), else the host's. They live on the row where it keeps them
(`drafters`: the engine's requests, so they go with the request whatever ends it), else here
by request id until `release`. `Lookups.peek` is a controller's `Peek`
(controller/interface.py): the proposal a look-up drafter (its class's `peekable`: n-gram,
suffix) would make now at a row's tokens."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from autospec.drafters.base import (Draft, DraftContext, Drafter, check_draft, create_drafter,
                                    drafter_class)
from autospec.models.sampling import SamplingParams


class LookupRow(Protocol):
    """What a look-up reads of a row (a controller's Row, controller/interface.py, is one)."""
    request_id: str
    tokens: list[int]  # prompt + output so far
    prompt_len: int


def lookup_drafters(names: Sequence[str]) -> tuple[str, ...]:
    """The look-up drafters among `names` (no model forward: a host without models runs them)."""
    return tuple(name for name in names if drafter_class(name).peekable)


@dataclass
class Lookups:
    """A host's drafters per row (the module docstring). `clock` times a look-up; `seconds`
    sums the look-ups' time since the last `take_seconds`."""
    options: dict[str, dict] = field(default_factory=dict)
    models: object = field(default=None, repr=False)
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)
    _drafters: dict[str, dict[str, Drafter]] = field(default_factory=dict, repr=False)
    _seconds: float = 0.0

    def drafter(self, row: LookupRow, name: str) -> Drafter:
        """The row's drafter `name`, made on first use."""
        drafters = self._of(row)
        drafter = drafters.get(name)
        if drafter is None:
            own = getattr(row, "drafter_options", None)
            options = self.options if own is None else own
            drafter = drafters[name] = create_drafter(name, self.models, **options.get(name, {}))
        return drafter

    def peek(self, row: LookupRow, name: str, k: int,
             context: DraftContext | None = None) -> Draft | None:
        """What look-up drafter `name` proposes now at the row's tokens (`context`: the host's
        view of the row, default its tokens alone), up to k tokens; None where `name` is not a
        look-up drafter."""
        if not drafter_class(name).peekable:
            return None
        drafter = self.drafter(row, name)
        t0 = self.clock()
        draft = check_draft(name, drafter.propose(context or _bare(row), k))
        self._seconds += self.clock() - t0
        return draft

    def take_seconds(self) -> float:
        seconds, self._seconds = self._seconds, 0.0
        return seconds

    def release(self, row: LookupRow, context: DraftContext | None = None) -> None:
        """The row's request has ended (or was aborted): its drafters publish (`finish`, at
        `context`, default its tokens alone); those kept here go (a row's own go with it)."""
        own = getattr(row, "drafters", None)
        drafters = own if own is not None else self._drafters.pop(row.request_id, {})
        for drafter in list(drafters.values()):
            drafter.finish(context or _bare(row))

    def _of(self, row: LookupRow) -> dict[str, Drafter]:
        own = getattr(row, "drafters", None)
        return own if own is not None else self._drafters.setdefault(row.request_id, {})


def _bare(row: LookupRow) -> DraftContext:
    return DraftContext(row.tokens, SamplingParams(), None, row.prompt_len)
