"""A small language model as drafter, with its own KV cache.

The cache holds `fed`, the tokens the drafter has run through its model. Before each
proposal it keeps the longest prefix of `fed` that the context still agrees with (after a
rejection the tail is stale), crops the cache to it and runs the rest: so roll-back needs no
bookkeeping from `observe`, and after a full accept the last draft token and the bonus token
are both fed — the cache never has a hole (gpt-fast's fix, done lazily).
"""
from __future__ import annotations

import torch

from autospec.drafters.base import Draft, DraftContext, Drafter, agreeing_prefix, register
from autospec.models.kv import cache_kwarg, cached_forward, new_cache, rollback
from autospec.models.pair import kv_bytes_per_token, weight_bytes
from autospec.models.sampling import probs_from_logits, sample


class CachedLMDrafter(Drafter):
    """Drafts autoregressively from any causal LM; subclasses pick the model and the token."""

    def __init__(self, model):
        self.model = model
        self.kwarg = cache_kwarg(model)
        self._weight_bytes = weight_bytes(model)
        self._kv_bytes = kv_bytes_per_token(model)
        self.reset()

    def reset(self) -> None:
        self.cache = new_cache(self.model)
        self.fed: list[int] = []

    def pick(self, logits: torch.Tensor, ctx: DraftContext) -> tuple[int, torch.Tensor | None]:
        """Next draft token from (V,) logits, and the distribution it was drawn from."""
        if ctx.sampling.greedy:
            return int(logits.argmax()), None
        probs = probs_from_logits(logits, ctx.sampling)
        return sample(probs, ctx.generator), probs

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, k: int) -> Draft:
        keep = min(agreeing_prefix(self.fed, ctx.tokens), len(ctx.tokens) - 1)
        rollback(self.cache, keep)
        pending = ctx.tokens[keep:]
        self.fed = self.fed[:keep] + pending
        tokens, probs = [], []
        bytes_read = 0
        for i in range(k):
            logits = cached_forward(self.model, torch.tensor([pending]), self.cache, self.kwarg,
                                    last=1)[0, -1]
            bytes_read += self._weight_bytes + self._kv_bytes * len(self.fed)
            token, token_probs = self.pick(logits, ctx)
            tokens.append(token)
            probs.append(token_probs)
            pending = [token]
            if i < k - 1:
                self.fed.append(token)
        draft_probs = None if ctx.sampling.greedy else torch.stack(probs)
        return Draft(tokens, draft_probs, bytes_read)


@register("draft-model")
class DraftModelDrafter(CachedLMDrafter):
    cost_hint = 0.2
    needs_draft_model = True

    def __init__(self, models):
        if models.draft is None:
            raise ValueError("drafter 'draft-model' needs a draft model (--draft PATH)")
        super().__init__(models.draft)
