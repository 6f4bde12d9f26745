"""The training corpus: the Python standard library's own source files.

Every machine with Python has them, and no one here wrote them. A stable hash of each file's
path relative to the corpus root puts one file in ten into a held-out split; the models never
train on it, and the shipped workloads (configs/workloads/) are built from it.
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELDOUT_MODULUS = 10  # one file in ten is held out


def default_corpus_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str) -> bool:
    """True for the files kept out of training (sha1 of the relative path, mod 10 == 0)."""
    digest = hashlib.sha1(relpath.encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELDOUT_MODULUS == 0


@dataclass(frozen=True)
class SourceFile:
    relpath: str
    text: str


def iter_sources(root: Path) -> list[SourceFile]:
    """All readable UTF-8 .py files under root (site-packages excluded), sorted by path."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"corpus directory '{root}' does not exist")
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel.split("/") or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few stdlib test files are deliberately mis-encoded
        if text.strip():
            files.append(SourceFile(rel, text))
    if not files:
        raise FileNotFoundError(f"no Python source files under '{root}'")
    return files


def split(files: list[SourceFile]) -> tuple[list[SourceFile], list[SourceFile]]:
    """(train, heldout) by the stable path hash."""
    train = [f for f in files if not is_heldout(f.relpath)]
    heldout = [f for f in files if is_heldout(f.relpath)]
    return train, heldout
