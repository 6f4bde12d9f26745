"""K for every row of a batch at once, from what the batch's forward costs (issue 15).

At batch 1 a verify forward is memory-bound: K more tokens cost little, and speculation pays
from a low acceptance. In a full batch the forward is compute-bound: every drafted token of
every row costs, and the same acceptance no longer pays (vLLM measured +23 % at batch 1 and
-16 % at batch 32 at a flat acceptance). So K is chosen for the batch's goodput — its tokens
per second — not for each row alone:

    step seconds   s(B, T) = a + b B + c T        (T tokens in the forward, B rows; fitted
                                                  online from the batch steps: BatchCost)
    goodput        (B + sum_i E_i(K_i)) / (s(B, B + sum_i K_i) + sum_i d_i K_i)

with E_i(K) = sum_{j<K} prod_{l<=j} alpha_il the expected accepted tokens of row i and d_i its
drafter's seconds per drafted token. The gain of row i's (j+1)-th drafted token,
prod_{l<=j} alpha_il, falls with j, and its cost c + d_i is the same for every j, so the best
set of drafted tokens is a prefix per row: maximising a ratio, Dinkelbach's iteration — take
every token whose gain beats R (c + d_i) at the current goodput R, recompute R, repeat — ends
in a few rounds at the optimum, for all rows in one pass over a (B, K_max) array. K = 0 for
every row when no drafted token pays (`batch_ks`).
"""
from __future__ import annotations

import numpy as np

MIN_BATCH_STEPS = 4.0  # (weighted) batch steps observed before the batch line is trusted


def batch_ks(gains: np.ndarray, token_seconds: np.ndarray, base_seconds: float,
             rounds: int = 8) -> np.ndarray:
    """K per row maximising the batch's goodput (see the module docstring).

    gains: (B, K_max) expected extra tokens of each row's (j+1)-th drafted token, falling in
    j (0 where the row cannot draft that far); token_seconds: (B,) seconds a drafted token
    of that row adds (the forward's per-token slope plus the drafter's per-token cost);
    base_seconds: the step's seconds with no drafted token (a + b B + c B).
    Returns (B,) ints."""
    rows = gains.shape[0]
    rate = rows / base_seconds
    take = np.zeros_like(gains, dtype=bool)
    for _ in range(rounds):
        # a prefix per row: gains fall along j, the price is the row's
        new = np.cumprod(gains > rate * token_seconds[:, None], axis=1).astype(bool)
        new_rate = (rows + gains[new].sum()) / (base_seconds + (new * token_seconds[:, None]).sum())
        if np.array_equal(new, take):
            break
        take, rate = new, new_rate
    return take.sum(axis=1)


class BatchCost:
    """s(B, T) = a + b B + c T by discounted least squares over batch steps, ridge-anchored at
    batch 1 on the single-row verify line (CostModel), which a batch-1 run measures anyway:
    with every batch of one size, B and the constant could not be told apart otherwise."""

    def __init__(self, forgetting: float = 0.98, anchor_weight: float = 4.0):
        self.forgetting = forgetting
        self.anchor_weight = anchor_weight
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self.observed = 0.0  # discounted batch steps

    def observe(self, rows: int, tokens: int, seconds: float, weight: float = 1.0) -> None:
        """One batch step (a row's record may report it with weight 1 / rows)."""
        x = np.array([1.0, rows, tokens])
        self._xtx = self._xtx * self.forgetting ** weight + weight * np.outer(x, x)
        self._xty = self._xty * self.forgetting ** weight + weight * seconds * x
        self.observed = self.observed * self.forgetting ** weight + weight

    def state(self) -> dict:
        """What restores this model exactly (JSON): the store keeps it per pair and hardware."""
        return {"xtx": self._xtx.ravel().tolist(), "xty": self._xty.tolist(),
                "observed": self.observed}

    def restore(self, state: dict) -> "BatchCost":
        self._xtx = np.asarray(state["xtx"], float).reshape(3, 3)
        self._xty = np.asarray(state["xty"], float).reshape(3)
        self.observed = float(state["observed"])
        return self

    def line(self, anchor: tuple[float, float] | None) -> tuple[float, float, float] | None:
        """(a, b, c), with batch 1 anchored to the single-row line v(K) = base + slope K
        (`anchor`, CostModel.line()); without one (a server that never ran a batch of one),
        b = 0 and s = a + c T. None before MIN_BATCH_STEPS batch steps."""
        if self.observed < MIN_BATCH_STEPS:
            return None
        xtx, xty = self._xtx.copy(), self._xty.copy()
        if anchor is None:
            keep = [0, 2]
            a, c = np.linalg.solve(xtx[np.ix_(keep, keep)] + 1e-12 * np.eye(2), xty[keep])
            return float(a), 0.0, max(float(c), 0.0)
        base, slope = anchor
        w = self.anchor_weight
        for k in (0.0, 8.0):  # v(0) and v(8) of the single-row line, at B = 1, T = K + 1
            x = np.array([1.0, 1.0, k + 1])
            xtx += w * np.outer(x, x)
            xty += w * (base + slope * k) * x
        a, b, c = np.linalg.solve(xtx + 1e-12 * np.eye(3), xty)
        return float(a), float(b), max(float(c), 0.0)
