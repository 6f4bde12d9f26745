"""The one contract between a controller and the loop that hosts it.

Three hosts drive a controller, and each needs only this module and the drafter registry
(and, a host without an engine, its look-ups: `drafters/lookups.py`): the engine
(`engine/jobs.py`, one step over its rows), replay (`bench/recorded.py`, the same loop over a
recorded target) and vLLM's proposer (`autospec/vllm/proposer.py`). A host

1. tells the controller once, before its first step, which drafters it can run (`bind`);
2. asks, when a prompt chunk would ride in the step, how many tokens may (`chunk_budget`);
3. before every step hands it the step's rows as one value (`Step`) and gets one `Decision`
   per row (`decide`);
4. after the step hands it the step's outcome as one value (`Outcome`: a `StepRecord` per
   row) (`observe`);
5. when a request ends where no Outcome says so (aborted, or finished by a host that learns
   it only after the fact: vLLM's scheduler), tells it to forget the row (`release`).

Every method is abstract: a host never probes for one. What a controller knows of a drafter
is what the drafter's class declares (`Drafter.peekable`, `cost_hint`), never its name.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol, Sequence

from autospec.confidence import StopRule
from autospec.drafters.base import Draft
from autospec.drafters.lookups import Lookups
from autospec.telemetry import StepRecord


class Row(Protocol):
    """What a controller reads of a row (engine.request.Request is one; so are replay's and
    the vLLM proposer's rows)."""
    request_id: str
    tokens: list[int]  # prompt + output so far
    prompt_len: int
    workload: str | None

    @property
    def done(self) -> bool: ...


# peek(row, drafter, k): the proposal look-up drafter `drafter` would make now (the step then
# reuses it), or None where `drafter` is not a look-up drafter (its class's `peekable`)
Peek = Callable[[Row, str, int], "Draft | None"]


class Decision(NamedTuple):
    """A row's choice for one step: its drafter and K (None, 0: decode plain), and where a
    model drafter stops the row before K by its tokens' confidences (`stop`, a StopRule:
    autospec/confidence.py; None: it drafts K)."""
    drafter: str | None
    k: int
    stop: StopRule | None = None


PLAIN = Decision(None, 0)


@dataclass
class Step:
    """What a controller decides over: the step's rows in order, the host's look-up (`peek`),
    and the prompt tokens riding in the step beside them (0: none; `chunk_budget` bounded it)."""
    rows: Sequence[Row]
    peek: Peek
    chunk: int = 0


@dataclass
class Outcome:
    """What the step did: one StepRecord per row of the Step, in its order (each with the
    step's batch size, positions, forward seconds and the row's proposed / accepted)."""
    records: Sequence[StepRecord]
    rows: Sequence[Row]


class Controller(ABC):
    """Chooses (drafter, K) for every row before each step; told each step's outcome after."""

    @abstractmethod
    def bind(self, drafters: tuple[str, ...]) -> None:
        """The drafters this host can run: once, before the controller's first step there (a
        controller that several hosts drive is told by each). A controller never picks one
        outside them."""

    @abstractmethod
    def chunk_budget(self, rows: int, default: int) -> int:
        """Prompt tokens a joining request may add to a step of `rows` decoding rows, at most
        `default` (the host's chunk)."""

    @abstractmethod
    def decide(self, step: Step) -> list[Decision]:
        """One Decision per row of `step`, in its order."""

    @abstractmethod
    def observe(self, outcome: Outcome) -> None:
        """The step's records, one per row of the Step decided. A row whose request is `done`
        is forgotten after its record."""

    @abstractmethod
    def release(self, row: Row) -> None:
        """The row's request has ended (finished or aborted): forget what is kept for it."""


class RowController(Controller):
    """A controller that decides each row on its own (the baselines): `decide_row` and
    `observe_row`; binds to nothing and lets any chunk ride."""

    def bind(self, drafters: tuple[str, ...]) -> None:
        pass

    def chunk_budget(self, rows: int, default: int) -> int:
        return default

    def decide(self, step: Step) -> list[Decision]:
        return [self.decide_row(row) for row in step.rows]

    def observe(self, outcome: Outcome) -> None:
        for record, row in zip(outcome.records, outcome.rows):
            self.observe_row(record, row)
            if row.done:
                self.release(row)

    def release(self, row: Row) -> None:
        pass

    @abstractmethod
    def decide_row(self, row: Row) -> Decision: ...

    def observe_row(self, record: StepRecord, row: Row) -> None:
        pass


@dataclass
class StaticController(RowController):
    """The same (drafter, k) every step; (None, 0) is plain decoding."""
    drafter: str | None
    k: int

    def decide_row(self, row: Row) -> Decision:
        return Decision(self.drafter, self.k)


def decide_one(controller: Controller, row: Row, peek: Peek | None = None) -> Decision:
    """A batch of one (a caller that steps one row: tests, simple scripts); its peek by
    default a fresh `Lookups`' (drafters/lookups.py)."""
    return controller.decide(Step([row], peek or Lookups().peek))[0]


def observe_one(controller: Controller, record: StepRecord, row: Row) -> None:
    controller.observe(Outcome([record], [row]))
