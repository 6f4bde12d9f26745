"""The daemon process: open the store, put the policy in force, listen, and keep going.

Background work, all on the state's worker thread: flush learnt estimates to the store every
`flush_interval` seconds (and at exit), and reload the policy file when it changes on disk.
Signals (rq's worker convention): the first SIGTERM/SIGINT is a warm shutdown — stop
listening, let in-flight requests finish, flush, exit 0; a second one exits at once (1).
A batch acknowledged before a kill -9 is in the store (it was committed before the 200);
estimates learnt since the last flush are rebuilt from later traffic.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from aiohttp import web

from autospec.daemon.app import make_app
from autospec.daemon.listen import Listen
from autospec.daemon.state import DaemonState

log = logging.getLogger("autospec.daemon")


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, event, and the record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                 "logger": record.name, "event": record.getMessage()}
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    root = logging.getLogger("autospec")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


async def run_daemon(state: DaemonState, listen: Listen, token: str | None = None,
                     burst: int | None = None, flush_interval: float = 2.0,
                     watch_interval: float = 1.0, announce=print) -> int:
    """Serve until a signal (or `burst` acknowledged batches); returns the exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    batches = 0

    def on_batch() -> None:
        nonlocal batches
        batches += 1
        if burst is not None and batches >= burst:
            stop.set()

    stop_on_signals(loop, stop, log)
    runner = web.AppRunner(make_app(state, token, on_batch), access_log=None,
                           handle_signals=False, shutdown_timeout=10.0)
    await runner.setup()
    site = await _site(runner, listen)
    await site.start()
    url = _bound_url(site, listen)
    announce(f"autospec daemon listening on {url}")
    log.info("listening", extra={"fields": {"url": url, "store": state.store.url,
                                            "policy_hash": state.policy.policy_hash}})

    async def every(seconds: float, work) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await loop.run_in_executor(state.worker, work)
            except Exception:  # noqa: BLE001 - a failed flush/reload must not stop the daemon
                log.exception("background work failed; will retry")

    def watch() -> None:
        if state.policy_file_changed():
            state.reload_policy()

    tasks = [asyncio.create_task(every(flush_interval, state.flush)),
             asyncio.create_task(every(watch_interval, watch))]
    try:
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await runner.cleanup()  # stop listening; in-flight requests finish first
        written = await loop.run_in_executor(state.worker, state.flush)
        state.worker.shutdown(wait=True)
        state.store.close()
        if listen.unix_path:
            listen.unix_path.unlink(missing_ok=True)
        log.info("stopped", extra={"fields": {"estimates_flushed": written,
                                              "batches": batches}})
    return 0


def stop_on_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event,
                    logger: logging.Logger) -> None:
    """First SIGTERM/SIGINT: set `stop` (a warm shutdown). Second: exit at once with 1."""
    received = 0

    def on_signal(signum: int) -> None:
        nonlocal received
        received += 1
        if received > 1:  # cold shutdown: the operator insists
            logger.warning("second signal: exiting now", extra={"fields": {"signal": signum}})
            os._exit(1)
        logger.info("signal: finishing in-flight work, then exiting",
                    extra={"fields": {"signal": signum}})
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)


async def _site(runner: web.AppRunner, listen: Listen) -> web.BaseSite:
    if listen.unix_path is None:
        return web.TCPSite(runner, listen.host, listen.port)
    path = listen.unix_path
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        if _socket_alive(path):
            raise OSError(f"{path}: another daemon is listening there")
        path.unlink()  # left behind by a killed daemon
    old_umask = os.umask(0o177)  # the socket is the owner's only (0600)
    try:
        return web.UnixSite(runner, str(path))
    finally:
        os.umask(old_umask)


def _socket_alive(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _bound_url(site: web.BaseSite, listen: Listen) -> str:
    if listen.unix_path:
        return listen.url
    server = site._server  # the real port when 0 was asked for
    port = server.sockets[0].getsockname()[1] if server and server.sockets else listen.port
    host = f"[{listen.host}]" if ":" in listen.host else listen.host
    return f"http://{host}:{port}"
