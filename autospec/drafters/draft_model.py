"""A small language model as drafter: the drafting algorithm, written once.

`BatchDraftModel` drafts for many rows at once — every row that chose the model drafts in ONE
forward per draft position, not one forward per row and position (the engine's draft-model
rows); `CachedLMDrafter` is the same over one row of its own (a per-request drafter: the early
exit, the synthetic drafter, a draft model outside the engine's batch).

The model gets a RowCache of its own (models/kv.py), slot for slot beside the target's, and
per slot `fed`: the tokens its cache holds. A step's rows each keep the longest prefix of `fed`
their context still agrees with (a rejection leaves a stale tail; rolling back is setting the
length), then position 0 runs every row's pending tokens (usually the bonus token, or the last
draft token and the bonus after a full accept — gpt-fast's no-hole rule, done lazily, so
`observe` has nothing to roll back; a whole prompt on a row's first step) and each later
position one token per row still drafting (a row with k = 2 leaves the forward after position
1; the others go on). Greedy picks the argmax per row; sampling draws per row from its own
generator and keeps the distribution it drew from (draft_probs), so rejection sampling stays
exact per request.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from autospec.drafters.contract import Draft, DraftContext, Drafter, agreeing_prefix, register
from autospec.models.kv import RowCache, cache_kwarg, keeps_logits, kv_bytes_per_token
from autospec.models.pair import weight_bytes
from autospec.models.quantized import rows_argmax
from autospec.models.sampling import probs_from_logits, sample


@dataclass
class DraftRow:
    """One row's part in a batched draft: its slot, its context and how many tokens."""
    slot: int
    ctx: DraftContext
    k: int


class BatchDraftModel:
    """A draft model drafting for many rows at once (`propose`), with a cache slot per row."""

    def __init__(self, model, max_batch: int, max_len: int | None = None,
                 pick: Callable[[torch.Tensor, DraftContext], tuple[int, torch.Tensor | None]] | None = None):
        self.model = model
        self.pick = pick or self.pick
        self.kwarg = cache_kwarg(model)
        self.max_positions = int(getattr(model.config, "max_position_embeddings", None)
                                 or max_len or 2048)
        self.cache = RowCache(model, max_batch, min(max_len or self.max_positions,
                                                    self.max_positions))
        self.fed: list[list[int]] = [[] for _ in range(max_batch)]
        self._weight_bytes = weight_bytes(model)
        self._kv_bytes = kv_bytes_per_token(model)
        self.forwards = 0  # draft forwards run (one per draft position of a step)

    @staticmethod
    def pick(logits: torch.Tensor, ctx: DraftContext) -> tuple[int, torch.Tensor | None]:
        """Next draft token from (V,) logits, and the distribution it was drawn from (None
        under greedy decoding)."""
        if ctx.sampling.greedy:  # argmax's index, sooner (models/quantized.py rows_argmax)
            return int(rows_argmax(logits[None])[0]), None
        token_probs = probs_from_logits(logits, ctx.sampling)
        return sample(token_probs, ctx.generator), token_probs

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
        confidences: list[list[float]] = [[] for _ in rows]
        survival = [1.0] * len(rows)  # a row's StopRule survival so far
        going = [row.k for row in rows]  # positions a row may still draft (0: stopped)
        moved = [0] * len(rows)
        for position in range(max(row.k for row in rows)):
            # 1. the rows still drafting at this position, each feeding its pending tokens
            active = [i for i in range(len(rows)) if going[i] > position]
            if not active:
                break
            logits = self._last_logits([rows[i].slot for i in active], [pending[i] for i in active])
            picked = []
            for j, i in enumerate(active):
                row = rows[i]
                self.cache.lengths[row.slot] += len(pending[i])
                self.fed[row.slot] += pending[i]
                moved[i] += self._weight_bytes // len(active) + self._kv_bytes * len(self.fed[row.slot])
                # 2. pick: argmax, or a draw from the row's own generator
                picked.append(self.pick(logits[j], row.ctx))
            # 3. each token's confidence: the drafter's probability of it (a draw's from the
            # distribution it was drawn from), from the logits already made
            own = token_probabilities(logits, [token for token, _ in picked])
            for j, (i, (token, token_probs)) in enumerate(zip(active, picked)):
                confidence = own[j] if token_probs is None else float(token_probs[token])
                stop = rows[i].ctx.stop
                if stop is not None:  # 4. the row's StopRule: drop the token, or stop after it
                    survival[i], kept, goes_on = stop.step(survival[i], position, confidence)
                    going[i] = going[i] if goes_on and kept else 0
                    if not kept:
                        continue
                if token_probs is not None:
                    probs[i].append(token_probs)
                drafted[i].append(token)
                confidences[i].append(min(1.0, max(0.0, confidence)))
                pending[i] = [token]
        drafts = [Draft(tokens, None if row.ctx.sampling.greedy or not tokens else torch.stack(row_probs),
                        bytes_read, row_confidences)
                  for row, tokens, row_probs, bytes_read, row_confidences
                  in zip(rows, drafted, probs, moved, confidences)]
        return drafts, time.perf_counter() - t0

    def _last_logits(self, slots: list[int], inputs: list[list[int]]) -> torch.Tensor:
        """(n, V) the logits after each row's last input token: one forward, rows right-padded,
        the LM head only at the distinct last positions (a first step feeds a whole prompt)."""
        keep = sorted({len(ids) - 1 for ids in inputs})
        extra = {}
        if keeps_logits(type(self.model)):
            extra["logits_to_keep"] = torch.tensor(keep, device=self.cache.device)
        else:  # the head over every position
            keep = list(range(max(map(len, inputs))))
        logits = self.cache.forward(self.model, self.kwarg, slots, inputs, self.max_positions,
                                    **extra)
        self.forwards += 1
        column = {position: c for c, position in enumerate(keep)}
        rows = torch.arange(len(inputs))
        return logits[rows, torch.tensor([column[len(ids) - 1] for ids in inputs])].float()


