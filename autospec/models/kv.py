"""KV-cache plumbing over transformers' Cache API (5.x names it `cache`, 4.x `past_key_values`).

Roll-back is a crop: entries past the accepted length are dropped, and the next forward
overwrites them. DynamicCache.crop(-n) removes the last n tokens in both 4.x and 5.x.
"""
from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache


def cache_kwarg(model) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@functools.lru_cache(maxsize=None)
def keeps_logits(model_class) -> bool:
    """Whether the model's forward takes `logits_to_keep` (the head over some positions only)."""
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def new_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


def cached_forward(model, input_ids: torch.Tensor, cache: DynamicCache, kwarg: str,
                   last: int | None = None, **inputs: torch.Tensor) -> torch.Tensor:
    """Logits (B, n, V) for input_ids (B, n) appended after what the cache holds; with `last`,
    only the last `last` positions are scored (a prefill needs none or one: the LM head over a
    whole prompt costs as much as several decode steps). `inputs`: position_ids and a 4-D
    attention_mask where rows sit at their own offsets (engine/batch.py)."""
    extra = {"logits_to_keep": last} if last is not None and keeps_logits(type(model)) else {}
    return model(input_ids=input_ids, use_cache=True, **{kwarg: cache}, **extra, **inputs).logits


def rollback(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions of every layer."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
