"""API keys for `autospec serve`: every /v1/* route wants `Authorization: Bearer KEY`, as
OpenAI's clients send it (vLLM's --api-key does the same); /healthz stays open.

Keys come from `--api-key` (repeatable; AUTOSPEC_API_KEY) and from `--api-key-file`, one key a
line (blank lines and `#` comments skipped), re-read when the file changes (a stat per request),
so a key is rotated by editing the file: add the new key, move clients over, delete the old
one — no restart of the server or its clients. Compared in constant time against every key.
"""
from __future__ import annotations

import hmac
import os
from pathlib import Path


class ApiKeys:
    def __init__(self, keys: tuple[str, ...] = (), path: str | os.PathLike | None = None):
        self.fixed = tuple(k for k in keys if k)
        self.path = Path(path) if path else None
        self._stamp: tuple[int, int] | None = None
        self._from_file: tuple[str, ...] = ()
        if self.path is not None:
            self._reload()  # an unreadable file fails at start-up, not at the first request
            if not self.keys():
                raise ValueError(f"--api-key-file {self.path}: no key in it (one a line)")

    def _reload(self) -> None:
        stat = self.path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            lines = self.path.read_text().splitlines()
            self._from_file = tuple(line.strip() for line in lines
                                    if line.strip() and not line.strip().startswith("#"))
            self._stamp = stamp

    def keys(self) -> tuple[str, ...]:
        if self.path is not None:
            try:
                self._reload()
            except OSError:
                pass  # mid-rotation (replaced, not yet there): the last keys read stay
        return self.fixed + self._from_file

    @property
    def enabled(self) -> bool:
        return bool(self.fixed) or self.path is not None

    def allows(self, authorization: str | None) -> bool:
        """Whether an Authorization header carries one of the keys."""
        given = (authorization or "").encode()
        found = False
        for key in self.keys():  # every key compared: the time does not say which matched
            found |= hmac.compare_digest(given, f"Bearer {key}".encode())
        return found
