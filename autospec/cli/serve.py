"""`autospec serve`: OpenAI-compatible completions and chat completions on the engine,
reporting to the daemon."""
from __future__ import annotations

import click

from autospec.cli.options import (draft_option, weights_option, load_engine, pair_option,
                                  prefill_chunk_option, target_option)
from autospec.serve.openai import TENANT_FIELDS


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@pair_option
@target_option
@draft_option
@weights_option
@click.option("--daemon", "daemon_url", default=None, metavar="URL",
              help="The daemon: unix:PATH or http://HOST:PORT. Default: none (no telemetry).")
@click.option("--token", default=None, envvar="AUTOSPEC_DAEMON_TOKEN", show_envvar=True,
              help="Bearer token for the daemon.")
@click.option("--model-name", default=None, help="The name clients send as `model`.")
@click.option("--params-interval", default=5.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds between parameter pulls from the daemon.")
@click.option("--buffer", "buffer_limit", default=10_000, show_default=True,
              type=click.IntRange(min=1), help="Telemetry records kept while the daemon is away.")
@click.option("--no-share", is_flag=True,
              help="The suffix drafter drafts from the current request only: no request reads "
                   "another's output (sets drafter_options.suffix.share to false).")
@click.option("--share-outputs", is_flag=True,
              help="Share finished outputs with the other processes on the same --daemon (for "
                   "the suffix drafter; by pair, and by tenant with --tenant-field).")
@click.option("--tenant-field", default=None, type=click.Choice(TENANT_FIELDS),
              help="Keep each tenant's outputs apart, the tenant read from this request field "
                   "(required in every request). Default: one shared index for all requests.")
@click.option("--max-batch", default=None, type=click.IntRange(min=1),
              help="Requests decoding together, one target forward per step (continuous "
                   "batching; the others wait). Default: 8 on a CPU, where a forward's cost "
                   "grows with its rows (16 rows cost 2.2x one here) and more rows mostly add "
                   "latency; 32 on a GPU, whose forward stays memory-bound longer.")
@click.option("--max-queue", default=None, type=click.IntRange(min=1),
              help="Requests waiting for a row; one more is refused with HTTP 429 and a "
                   "Retry-After header. Default: 4 x --max-batch.")
@click.option("--api-key", "api_keys", multiple=True, envvar="AUTOSPEC_API_KEY",
              show_envvar=True, metavar="KEY",
              help="Require `Authorization: Bearer KEY` on every /v1/* route (repeatable; "
                   "prefer the env var: argv is visible in ps). Needed off loopback.")
@click.option("--api-key-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Keys, one a line, re-read when the file changes: rotate a key without a "
                   "restart.")
@prefill_chunk_option
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def serve(host, port, pair, target, draft, weights, daemon_url, token, model_name, params_interval,
          buffer_limit, no_share, share_outputs, tenant_field, max_batch, max_queue, api_keys,
          api_key_file, prefill_chunk, log_level):
    """OpenAI /v1/completions and /v1/chat/completions (with SSE streaming) on the engine and
    the online controller."""
    from autospec.serve.client import DaemonClient
    from autospec.daemon.listen import is_loopback
    from autospec.daemon.service import configure_logging
    from autospec.engine.bandwidth import hardware_key, peak_bandwidth_gbs
    from autospec.serve.server import Server

    from autospec.serve.auth import ApiKeys
    try:
        keys = ApiKeys(api_keys, api_key_file)
    except (OSError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--api-key-file") from None
    if not is_loopback(host) and not keys.enabled:
        raise click.UsageError(f"--host {host} is reachable from the network: give --api-key "
                               f"(or AUTOSPEC_API_KEY, or --api-key-file)")
    if no_share and tenant_field:
        raise click.UsageError("--no-share shares nothing: there are no tenants to keep apart "
                               "(give one of --no-share, --tenant-field)")
    if share_outputs and (no_share or not daemon_url):
        raise click.UsageError("--share-outputs shares through the daemon: it needs --daemon "
                               "and not --no-share")
    configure_logging(log_level)
    engine = load_engine(target, draft, weights, pair,
                         {"suffix": {"share": False}} if no_share else None)
    pair_name = engine.models.key
    client = None
    if daemon_url:
        try:
            client = DaemonClient(daemon_url, pair_name, hardware_key(), token,
                                  buffer_limit=buffer_limit, peak_bandwidth_gbs=peak_bandwidth_gbs())
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--daemon") from None
    server = Server(engine, model_name or pair_name, client, params_interval,
                    tenant_field=tenant_field, share_outputs=share_outputs,
                    max_batch=max_batch, max_queue=max_queue, decode_thread=False,
                    api_keys=keys, prefill_chunk=prefill_chunk or None)
    raise SystemExit(serve_on_main_thread(server, host, port))


def serve_on_main_thread(server, host: str, port: int) -> int:
    """The event loop (HTTP, the daemon client) on a thread, the decode loop on this one: torch's
    OpenMP regions issued from any other thread are slow in this build (a 3-token verify 9-10 ms
    against 6 ms here). Signals land on this thread; the first sets the loop's stop event (a
    warm shutdown: the loop drains, then closes the decode loop, which returns), a second
    exits at once."""
    import asyncio
    import os
    import signal
    import threading

    from autospec.serve.run import run_serve
    from autospec.serve.server import log
    handle: dict = {}

    def on_loop(loop, stop) -> None:
        handle["loop"], handle["stop"] = loop, stop

    def serve_http() -> None:
        try:
            handle["code"] = asyncio.run(run_serve(server, host, port, announce=click.echo,
                                                   on_loop=on_loop))
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            handle["error"] = exc
            server.decode.close()  # let run_here return

    received = []

    def on_signal(signum, _frame) -> None:
        received.append(signum)
        if len(received) > 1:
            log.warning("second signal: exiting now", extra={"fields": {"signal": signum}})
            os._exit(1)
        log.info("signal: finishing in-flight work, then exiting", extra={"fields": {"signal": signum}})
        if "loop" in handle:
            handle["loop"].call_soon_threadsafe(handle["stop"].set)
        else:
            server.decode.close()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    http = threading.Thread(target=serve_http, name="autospec-http")
    http.start()
    server.decode.run_here()
    http.join()
    error = handle.get("error")
    if isinstance(error, OSError):
        raise click.ClickException(f"cannot listen on {host}:{port}: {error.strerror or error}")
    if error is not None:
        raise error
    return handle.get("code", 0)
