"""K for every row of a step at once, from what the step's forward costs.

At batch 1 a verify forward is memory-bound: K more tokens cost little, and speculation pays
from a low acceptance. In a full batch the forward is compute-bound: drafted tokens cost,
and the same acceptance no longer pays (vLLM measured +23 % at batch 1 and -16 % at batch 32
at a flat acceptance). So K is chosen for the step's goodput — its tokens per second — not
for each row alone. Rows of unequal widths verify packed (models/kv.py): the forward
computes every row's real tokens and no padding, so a drafted token costs the same whichever
row drafts it, and a confident row can speculate while the others decode plain:

    step seconds   s(X)     the forward over B + X tokens (X drafted over all rows, at most
                            W - 1 in one), the per-step overhead in (`Prices`: batch 1's
                            measured sizes, or the batch line a + b B + c (B + X) + j [X > 0]
                            + w B (W - 1) + o B of `BatchCost`; under a step cap moved
                            to the size's own steps, `BatchCost.residuals`)
    goodput        (B + sum_i E_i(K_i)) / (s(sum_i K_i) + sum_i d_i K_i)

with E_i(K) = sum_{j<K} g_ij, g_ij = prod_{l<=j} alpha_il the chance row i's (j+1)-th drafted
token is kept, and d_i its drafter's seconds per drafted token. At a goodput R a token is
worth g_ij - R d_i; those fall along a row, so the best X tokens are the X best of them
(each row's a prefix of its positions), and the best X is the best ratio among those
prefixes; R is recomputed from it until it holds (Dinkelbach's iteration on the ratio), a few
rounds. Attention pads every row to the widest (w B (W - 1)), which a token's worth does not
see: where w is measured, the same is done with every row's K capped at 1, 2, 4, 8, 16, and
the best of those kept. At batch 1 this is the best K of one row against its measured
forward sizes; X = 0 (plain for every row) where no draft pays for its forward.

The same step prices each row's drafter choice (adaptive.decide_batch): a row pays its share
of the step, s / B, and a drafted token's price c.
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from autospec.controller.decide import best_k
from autospec.controller.estimates import RunningMedian

# (weighted) batch steps observed before the batch line is trusted, and the weight (in steps)
# of the priors where steps leave the plane open (BatchCost.line): enough to settle it, little
# against the steps that measure it. Replayed at 16 rows: 16 steps cost 0.6 % of tokens/s on
# the drifting trace, beyond noise; 1 step and the prior at 0.01 or 0.25 moved nothing
# (docs/controller.md), as a trace's steps sit on its line; live they guard a server's
# first steps
MIN_BATCH_STEPS = 4.0
UNMEASURED_PRIOR = 0.05
FEATURES = 5  # 1, B, P, drafted, B (W - 1) (step_features)
# row-widths tried as a cap on every row's K where the padding has a price (batch_ks)
WIDTH_CAPS = (1, 2, 4, 8, 16, 32)
# batch steps without a drafted one after which a drafted step's jump is priced 0 again: the
# jump is measured by drafted steps only, so one slow drafted step (a first use of a forward
# shape) otherwise kept every row plain for ~150 steps (the reference pair at 16 rows: 14
# steps plain of 79 after one 39 ms step where 20 ms was usual, adaptive 0.85x ngram:8)
STALE_JUMP_STEPS = 8.0
# steps of one size and kind whose median residual moves the line's price there
# (BatchCost.residuals): RunningMedian's window, robust to a one-off pause
RESIDUAL_STEPS = 9


@dataclass(frozen=True)
class Prices:
    """What a step of `rows` rows costs, as a decision reads it: `step(x)` the seconds of its
    forward over rows + x tokens, drafting aside — `table[x]` where the size was measured
    (batch 1: CostModel's per-size means), else fixed + per_token x — and `shares[k]` a row's
    part of a step in which it drafts k tokens (batch 1: the step itself), what its drafter
    choice compares."""
    rows: int
    fixed: float
    per_token: float
    table: list[float]
    shares: list[float]
    single: float  # a one-row plain step: what an unmeasured drafter's cost hint scales
    jump: float = 0.0  # what a step pays once for drafting at all (BatchCost's j)
    width: float = 0.0  # per row, per query position the widest row pads it to (BatchCost's w)

    def step(self, drafted: int, widest: int = 0) -> float:
        """Seconds of a step drafting `drafted` tokens, at most `widest` in one row."""
        if drafted < len(self.table):
            return self.table[drafted]
        return (self.fixed + self.per_token * drafted + (self.jump if drafted else 0.0)
                + self.width * self.rows * widest)


def batch_ks(means: list[list[float]], draft_seconds: list[float], prices: Prices,
             max_seconds: float | None = None, rounds: int = 8) -> list[int]:
    """K per row maximising the step's goodput: `best_batch`'s K."""
    return best_batch(means, draft_seconds, prices, max_seconds, rounds)[1]


def best_batch(means: list[list[float]], draft_seconds: list[float], prices: Prices,
               max_seconds: float | None = None, rounds: int = 8) -> tuple[float, list[int]]:
    """(the goodput in tokens per second, K per row) maximising the step's goodput (the
    module docstring), in Python floats (it runs once a step: numpy's per-call cost was most
    of its time).

    means: per row, the chance of each token it may draft being kept given the ones before
    it were — its drafter's per-position means, or each proposed token's calibrated
    confidence (autospec/confidence.py) — as far as it may draft (a row that does not
    draft: []); draft_seconds: per row, a drafted token's cost to its drafter.
    max_seconds: no step (forward and drafting) predicted longer is chosen (a latency bound;
    plain for every row always stays). Where the widest row's padding has a price
    (`Prices.width`), the best is also sought with every row's K capped at each of WIDTH_CAPS
    (the worth of a token does not see what it widens), and the best of those kept.

    One row at its measured forward sizes (`Prices.table`) is the same objective over a prefix
    of one row, which `decide.best_k` walks once rather than by Dinkelbach's rounds."""
    if len(means) == 1 and max_seconds is None and len(means[0]) < len(prices.table):
        plain = 1.0 / prices.step(0)
        rate, k = best_k(means[0], draft_seconds[0], prices.table, len(means[0]))
        return (rate, [k]) if rate > plain else (plain, [0])
    gains = []
    for row in means:
        gain, running = [], 1.0
        for alpha in row:
            running *= alpha
            if running <= 0.0:
                break
            gain.append(running)
        gains.append(gain)
    longest = max(map(len, gains), default=0)
    caps = [longest]
    if prices.width > 0.0:
        caps = [cap for cap in WIDTH_CAPS if cap < longest] + caps
    best_rate, best = -1.0, [0] * len(means)
    for cap in caps:
        rate, ks = _best_ks([g[:cap] for g in gains], draft_seconds, prices, max_seconds, rounds)
        if rate > best_rate:
            best_rate, best = rate, ks
    return best_rate, best


