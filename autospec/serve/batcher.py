"""The serving process's one decode thread: continuous batching over a bounded wait queue.

The event loop never touches the engine. It hands the thread a request (`submit`) and awaits
two futures: `started` (the request holds a row, or could not get one: too long for a row) and
`done` (its Generation). Between two batched steps the thread runs the calls queued for it
(`call`: chat rendering, parameter updates — the tokenizer and the controllers are its alone,
so they need no lock), admits waiting requests into free rows, and then advances every active
row in one target forward (`Engine.advance`, the step `Engine.run` takes too).

Admission is bounded twice: at most `max_batch` rows decode (the RowCache's slots) and at most
`max_queue` requests wait for one beyond the rows that are free. A request past both is
refused at once (`QueueFull`, an HTTP 429 with Retry-After) rather than queued without limit:
a client can back off or go to another replica, and every request that was accepted is
decoded, even through a shutdown (`close` lets the queue drain first).
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Callable

import torch

from autospec.engine.loop import Engine
from autospec.controller.interface import Controller
from autospec.engine.request import Request

OnTokens = Callable[[list[int], bool], None]  # (tokens appended by a step, the request ended)


class QueueFull(Exception):
    """The wait queue is at its bound; `retry_after`: whole seconds until a row is likely free."""

    def __init__(self, waiting: int, retry_after: int):
        super().__init__(f"server busy: {waiting} requests already wait for a batch row "
                         f"(--max-queue); retry after {retry_after} s")
        self.retry_after = retry_after


@dataclass
class Row:
    """An admitted request: what decodes it and where its tokens go."""
    request: Request
    controller: Controller
    on_tokens: OnTokens | None = None
    ticket: "Ticket | None" = None


@dataclass
class Ticket:
    """An accepted request, waiting or decoding. `start` runs on the decode thread when a row
    is free and returns the Row (or raises: the request then fails, `started` says why)."""
    start: Callable[[Engine], Row]
    started: Future = field(default_factory=Future)  # -> None, once it holds a row
    done: Future = field(default_factory=Future)  # -> Generation
    # when it was accepted: the request's start, as Engine.run counts a client's (its
    # wall time and time to first token include the wait for a row)
    accepted: float = field(default_factory=time.perf_counter)


class DecodeLoop:
    """The decode thread owning `engine` (see the module docstring)."""

    def __init__(self, engine: Engine, max_queue: int, own_thread: bool = True):
        """own_thread: decode on a thread of its own (in-process use, tests); False: the
        caller runs `run_here()` — `autospec serve` decodes on the main thread, where torch's
        OpenMP regions run at full speed (see `_loop`)."""
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.engine, self.max_queue = engine, max_queue
        self._wake = threading.Condition()
        self._waiting: deque[Ticket] = deque()
        # rows no request holds, as the decode thread last counted them: the waiting requests
        # take them first, so max_queue bounds those beyond them (counting only the waiting,
        # six requests arriving together at one free row and one queue place were all but one
        # refused whenever they came before the thread had admitted the first)
        self._free = engine.max_batch
        self._calls: deque[tuple[Callable, tuple, Future]] = deque()
        self._closing = False
        self._request_seconds = 1.0  # moving average of a request's wall time: Retry-After
        self._thread = None
        if own_thread:
            self._thread = threading.Thread(target=self._loop, name="autospec-decode", daemon=True)
            self._thread.start()

    def run_here(self) -> None:
        """Decode on the calling thread until `close()` (from another thread) and the queue
        drains."""
        self._loop()

    # -- any thread ------------------------------------------------------------------------
    def submit(self, start: Callable[[Engine], Row]) -> Ticket:
        """Queue a request for a row; QueueFull when max_queue already wait beyond the rows
        no request holds."""
        ticket = Ticket(start)
        with self._wake:
            if self._closing:
                raise RuntimeError("the decode loop is closed")
            if len(self._waiting) >= self.max_queue + self._free:
                # the queue drains a batch's worth of requests per request wall time
                turns = math.ceil(len(self._waiting) / self.engine.max_batch)
                raise QueueFull(len(self._waiting), max(1, math.ceil(turns * self._request_seconds)))
            self._waiting.append(ticket)
            self._wake.notify()
        return ticket

    def call(self, fn: Callable, *args) -> Future:
        """Run fn(*args) on the decode thread before its next step."""
        future: Future = Future()
        with self._wake:
            self._calls.append((fn, args, future))
            self._wake.notify()
        return future

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def close(self, timeout: float | None = None) -> None:
        """Decode every accepted request, then end the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the decode thread -----------------------------------------------------------------
    def _loop(self) -> None:
        if (self.engine.models.target.device.type == "cpu"
                and threading.current_thread() is not threading.main_thread()):
            # torch's OpenMP regions issued from a thread other than the main one are slow in
            # this build: measured on the 2-core machine, a 3-token verify forward 9-10 ms from
            # such a thread against 6 ms from the main one (a 1-token one 4.7 against 4.4),
            # and 6.2 ms with one intra-op thread. Skewed step times made drafting look dear
            # to the controller (the demo chose plain decoding on 28-51 % of steps). Off the
            # main thread, then, one intra-op thread; `autospec serve` decodes on the main one.
            torch.set_num_threads(1)
        active: list[Row] = []
        while True:
            with self._wake:
                while not (self._calls or self._waiting or active or self._closing):
                    self._wake.wait()
                if self._closing and not (self._calls or self._waiting or active):
                    return
                calls, self._calls = self._calls, deque()
            for fn, args, future in calls:
                _settle(future, fn, *args)
            with self._wake:  # after the calls: a request waits (and counts) until it joins
                free = self.engine.max_batch - len(active)
                joining = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
                self._free = free - len(joining)
            for ticket in joining:
                row = _settle(ticket.started, ticket.start, self.engine)
                if row is None:
                    _deliver(ticket.done, exc=_failure(ticket.started))
                else:
                    row.ticket, row.request.started = ticket, ticket.accepted
                    active.append(row)
            if active:
                active = self._step(active)
            with self._wake:
                self._free = self.engine.max_batch - len(active)

    def _step(self, active: list[Row]) -> list[Row]:
        """One batched step; the rows still decoding after it."""
        try:
            emitted = self.engine.advance([(row.request, row.controller) for row in active])
        except Exception as exc:  # a bug, not a request's fault: fail the batch, keep serving
            for row in active:
                self.engine.abandon(row.request)
                row.controller.release(row.request)
                _deliver(row.ticket.done, exc=exc)
            return []
        still = []
        for row, tokens in zip(active, emitted):
            try:
                if row.on_tokens and (tokens or row.request.done):  # none while it prefills
                    row.on_tokens(tokens, row.request.done)
                done = row.request.done  # or ended by on_tokens (a stop string)
                if done:
                    row.controller.release(row.request)  # a stop string: after its record
                    generation = self.engine.finish(row.request)
            except Exception as exc:
                self.engine.abandon(row.request)
                row.controller.release(row.request)
                _deliver(row.ticket.done, exc=exc)
                continue
            if done:
                seconds = time.perf_counter() - row.request.started
                self._request_seconds += 0.1 * (seconds - self._request_seconds)
                _deliver(row.ticket.done, generation)
            else:
                still.append(row)
        return still


def _settle(future: Future, fn: Callable, *args):
    """future <- fn(*args) or its exception; returns the result (None on an exception)."""
    try:
        result = fn(*args)
    except Exception as exc:  # handed to the awaiting side
        _deliver(future, exc=exc)
        return None
    _deliver(future, result)
    return result


def _deliver(future: Future, result=None, exc: BaseException | None = None) -> None:
    """Resolve `future` unless its awaiting side cancelled it (a handler cancelled while it
    waited): the decode thread must not die of it, and the request still decodes."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass  # cancelled


def _failure(future: Future) -> BaseException:
    return RuntimeError("the request was cancelled") if future.cancelled() else future.exception()
