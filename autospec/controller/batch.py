"""K for every row of a batch at once, from what the batch's forward costs (issue 15).

At batch 1 a verify forward is memory-bound: K more tokens cost little, and speculation pays
from a low acceptance. In a full batch the forward is compute-bound: drafted tokens cost,
and the same acceptance no longer pays (vLLM measured +23 % at batch 1 and -16 % at batch 32
at a flat acceptance). So K is chosen for the batch's goodput — its tokens per second — not
for each row alone. The forward pads every row to the longest (engine/batch.py), so what it
computes is B rows x W positions, W = 1 + the largest K of any row:

    step seconds   s(B, W) = a + b B + c B W + o B   (a, b, c fitted online from the batch
                                                  forwards: BatchCost, with P = B W the padded
                                                  size; o the per-row overhead outside them)
    goodput        (B + sum_i E_i(K_i)) / (s(B, 1 + max_i K_i) + sum_i d_i K_i)

with E_i(K) = sum_{j<K} prod_{l<=j} alpha_il the expected accepted tokens of row i and d_i its
drafter's seconds per drafted token. One long draft makes every row's slot that long, so the
choice is a width: for each W, every row drafts what pays within it — a prefix of its
positions, since a token's gain prod_{l<=j} alpha_il falls with j while its price d_i does not:
all W - 1 for a free look-up drafter, fewer where drafting costs — and the best W wins.
Dinkelbach's iteration on the goodput R (a token is taken where its gain beats R d_i; R is
recomputed) ends in a few rounds, over a (B, K_max + 1) table for every width at once
(`batch_ks`). W = 1 (K = 0 for every row) when no draft pays for its padding.
"""
from __future__ import annotations

import numpy as np

MIN_BATCH_STEPS = 4.0  # (weighted) batch steps observed before the batch line is trusted
OVERHEAD_SMOOTHING = 0.1  # EWMA weight of one step's per-row overhead


def batch_ks(gains: np.ndarray, draft_seconds: np.ndarray, a: float, b: float, c: float,
             rounds: int = 6) -> np.ndarray:
    """K per row maximising the batch's goodput (see the module docstring).

    gains: (B, K_max) expected extra tokens of each row's (j+1)-th drafted token, falling in
    j (0 where the row cannot draft that far); draft_seconds: (B,) seconds a drafted token of
    that row costs its drafter; a, b, c: the step's cost s = a + b B + c B W. Returns (B,) ints."""
    rows, k_max = gains.shape
    widths = np.arange(k_max + 1)  # K* = W - 1, the longest draft allowed
    cum = np.concatenate([np.zeros((rows, 1)), np.cumsum(gains, axis=1)], axis=1)  # E_i(k)
    forward = a + b * rows + c * rows * (widths + 1)  # (K_max + 1,) seconds per width
    rate = rows / forward[0]
    best = np.zeros(rows, dtype=int)
    for _ in range(rounds):
        # each row's free length: the prefix of its positions whose gain beats its price
        free = np.cumprod(gains > rate * draft_seconds[:, None], axis=1).sum(axis=1)  # (B,)
        ks = np.minimum(free[:, None], widths[None, :])  # (B, K_max + 1): K_i at each width
        tokens = rows + np.take_along_axis(cum, ks, axis=1).sum(axis=0)
        seconds = forward + (ks * draft_seconds[:, None]).sum(axis=0)
        goodput = tokens / seconds
        width = int(np.argmax(goodput))
        new_rate = float(goodput[width])
        best = ks[:, width]
        if abs(new_rate - rate) <= 1e-9 * rate:
            break
        rate = new_rate
    return best


def rows_ks(means: list[list[float]], draft_seconds: list[float], k_max: int, a: float,
            b: float, c: float) -> list[int]:
    """`batch_ks` from each row's per-position acceptance means (a row that does not draft:
    []; a look-up's row as far as its proposal): the gains are their running products."""
    gains = np.zeros((len(means), k_max))
    for i, row in enumerate(means):
        if row:
            gains[i, :min(len(row), k_max)] = np.cumprod(row[:k_max])
    return batch_ks(gains, np.asarray(draft_seconds, float), a, b, c).tolist()


