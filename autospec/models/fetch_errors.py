"""What a fetch's steps share (models/fetch.py, and the GGUF conversion, models/gguf.py): the one
error a fetch fails with, and `writing`, which turns a full disk into that error."""
from __future__ import annotations

import errno
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class FetchError(ValueError):
    """A fetch that cannot complete; the message is one line and names the file at fault."""


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn a full disk into one clear line naming what was being written."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise FetchError(f"disk full while writing {exc.filename or path}") from None
        raise
    except FetchError:
        raise
    except Exception as exc:  # safetensors' writer reports ENOSPC as its own error type
        if "No space left on device" in str(exc) or "StorageFull" in str(exc):
            raise FetchError(f"disk full while writing {path}") from None
        raise
