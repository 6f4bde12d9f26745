"""Online acceptance estimates the controller decides from, per drafter and position (the step's
cost is controller/cost.py's).

A discounted Beta per draft position (conditional on every earlier position being accepted),
so it follows phase changes inside a request: each update first shrinks the evidence by
`discount`, then adds the new observation.

All of it is on the per-step path (decide + update must stay under 1 % of a step), so in Python
floats: right after a forward the CPU's caches are cold and a dozen numpy calls on 16-element
arrays cost more than the loops.
"""
from __future__ import annotations

import numpy as np

DEFAULT_PRIOR_MEAN = 0.5  # acceptance before any evidence: no opinion either way
# what a workload's pooled estimate's prior (a policy's prior mean) is worth, in observations:
# the pooled evidence outweighs it within a request or two; the daemon's Learner keeps the same
# estimates. Replayed at 0.5 and 8 (`autospec replay TRACE --knobs`, docs/controller.md): no
# effect beyond noise on any trace, so any small value serves
POOLED_PRIOR_STRENGTH = 2.0
# what the positions' pooled rate is worth as each position's prior, in observations.
# Replayed (confidence on): 0.5 cost 2.3 % of tokens/s on held-out, beyond noise; 32 moved
# nothing beyond noise (docs/controller.md)
POOL_STRENGTH = 8.0


class AcceptanceEstimate:
    """P(accept position j | accepted 0..j-1), j = 0..k_max-1, as a Beta per position.

    Evidence (accepted / rejected counts) is multiplied by `discount` each update (1, the
    controller's: kept whole; the daemon's Learner ages its own). Two levels of shrinkage:
    the pooled rate m_j = (sum of all positions' evidence + s_prior * prior_mean_j) / (...) is
    the prior of position j, worth POOL_STRENGTH observations: deep positions, rarely drafted,
    borrow from shallow ones, and every position's noise shrinks, while the outside prior
    (a workload's pooled estimate) is worth only `prior_strength` observations in all.

    On the per-step path (decide + update under 1 % of a step) the evidence is kept in
    Python floats with the discount applied lazily: the stored counts are in units of
    `_scale` (evidence = stored * scale), so an update multiplies one float and touches only
    the positions it observed, instead of rescaling every position; numpy views (`ev_a`,
    `beta()`, `mean()`) are built on demand for everything off that path.
    """

    def __init__(self, k_max: int, prior_mean=DEFAULT_PRIOR_MEAN,
                 prior_strength: float = POOLED_PRIOR_STRENGTH, discount: float = 1.0):
        self.k_max = k_max
        if isinstance(prior_mean, (int, float)):
            self._prior_list = [float(prior_mean)] * k_max
        else:  # per position (a list, or another estimate's mean())
            prior = [float(x) for x in prior_mean]
            if len(prior) != k_max:
                raise ValueError(f"prior_mean has {len(prior)} positions, k_max is {k_max}")
            self._prior_list = prior
        self.strength = prior_strength
        self.pool_strength = POOL_STRENGTH
        self.discount = discount
        self._raw_a, self._raw_b = [0.0] * k_max, [0.0] * k_max
        self._scale, self._params, self.total_a, self.total_b = 1.0, None, 0.0, 0.0

    def _set(self, ev_a, ev_b, total_a: float | None = None, total_b: float | None = None) -> None:
        """Replace the evidence (and its totals, summed here unless given); the cached Beta
        parameters go with it."""
        self._raw_a = [float(x) for x in ev_a]
        self._raw_b = [float(x) for x in ev_b]
        self._scale = 1.0
        self._params = None
        self.total_a = float(sum(self._raw_a)) if total_a is None else total_a
        self.total_b = float(sum(self._raw_b)) if total_b is None else total_b

    @property
    def prior_mean(self) -> np.ndarray:
        """(k_max,) the outside prior's mean per position."""
        return np.array(self._prior_list)

    @property
    def ev_a(self) -> np.ndarray:
        """(k_max,) discounted accepted counts per position."""
        return np.array(self._raw_a) * self._scale

    @property
    def ev_b(self) -> np.ndarray:
        """(k_max,) discounted rejected counts per position."""
        return np.array(self._raw_b) * self._scale

    def update(self, proposed: int, accepted: int) -> None:
        """One verified draft: positions 0..accepted-1 kept, position `accepted` (if proposed)
        rejected, later positions unobserved."""
        d = self.discount
        self._scale *= d
        if self._scale < 1e-100:  # fold the scale back in before the stored counts overflow
            self._set(self.ev_a, self.ev_b, self.total_a, self.total_b)
            self._scale *= d
        step = 1.0 / self._scale
        kept = min(accepted, self.k_max)
        raw_a = self._raw_a
        for j in range(kept):
            raw_a[j] += step
        rejected = accepted < proposed and accepted < self.k_max
        if rejected:
            self._raw_b[accepted] += step
        self.total_a = self.total_a * d + kept
        self.total_b = self.total_b * d + rejected
        self._params = None

    def beta_lists(self) -> tuple[list[float], list[float]]:
        """(a, b), each k_max Python floats: the Beta parameters per position (cached until
        an update). The per-step path's form of `beta()`."""
        if self._params is None:
            s, strength, scale = self.strength, self.pool_strength, self._scale
            weight = strength / (self.total_a + self.total_b + s)
            # the pooled prior of position j, in pseudo-observations: weight * (total_a + s m_j)
            base = weight * self.total_a
            pooled = [base + weight * s * prior for prior in self._prior_list]
            self._params = ([raw * scale + p for raw, p in zip(self._raw_a, pooled)],
                            [raw * scale + strength - p for raw, p in zip(self._raw_b, pooled)])
            self._means = None
        return self._params

    def mean_list(self) -> list[float]:
        """(k_max) posterior means as Python floats (cached with the Beta parameters)."""
        a, b = self.beta_lists()
        if self._means is None:
            self._means = [x / (x + y) for x, y in zip(a, b)]
        return self._means

    def beta(self) -> tuple[np.ndarray, np.ndarray]:
        """(a, b), each (k_max,): the Beta parameters per position."""
        a, b = self.beta_lists()
        return np.array(a), np.array(b)

    def mean(self) -> np.ndarray:
        return np.array(self.mean_list())

    def observations(self) -> np.ndarray:
        return self.ev_a + self.ev_b

    def rates(self) -> np.ndarray:
        """Raw evidence rate per position (the pooled mean where there is no evidence): with
        observations(), all that is needed to restore the estimate (`restore`)."""
        seen = self.observations()
        return np.where(seen > 0, self.ev_a / np.maximum(seen, 1e-300), self.mean())

    def restore(self, rates, observations) -> "AcceptanceEstimate":
        """Replace the evidence by saved (rates, observations), truncated or zero-padded to
        k_max. Returns self."""
        n = min(self.k_max, len(rates))
        seen = np.zeros(self.k_max)
        seen[:n] = np.asarray(observations, float)[:n]
        rate = np.zeros(self.k_max)
        rate[:n] = np.asarray(rates, float)[:n]
        self._set(seen * rate, seen * (1 - rate))
        return self
