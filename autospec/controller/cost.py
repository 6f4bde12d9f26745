"""What a step costs: one model for every batch size, learnt from every step by one rule.

A step runs the target's forward over P positions of B rows (each row's real tokens, packed:
models/kv.py), the widest W tokens wide, after drafting. Its seconds, drafting aside:

    s(B, P, W) = a + b B + c P + j [P > B] + w B (W - 1)      the plane, over every step
               + r(B, W - 1)                                  the size's own departure
               + o B                                          the per-row overhead

- The plane: discounted least squares over every step, batch 1 included, plain and drafted
  steps' normal equations apart (each kind forgotten only as newer steps of its kind come: a
  run of drafted steps no longer wipes out what a plain step costs). b, c, j and w are drawn
  weakly to 0, the optimistic end, where the steps leave them open: one batch size puts its
  cost in the constant, and a drafted token costs nothing until drafted steps measure it, so
  drafting is tried where it might pay. j: on a CPU the first drafted token of a step costs
  more than the next (the products change kernels: SmolLM2 at 16 rows, 16 plain tokens 193
  ms, 21 tokens 285, 68 tokens 450); w: attention pads every row to the widest (at 16
  reference rows 46 drafted tokens at mixed widths took 30 ms, 49 at one width 24 ms).
- The residuals: per size (B, W - 1), the discounted mean of its steps beyond the plane,
  worth n / (n + SIZE_PRIOR) for n steps. A drafted size moves with its row count's plain steps until its
  own steps say otherwise. A CPU's step is not a plane: at batch 1 the compiled forward's
  one-token and 2-17-token libraries make v(K) a step (v(3) ~20 % over the line through all
  sizes on the reference pair), and under a step cap, steps of 2-6 rows outnumbered those of
  16 and the plane alone priced a plain 16-row step 32 ms where it took 22.
- One staleness rule: drafted evidence (the drafted steps' equations, the drafted sizes) is
  measured only by drafted steps, so once `stale_after` steps pass without one it is trusted
  less and less, none after twice that, and the next drafted step starts it afresh: one slow
  early drafted step (a first use of a forward shape) cannot keep every row plain for good.
  Counted in rows (a step of 16 counting 16, stale after 4 such steps) it made every drafted
  token free every 8 plain steps at 16 SmolLM2 rows, and the rows drafted deep at a loss
  (adaptive 0.74x ngram:2, accepting 29 %).
- One overhead: the running median (robust to a one-off pause) of each step's seconds per
  row outside its forward and its drafts — proposing, accepting, the controller.
- Each drafter's seconds per drafted token (an EWMA) and its start-up per context token.

`prices(rows)` is what a decision reads (`Prices`); the live controller, the daemon's Learner,
replay's recorded costs (bench/recorded.py) and `autospec bench --record`'s calibration
(bench/record.py) all go through this one model.

On the per-step path: Python floats (numpy's calls on small arrays cost more), re-priced
every REFRESH steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autospec.controller.fit import FEATURES, RunningMedian, normal_equations, solve

# steps observed before the model prices anything: every row decodes plain until then. The
# batch cost it replaced, replayed at 1 and 16 (`autospec replay --knobs`, both audited
# there): nothing beyond noise (a trace's steps sit on its costs); live it guards a
# process's first, noisiest steps
MIN_STEPS = 4.0
# the weight (in steps, at the mean size) of the priors drawing b, c, j and w to 0 where the
# steps leave them open: enough to settle the plane, little against steps that measure it
# (the batch cost's, replayed at 0.01 and 0.25: nothing beyond noise)
UNMEASURED_PRIOR = 0.05
# observations of one size before its own mean counts half: a weight against live timing
# noise that replay cannot judge (a trace's costs are exact): chosen, not measured
SIZE_PRIOR = 4.0
CLIP = 3.0  # an observation over CLIP x its prediction (a cold start, a hiccup) is clipped
# steps a solved plane, and the prices made from it, serve (a kind's first step, and each of a
# stale spell, solve at once): live, re-pricing every step and solving at every switch of kind
# cost SmolLM2 ~75 us a step at batch 1 (docs/controller.md); replayed, -0.6 % to +1.5 %
REFRESH = 4.0


def step_features(rows: int, positions: int, width: int = 1) -> tuple[float, ...]:
    """A step's regressors: 1, B, P, whether it drafted at all (P > B) and B (W - 1), the
    query positions the widest row (W tokens) pads the others to. Over 280 steps at 16
    reference rows (plain, ngram:2 to 16, adaptive) the residual was 2.1 ms rms without the
    last regressor, 1.3 ms with it."""
    return (1.0, float(rows), float(positions), 1.0 if positions > rows else 0.0,
            float(rows * (width - 1)))


@dataclass(frozen=True)
class Prices:
    """A step of `rows` rows as a decision reads it: `step(x, widest)` the seconds of its
    forward over rows + x drafted tokens, at most `widest` in one row, with the per-step
    overhead (drafting aside); `shares[k]` a row's part of a step in which it drafts k, what
    its drafter choice compares (one row: the step itself)."""
    rows: int
    fixed: float  # a plain step (its size's residual and the overhead in)
    per_token: float  # c: a drafted token, whichever row drafts it
    # by the widest row's drafted tokens, 0..k_max: what a step of that width takes beyond
    # the plane, less a plain step's (index 0: 0)
    residuals: tuple[float, ...] = (0.0,)
    single: float = 0.0  # a one-row plain step: what an unmeasured drafter's cost hint scales
    jump: float = 0.0  # what a step pays once for drafting at all (j)
    width: float = 0.0  # per row, per query position the widest row pads it to (w)
    # one row's step at K = 0..k_max (`decide.best_k`'s verify list): step(k) for each k
    table: list[float] = field(init=False, repr=False, compare=False)
    # a row's share of the step when it drafts k = 0..k_max tokens: the plain step's share,
    # its own tokens, and a share of the jump and of its width's residual as if it drafted
    # alone and were the widest (one row: the step itself)
    shares: list[float] = field(init=False, repr=False, compare=False)

    def __post_init__(self):  # both read every step: made once
        rows, share, per = self.rows, self.fixed / self.rows, self.per_token + self.width
        object.__setattr__(self, "table", [self.step(k) for k in range(len(self.residuals))])
        object.__setattr__(self, "shares", [share] + [
            share + per * k + (self.jump + r) / rows
            for k, r in enumerate(self.residuals[1:], start=1)])

    @property
    def token(self) -> float:
        """One more token in one row, as if it were the widest: its position and its padding
        (what a row's next drafted token, or a prompt chunk's, is priced at)."""
        return self.per_token + self.width

    @classmethod
    def one_row(cls, table: list[float]) -> "Prices":
        """One row's prices from its forward's seconds at K = 0..k_max, `table`."""
        return cls(1, table[0], 0.0, (0.0,) + tuple(v - table[0] for v in table[1:]), table[0])

    def step(self, drafted: int, widest: int | None = None) -> float:
        """Seconds of a step drafting `drafted` tokens, at most `widest` in one row (one row:
        `drafted`)."""
        if not drafted:
            return self.fixed
        widest = drafted if widest is None else widest
        residuals = self.residuals
        return (self.fixed + self.per_token * drafted + self.jump + self.width * self.rows * widest
                + residuals[widest if widest < len(residuals) else -1])


@dataclass
class _Size:
    """One size's steps: discounted weight, mean features, mean seconds (discounted means, so
    they follow a change), and their count (what their mean is worth against the plane)."""
    n: float = 0.0
    count: float = 0.0
    x: list[float] = field(default_factory=lambda: [0.0] * FEATURES)
    seconds: float = 0.0


class StepCost:
    """The step's cost (the module docstring)."""

    def __init__(self, k_max: int, stale_after: int = 0, forgetting: float = 0.98,
                 smoothing: float = 0.1):
        self.k_max = k_max
        self.stale_after = stale_after  # 0: drafted evidence never goes stale
        self.forgetting = forgetting
        self.smoothing = smoothing
        self._plain = normal_equations()
        self._drafted = normal_equations()
        self.observed = 0.0  # discounted steps
        self.steps = 0.0  # steps (each row of a batch 1 / rows of one)
        self._since_drafted = 0.0  # steps since the last drafted one
        self._sizes: dict[tuple[int, int], _Size] = {}  # (rows, widest drafted)
        # the kinds (plain, drafted) the last solve had steps of (a kind's first solves at once)
        self._kinds_then: tuple[bool, bool] = (False, False)
        self._overhead = RunningMedian()
        self.draft: dict[str, float] = {}  # drafter -> seconds per drafted token
        self.prefill: dict[str, float] = {}  # drafter -> seconds per context token at start-up
        self._plane: tuple[float, ...] | None = None  # solved; kept REFRESH steps
        self._last_plane: tuple[float, ...] | None = None  # the last solved (for the clip)
        self._solved_at = 0.0  # `steps` when it was solved
        self._prices: dict[int, Prices] = {}

    # -- observing -------------------------------------------------------------------------
    def observe(self, rows: int, positions: int, seconds: float, weight: float = 1.0,
                width: int | None = None) -> None:
        """One step's forward: `rows` rows over `positions` tokens, the widest `width` (unsaid:
        as narrow as the positions allow, one row all of them), taking `seconds`; each row of
        a batch may report it with weight 1 / rows (together one step)."""
        width = -(-positions // rows) if width is None else width
        drafted = positions > rows
        x = step_features(rows, positions, width)
        if drafted:
            if self.stale_after and self._since_drafted > self.stale_after:
                # the first drafted step after a stale spell: drafted evidence afresh, so
                # the steps that caused the spell cannot cause the next one
                self._drafted = normal_equations()
                for (_, wide), size in self._sizes.items():
                    if wide:
                        size.n = size.count = 0.0
                self._kinds_then = (self._kinds_then[0], False)  # solved at once: below
            self._since_drafted = 0.0
        else:
            self._since_drafted += weight
        size = self._sizes.get((rows, width - 1))
        if size is None:
            size = self._sizes[rows, width - 1] = _Size()
        if self.observed >= 5:  # against the size's own steps, else the last plane solved
            if size.n >= 1.0:
                seconds = min(seconds, CLIP * size.seconds)
            elif self._last_plane is not None:
                seconds = min(seconds, CLIP * max(_dot(self._last_plane, x), 1e-6))
        keep = self.forgetting ** weight
        xtx, xty = self._drafted if drafted else self._plain
        x0, x1, x2, x3, x4 = x  # FEATURES of them, unrolled: this runs every step
        for i, row in enumerate(xtx):
            xi = weight * x[i]
            row[:] = (row[0] * keep + xi * x0, row[1] * keep + xi * x1, row[2] * keep + xi * x2,
                      row[3] * keep + xi * x3, row[4] * keep + xi * x4)
            xty[i] = xty[i] * keep + xi * seconds
        size.n = size.n * keep + weight
        size.count += weight
        share = weight / size.n
        size.x = [m + (v - m) * share for m, v in zip(size.x, x)]
        size.seconds += (seconds - size.seconds) * share
        self.observed = self.observed * keep + weight
        self.steps += weight
        if (self.steps - self._solved_at >= REFRESH or not self._kinds_then[drafted]
                or self._since_drafted > self.stale_after > 0):
            self._plane, self._prices = None, {}

    def observe_overhead(self, seconds: float, weight: float = 1.0) -> None:
        """A step's seconds per row outside its forward and its drafts (Engine.advance
        measures them once a step: StepRecord.overhead_seconds / rows), each row's record
        reporting it with 1 / rows of the step's weight; clipped at 0."""
        self._overhead.observe(max(0.0, seconds), weight)

    def observe_draft(self, drafter: str, seconds: float, proposed: int) -> None:
        if proposed > 0:
            per_token = seconds / proposed
            old = self.draft.get(drafter)
            self.draft[drafter] = per_token if old is None else old + self.smoothing * (per_token - old)

    def observe_prefill(self, drafter: str, seconds: float, proposed: int, context: int) -> None:
        """A drafter's first step in a request: its draft seconds minus the per-token part
        are the start-up (a cache prefill over `context` tokens)."""
        start_up = max(0.0, seconds - self.draft.get(drafter, 0.0) * proposed)
        if context > 0:
            rate = start_up / context
            old = self.prefill.get(drafter)
            self.prefill[drafter] = rate if old is None else old + self.smoothing * (rate - old)

    def prefill_seconds(self, drafter: str, context: int) -> float:
        """Predicted start-up seconds of a drafter over `context` tokens (0 before measured:
        a stateless drafter, like n-gram lookup, has next to none)."""
        return self.prefill.get(drafter, 0.0) * context

    def _changed(self) -> None:
        self._plane, self._prices = None, {}
        self._kinds_then = (False, False)

    # -- reading ---------------------------------------------------------------------------
    @property
    def row_overhead(self) -> float:
        """Seconds per row a step pays outside its forward and drafts (0 until measured)."""
        return self._overhead.value

    def plane(self) -> tuple[float, ...] | None:
        """(a, b, c, j, w), or None before MIN_STEPS steps."""
        if self.steps < MIN_STEPS - 1e-9:
            return None
        if self._plane is None:
            self._plane = self._last_plane = self._solve()
            self._solved_at = self.steps
            self._kinds_then = (self._plain[0][0][0] > 0.0, self._drafted[0][0][0] > 0.0)
        return self._plane

    def _trust(self) -> float:
        """1 while drafted evidence is fresh; falls linearly to 0 from `stale_after` steps
        without a drafted one to twice that."""
        if not self.stale_after or self._since_drafted <= self.stale_after:
            return 1.0
        return max(0.0, 2.0 - self._since_drafted / self.stale_after)

    def _solve(self) -> tuple[float, ...]:
        trust = self._trust()
        (pxx, pxy), (dxx, dxy) = self._plain, self._drafted
        xtx = [[p + trust * d for p, d in zip(pr, dr)] for pr, dr in zip(pxx, dxx)]
        xty = [p + trust * d for p, d in zip(pxy, dxy)]
        mean_rows = xtx[0][1] / xtx[0][0] if xtx[0][0] > 0 else 1.0
        for i in (1, 2, 3, 4):  # the optimistic end where the steps leave it open (docstring)
            xtx[i][i] += UNMEASURED_PRIOR * (1.0 if i == 3 else mean_rows * mean_rows)
        a, b, c, jump, width = solve(xtx, xty)
        return a, b, max(c, 0.0), max(jump, 0.0), max(width, 0.0)

    def _beyond(self, rows: int, widest: int, plane: tuple[float, ...]) -> tuple[float, float]:
        """(what the size's steps took beyond `plane`, their count; 0, 0 where none)."""
        size = self._sizes.get((rows, widest))
        if size is None or size.count <= 0.0:
            return 0.0, 0.0
        a, b, c, jump, width = plane
        x = size.x
        return (size.seconds - a - b * x[1] - c * x[2] - jump * x[3] - width * x[4],
                size.count)

    def prices(self, rows: int) -> Prices | None:
        """The step's prices at `rows` rows (None before MIN_STEPS steps: plain). A size's
        residual, by its steps' count n: (rows, 0)'s own towards 0, a drafted width's towards
        (rows, 0)'s, faded as the plane's drafted evidence is."""
        cached = self._prices.get(rows)
        if cached is not None:
            return cached
        plane = self.plane()
        if plane is None:
            return None
        a, b, c, jump, width = plane
        overhead = self.row_overhead
        own, n = self._beyond(rows, 0, plane)
        plain = own * n / (n + SIZE_PRIOR)
        fixed = max(a + (b + c + overhead) * rows + plain, 1e-6)
        trust, residuals = self._trust(), [0.0]
        for k in range(1, self.k_max + 1):  # relative to the plain step's
            own, n = self._beyond(rows, k, plane)
            n *= trust
            residuals.append((own - plain) * n / (n + SIZE_PRIOR) if n else 0.0)
        own, n = self._beyond(1, 0, plane)
        single = max(a + b + c + overhead + own * n / (n + SIZE_PRIOR), 1e-6)
        out = self._prices[rows] = Prices(rows, fixed, c, tuple(residuals), single, jump, width)
        return out

    def line(self) -> tuple[float, float] | None:
        """(base, slope): one row's verify forward over K + 1 tokens as a line, base + slope
        K (what a store of an older version keeps, and `seed` takes back)."""
        plane = self.plane()
        if plane is None:
            return None
        a, b, c, jump, width = plane
        return a + b + c, c + width + jump / 8  # through K = 0 and K = 8, as `seed` puts it

    # -- keeping ---------------------------------------------------------------------------
    def seed(self, base: float, slope: float, weight: float = 4.0) -> None:
        """Start from a kept one-row line v(K) = base + slope K (an older store's or
        snapshot's), worth `weight` steps: pseudo-steps at K = 0 and K = 8."""
        for k in (0, 8):
            x = step_features(1, k + 1, k + 1)
            xtx, xty = self._drafted if k else self._plain
            y = base + slope * k
            for i in range(FEATURES):
                for j in range(FEATURES):
                    xtx[i][j] += weight / 2 * x[i] * x[j]
                xty[i] += weight / 2 * y * x[i]
        self.observed = max(self.observed, weight)
        self.steps = max(self.steps, weight)
        self._changed()

    def state(self) -> dict:
        """What restores the plane and the overhead (JSON): the store keeps it per pair and
        hardware. The sizes are measured afresh within a few steps; drafters' seconds are
        kept with their estimates."""
        (xtx, xty), (plain_xtx, plain_xty) = self._drafted, self._plain
        return {"xtx": [v for row in xtx for v in row], "xty": list(xty),
                "plain_xtx": [v for row in plain_xtx for v in row], "plain_xty": list(plain_xty),
                "observed": self.observed, "row_overhead": self.row_overhead}

    def restore(self, state: dict) -> "StepCost":
        """Continue from `state()`, or an older version's batch cost (its plain steps kept with
        the drafted ones before they were apart; fewer features: those measured anew)."""
        self._drafted = normal_equations(state["xtx"], state["xty"])
        self._plain = normal_equations(state.get("plain_xtx"), state.get("plain_xty"))
        self.observed = self.steps = float(state["observed"])
        self._overhead.seed(float(state.get("row_overhead", 0.0)))
        self._changed()
        return self


def merged_state(states: list[dict]) -> dict | None:
    """Several StepCost.state() as one (a fleet of daemons on one store): the sufficient
    statistics add up; the overhead is the median's median."""
    states = [StepCost(1).restore(s).state() for s in states if s and s["observed"] > 0]
    if not states:
        return None
    out = {name: [sum(values) for values in zip(*(s[name] for s in states))]
           for name in ("xtx", "xty", "plain_xtx", "plain_xty")}
    overheads = sorted(s["row_overhead"] for s in states)
    return out | {"observed": float(sum(s["observed"] for s in states)),
                  "row_overhead": overheads[len(overheads) // 2]}


def recorded_prices(rows: int, k_max: int, one_row: list[float],
                    plane: list[float] | None) -> Prices:
    """The prices a trace's recorded costs give (bench/recorded.py): `plane` (a, b, c, j, w),
    measured by `autospec bench --record`, and one row's forward at each K, `one_row` (its
    departures from the plane are that size's residuals, exactly). A trace without a plane
    prices one row only."""
    if plane is None:
        if rows != 1:
            raise ValueError("the trace has no batch line (recorded before batches were "
                             "calibrated): record it again (autospec bench --record)")
        return Prices.one_row(one_row)
    a, b, c, jump, width = plane
    if rows != 1:
        return Prices(rows, a + (b + c) * rows, c, (0.0,) * (k_max + 1), a + b + c, jump, width)
    line = [_dot(plane, step_features(1, k + 1, k + 1)) for k in range(k_max + 1)]
    fixed = one_row[0]
    residuals = (0.0,) + tuple(v - at - (fixed - line[0])
                               for v, at in zip(one_row[1:], line[1:]))
    return Prices(1, fixed, c, residuals, fixed, jump, width)


def _dot(plane, x) -> float:
    return sum(p * v for p, v in zip(plane, x))