def token_probabilities(logits: torch.Tensor, tokens: list[int]) -> list[float]:
    """(n, V) logits and one token per row -> each token's softmax probability (exp(logit -
    logsumexp): one reduction, no (n, V) softmax written)."""
    rows = torch.arange(len(tokens))
    chosen = logits[rows, torch.tensor(tokens)]
    return (chosen - torch.logsumexp(logits, -1)).exp().tolist()


class OneRowDrafter(Drafter):
    """A per-request drafter that drafts through a batched drafting of one row of its own,
    made at the first proposal (the engine drafts its rows of such drafters in its own
    batched drafting, and this row would go unused)."""
    drafting = None

    def one_row(self):
        """The batched drafting over one row (BatchDraftModel, BatchEagle)."""
        raise NotImplementedError

    def reset(self) -> None:
        if self.drafting is not None:
            self.drafting.reset(0)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        if k <= 0:
            return Draft.empty()
        if self.drafting is None:
            self.drafting = self.one_row()
        drafts, _ = self.drafting.propose([DraftRow(0, ctx, k)])
        return drafts[0]


class CachedLMDrafter(OneRowDrafter):
    """Drafts autoregressively from any causal LM, in a one-row cache of its own; a
    subclass's `pick` chooses each draft token (synthetic: a set acceptance)."""

    def __init__(self, model):
        self.model = model

    pick = staticmethod(BatchDraftModel.pick)

    def one_row(self) -> BatchDraftModel:
        return BatchDraftModel(self.model, 1, pick=self.pick)


@register("draft-model")
class DraftModelDrafter(CachedLMDrafter):
    cost_hint = 0.2

    @classmethod
    def runs_on(cls, models) -> bool:
        return models.draft is not None

    def __init__(self, models):
        if models.draft is None:
            raise ValueError("drafter 'draft-model' needs a draft model (--draft PATH)")
        super().__init__(models.draft)

    @classmethod
    def batch_drafting(cls, models, max_batch: int, max_len: int, **options):
        if models.draft is None:
            return None
        return BatchDraftModel(models.draft, max_batch, max_len)