def _best_ks(gains: list[list[float]], draft_seconds: list[float], prices: Prices,
             max_seconds: float | None, rounds: int) -> tuple[float, list[int]]:
    """(goodput, K per row) of batch_ks for rows whose kept-token chances are `gains`."""
    n = len(gains)
    step = prices.step
    rate = n / step(0)
    best: list[tuple] = []
    for _ in range(rounds):
        # every token worth drafting at this rate, best first (within a row in order: its
        # worth falls along it, and the sort is stable)
        tokens = []
        for i, (row, d) in enumerate(zip(gains, draft_seconds)):
            price = rate * d
            for g in row:
                if g <= price:
                    break
                tokens.append((g - price, g, d, i))
        tokens.sort(key=lambda t: -t[0])
        kept, gained, drafting, new_rate = 0, 0.0, 0.0, n / step(0)
        counts, widest = [0] * n, 0
        for x, (_, g, d, i) in enumerate(tokens, start=1):
            gained += g
            drafting += d
            counts[i] += 1
            widest = max(widest, counts[i])
            seconds = step(x, widest) + drafting
            if max_seconds is not None and seconds > max_seconds:
                continue
            goodput = (n + gained) / seconds
            if goodput > new_rate:
                kept, new_rate = x, goodput
        chosen = tokens[:kept]
        if chosen == best or abs(new_rate - rate) <= 1e-12 * rate:
            best, rate = chosen, new_rate
            break
        best, rate = chosen, new_rate
    ks = [0] * n
    for *_, i in best:
        ks[i] += 1
    return rate, ks


