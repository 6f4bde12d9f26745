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

DEFAULT_PRIOR_MEAN = 0.5  # acceptance before any evidence: no opinion either way


class AcceptanceEstimate:
    """P(accept position j | accepted 0..j-1), j = 0..k_max-1, as a Beta per position.

    Evidence (accepted / rejected counts) is discounted each update. Two levels of shrinkage:
    the pooled rate m_j = (sum of all positions' evidence + s_prior * prior_mean_j) / (...) is
    the prior of position j, worth `pool_strength` observations: deep positions, rarely drafted,
    borrow from shallow ones, and every position's noise shrinks, while the outside prior
    (a workload's pooled estimate) is worth only `prior_strength` observations in all.
    """

    def __init__(self, k_max: int, prior_mean=DEFAULT_PRIOR_MEAN, prior_strength: float = 2.0,
                 discount: float = 0.98, pool_strength: float = 8.0):
        self.k_max = k_max
        self.prior_mean = np.broadcast_to(np.asarray(prior_mean, float), (k_max,)).copy()
        self.strength = prior_strength
        self.pool_strength = pool_strength
        self.discount = discount
        self._set(np.zeros(k_max), np.zeros(k_max))

    def _set(self, ev_a: np.ndarray, ev_b: np.ndarray, total_a: float | None = None,
             total_b: float | None = None) -> None:
        """Replace the evidence (and its totals, summed here unless given); the cached Beta
        parameters go with it."""
        self.ev_a, self.ev_b, self._params = ev_a, ev_b, None
        self.total_a = float(ev_a.sum()) if total_a is None else total_a
        self.total_b = float(ev_b.sum()) if total_b is None else total_b

    def update(self, proposed: int, accepted: int) -> None:
        """One verified draft: positions 0..accepted-1 kept, position `accepted` (if proposed)
        rejected, later positions unobserved. On the per-step path: the totals are kept
        as running sums rather than re-summed."""
        d = self.discount
        ev_a, ev_b = self.ev_a * d, self.ev_b * d
        kept = min(accepted, self.k_max)
        ev_a[:kept] += 1
        rejected = accepted < proposed and accepted < self.k_max
        if rejected:
            ev_b[accepted] += 1
        self._set(ev_a, ev_b, self.total_a * d + kept, self.total_b * d + rejected)

    def update_many(self, proposed, accepted) -> None:
        """`update` for each (proposed[i], accepted[i]) in order, in one vectorised pass:
        after n updates the old evidence is scaled by discount^n and update i's increments
        by discount^(n-1-i). Same result as the loop, to rounding."""
        proposed = np.asarray(proposed, int)
        accepted = np.asarray(accepted, int)
        n = len(proposed)
        if n == 0:
            return
        weights = self.discount ** np.arange(n - 1, -1, -1, dtype=float)  # (n,)
        positions = np.arange(self.k_max)  # (k_max,)
        kept = positions[None, :] < np.minimum(accepted, self.k_max)[:, None]  # (n, k_max)
        rejected = (positions[None, :] == accepted[:, None]) & (accepted < proposed)[:, None]
        scale = self.discount ** n
        self._set(self.ev_a * scale + weights @ kept, self.ev_b * scale + weights @ rejected)

    def beta(self) -> tuple[np.ndarray, np.ndarray]:
        """(a, b), each (k_max,): the Beta parameters per position (cached until an update)."""
        if self._params is None:
            self._params = self._beta()
        return self._params

    def _beta(self) -> tuple[np.ndarray, np.ndarray]:
        s = self.strength
        pooled = (self.total_a + s * self.prior_mean) / (self.total_a + self.total_b + s)
        return self.ev_a + self.pool_strength * pooled, self.ev_b + self.pool_strength * (1 - pooled)

    def mean(self) -> np.ndarray:
        a, b = self.beta()
        return a / (a + b)

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


