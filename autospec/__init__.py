"""autospec: speculative decoding that tunes itself.

    import autospec
    out = autospec.generate("def add(a, b):", drafter="ngram", k=4)
    out.text, out.telemetry.mean_accepted_length
"""
from __future__ import annotations

__version__ = "0.1.0"

_pairs: dict = {}


def load(target: str | None = None, draft: str | None = None, dtype: str = "float32"):
    """An Engine over target + draft (default: the shipped reference pair), cached per process."""
    from autospec.engine.loop import Engine
    from autospec.models.pair import load_pair
    key = (target, draft, dtype)
    if key not in _pairs:
        _pairs[key] = Engine(load_pair(target, draft, dtype))
    return _pairs[key]


def generate(prompt, *, target: str | None = None, draft: str | None = None, **options):
    """One completion; options as Engine.generate (drafter, k, max_new_tokens, temperature,
    top_k, top_p, seed, policy, on_tokens). Returns a Generation (text, token_ids, telemetry)."""
    return load(target, draft).generate(prompt, **options)


def __getattr__(name):
    if name in ("Engine", "Generation", "StaticPolicy"):
        from autospec.engine import loop
        return getattr(loop, name)
    raise AttributeError(name)
