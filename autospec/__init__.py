"""autospec: speculative decoding that tunes itself.

    import autospec
    out = autospec.generate("def add(a, b):", drafter="ngram", k=4)
    out.text, out.telemetry.mean_accepted_length
    autospec.generate([{"role": "user", "content": "Hi!"}], pair="smollm2")  # a chat

Layers, each importing only those before it (tests/test_layout.py checks it, statically and
by importing each layer with the ones above it blocked):

    models <- drafters <- controller <- engine <- policy, daemon, serve, bench, tune <- cli

models/ is the networks: loading a pair, KV-cache plumbing (kv.py) and logits to a sampling
distribution (sampling.py), which drafters and the engine both use, so they live at the bottom.
drafters/ holds the contract, the registry and `agreeing_prefix` (a draft against the target's
tokens), and answers which drafters a pair can run (`available_drafters`). controller/ decides
from what a host hands it and never calls one; the engine drives it. paths, telemetry,
confidence, configcheck and kernels/ sit below them all. No two modules import each other,
not even through an import inside a function (tests/test_layout.py).
"""
from __future__ import annotations

__version__ = "0.1.0"

_pairs: dict = {}


def load(target: str | None = None, draft: str | None = None, weights: str = "auto", *,
         pair: str | None = None):
    """An Engine over a named pair ("reference", the default, or "smollm2"; see
    autospec/models/pairs.py) or over target + draft paths, at weight format `weights`
    (auto: the target's own; float32, bfloat16 or int4: autospec/models/weights.py), cached
    per process."""
    from autospec.engine.loop import Engine
    from autospec.engine.request import freeze_heap
    from autospec.models import ModelLoadError
    from autospec.models.pair import load_named_pair, load_pair
    from autospec.models.pairs import named_pair
    if pair is not None:
        if target is not None or draft is not None:
            raise ModelLoadError(f"pair={pair!r} names both models: give pair or target/draft, "
                                 f"not both")
        named_pair(pair)  # unknown names fail here, listing the known ones
    key = (target, draft, weights, pair)
    if key not in _pairs:
        models = load_named_pair(pair, weights) if pair else load_pair(target, draft, weights)
        _pairs[key] = Engine(models)
        freeze_heap()  # cached for the process: out of the collector's walks (engine/request.py)
    return _pairs[key]


def generate(prompt, *, target: str | None = None, draft: str | None = None,
             pair: str | None = None, weights: str = "auto", **options):
    """One completion; options as Engine.generate (drafter, k, max_new_tokens, temperature,
    top_k, top_p, seed, controller, on_tokens). `prompt` is text, token ids, or a chat: a list of
    {"role", "content"} messages, rendered with the target's chat template. Returns a
    Generation (text, token_ids, telemetry)."""
    engine = load(target, draft, weights, pair=pair)
    if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], dict):
        from autospec.models.chat import encode_chat
        prompt = encode_chat(engine.models, prompt)
    return engine.generate(prompt, **options)


def __getattr__(name):
    if name == "Engine":
        from autospec.engine.loop import Engine
        return Engine
    if name == "Generation":
        from autospec.engine.request import Generation
        return Generation
    if name in ("Controller", "StaticController"):
        from autospec.controller import interface
        return getattr(interface, name)
    raise AttributeError(name)
