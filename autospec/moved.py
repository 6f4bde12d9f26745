"""Deprecated import paths (one release): a module that moved leaves a shim whose
`__getattr__ = forward({name: new module})` imports the new home lazily, on first use, so a
shim adds no import edge between folders."""
from __future__ import annotations

import importlib
from typing import Callable


def forward(moved: dict[str, str]) -> Callable[[str], object]:
    """A module-level __getattr__ serving each moved name from its new module."""
    def __getattr__(name: str):
        if name in moved:
            return getattr(importlib.import_module(moved[name]), name)
        raise AttributeError(name)
    return __getattr__
