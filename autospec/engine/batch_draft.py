"""The draft model under batching: every row that chose it drafts in ONE draft forward per
draft position, not one forward per row and position.

The draft model gets a RowCache of its own (engine/row_cache.py), slot for slot beside the
target's, and per slot `fed`: the tokens its cache holds. A step's rows each keep the longest
prefix of `fed` their context still agrees with (a rejection leaves a stale tail; rolling back
is setting the length), then position 0 runs every row's pending tokens (usually the bonus
token, or the last draft token and the bonus after a full accept — gpt-fast's no-hole rule;
a whole prompt on a row's first draft-model step) and each later position one token per row
still drafting (a row with k = 2 leaves the forward after position 1; the others go on).
What CachedLMDrafter does per row (drafters/draft_model.py), batched: greedy picks the argmax
per row, sampling draws per row from its own generator and keeps the distribution it drew
from (draft_probs), so rejection sampling stays exact per request.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from autospec.drafters.base import Draft, DraftContext, agreeing_prefix
from autospec.engine.row_cache import RowCache
from autospec.models.kv import keeps_logits, cache_kwarg
from autospec.models.pair import kv_bytes_per_token, weight_bytes
from autospec.models.sampling import probs_from_logits, sample


@dataclass
class DraftRow:
    """One row's part in a batched draft: its slot, its context and how many tokens."""
    slot: int
    ctx: DraftContext
    k: int


class BatchDraftModel:
    """A draft model drafting for many rows at once (`propose`), with a cache slot per row."""

    def __init__(self, model, max_batch: int, max_len: int):
        self.model = model
        self.kwarg = cache_kwarg(model)
        self.max_positions = int(getattr(model.config, "max_position_embeddings", max_len))
        self.cache = RowCache(model, max_batch, min(max_len, self.max_positions))
        self.fed: list[list[int]] = [[] for _ in range(max_batch)]
        self._weight_bytes = weight_bytes(model)
        self._kv_bytes = kv_bytes_per_token(model)
        self.forwards = 0  # draft forwards run (one per draft position of a step)

    def reset(self, slot: int) -> None:
        """A new request took `slot`: nothing of the last one's is kept."""
        self.fed[slot] = []
        self.cache.lengths[slot] = 0

    @torch.inference_mode()
    def propose(self, rows: list[DraftRow]) -> tuple[list[Draft], float]:
        """Each row's draft of rows[i].k tokens, and the seconds the batched drafting took."""
        t0 = time.perf_counter()
        pending = []
        for row in rows:
            tokens = row.ctx.tokens
            keep = min(agreeing_prefix(self.fed[row.slot], tokens), len(tokens) - 1)
            self.cache.lengths[row.slot] = keep
            self.fed[row.slot] = self.fed[row.slot][:keep]
            pending.append(tokens[keep:])
        drafted: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        moved = [0] * len(rows)
        for position in range(max(row.k for row in rows)):
            # 1. the rows still drafting at this position, each feeding its pending tokens
            active = [i for i, row in enumerate(rows) if row.k > position]
            logits = self._last_logits([rows[i].slot for i in active], [pending[i] for i in active])
            for j, i in enumerate(active):
                row = rows[i]
                self.cache.lengths[row.slot] += len(pending[i])
                self.fed[row.slot] += pending[i]
                moved[i] += self._weight_bytes // len(active) + self._kv_bytes * len(self.fed[row.slot])
                # 2. pick: argmax, or a draw from the row's own generator
                if row.ctx.sampling.greedy:
                    token = int(logits[j].argmax())
                else:
                    token_probs = probs_from_logits(logits[j], row.ctx.sampling)
                    token = sample(token_probs, row.ctx.generator)
                    probs[i].append(token_probs)
                drafted[i].append(token)
                pending[i] = [token]
        drafts = [Draft(tokens, None if row.ctx.sampling.greedy else torch.stack(row_probs),
                        bytes_read)
                  for row, tokens, row_probs, bytes_read in zip(rows, drafted, probs, moved)]
        return drafts, time.perf_counter() - t0

    def _last_logits(self, slots: list[int], inputs: list[list[int]]) -> torch.Tensor:
        """(n, V) the logits after each row's last input token: one forward, rows right-padded,
        the LM head only at the distinct last positions (a first step feeds a whole prompt)."""
        width = max(map(len, inputs))
        input_ids = torch.tensor([ids + [0] * (width - len(ids)) for ids in inputs],
                                 device=self.cache.device)
        position_ids, mask = self.cache.bind(slots, [len(ids) for ids in inputs],
                                             self.max_positions)
        keep = sorted({len(ids) - 1 for ids in inputs})
        extra = {}
        if keeps_logits(type(self.model)):
            extra["logits_to_keep"] = torch.tensor(keep, device=self.cache.device)
        else:  # the head over every position
            keep = list(range(width))
        try:
            logits = self.model(input_ids=input_ids, use_cache=True, **{self.kwarg: self.cache},
                                position_ids=position_ids, attention_mask=mask, **extra).logits
        finally:
            self.cache.bound = None
        self.forwards += 1
        column = {position: c for c, position in enumerate(keep)}
        rows = torch.arange(len(inputs))
        return logits[rows, torch.tensor([column[len(ids) - 1] for ids in inputs])].float()
