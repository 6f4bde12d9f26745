"""K for every row of a batch at once, from what the batch's forward costs (issue 15).

At batch 1 a verify forward is memory-bound: K more tokens cost little, and speculation pays
from a low acceptance. In a full batch the forward is compute-bound: drafted tokens cost,
and the same acceptance no longer pays (vLLM measured +23 % at batch 1 and -16 % at batch 32
at a flat acceptance). So K is chosen for the batch's goodput — its tokens per second — not
for each row alone. The forward pads every row to the longest (engine/loop.py), so what it
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
recomputed) ends in a few rounds, every width priced at once in each (`goodput_ks`). W = 1
(K = 0 for every row) when no draft pays for its padding.

The same marginal rule prices each row's drafter choice in a batch (adaptive.decide_batch): a
row pays its share s / B of the step, and a second of its drafting stalls every row.
"""
from __future__ import annotations

from autospec.controller.estimates import RunningMedian

MIN_BATCH_STEPS = 4.0  # (weighted) batch steps observed before the batch line is trusted


def goodput_ks(gains: list[list[float]], draft_seconds: list[float], k_max: int, a: float,
               b: float, c: float, rounds: int = 6,
               max_seconds: float | None = None) -> list[int]:
    """K per row maximising the batch's goodput (see the module docstring), in Python floats
    (it runs once a step: numpy's per-call cost was most of its time).

    gains: per row, the expected extra tokens of its (j+1)-th drafted token, falling in j, as
    far as it can draft (a 0 ends it); draft_seconds: per row, what a drafted token costs its
    drafter; a, b, c: the step's cost s = a + b B + c B W. Every round: each row's free length
    (the prefix of its gains that beat R d_i), then every width's tokens and seconds at once —
    a row adds its running sum up to its free length and stays at it beyond (a running tail) —
    O(rows x free length + K_max). max_seconds: no width whose step (forward and drafting) is
    predicted longer is chosen (a latency bound; width 1, K = 0 for all, always stays)."""
    n = len(gains)
    forward = [a + b * n + c * n * (w + 1) for w in range(k_max + 1)]
    cums = []
    for row in gains:
        cum, total = [0.0], 0.0
        for g in row[:k_max]:
            total += g
            cum.append(total)
        cums.append(cum)
    rate = n / forward[0]
    best = [0] * n
    for _ in range(rounds):
        frees = []
        for row, d in zip(gains, draft_seconds):
            price, free = rate * d, 0
            for g in row[:k_max]:
                if g <= price:
                    break
                free += 1
            frees.append(free)
        top = max(frees)
        tokens = [float(n)] * (top + 1)
        seconds = forward[:top + 1]
        tail_tokens = [0.0] * (top + 2)
        tail_seconds = [0.0] * (top + 2)
        for cum, d, free in zip(cums, draft_seconds, frees):
            for w in range(1, free):  # widths below the row's free length: it drafts w
                tokens[w] += cum[w]
                seconds[w] += d * w
            tail_tokens[free] += cum[free]  # from its free length on: it drafts all of it
            tail_seconds[free] += d * free
        run_tokens = run_seconds = 0.0
        width, new_rate = 0, -1.0
        for w in range(top + 1):
            run_tokens += tail_tokens[w]
            run_seconds += tail_seconds[w]
            step = seconds[w] + run_seconds
            if w and max_seconds is not None and step > max_seconds:
                break  # wider steps only take longer
            goodput = (tokens[w] + run_tokens) / step
            if goodput > new_rate:
                width, new_rate = w, goodput
        best = [min(free, width) for free in frees]
        if abs(new_rate - rate) <= 1e-9 * rate:
            break
        rate = new_rate
    return best


def rows_ks(means: list[list[float]], draft_seconds: list[float], k_max: int, a: float,
            b: float, c: float, max_seconds: float | None = None) -> list[int]:
    """`goodput_ks` from each row's per-position acceptance means (a row that does not draft:
    []; a look-up's row as far as its proposal): the gains are their running products."""
    gains = []
    for row in means:
        gain, running = [], 1.0
        for alpha in row[:k_max]:
            running *= alpha
            if running <= 0.0:
                break
            gain.append(running)
        gains.append(gain)
    return goodput_ks(gains, draft_seconds, k_max, a, b, c, max_seconds=max_seconds)


