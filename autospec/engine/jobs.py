"""Engine.run: the loop over many requests (closed: N clients; open: requests sent at given
times), each step one `Engine.advance` over the rows in flight. Written as a function over
the engine (bound as its `run` method) so that loop.py holds the step and its parts."""
from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from autospec.engine.request import Controller, Generation, Job, Request, StaticController

if TYPE_CHECKING:
    from autospec.engine.loop import Engine


def run_jobs(self: "Engine", jobs: Iterable[Job], controller: Controller | None = None,
             max_batch: int | None = None,
             on_tokens: Callable[[Request, list[int]], None] | None = None,
             arrivals: Sequence[float] | None = None,
             on_refused: Callable[[int, str], None] | None = None) -> list[Generation | None]:
    """Continuous batching over `jobs` in order, up to max_batch rows (default: all), the
    generations in job order. Closed loop (no `arrivals`): max_batch clients, each sending
    its next job when its last one ends; a job that cannot start (too long) ends the run.
    Open loop: job i is sent `arrivals[i]` s after the start and queues for a row
    (Request.queue_seconds); one that cannot start is refused (`on_refused(i, why)`, its
    generation None). A request's `started`, hence its TTFT, is when it was sent."""
    max_batch = self.max_batch if max_batch is None else max_batch
    if not 1 <= max_batch <= self.max_batch:
        raise ValueError(f"max_batch must be in 1..{self.max_batch} (the cache's rows), "
                         f"got {max_batch}")
    controller = controller or StaticController(None, 0)
    pending = deque(enumerate(jobs))
    results: list[Generation | None] = [None] * len(pending)
    t0 = time.perf_counter()
    submitted = deque([t0] * max_batch)  # closed loop: when each client sent its next job
    sends = None if arrivals is None else [t0 + t for t in arrivals]  # open loop
    active: dict[int, Request] = {}
    try:
        while pending or active:
            while pending and len(active) < max_batch:
                i, job = pending[0]
                sent = submitted[0] if sends is None else sends[i]
                if sent > time.perf_counter():
                    break  # not sent yet
                pending.popleft()
                if sends is None:
                    submitted.popleft()
                try:
                    request = self.start(job.prompt, job.max_new_tokens, job.sampling,
                                         job.seed, job.request_id, job.workload)
                except ValueError as exc:
                    if sends is None:
                        raise
                    if on_refused:
                        on_refused(i, str(exc))
                    continue
                request.queue_seconds = request.started - sent
                request.started = sent
                active[i] = request
            if not active:  # open loop, idle: until the next job is sent
                time.sleep(max(0.0, sends[pending[0][0]] - time.perf_counter()))
                continue
            rows = list(active.items())
            emitted = self.advance([(request, controller) for _, request in rows])
            for (i, request), tokens in zip(rows, emitted):
                if on_tokens and tokens:  # none while it prefills (prefill_chunk)
                    on_tokens(request, tokens)
                if request.done:
                    results[i] = self.finish(active.pop(i))
                    submitted.append(time.perf_counter())
    finally:  # a run that fails (a job that cannot start, closed loop): free the rows
        for request in active.values():
            self.abandon(request)
    return results
