"""`autospec daemon`: the long-running slow path (see autospec/daemon/)."""
from __future__ import annotations

from pathlib import Path

import click


def default_listen() -> str:
    from autospec.paths import daemon_socket
    return f"unix:{daemon_socket()}"


@click.command()
@click.option("--listen", default=None, metavar="ADDR",
              help="unix:PATH, HOST:PORT or PORT. Default: unix:<data dir>/daemon.sock.")
@click.option("--db", default=None, metavar="URL",
              help="SQLAlchemy URL of the store (env AUTOSPEC_DB). Default: SQLite under the "
                   "data dir.")
@click.option("--policy", "policy_path", type=click.Path(path_type=Path), default=None,
              help="Policy file to put in force and watch (reloaded on change).")
@click.option("--allow-remote", is_flag=True,
              help="Allow a non-loopback address (requires --token).")
@click.option("--token", default=None, envvar="AUTOSPEC_DAEMON_TOKEN", show_envvar=True,
              help="Bearer token clients must send (prefer the env var: argv is visible in ps).")
@click.option("--flush-interval", default=2.0, show_default=True, type=click.FloatRange(min=0.05),
              help="Seconds between persisting learnt estimates.")
@click.option("--instance", default="", envvar="AUTOSPEC_INSTANCE", show_envvar=True,
              help="This daemon's name in a fleet (daemons sharing one store, PostgreSQL): "
                   "each learns its own rows and serves them merged with the others'. "
                   "Give every daemon of a fleet its own. Default: \"\" (a lone daemon).")
@click.option("--once", is_flag=True, help="Exit (cleanly) after one acknowledged batch.")
@click.option("--burst", default=None, type=click.IntRange(min=1),
              help="Exit (cleanly) after N acknowledged batches.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def daemon(listen, db, policy_path, allow_remote, token, flush_interval, instance, once, burst,
           log_level):
    """Ingest telemetry, learn estimates, serve parameters; SQLite store, policy file."""
    import asyncio
    import os

    from autospec.daemon.listen import parse_listen
    from autospec.daemon.service import configure_logging, run_daemon
    from autospec.daemon.state import DaemonState
    from autospec.policy import PolicyError
    from autospec.store import StoreError, open_store

    try:
        address = parse_listen(listen or default_listen())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    if not address.loopback:
        if not allow_remote:
            raise click.UsageError(f"--listen {listen}: not a loopback address; the daemon "
                                   f"accepts telemetry and reloads, so a network address needs "
                                   f"--allow-remote and a token (AUTOSPEC_DAEMON_TOKEN)")
        if not token:
            raise click.UsageError(f"--listen {listen} with --allow-remote needs a bearer token "
                                   f"(--token or AUTOSPEC_DAEMON_TOKEN)")
    configure_logging(log_level)
    try:
        store = open_store(db or os.environ.get("AUTOSPEC_DB"))
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    state = DaemonState(store, policy_path, instance)
    try:
        state.load_initial_policy()
    except (PolicyError, StoreError) as exc:
        store.close()
        raise click.ClickException(str(exc)) from None
    try:
        code = asyncio.run(run_daemon(state, address, token, 1 if once else burst,
                                      flush_interval, announce=lambda line: click.echo(line)))
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {address.url}: {exc.strerror or exc}") from None
    raise SystemExit(code)
