"""The serving process's side of the daemon: buffered telemetry out, parameters in.

Nothing here is on the decode path. `submit` appends a finished request's record to a bounded
buffer (O(1)); a background task (`run`) sends batches every `flush_interval` seconds. A batch
keeps its batch_id until the daemon acknowledges it, so a re-send after a timeout or a daemon
restart is stored once. When the daemon is down the buffer fills up to `buffer_limit` records,
then the oldest are dropped (and counted): memory stays bounded, serving never waits.

With `share_outputs`, the segments this process's requests hand to their shared suffix indexes
(`submit_output`, from the decode thread) ride in the same batches, and `fetch_outputs` pulls
the other processes' (autospec/daemon/outputs.py).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import socket
import uuid
from collections import deque
from dataclasses import dataclass

import aiohttp

from autospec.telemetry import RequestRecord

log = logging.getLogger("autospec.serve")
OUTPUT_TOKENS_PER_BATCH = 1 << 18  # ~1 MB of JSON; the rest rides in the next batch


@dataclass
class ClientStats:
    submitted: int = 0
    acknowledged_records: int = 0
    acknowledged_batches: int = 0
    failed_sends: int = 0
    dropped_records: int = 0
    params_fetched: int = 0
    outputs_sent: int = 0  # segments in acknowledged batches
    outputs_dropped: int = 0
    outputs_pulled: int = 0


def parse_daemon_url(url: str) -> tuple[str, str | None]:
    """(base URL, Unix socket path or None) for `unix:PATH` or `http(s)://host:port`."""
    if url.startswith("unix:") and len(url) > len("unix:"):
        return "http://localhost", url[len("unix:"):]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"daemon URL {url!r}: expected unix:PATH or http://HOST:PORT")
    return url.rstrip("/"), None


class DaemonClient:
    def __init__(self, url: str, model_pair: str, hardware: str, token: str | None = None,
                 batch_size: int = 64, flush_interval: float = 0.5, buffer_limit: int = 10_000,
                 timeout: float = 2.0, peak_bandwidth_gbs: float | None = None):
        self.url = url
        self.base, self.unix_path = parse_daemon_url(url)
        self.model_pair, self.hardware = model_pair, hardware
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.batch_size, self.flush_interval = batch_size, flush_interval
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.peak = peak_bandwidth_gbs
        self.buffer: deque[RequestRecord] = deque()
        self.buffer_limit = buffer_limit
        self.pending: tuple[str, bytes, int, int] | None = None  # (batch_id, body, records,
        # output segments), unacknowledged
        self.outputs: deque[tuple[str | None, list[int]]] = deque()  # (tenant, tokens) to send
        self.outputs_since, self.outputs_epoch = 0, None  # where the last pull ended
        self.instance = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._seq = itertools.count(1)
        self.stats = ClientStats()
        self.connected = False
        self._session: aiohttp.ClientSession | None = None
        self._wake = asyncio.Event()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.UnixConnector(path=self.unix_path) if self.unix_path else None
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout,
                                                  headers=self.headers)
        return self._session

    # -- telemetry out ---------------------------------------------------------------------
    def submit(self, record: RequestRecord) -> None:
        """Event loop thread. Never blocks, never fails: a full buffer drops its oldest."""
        if len(self.buffer) >= self.buffer_limit:
            self.buffer.popleft()
            self.stats.dropped_records += 1
        self.buffer.append(record)
        self.stats.submitted += 1
        if len(self.buffer) >= self.batch_size:
            self._wake.set()

    def submit_output(self, tenant: str | None, tokens: list[int]) -> None:
        """Any thread (deque appends are atomic). A full queue drops its oldest."""
        if len(self.outputs) >= self.buffer_limit:
            self.outputs.popleft()
            self.stats.outputs_dropped += 1
        self.outputs.append((tenant, list(tokens)))

    @property
    def unacknowledged(self) -> int:
        return len(self.buffer) + (self.pending[2] if self.pending else 0)

    def _next_batch(self) -> tuple[str, bytes, int] | None:
        if self.pending is None and self.buffer:
            records = [self.buffer.popleft() for _ in range(min(self.batch_size, len(self.buffer)))]
            batch_id = f"{self.instance}:{next(self._seq)}"
            segments, tokens = [], 0
            while self.outputs and tokens < OUTPUT_TOKENS_PER_BATCH:
                tenant, output = self.outputs.popleft()
                segments.append({"tenant": tenant, "tokens": output})
                tokens += len(output)
            body = json.dumps({"batch_id": batch_id, "model_pair": self.model_pair,
                               "hardware": self.hardware,
                               "records": [r.to_dict() for r in records],
                               **({"peak_bandwidth_gbs": self.peak} if self.peak else {}),
                               **({"outputs": {"instance": self.instance, "segments": segments}}
                                  if segments else {})})
            self.pending = (batch_id, body.encode(), len(records), len(segments))
        return self.pending

    async def send_once(self) -> bool:
        """Send the pending batch (forming one if needed); True when acknowledged."""
        batch = self._next_batch()
        if batch is None:
            return True
        batch_id, body, count, segments = batch
        try:
            async with self.session.post(f"{self.base}/v1/telemetry", data=body,
                                         headers={"Content-Type": "application/json"}) as reply:
                if reply.status == 200:
                    self.pending = None
                    self.stats.acknowledged_batches += 1
                    self.stats.acknowledged_records += count
                    self.stats.outputs_sent += segments
                    self.connected = True
                    return True
                text = (await reply.text())[:300]
                if 400 <= reply.status < 500 and reply.status not in (408, 429):
                    # the daemon will never take this batch: drop it rather than retry forever
                    log.error("daemon refused a telemetry batch; dropped",
                              extra={"fields": {"status": reply.status, "error": text,
                                                "batch_id": batch_id}})
                    self.stats.dropped_records += count
                    self.stats.outputs_dropped += segments
                    self.pending = None
                    return True
                raise aiohttp.ClientResponseError(reply.request_info, (), status=reply.status,
                                                  message=text)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self.stats.failed_sends += 1
            if self.connected:
                log.warning("daemon unreachable; buffering telemetry",
                            extra={"fields": {"error": str(exc)[:200],
                                              "buffered": self.unacknowledged}})
            self.connected = False
            return False

    async def run(self) -> None:
        """Background task: send batches every flush_interval; back off while the daemon is
        unreachable (0.2 s doubling to 5 s)."""
        backoff = 0.0
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.flush_interval + backoff)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            while self.unacknowledged:
                if not await self.send_once():
                    backoff = min(5.0, max(0.2, backoff * 2))
                    break
                backoff = 0.0

    async def drain(self, timeout: float) -> bool:
        """Try to send everything buffered within `timeout` seconds (at shutdown)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.unacknowledged and loop.time() < deadline:
            if not await self.send_once():
                await asyncio.sleep(0.2)
        return not self.unacknowledged

    # -- parameters in ---------------------------------------------------------------------
    async def fetch_params(self, workload: str | None = None) -> dict | None:
        query = {"model_pair": self.model_pair, "hardware": self.hardware}
        if workload:
            query["workload"] = workload
        try:
            async with self.session.get(f"{self.base}/v1/params", params=query) as reply:
                if reply.status != 200:
                    return None
                self.stats.params_fetched += 1
                return await reply.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            return None

    async def fetch_outputs(self) -> list[tuple[str | None, list[int]]] | None:
        """The other processes' segments logged since the last pull ((tenant, tokens) each,
        oldest first); None if the daemon is unreachable (the next pull catches up)."""
        pulled = []
        while True:
            query = {"model_pair": self.model_pair, "instance": self.instance,
                     "since": str(self.outputs_since), **({"epoch": self.outputs_epoch}
                                                          if self.outputs_epoch else {})}
            try:
                async with self.session.get(f"{self.base}/v1/suffix", params=query) as reply:
                    if reply.status != 200:
                        return pulled or None
                    body = await reply.json()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
                return pulled or None
            self.outputs_since, self.outputs_epoch = body["next"], body["epoch"]
            pulled += [(s["tenant"], s["tokens"]) for s in body["segments"]]
            self.stats.outputs_pulled += len(body["segments"])
            if not body["more"]:
                return pulled

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
