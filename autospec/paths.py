"""Where autospec keeps things: the shipped reference pair, the cache, the user's data."""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REFERENCE_DIR = PACKAGE_DIR / "reference"  # shipped: target/ and draft/, HF format


def cache_dir() -> Path:
    root = os.environ.get("AUTOSPEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "autospec")
    return Path(root)
