"""Online estimates the controller decides from: acceptance per drafter and position, and cost.

Acceptance: a discounted Beta per draft position (conditional on every earlier position being
accepted), so it follows phase changes inside a request: each update first shrinks the evidence
by `discount`, then adds the new observation.

Cost: EWMAs of draft seconds per drafted token (per drafter); target verify seconds per forward
size as a discounted least-squares line through every step, each size moved towards its own
measured mean (on a CPU the cost steps rather than growing evenly); and the per-step overhead
outside draft and verify, which every round pays (`step_list` is what decisions price).

All of it is on the per-step path (decide + update must stay under 1 % of a step), so in Python
floats: right after a forward the CPU's caches are cold and a dozen numpy calls on 16-element
arrays cost more than the loops.
"""
from __future__ import annotations

from collections import deque

import numpy as np

DEFAULT_PRIOR_MEAN = 0.5  # acceptance before any evidence: no opinion either way
# observations of one forward size before its own mean counts half. Like CostModel's smoothing
# and forgetting, a weight against live timing noise that replay cannot judge (a trace's step
# costs sit exactly on its line): chosen, not measured
SIZE_PRIOR = 4.0
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


class RunningMedian:
    """The median of the last `window` observations' worth (0.0 before any): what a per-step
    overhead is estimated by. A mean would take in a one-off pause — a full garbage
    collection (165 ms against a 0.1 ms overhead on the reference pair), a page fault, a
    first call's lazy set-up — and price every decision by it for dozens of steps. Each
    observation has a weight (a batched step's rows each report it with 1 / rows: together
    one step), and the window holds the newest observations worth `window` in all."""

    def __init__(self, window: int = 9):
        self.window = window
        self._last: deque[list[float]] = deque()  # [value, weight], oldest first
        self._total = 0.0
        self._value: float | None = 0.0  # None: to be computed from _last

    def observe(self, x: float, weight: float = 1.0) -> None:
        last = self._last
        if last and last[-1][0] == x and last[-1][1] + weight <= 1.0 + 1e-9:
            last[-1][1] += weight  # a batched step's next row: one entry per step
        else:
            last.append([x, weight])
        self._total += weight
        while self._total - last[0][1] >= self.window - 1e-9:
            self._total -= last.popleft()[1]
        self._value = None

    @property
    def value(self) -> float:
        """The weighted median; at equal weights the middle one (the two middle ones' mean)."""
        if self._value is None and len(self._last) == self._total:  # every weight 1: batch 1
            ordered = sorted(x for x, _ in self._last)
            n = len(ordered)
            self._value = ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
        if self._value is None:
            half, below = self._total / 2, 0.0
            ordered = sorted(self._last)
            for i, (value, w) in enumerate(ordered):
                below += w
                if abs(below - half) <= 1e-9 * self._total and i + 1 < len(ordered):
                    self._value = 0.5 * (value + ordered[i + 1][0])
                    break
                if below > half:
                    self._value = value
                    break
        return self._value

    def seed(self, x: float) -> None:
        """Start from a kept value (a restored state) as if observed once."""
        self._last.clear()
        self._total, self._value = 0.0, 0.0
        if x:
            self.observe(x)


