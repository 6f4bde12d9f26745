"""The serving process's life: the HTTP app up, the daemon client and parameter pulls
running, then at a signal a warm shutdown (in-flight requests finish, telemetry is drained,
the decode loop decodes what it accepted)."""
from __future__ import annotations

import asyncio

from aiohttp import web

from autospec.daemon.service import stop_on_signals
from autospec.serve.server import Server, log


async def run_serve(server: Server, host: str, port: int, announce=print,
                    drain_timeout: float = 5.0, on_loop=None) -> int:
    """Serve until SIGTERM/SIGINT (second signal: exit at once); flush telemetry at exit.
    on_loop(loop, stop): for an event loop off the main thread, where signal handlers cannot
    be installed — the caller's own handlers then set `stop` through the loop."""
    stop = asyncio.Event()
    if on_loop is None:
        stop_on_signals(asyncio.get_running_loop(), stop, log)
    else:
        on_loop(asyncio.get_running_loop(), stop)
    tasks = []
    if server.daemon is not None:
        warm = await server.pull_params()
        await server.pull_outputs()
        log.info("parameters from the daemon" if warm else
                 "daemon not reachable: starting on the policy defaults",
                 extra={"fields": {"daemon": server.daemon.url}})
        tasks = [asyncio.create_task(server.daemon.run()), asyncio.create_task(server.params_loop())]
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]
    announce(f"autospec serve listening on http://{host}:{bound}")
    try:
        await stop.wait()
    finally:
        await runner.cleanup()  # in-flight requests finish first
        for task in tasks:
            task.cancel()
        if server.daemon is not None:
            sent = await server.daemon.drain(drain_timeout)
            if not sent:
                log.warning("telemetry not delivered at exit", extra={"fields": {
                    "records": server.daemon.unacknowledged}})
            await server.daemon.close()
        server.decode.close()  # every accepted request is decoded first
    return 0