class CostModel:
    """Seconds per drafted token per drafter (EWMA), and target verify seconds as an affine
    function of the forward's size, v(K) = base + slope * K, fitted by discounted least squares
    over every step (all sizes inform one line, so rarely used K are never stale). An
    observation over 3x the current prediction (a cold start, a hiccup) is clipped."""

    def __init__(self, k_max: int, smoothing: float = 0.1, forgetting: float = 0.98,
                 warmup: bool = False, stale_after: int = 0):
        self.k_max = k_max
        self.smoothing = smoothing
        self.forgetting = forgetting
        # No lock-in (issue 14). The first forward of each size pays for allocation and
        # kernel selection, not for the size: with `warmup` it stays out of the fit. And the
        # line's slope is learnt only from forwards with K > 0: once none has run for
        # `stale_after` steps (the controller chose plain decoding throughout), the slope is
        # trusted less and less and falls to 0 — the memory-bound prior — over as many steps
        # again, so a slope that one slow early forward made too steep cannot keep K = 0
        # forever: drafting looks cheap again, is tried, and the real slope is measured.
        self.warmup = warmup
        self.stale_after = stale_after
        self._warm: set[int] = set()  # forward sizes (K) seen once
        self._since_drafted = 0  # verify forwards since the last one with K > 0
        self.draft: dict[str, float] = {}
        self.prefill: dict[str, float] = {}  # drafter -> seconds per context token at start-up
        self._sums = np.zeros(5)  # discounted sum of w, x, x^2, y, x*y
        self._sizes = np.arange(k_max + 1, dtype=float)
        self.observed = 0

    def observe_draft(self, drafter: str, seconds: float, proposed: int) -> None:
        if proposed > 0:
            per_token = seconds / proposed
            old = self.draft.get(drafter)
            self.draft[drafter] = per_token if old is None else old + self.smoothing * (per_token - old)

    def observe_prefill(self, drafter: str, seconds: float, proposed: int, context: int) -> None:
        """A drafter's first step in a request: its draft seconds minus the per-token part
        are the start-up (a cache prefill over `context` tokens)."""
        per_token = self.draft.get(drafter, 0.0)
        start_up = max(0.0, seconds - per_token * proposed)
        if context > 0:
            rate = start_up / context
            old = self.prefill.get(drafter)
            self.prefill[drafter] = rate if old is None else old + self.smoothing * (rate - old)

    def prefill_seconds(self, drafter: str, context: int) -> float:
        """Predicted start-up seconds of a drafter over `context` tokens (0 before measured:
        a stateless drafter, like n-gram lookup, has next to none)."""
        return self.prefill.get(drafter, 0.0) * context

    def observe_verify(self, verify_tokens: int, seconds: float) -> None:
        k = verify_tokens - 1
        if self.warmup and k not in self._warm:
            self._warm.add(k)
            return
        if k > 0:
            if self.stale_after and self._since_drafted > self.stale_after:
                # the first drafted forward after a stale spell: the line is fitted afresh
                # from here on (the plain forwards that follow restore its base within a few
                # steps), so the forwards that caused the spell cannot cause the next one
                self._sums = np.zeros(5)
            self._since_drafted = 0
        else:
            self._since_drafted += 1
        if self.observed >= 5:
            seconds = min(seconds, 3 * float(self.verify_seconds()[min(k, self.k_max)]))
        self._sums *= self.forgetting
        self._sums += (1.0, k, k * k, seconds, k * seconds)
        self.observed += 1

    def observe_verify_many(self, verify_tokens, seconds) -> None:
        """`observe_verify` for many steps in one pass (clipped against the prediction at the
        start of the batch rather than step by step)."""
        k = np.asarray(verify_tokens, float) - 1
        y = np.asarray(seconds, float)
        n = len(k)
        if n == 0:
            return
        if self.observed >= 5:
            predicted = self.verify_seconds()
            y = np.minimum(y, 3 * predicted[np.minimum(k, self.k_max).astype(int)])
        weights = self.forgetting ** np.arange(n - 1, -1, -1, dtype=float)
        terms = np.stack([np.ones(n), k, k * k, y, k * y])  # (5, n)
        self._sums = self._sums * self.forgetting ** n + terms @ weights
        self.observed += n

    def seed(self, base: float, slope: float, weight: float = 4.0) -> None:
        """Start from a saved line v(K) = base + slope * K (a warm start), worth `weight`
        observations: two pseudo-points at K = 0 and K = k_max / 2."""
        half = self.k_max / 2
        self._sums = np.zeros(5)
        for k in (0.0, half):
            y = base + slope * k
            self._sums += (weight / 2, weight / 2 * k, weight / 2 * k * k, weight / 2 * y,
                           weight / 2 * k * y)
        self.observed = max(self.observed, int(weight))

    def line(self) -> tuple[float, float] | None:
        """(base, slope) of the current fit, or None before any observation."""
        if self.observed == 0:
            return None
        v = self.verify_seconds()
        return float(v[0]), float(v[1] - v[0])

    @property
    def _sums(self) -> np.ndarray:
        return self._fit_sums

    @_sums.setter
    def _sums(self, value: np.ndarray) -> None:
        self._fit_sums, self._verify = value, None

    def verify_seconds(self) -> np.ndarray:
        """(k_max+1,) predicted seconds of a forward over K+1 tokens, K = 0..k_max (cached
        until the next observation)."""
        if self._verify is None:
            self._verify = self._fit()
        return self._verify

    def _fit(self) -> np.ndarray:
        w, x, xx, y, xy = self._sums.tolist()  # Python floats: faster than numpy scalars here
        if w == 0:
            return np.ones(self.k_max + 1)
        mean_x, mean_y = x / w, y / w
        var = xx / w - mean_x ** 2
        # one size seen so far: assume a memory-bound (flat) forward, the optimistic prior
        slope = max(0.0, (xy / w - mean_x * mean_y) / var) if var > 1e-9 else 0.0
        # a stale slope is trusted less and less (see __init__); the line still passes through
        # the mean of what was observed, which recent plain steps dominate
        slope *= self._trust()
        base = max(mean_y - slope * mean_x, 1e-6)
        return base + slope * self._sizes

    def _trust(self) -> float:
        """1 while the slope is fresh; falls linearly to 0 from `stale_after` forwards without
        a drafted one to twice that."""
        if not self.stale_after or self._since_drafted <= self.stale_after:
            return 1.0
        return max(0.0, 2.0 - self._since_drafted / self.stale_after)

    def draft_seconds(self, drafter: str, hint: float) -> float:
        """Measured seconds per drafted token, or hint * verify(0) before any measurement."""
        if drafter in self.draft:
            return self.draft[drafter]
        return hint * float(self.verify_seconds()[0])
