"""Online estimates the controller decides from: acceptance per drafter and position, and cost.

Acceptance: a discounted Beta per draft position (conditional on every earlier position being
accepted), so it follows phase changes inside a request: each update first shrinks the evidence
towards the prior by `discount`, then adds the new observation.

Cost: EWMAs of draft seconds per drafted token (per drafter) and of target verify seconds per
number of tokens in the forward; entries never observed are filled from a least-squares line
through the observed ones (verify cost is close to affine in tokens on a CPU).
"""
from __future__ import annotations

import numpy as np


class AcceptanceEstimate:
    """Beta(a, b) per position j = 0..k_max-1 for P(accept j | accepted 0..j-1)."""

    def __init__(self, k_max: int, prior_mean: float = 0.5, prior_strength: float = 2.0,
                 discount: float = 0.98):
        self.k_max = k_max
        self.prior_a = np.full(k_max, prior_mean * prior_strength)
        self.prior_b = np.full(k_max, (1 - prior_mean) * prior_strength)
        self.a, self.b = self.prior_a.copy(), self.prior_b.copy()
        self.discount = discount

    def update(self, proposed: int, accepted: int) -> None:
        """One verified draft: positions 0..accepted-1 kept, position `accepted` (if proposed)
        rejected, later positions unobserved."""
        self.a = self.prior_a + self.discount * (self.a - self.prior_a)
        self.b = self.prior_b + self.discount * (self.b - self.prior_b)
        kept = min(accepted, self.k_max)
        self.a[:kept] += 1
        if accepted < proposed and accepted < self.k_max:
            self.b[accepted] += 1

    def mean(self) -> np.ndarray:
        return self.a / (self.a + self.b)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return rng.beta(self.a, self.b)

    def observations(self) -> np.ndarray:
        return self.a + self.b - self.prior_a - self.prior_b


class CostModel:
    """Seconds per drafted token per drafter, and target verify seconds per forward size."""

    def __init__(self, k_max: int, smoothing: float = 0.1):
        self.k_max = k_max
        self.smoothing = smoothing
        self.draft: dict[str, float] = {}
        self.verify = np.full(k_max + 1, np.nan)  # index K: a forward over K+1 tokens

    def _ewma(self, old: float, new: float) -> float:
        return new if np.isnan(old) else old + self.smoothing * (new - old)

    def observe_draft(self, drafter: str, seconds: float, proposed: int) -> None:
        if proposed > 0:
            per_token = seconds / proposed
            self.draft[drafter] = self._ewma(self.draft.get(drafter, np.nan), per_token)

    def observe_verify(self, verify_tokens: int, seconds: float) -> None:
        k = verify_tokens - 1
        if 0 <= k <= self.k_max:
            self.verify[k] = self._ewma(self.verify[k], seconds)

    def verify_seconds(self) -> np.ndarray:
        """(k_max+1,) with gaps filled by a line through the observed points."""
        seen = ~np.isnan(self.verify)
        if seen.all():
            return self.verify.copy()
        ks = np.arange(self.k_max + 1)
        if seen.sum() == 0:
            return np.ones(self.k_max + 1)
        if seen.sum() == 1:
            # one point: assume the forward is memory-bound (flat), the optimistic prior
            return np.full(self.k_max + 1, self.verify[seen][0])
        slope, intercept = np.polyfit(ks[seen], self.verify[seen], 1)
        filled = np.where(seen, self.verify, intercept + slope * ks)
        return np.maximum(filled, 1e-6)

    def draft_seconds(self, drafter: str, hint: float) -> float:
        """Measured seconds per drafted token, or hint * verify(0) before any measurement."""
        if drafter in self.draft:
            return self.draft[drafter]
        return hint * float(self.verify_seconds()[0])
