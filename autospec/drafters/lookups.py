"""The look-ups of a host that has no engine: the vLLM proposer (autospec/vllm/proposer.py),
and a caller that decides one row on its own (`decide_one`'s default peek,
controller/interface.py: tests, simple scripts). The engine and replay look up through
their `Host.peek` instead (engine/jobs.py), which keeps each request's drafters on the
request and charges the look-up on the host's clock.

`Lookups.peek` is a controller's `Peek` (controller/interface.py): the proposal a look-up
drafter (its class's `peekable`: n-gram, suffix) would make now at a row's tokens."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

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
    """A host's look-up drafters, one per (row, drafter), made from the registry: the `peek` of
    a host that has no engine (the vLLM proposer; `decide_one`). `seconds` sums the look-ups'
    time since the last `take_seconds`."""
    options: dict[str, dict] = field(default_factory=dict)
    models: object = None
    _drafters: dict[tuple[str, str], Drafter] = field(default_factory=dict)
    _seconds: float = 0.0

    def peek(self, row: LookupRow, name: str, k: int) -> Draft | None:
        if not drafter_class(name).peekable:
            return None
        key = (row.request_id, name)
        drafter = self._drafters.get(key)
        if drafter is None:
            drafter = self._drafters[key] = create_drafter(name, self.models,
                                                           **self.options.get(name, {}))
        t0 = time.perf_counter()
        draft = check_draft(name, drafter.propose(DraftContext(row.tokens, SamplingParams(),
                                                               None, row.prompt_len), k))
        self._seconds += time.perf_counter() - t0
        return draft

    def take_seconds(self) -> float:
        seconds, self._seconds = self._seconds, 0.0
        return seconds

    def release(self, row: LookupRow) -> None:
        """The row's request has ended (or was aborted): its drafters publish and go."""
        for key in [key for key in self._drafters if key[0] == row.request_id]:
            drafter = self._drafters.pop(key)
            drafter.finish(DraftContext(row.tokens, SamplingParams(), None, row.prompt_len))