class BatchCost:
    """s(B, P) = a + b B + c P (P the positions the forward computes: its real tokens, rows
    packed) by discounted least squares over batch steps, ridge-anchored at batch 1 on the
    single-row verify line (CostModel), which a batch-1 run measures anyway: with every batch
    of one size, B and the constant could not be told apart otherwise. Until drafted steps
    of a batch measure c, it is batch 1's slope: the optimistic end (a drafted token costs at
    least that much in a batch, and at most a row's plain token, b = 0), so that drafting
    is tried where it might pay and its cost measured — the other end priced the reference
    pair's rows plain at 4 and 16 rows (0.92x, 0.81x plain) where n-gram pays 2.6x, 1.45x."""

    # forgetting and anchor_weight: replay cannot judge them (its step costs follow the
    # trace's line exactly, so any estimator converges: 0.9-1.0 and 0.5-16 moved nothing); they
    # weigh live noise, which replay does not have
    def __init__(self, forgetting: float = 0.98, anchor_weight: float = 4.0):
        self.forgetting = forgetting
        self.anchor_weight = anchor_weight
        # the normal equations in Python floats (a row's step folds in once per row, per
        # step), plain steps' and drafted steps' apart: each kind is forgotten only as newer
        # steps of its kind come. Forgotten together, a run of drafted steps wiped out what a
        # plain step costs, and the drafting jump took the difference: SmolLM2 at 16 rows
        # priced a plain step 50 ms where it took 85, and drafting at all 45 ms where it
        # cost 20 (what keeps rows plain that should draft)
        self._plain = _normal_equations()
        self._drafted = _normal_equations()
        self.observed = 0.0  # discounted batch steps
        # seconds per row a batch step pays outside its forward and its drafts (proposing,
        # accepting, the controller, row by row): the running median of the steps' (robust to
        # a one-off pause), 0 until measured. Charged to every width alike, it is what makes
        # fewer, longer steps worth their padding
        self._overhead = RunningMedian()
        self._line: tuple | None = None  # (anchor, (a, b, c, j, w)) until the next observation
        self._since_drafted = 0.0  # batch steps since the last drafted one
        # by (rows, drafted at all): the last RESIDUAL_STEPS steps (features, seconds), whose
        # seconds beyond the line move its price at that size (`residuals`); not kept by
        # `state` (measured afresh within a few steps)
        self._recent: dict[tuple[int, bool], deque] = {}

    def observe(self, rows: int, positions: int, seconds: float, weight: float = 1.0,
                width: int = 1) -> None:
        """One batch step over `positions`, its widest row `width` tokens wide (a row's record
        may report it with weight 1 / rows)."""
        x = step_features(rows, positions, width)
        keep = self.forgetting ** weight
        xtx, xty = self._drafted if positions > rows else self._plain
        for i in range(FEATURES):
            row = xtx[i]
            for j in range(FEATURES):
                row[j] = row[j] * keep + weight * x[i] * x[j]
            xty[i] = xty[i] * keep + weight * seconds * x[i]
        self.observed = self.observed * keep + weight
        self._since_drafted = 0.0 if positions > rows else self._since_drafted + weight
        self._line = None

    def observe_step(self, rows: int, positions: int, seconds: float, width: int) -> None:
        """One batch step, once (its rows' `observe` take it row by row): kept by size and
        kind for `residuals`."""
        self._recent.setdefault((rows, positions > rows), deque(maxlen=RESIDUAL_STEPS)).append(
            (step_features(rows, positions, width), seconds))

    def residuals(self, rows: int, fitted: tuple[float, ...]) -> tuple[float, float]:
        """(plain, drafted): the median of what the last steps of `rows` rows of each kind
        took beyond the line `fitted` (a, b, c, j, w) predicts for them; 0 where none.

        The line is one plane over every batch size, and a CPU's step is not: on the
        reference pair under a step cap, steps of 2-6 rows outnumbered those of 16 and the
        plane priced a plain 16-row step 32 ms where it took 22, and 30 drafted tokens 5 ms
        where they took 8 — a 1.25 cap then chose steps of 1.4 plain ones. A step's price at
        a size its steps measured is the line moved by them. A kind not measured at this
        size (or drafted steps gone stale, as the jump does) moves with the other: a gap
        between them only where both were measured, so no price keeps a kind from being
        tried."""
        moved = []
        for kind in (False, True):
            steps = self._recent.get((rows, kind))
            if not steps or (kind and self._since_drafted >= STALE_JUMP_STEPS):
                moved.append(None)
                continue
            moved.append(statistics.median(seconds - sum(p * x for p, x in zip(fitted, features))
                                           for features, seconds in steps))
        plain, drafted = moved
        plain = drafted if plain is None else plain
        drafted = plain if drafted is None else drafted
        return plain or 0.0, drafted or 0.0

    def observe_overhead(self, seconds: float, weight: float = 1.0) -> None:
        """A batch step's seconds per row outside its forward and drafts (Engine.advance
        measures them once per step: StepRecord.overhead_seconds / rows), each row's record
        reporting it with 1 / rows of the step's weight."""
        self._overhead.observe(max(0.0, seconds), weight)

    @property
    def row_overhead(self) -> float:
        """Seconds per row a batch step pays outside its forward and drafts."""
        return self._overhead.value

    def state(self) -> dict:
        """What restores this model exactly (JSON): the store keeps it per pair and hardware."""
        (xtx, xty), (plain_xtx, plain_xty) = self._drafted, self._plain
        return {"xtx": [v for row in xtx for v in row], "xty": list(xty),
                "plain_xtx": [v for row in plain_xtx for v in row], "plain_xty": list(plain_xty),
                "observed": self.observed, "row_overhead": self.row_overhead}

    def restore(self, state: dict) -> "BatchCost":
        # kept before plain steps were apart: all of it with the drafted ones; with fewer
        # features (the jump, the padding added since), those measured anew
        self._drafted = _normal_equations(state["xtx"], state["xty"])
        self._plain = _normal_equations(state.get("plain_xtx"), state.get("plain_xty"))
        self.observed = float(state["observed"])
        self._overhead.seed(float(state.get("row_overhead", 0.0)))  # absent before it was kept
        self._line = None
        return self

    def line(self, anchor: tuple[float, float] | None) -> tuple[float, ...] | None:
        """(a, b, c, j, w), with batch 1 anchored to the single-row line v(K) = base + slope K
        (`anchor`, CostModel.line()); without one (a server that never ran a batch of one),
        b and c drawn weakly to 0. j, a drafted step's jump, and w, what a row pays per query
        position the widest row pads it to, drawn weakly to 0 until steps show them. None before MIN_BATCH_STEPS batch steps. Kept until the next observation
        (every row of a batch asks)."""
        if self.observed < MIN_BATCH_STEPS:
            return None
        if self._line is not None and self._line[0] == anchor:
            return self._line[1]
        xtx = [[p + d for p, d in zip(*rows)] for rows in zip(self._plain[0], self._drafted[0])]
        xty = [p + d for p, d in zip(self._plain[1], self._drafted[1])]
        rows = xtx[0][1] / xtx[0][0]  # the batch steps' mean size
        # the optimistic end where the steps leave it open: no jump; without a batch of one
        # measured (a closed loop of N clients), b and c 0 too, so plain steps of one size
        # put their cost in the constant (all a row's share reads) and the drafted steps
        # that follow measure c (with b = 0 forced, plain steps priced a drafted token as a
        # row's whole share: on the reference pair at 4 rows no row ever drafted, 0.89x plain)
        xtx[3][3] += UNMEASURED_PRIOR
        xtx[4][4] += UNMEASURED_PRIOR * rows * rows
        if anchor is None:
            for i in (1, 2):
                xtx[i][i] += UNMEASURED_PRIOR * rows * rows
        else:
            base, slope = anchor
            w = self.anchor_weight
            for k in (0, 8):  # v(0) and v(8) of the single-row line, at B = 1, P = W = K + 1
                x = step_features(1, k + 1, k + 1)
                for i in range(FEATURES):
                    for j in range(FEATURES):
                        xtx[i][j] += w * x[i] * x[j]
                    xty[i] += w * (base + slope * k) * x[i]
        a, b, c, jump, width = _solve(xtx, xty)
        if self._since_drafted >= STALE_JUMP_STEPS:
            jump = 0.0  # stale: priced at the optimistic end until a drafted step measures it
        fitted = (a, max(b, 0.0) if anchor is None else b, max(c, 0.0), max(jump, 0.0),
                  max(width, 0.0))
        self._line = (anchor, fitted)
        return fitted


