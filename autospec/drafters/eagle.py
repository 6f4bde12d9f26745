"""`eagle`: drafts from the target's own features (EAGLE-1) through a feature head.

The head (models/eagle_head.py) reads pairs (f_t, x_{t+1}) — the target's last hidden state at
position t and the token after it — and predicts f_{t+1}, scored by the target's head rows.
The engine keeps f_t for every cached position of every row beside its KV cache (RowCache
keep_hidden), written by the verify forward it already ran and rolled back with it; a row's
context hands them over as `DraftContext.hidden`.

The head keeps a one-layer KV cache of its own, slot for slot beside the target's, and per
slot `fed`: how many pairs with the TARGET's features it holds. Tokens only ever grow, so a
step's position 0 feeds the pairs since then — t = fed .. L-2, the last being (f_{L-2},
x_{L-1}), x_{L-1} the newest token — all with true features (a first step: the whole prompt);
its last prediction f̂_{L-1} gives draft token 1. Each later position feeds (f̂, d_j), its
own prediction and its own token (EAGLE-1's autoregression over features). Those entries are
speculative: the next step rolls the head's cache back to `fed` (setting a length) and feeds
the target's real features for whatever was accepted. Greedy picks the argmax, sampling draws
from the row's generator and keeps the distribution (exact rejection sampling downstream).
"""
from __future__ import annotations

import time

import torch

from autospec.drafters.contract import Draft, register
from autospec.drafters.draft_model import BatchDraftModel, DraftRow, OneRowDrafter
from autospec.models.forward import head_one_row, head_scores
from autospec.models.kv import RowCache
from autospec.models.weights import stored_bytes


