"""Child autospec processes (a daemon, a server): spawn one, wait for the line it prints when
it is ready (`... listening on URL`), stop it — warm first (SIGTERM: flush, exit 0), cold
after a timeout. One helper for `autospec demo`, the daemon benchmark and the tests."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

READY = "listening on "  # what `autospec daemon` and `autospec serve` print first, then the URL


class StartError(RuntimeError):
    """A child that exited, or printed something else, before its ready line."""


@dataclass
class Child:
    popen: subprocess.Popen
    url: str  # as announced on its ready line
    log: Path  # its stderr

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        return self.popen.wait(timeout)

    def kill(self) -> int:
        """SIGKILL now (no flush); the exit code."""
        if self.popen.poll() is None:
            self.popen.kill()
        return self.popen.wait(10)

    def stop(self, timeout: float = 15.0) -> int:
        """A warm shutdown (SIGTERM), a cold one after `timeout` seconds; the exit code."""
        if self.popen.poll() is not None:
            return self.popen.returncode
        self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()


def spawn(args: list[str], log: Path, env: dict | None = None, timeout: float = 120.0,
          new_session: bool = False) -> Child:
    """`python -m autospec ARGS` (stderr appended to `log`, `env` over this process's); returns
    once it announced its URL. StartError (exit code and the log's tail) otherwise; the child
    is killed then. `new_session`: a Ctrl-C in the terminal does not reach the child."""
    with open(log, "a") as handle:  # the child holds its own descriptor
        popen = subprocess.Popen([sys.executable, "-m", "autospec", *args], stdout=subprocess.PIPE,
                                 stderr=handle, text=True, env={**os.environ, **(env or {})},
                                 start_new_session=new_session)
    deadline = time.monotonic() + timeout
    line = popen.stdout.readline()
    if READY not in line or time.monotonic() > deadline:
        popen.kill()
        popen.wait(10)
        tail = Path(log).read_text()[-2000:] if Path(log).exists() else ""
        raise StartError(f"autospec {args[0]} did not start (exit code {popen.returncode}, "
                         f"first line {line.strip()!r}); its log {log}:\n{tail}")
    return Child(popen, line.strip().rsplit(READY, 1)[1], Path(log))


def start_daemon(tmp: Path, flush: float = 2.0) -> tuple[subprocess.Popen, str]:
    """`autospec daemon` on a Unix socket in `tmp`, with a fresh SQLite store there (the daemon
    benchmarks', bench/daemon_measure.py and bench/soak.py): the child and its socket."""
    sock = tmp / "daemon.sock"
    child = spawn(["daemon", "--listen", f"unix:{sock}", "--db", f"sqlite:///{tmp / 'store.db'}",
                   "--flush-interval", str(flush), "--log-level", "warning"], tmp / "daemon.log")
    return child.popen, str(sock)
