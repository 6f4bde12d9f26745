"""The store's exceptions: every one names the store's URL (password hidden)."""
from __future__ import annotations


class StoreError(RuntimeError):
    """The database refused or failed (read-only, disk full, locked, unreachable). The
    transaction in flight is rolled back; everything committed before it is kept."""


class StoreSchemaError(StoreError):
    """The store's schema version does not match this code's and cannot be migrated."""
