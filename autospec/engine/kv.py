"""Deprecated (one release): KV-cache plumbing moved to autospec.models.kv, below drafters and engine."""
from autospec.moved import forward

__getattr__ = forward({name: "autospec.models.kv"
                       for name in ("cache_kwarg", "new_cache", "cached_forward", "rollback")})
