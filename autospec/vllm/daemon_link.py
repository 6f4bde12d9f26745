"""The vLLM proposer's link to `autospec daemon`: the serving process's DaemonClient (serve's,
the same schema and batching) on a thread of its own with its own event loop, so that nothing
the daemon does — slow, down, killed, restarted — ever reaches vLLM's step.

Out: `submit(record)` hands a finished request's RequestRecord to the loop thread (O(1); a
full buffer drops its oldest and counts it). In: the latest GET /v1/params answer, pulled at
start and every `interval` seconds; the proposer takes it between steps (`take_params`).
"""
from __future__ import annotations

import asyncio
import logging
import threading

from autospec.serve.client import ClientStats, DaemonClient

log = logging.getLogger("vllm.autospec")  # under vLLM's logger: its handlers and format


class DaemonLink:
    def __init__(self, url: str, model_pair: str, hardware: str, interval: float = 5.0,
                 flush_interval: float = 0.5):
        self.interval = interval
        self._loop = asyncio.new_event_loop()
        self.client = DaemonClient(url, model_pair, hardware, flush_interval=flush_interval)
        self._params: dict | None = None
        self._fresh = False
        self._stopped = False
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="autospec-daemon-link", daemon=True)
        self._thread.start()

    @property
    def stats(self) -> ClientStats:
        return self.client.stats

    def submit(self, record) -> None:
        """Any thread; never blocks."""
        if not self._stopped:
            self._loop.call_soon_threadsafe(self.client.submit, record)

    def take_params(self) -> dict | None:
        """The params pulled since the last call (None: nothing new)."""
        if not self._fresh:
            return None
        self._fresh = False
        return self._params

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        sender = asyncio.ensure_future(self.client.run())
        was_up = None
        while not self._stop.is_set():
            params = await self.client.fetch_params()
            if params is not None:
                self._params, self._fresh = params, True
            if (params is not None) != was_up:
                log.info("autospec: daemon %s (%s)", "reached" if params else "unreachable",
                         self.client.url)
                was_up = params is not None
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
        sender.cancel()
        await self.client.drain(2.0)
        await self.client.close()

    def close(self, timeout: float = 3.0) -> None:
        """Send what is buffered (at most `timeout` seconds), then stop the thread."""
        if self._stopped:
            return
        self._stopped = True
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
