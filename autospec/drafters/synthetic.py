"""A drafter with a chosen acceptance rate, for tests and simulation.

It runs the target itself (so it is never fast): with probability `alpha` each position is the
target's own choice, otherwise a token the target would not pick. Per-position acceptance is
then alpha, independent across positions: the flat-alpha case of the cost model in
docs/controller.md. Under sampling it draws from the mixture alpha * target + (1 - alpha) *
uniform and reports that mixture as draft_probs, so rejection sampling stays exact.
"""
from __future__ import annotations

import torch

from autospec.drafters.contract import DraftContext, register
from autospec.drafters.draft_model import CachedLMDrafter
from autospec.models.sampling import probs_from_logits, sample


@register("synthetic")
class SyntheticDrafter(CachedLMDrafter):
    def __init__(self, models, alpha: float = 0.7, seed: int = 0, cost_hint: float = 0.1):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"synthetic alpha must be in [0, 1], got {alpha}")
        self.alpha = alpha
        self.cost_hint = cost_hint
        self.rng = torch.Generator().manual_seed(seed)
        super().__init__(models.target)

    def pick(self, logits: torch.Tensor, ctx: DraftContext) -> tuple[int, torch.Tensor | None]:
        if ctx.sampling.greedy:
            hit = float(torch.rand(1, generator=self.rng)) < self.alpha
            top2 = torch.topk(logits, 2).indices.tolist()
            return (top2[0] if hit else top2[1]), None
        target_probs = probs_from_logits(logits, ctx.sampling)
        mixture = self.alpha * target_probs + (1 - self.alpha) / target_probs.numel()
        return sample(mixture, self.rng), mixture
