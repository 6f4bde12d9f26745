"""Where the daemon (or serve) listens: `unix:PATH`, `HOST:PORT`, or `PORT` (loopback).

Loopback or a Unix socket by default; any other address is reachable from the network, so it
needs `--allow-remote` and a bearer token."""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

from autospec.paths import user_path


@dataclass(frozen=True)
class Listen:
    unix_path: Path | None = None
    host: str | None = None
    port: int | None = None

    @property
    def url(self) -> str:
        """How a client names this address (what `--daemon` accepts)."""
        return f"unix:{self.unix_path}" if self.unix_path else f"http://{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        return self.unix_path is not None or is_loopback(self.host)


def parse_listen(text: str) -> Listen:
    """`unix:/run/autospec.sock`, `127.0.0.1:8765`, `[::1]:8765`, `localhost:8765` or `8765`."""
    text = text.strip()
    if text.startswith("unix:"):
        path = text[len("unix:"):]
        if not path:
            raise ValueError("listen address 'unix:' needs a path, e.g. unix:/tmp/autospec.sock")
        return Listen(unix_path=user_path(path).absolute())
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"listen address {text!r}: expected unix:PATH, HOST:PORT or PORT") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"listen address {text!r}: port {number} not in 0..65535")
    return Listen(host=host, port=number)


def is_loopback(host: str | None) -> bool:
    if host in (None, "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: loopback only if every address it resolves to is
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return False
        return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)