class BatchCost:
    """s(B, P) = a + b B + c P (P = B W, the padded positions the forward computes) by
    discounted least squares over batch steps, ridge-anchored at batch 1 on the single-row
    verify line (CostModel), which a batch-1 run measures anyway: with every batch of one
    size, B and the constant could not be told apart otherwise."""

    def __init__(self, forgetting: float = 0.98, anchor_weight: float = 4.0):
        self.forgetting = forgetting
        self.anchor_weight = anchor_weight
        # the normal equations in Python floats (a row's step folds in once per row, per step)
        self._xtx = [[0.0] * 3 for _ in range(3)]
        self._xty = [0.0] * 3
        self.observed = 0.0  # discounted batch steps
        # seconds per row a batch step pays outside its forward and its drafts (proposing,
        # accepting, the controller, row by row): the running median of the steps' (robust to
        # a one-off pause), 0 until measured. Charged to every width alike, it is what makes
        # fewer, longer steps worth their padding
        self._overhead = RunningMedian()
        self._step: tuple[float, int, float] | None = None  # (step start, rows, max seen)
        self._line: tuple | None = None  # (anchor, (a, b, c)) until the next observation

    def observe(self, rows: int, positions: int, seconds: float, weight: float = 1.0) -> None:
        """One batch step over `positions` = rows x width (a row's record may report it with
        weight 1 / rows)."""
        x = (1.0, float(rows), float(positions))
        keep = self.forgetting ** weight
        for i in range(3):
            row = self._xtx[i]
            for j in range(3):
                row[j] = row[j] * keep + weight * x[i] * x[j]
            self._xty[i] = self._xty[i] * keep + weight * seconds * x[i]
        self.observed = self.observed * keep + weight
        self._line = None

    def observe_overhead(self, started: float, rows: int, seconds: float) -> None:
        """One row's view of a batch step's overhead: the step's wall time so far less its
        forward and the row's draft. Rows report one after another, so a step's overhead is
        the largest of its rows' (the last to report has seen all but its own update); it is
        folded in when the next step's first row reports."""
        if self._step is not None and self._step[0] != started:
            _, step_rows, worst = self._step
            self._overhead.observe(max(0.0, worst) / step_rows)
            self._step = None
        if self._step is None:
            self._step = (started, rows, seconds)
        else:
            self._step = (started, rows, max(self._step[2], seconds))

    @property
    def row_overhead(self) -> float:
        """Seconds per row a batch step pays outside its forward and drafts."""
        return self._overhead.value

    def state(self) -> dict:
        """What restores this model exactly (JSON): the store keeps it per pair and hardware."""
        return {"xtx": [v for row in self._xtx for v in row], "xty": list(self._xty),
                "observed": self.observed, "row_overhead": self.row_overhead}

    def restore(self, state: dict) -> "BatchCost":
        flat = [float(v) for v in state["xtx"]]
        self._xtx = [flat[0:3], flat[3:6], flat[6:9]]
        self._xty = [float(v) for v in state["xty"]]
        self.observed = float(state["observed"])
        self._overhead.seed(float(state.get("row_overhead", 0.0)))  # absent before it was kept
        self._line = None
        return self

    def line(self, anchor: tuple[float, float] | None) -> tuple[float, float, float] | None:
        """(a, b, c), with batch 1 anchored to the single-row line v(K) = base + slope K
        (`anchor`, CostModel.line()); without one (a server that never ran a batch of one),
        b = 0 and s = a + c P. None before MIN_BATCH_STEPS batch steps. Kept until the next
        observation (every row of a batch asks)."""
        if self.observed < MIN_BATCH_STEPS:
            return None
        if self._line is not None and self._line[0] == anchor:
            return self._line[1]
        xtx = [row[:] for row in self._xtx]
        xty = self._xty[:]
        if anchor is None:
            a, c = _solve([[xtx[0][0], xtx[0][2]], [xtx[2][0], xtx[2][2]]], [xty[0], xty[2]])
            fitted = (a, 0.0, max(c, 0.0))
        else:
            base, slope = anchor
            w = self.anchor_weight
            for k in (0.0, 8.0):  # v(0) and v(8) of the single-row line, at B = 1, P = K + 1
                x = (1.0, 1.0, k + 1)
                for i in range(3):
                    for j in range(3):
                        xtx[i][j] += w * x[i] * x[j]
                    xty[i] += w * (base + slope * k) * x[i]
            a, b, c = _solve(xtx, xty)
            fitted = (a, b, max(c, 0.0))
        self._line = (anchor, fitted)
        return fitted


def _solve(m: list[list[float]], v: list[float]) -> list[float]:
    """m x = v for a small symmetric positive semi-definite m (Gaussian elimination with a
    1e-12 ridge, as np.linalg.solve on m + 1e-12 I)."""
    n = len(v)
    a = [[m[i][j] + (1e-12 if i == j else 0.0) for j in range(n)] + [v[i]] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        p = a[col][col]
        for r in range(col + 1, n):
            f = a[r][col] / p
            for j in range(col, n + 1):
                a[r][j] -= f * a[col][j]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        x[i] = (a[i][n] - sum(a[i][j] * x[j] for j in range(i + 1, n))) / a[i][i]
    return x