class BatchCost:
    """s(B, P) = a + b B + c P (P = B W, the padded positions the forward computes) by
    discounted least squares over batch steps, ridge-anchored at batch 1 on the single-row
    verify line (CostModel), which a batch-1 run measures anyway: with every batch of one
    size, B and the constant could not be told apart otherwise."""

    def __init__(self, forgetting: float = 0.98, anchor_weight: float = 4.0):
        self.forgetting = forgetting
        self.anchor_weight = anchor_weight
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self.observed = 0.0  # discounted batch steps
        # seconds per row a batch step pays outside its forward and its drafts (proposing,
        # accepting, the controller, row by row): an EWMA, 0 until measured. Charged to every
        # width alike, it is what makes fewer, longer steps worth their padding
        self.row_overhead = 0.0
        self._step: tuple[float, int, float] | None = None  # (step start, rows, max seen)

    def observe(self, rows: int, positions: int, seconds: float, weight: float = 1.0) -> None:
        """One batch step over `positions` = rows x width (a row's record may report it with
        weight 1 / rows)."""
        x = np.array([1.0, rows, positions])
        self._xtx = self._xtx * self.forgetting ** weight + weight * np.outer(x, x)
        self._xty = self._xty * self.forgetting ** weight + weight * seconds * x
        self.observed = self.observed * self.forgetting ** weight + weight

    def observe_overhead(self, started: float, rows: int, seconds: float) -> None:
        """One row's view of a batch step's overhead: the step's wall time so far less its
        forward and the row's draft. Rows report one after another, so a step's overhead is
        the largest of its rows' (the last to report has seen all but its own update); it is
        folded in when the next step's first row reports."""
        if self._step is not None and self._step[0] != started:
            _, step_rows, worst = self._step
            per_row = max(0.0, worst) / step_rows
            self.row_overhead = per_row if self.row_overhead == 0.0 else \
                self.row_overhead + OVERHEAD_SMOOTHING * (per_row - self.row_overhead)
            self._step = None
        if self._step is None:
            self._step = (started, rows, seconds)
        else:
            self._step = (started, rows, max(self._step[2], seconds))

    def state(self) -> dict:
        """What restores this model exactly (JSON): the store keeps it per pair and hardware."""
        return {"xtx": self._xtx.ravel().tolist(), "xty": self._xty.tolist(),
                "observed": self.observed, "row_overhead": self.row_overhead}

    def restore(self, state: dict) -> "BatchCost":
        self._xtx = np.asarray(state["xtx"], float).reshape(3, 3)
        self._xty = np.asarray(state["xty"], float).reshape(3)
        self.observed = float(state["observed"])
        self.row_overhead = float(state.get("row_overhead", 0.0))  # absent before it was kept
        return self

    def line(self, anchor: tuple[float, float] | None) -> tuple[float, float, float] | None:
        """(a, b, c), with batch 1 anchored to the single-row line v(K) = base + slope K
        (`anchor`, CostModel.line()); without one (a server that never ran a batch of one),
        b = 0 and s = a + c P. None before MIN_BATCH_STEPS batch steps."""
        if self.observed < MIN_BATCH_STEPS:
            return None
        xtx, xty = self._xtx.copy(), self._xty.copy()
        if anchor is None:
            keep = [0, 2]
            a, c = np.linalg.solve(xtx[np.ix_(keep, keep)] + 1e-12 * np.eye(2), xty[keep])
            return float(a), 0.0, max(float(c), 0.0)
        base, slope = anchor
        w = self.anchor_weight
        for k in (0.0, 8.0):  # v(0) and v(8) of the single-row line, at B = 1, P = K + 1
            x = np.array([1.0, 1.0, k + 1])
            xtx += w * np.outer(x, x)
            xty += w * (base + slope * k) * x
        a, b, c = np.linalg.solve(xtx + 1e-12 * np.eye(3), xty)
        return float(a), float(b), max(float(c), 0.0)