class CostModel:
    """Seconds per drafted token per drafter (EWMA), and target verify seconds as an affine
    function of the forward's size, v(K) = base + slope * K, fitted by discounted least squares
    over every step (all sizes inform one line, so rarely used K are never stale). An
    observation over 3x the current prediction (a cold start, a hiccup) is clipped."""

    def __init__(self, k_max: int, smoothing: float = 0.1, forgetting: float = 0.98,
                 stale_after: int = 0):
        self.k_max = k_max
        self.smoothing = smoothing
        self.forgetting = forgetting
        # No lock-in. The line's slope is learnt only from forwards with K > 0: once none has run for
        # `stale_after` steps (the controller chose plain decoding throughout), the slope is
        # trusted less and less and falls to 0 — the memory-bound prior — over as many steps
        # again, so a slope that one slow early forward made too steep cannot keep K = 0
        # forever: drafting looks cheap again, is tried, and the real slope is measured.
        self.stale_after = stale_after
        self._since_drafted = 0  # verify forwards since the last one with K > 0
        self.draft: dict[str, float] = {}
        self.prefill: dict[str, float] = {}  # drafter -> seconds per context token at start-up
        # seconds every step pays besides its draft and its verify forward (the engine's own
        # work: accept, roll back, telemetry, the controller): an EWMA, 0 until measured
        self._overhead = RunningMedian()
        self._step: list[float] | None = None
        # per forward size, a discounted mean of its measured seconds and its discounted count:
        # on this CPU v(K) is not affine — it steps (v(3) ~20 % over the line through all
        # sizes on the reference pair, K = 8..16 under it), and a line alone makes K = 3 look
        # cheap. A size's prediction is the line moved towards that mean, by n / (n +
        # SIZE_PRIOR); sizes never run keep the line.
        self._size_mean = [0.0] * (k_max + 1)
        self._size_n = [0.0] * (k_max + 1)
        self._sums = [0.0] * 5  # discounted sum of w, x, x^2, y, x*y (Python floats)
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
        if k > 0:
            if self.stale_after and self._since_drafted > self.stale_after:
                # the first drafted forward after a stale spell: the line is fitted afresh
                # from here on (the plain forwards that follow restore its base within a few
                # steps), so the forwards that caused the spell cannot cause the next one
                self._sums = [0.0] * 5
                self._size_mean = [0.0] * (self.k_max + 1)
                self._size_n = [0.0] * (self.k_max + 1)
            self._since_drafted = 0
        else:
            self._since_drafted += 1
        size = min(k, self.k_max)
        if self.observed >= 5:
            seconds = min(seconds, 3 * self.verify_list()[size])
        n = self._size_n[size] = self._size_n[size] * self.forgetting + 1.0
        self._size_mean[size] += (seconds - self._size_mean[size]) / n
        # Python floats: on the per-step path five numpy scalars cost more than the sums
        f = self.forgetting
        w, x, xx, y, xy = self._fit_sums
        self._sums = [w * f + 1.0, x * f + k, xx * f + k * k, y * f + seconds, xy * f + k * seconds]
        self.observed += 1

    def seed(self, base: float, slope: float, weight: float = 4.0) -> None:
        """Start from a saved line v(K) = base + slope * K (a warm start), worth `weight`
        observations: two pseudo-points at K = 0 and K = k_max / 2."""
        half = self.k_max / 2
        sums = [0.0] * 5
        for k in (0.0, half):
            y = base + slope * k
            for i, term in enumerate((1.0, k, k * k, y, k * y)):
                sums[i] += weight / 2 * term
        self._sums = sums
        self.observed = max(self.observed, int(weight))

    def line(self) -> tuple[float, float] | None:
        """(base, slope) of the current fit, or None before any observation."""
        if self.observed == 0:
            return None
        if self._fitted_line is None:  # cached until the next observation, as the sizes are
            self._fitted_line = self._line()
        return self._fitted_line

    @property
    def _sums(self) -> list[float]:
        return self._fit_sums

    @_sums.setter
    def _sums(self, value: list[float]) -> None:
        self._fit_sums, self._verify, self._verify_list, self._step = value, None, None, None
        self._fitted_line = None

    def observe_overhead(self, seconds: float) -> None:
        """One step's seconds outside its draft and its verify forward (the engine measures
        them: StepRecord.overhead_seconds); clipped at 0. The estimate is their running median."""
        self._overhead.observe(max(0.0, seconds))
        self._step = None

    @property
    def overhead(self) -> float:
        """Seconds a step pays outside its draft and verify (0 until measured)."""
        return self._overhead.value

    def step_list(self) -> list[float]:
        """(k_max+1) predicted seconds of a step whose forward holds K+1 tokens, draft aside:
        the verify line plus the per-step overhead. What a decision compares: without the
        overhead a long draft's saving of whole steps is undercounted and K comes out short
        (on the reference pair the overhead is ~4 % of a plain step)."""
        if self._step is None:
            overhead = self.overhead
            self._step = [v + overhead for v in self.verify_list()]
        return self._step

    def verify_seconds(self) -> np.ndarray:
        """(k_max+1,) predicted seconds of a forward over K+1 tokens, K = 0..k_max (cached
        until the next observation)."""
        if self._verify is None:
            self._verify = np.array(self.verify_list())
        return self._verify

    def verify_list(self) -> list[float]:
        """`verify_seconds()` as Python floats (the per-step path's form; cached the same)."""
        if self._verify_list is None:
            self._verify_list = self._fit()
        return self._verify_list

    def _line(self) -> tuple[float, float] | None:
        """(base, slope) of the discounted least-squares line, or None before any forward."""
        w, x, xx, y, xy = self._sums
        if w == 0:
            return None
        mean_x, mean_y = x / w, y / w
        var = xx / w - mean_x ** 2
        # one size seen so far: assume a memory-bound (flat) forward, the optimistic prior
        slope = max(0.0, (xy / w - mean_x * mean_y) / var) if var > 1e-9 else 0.0
        # a stale slope is trusted less and less (see __init__); the line still passes through
        # the mean of what was observed, which recent plain steps dominate
        slope *= self._trust()
        base = max(mean_y - slope * mean_x, 1e-6)
        return base, slope

    def _fit(self) -> list[float]:
        """The line, each size moved towards its own mean (see __init__)."""
        line = self._line()
        if line is None:
            return [1.0] * (self.k_max + 1)
        base, slope = line
        out = []
        for k, (mean, n) in enumerate(zip(self._size_mean, self._size_n)):
            at = base + slope * k
            out.append(at + (mean - at) * n / (n + SIZE_PRIOR))
        trust = self._trust()
        if trust < 1.0:  # a stale spell: the drafted sizes fade to the flat prior, out[0]
            out = [out[0]] + [trust * v + (1.0 - trust) * out[0] for v in out[1:]]
        return out

    def _trust(self) -> float:
        """1 while the slope is fresh; falls linearly to 0 from `stale_after` forwards without
        a drafted one to twice that."""
        if not self.stale_after or self._since_drafted <= self.stale_after:
            return 1.0
        return max(0.0, 2.0 - self._since_drafted / self.stale_after)