class BatchEagle:
    """The feature head drafting for many rows at once (`propose`), a cache slot per row."""

    def __init__(self, head, max_batch: int, max_len: int):
        self.head = head
        self.max_positions = max_len
        self.cache = RowCache(head, max_batch, max_len)
        self.fed = [0] * max_batch  # pairs with the target's features in each slot's cache
        self._weight_bytes = stored_bytes(head)  # as its format stores them
        self.forwards = 0

    def reset(self, slot: int) -> None:
        self.fed[slot] = 0
        self.cache.lengths[slot] = 0

    @torch.inference_mode()
    def propose(self, rows: list[DraftRow]) -> tuple[list[Draft], float]:
        """Each row's draft of rows[i].k tokens, and the seconds the batched drafting took."""
        t0 = time.perf_counter()
        tokens_in, features_in = [], []
        for row in rows:
            tokens, hidden = row.ctx.tokens, row.ctx.hidden
            if hidden is None or len(hidden) != len(tokens) - 1:
                raise ValueError("drafter 'eagle' needs the target's features for every cached "
                                 "position (an engine over a pair with a feature head)")
            fed = max(0, min(self.fed[row.slot], len(tokens) - 2))  # at least one pair to feed
            self.cache.lengths[row.slot] = fed
            self.fed[row.slot] = len(tokens) - 1
            tokens_in.append(tokens[fed + 1:])  # x_{fed+1} .. x_{L-1}
            features_in.append(hidden[fed:])  # f_fed .. f_{L-2}
        drafted: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        confidences: list[list[float]] = [[] for _ in rows]
        survival = [1.0] * len(rows)  # a row's StopRule survival so far
        going = [row.k for row in rows]  # positions a row may still draft (0: stopped)
        subset, widen = self.head.lm_head.token_ids, self.head.lm_head.widen
        for position in range(max(row.k for row in rows)):
            active = [i for i in range(len(rows)) if going[i] > position]
            if not active:
                break
            predicted = self._forward([rows[i].slot for i in active],
                                      [tokens_in[i] for i in active],
                                      [features_in[i] for i in active])  # (n, D)
            scores = head_scores(self.head, predicted).float()  # (n, N): the subset's
            # greedy rows' tokens in one argmax over the subset (outside it a logit is the
            # minimum: the same token as over the vocabulary); sampled rows widen theirs.
            # A token's confidence: its probability over the subset (a draw's: from the
            # distribution it was drawn from)
            top = scores.max(-1)
            best = subset[top.indices].tolist()
            own = (top.values - torch.logsumexp(scores, -1)).exp().tolist()
            for j, i in enumerate(active):
                row = rows[i]
                self.cache.lengths[row.slot] += len(tokens_in[i])
                token_probs = None
                if row.ctx.sampling.greedy:
                    token, confidence = best[j], own[j]
                else:
                    token, token_probs = BatchDraftModel.pick(widen(scores[j]), row.ctx)
                    confidence = float(token_probs[token])
                stop = row.ctx.stop
                if stop is not None:  # the row's StopRule: drop the token, or stop after it
                    survival[i], kept, goes_on = stop.step(survival[i], position, confidence)
                    going[i] = going[i] if goes_on and kept else 0
                    if not kept:
                        continue
                if token_probs is not None:
                    probs[i].append(token_probs)
                drafted[i].append(token)
                confidences[i].append(min(1.0, max(0.0, confidence)))
                tokens_in[i], features_in[i] = [token], predicted[j:j + 1]
        moved = self._weight_bytes // max(1, len(rows))
        drafts = [Draft(tokens, None if row.ctx.sampling.greedy or not tokens else torch.stack(row_probs),
                        moved, row_confidences)
                  for row, tokens, row_probs, row_confidences in zip(rows, drafted, probs, confidences)]
        return drafts, time.perf_counter() - t0

    def _forward(self, slots: list[int], tokens: list[list[int]],
                 features: list[torch.Tensor]) -> torch.Tensor:
        """The head's prediction after each row's last pair, (n, D): one forward, rows
        right-padded, each at its own offset in the head's cache (one row: compiled, where
        models/forward.py's head_one_row runs)."""
        if len(slots) == 1:
            predicted = head_one_row(self.head, tokens[0], features[0], self.cache, slots[0])
            if predicted is not None:
                self.forwards += 1
                return predicted[-1:]
        counts = [len(t) for t in tokens]
        width = max(counts)
        position_ids, mask = self.cache.bind(slots, counts, self.max_positions)
        cache = self.cache
        ids = torch.zeros((len(slots), width), dtype=torch.long, device=cache.device)
        feats = torch.zeros((len(slots), width, features[0].shape[-1]), dtype=cache.dtype,
                            device=cache.device)
        for i, (row_tokens, row_features) in enumerate(zip(tokens, features)):
            ids[i, :len(row_tokens)] = torch.tensor(row_tokens)
            feats[i, :len(row_tokens)] = row_features
        try:
            # pair t sits in cache position t and is rotated there (training places it at
            # t + 1: attention sees only differences of positions, so the function is the
            # same; head_one_row places them alike)
            predicted = self.head(ids, feats, position_ids, mask, cache)
        finally:
            cache.bound = None
        self.forwards += 1
        return predicted[torch.arange(len(slots)), torch.tensor(counts) - 1]


@register("eagle")
class EagleDrafter(OneRowDrafter):
    # the head is one decoder layer at the target's width: ~1/30 of SmolLM2's step
    cost_hint = 0.05

    def __init__(self, models):
        if models.eagle is None:
            raise ValueError("drafter 'eagle' needs a feature head (the smollm2 pair ships "
                             "one; `autospec models build --preset smollm2-eagle` makes it)")
        self.models = models

    @classmethod
    def runs_on(cls, models) -> bool:
        return models.eagle is not None

    @classmethod
    def batch_drafting(cls, models, max_batch: int, max_len: int, **options):
        return BatchEagle(models.eagle, max_batch, max_len) if models.eagle is not None else None

    def one_row(self) -> BatchEagle:
        return BatchEagle(self.models.eagle, 1, self.models.max_positions)