def step_features(rows: int, positions: int, width: int = 1) -> tuple[float, ...]:
    """A step's regressors: 1, B, P, whether it drafted at all (P > B) and B (W - 1), the
    query positions the widest row (W tokens) pads the others to. On a CPU the first drafted
    token of a step costs more than the next ones (SmolLM2 at 16 rows: 16 plain tokens 193
    ms, 21 tokens 285 ms, 68 tokens 450 ms — the matrix products change kernels), which a
    line in P alone spreads over every drafted token; and attention pays for the padding
    (models/attention.py): at 16 reference rows a step of 46 drafted tokens at mixed widths
    took 30 ms, one of 49 at one width 24 ms. Over 280 such steps (plain, ngram:2 to 16,
    adaptive) the residual was 2.1 ms rms without the last regressor, 1.3 ms with it."""
    return (1.0, float(rows), float(positions), 1.0 if positions > rows else 0.0,
            float(rows * (width - 1)))


def _normal_equations(flat: list[float] | None = None,
                      v: list[float] | None = None) -> tuple[list[list[float]], list[float]]:
    """(X'X, X'y) over FEATURES, from a kept state's (`flat` row-major X'X, possibly over
    fewer features: the others 0) or empty."""
    flat, v = [float(x) for x in flat or []], [float(x) for x in v or []]
    n = int(round(len(flat) ** 0.5))
    xtx = [[flat[i * n + j] if i < n and j < n else 0.0 for j in range(FEATURES)]
           for i in range(FEATURES)]
    return xtx, v[:n] + [0.0] * (FEATURES - n)


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
