"""Online estimates the controller decides from: acceptance per drafter and position, and cost.

Acceptance: a discounted Beta per draft position (conditional on every earlier position being
accepted), so it follows phase changes inside a request: each update first shrinks the evidence
by `discount`, then adds the new observation.

Cost: EWMAs of draft seconds per drafted token (per drafter) and of target verify seconds per
number of tokens in the forward; entries never observed are filled from a least-squares line
through the observed ones (verify cost is close to affine in tokens on a CPU).
"""
from __future__ import annotations

import numpy as np


class AcceptanceEstimate:
    """P(accept position j | accepted 0..j-1), j = 0..k_max-1, as a Beta per position.

    Evidence (accepted / rejected counts) is discounted each update. Two levels of shrinkage:
    the pooled rate m_j = (sum of all positions' evidence + s_prior * prior_mean_j) / (...) is
    the prior of position j, worth `pool_strength` observations: deep positions, rarely drafted,
    borrow from shallow ones, and every position's noise shrinks, while the outside prior
    (a workload's pooled estimate) is worth only `prior_strength` observations in all.
    """

    def __init__(self, k_max: int, prior_mean=0.5, prior_strength: float = 2.0,
                 discount: float = 0.98, pool_strength: float = 8.0):
        self.k_max = k_max
        self.prior_mean = np.broadcast_to(np.asarray(prior_mean, float), (k_max,)).copy()
        self.strength = prior_strength
        self.pool_strength = pool_strength
        self.discount = discount
        self.ev_a = np.zeros(k_max)
        self.ev_b = np.zeros(k_max)

    def update(self, proposed: int, accepted: int) -> None:
        """One verified draft: positions 0..accepted-1 kept, position `accepted` (if proposed)
        rejected, later positions unobserved."""
        self.ev_a *= self.discount
        self.ev_b *= self.discount
        kept = min(accepted, self.k_max)
        self.ev_a[:kept] += 1
        if accepted < proposed and accepted < self.k_max:
            self.ev_b[accepted] += 1

    def _beta(self) -> tuple[np.ndarray, np.ndarray]:
        s = self.strength
        pooled = (self.ev_a.sum() + s * self.prior_mean) / (self.ev_a.sum() + self.ev_b.sum() + s)
        return self.ev_a + self.pool_strength * pooled, self.ev_b + self.pool_strength * (1 - pooled)

    def mean(self) -> np.ndarray:
        a, b = self._beta()
        return a / (a + b)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return rng.beta(*self._beta())

    def observations(self) -> np.ndarray:
        return self.ev_a + self.ev_b


class CostModel:
    """Seconds per drafted token per drafter (EWMA), and target verify seconds as an affine
    function of the forward's size, v(K) = base + slope * K, fitted by discounted least squares
    over every step (all sizes inform one line, so rarely used K are never stale). An
    observation over 3x the current prediction (a cold start, a hiccup) is clipped."""

    def __init__(self, k_max: int, smoothing: float = 0.1, forgetting: float = 0.98):
        self.k_max = k_max
        self.smoothing = smoothing
        self.forgetting = forgetting
        self.draft: dict[str, float] = {}
        self._sums = np.zeros(5)  # discounted sum of w, x, x^2, y, x*y
        self.observed = 0

    def observe_draft(self, drafter: str, seconds: float, proposed: int) -> None:
        if proposed > 0:
            per_token = seconds / proposed
            old = self.draft.get(drafter)
            self.draft[drafter] = per_token if old is None else old + self.smoothing * (per_token - old)

    def observe_verify(self, verify_tokens: int, seconds: float) -> None:
        k = verify_tokens - 1
        if self.observed >= 5:
            seconds = min(seconds, 3 * float(self.verify_seconds()[min(k, self.k_max)]))
        self._sums *= self.forgetting
        self._sums += (1.0, k, k * k, seconds, k * seconds)
        self.observed += 1

    def verify_seconds(self) -> np.ndarray:
        """(k_max+1,) predicted seconds of a forward over K+1 tokens, K = 0..k_max."""
        w, x, xx, y, xy = self._sums
        if w == 0:
            return np.ones(self.k_max + 1)
        mean_x, mean_y = x / w, y / w
        var = xx / w - mean_x ** 2
        # one size seen so far: assume a memory-bound (flat) forward, the optimistic prior
        slope = max(0.0, (xy / w - mean_x * mean_y) / var) if var > 1e-9 else 0.0
        base = max(mean_y - slope * mean_x, 1e-6)
        return base + slope * np.arange(self.k_max + 1)

    def draft_seconds(self, drafter: str, hint: float) -> float:
        """Measured seconds per drafted token, or hint * verify(0) before any measurement."""
        if drafter in self.draft:
            return self.draft[drafter]
        return hint * float(self.verify_seconds()[0])
