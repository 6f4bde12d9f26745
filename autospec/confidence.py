"""Each drafted token's own confidence, calibrated online into P(accepted), and the rule that
stops a drafting where its next token cannot pay.

A drafter returns a confidence in [0, 1] with every token it proposes (`Draft.confidences`):
a model drafter its own probability of the token, a look-up drafter an evidence score of what
it matched. Confidences are not probabilities of acceptance — a draft model's 0.9 may be kept
half the time — so a `Calibration` per (workload, drafter) learns the map, bin by bin:

    p(c, j) = (kept_b + S * alpha_j) / (seen_b + S)        b = the bin of c (BINS equal bins)

kept_b / seen_b the verified tokens of bin b that were kept / scored (a token is scored only
where every token before it in its draft was kept: p is conditional, as alpha_j is), and
alpha_j the drafter's per-position mean acceptance at the token's position (the controller's
estimate for the request). A workload's calibration shrinks instead towards its drafter's
calibration over every workload (`parent`, the same formula at alpha_j): the map is mostly
the drafter's, and a workload's bins alone learn it slowly (`python -m
autospec.bench.calibration_check configs/traces/heldout.json`: the draft model's and the
early exit's mean |predicted - observed| 0.051 / 0.055 with each of the three workloads
learning alone, 0.047 / 0.040 with the parent; on SmolLM2's chat trace as recorded at c7b5f61
0.066 / 0.083 and 0.021 / 0.032, the feature head 0.068 and 0.030).
Before a bin has evidence anywhere p is alpha_j, so a new drafter — or one that returns no
confidences — decides exactly as the per-position means do; the bins' own rates take over as
tokens are verified.

The decision then ranks tokens by survival, g_j = prod_{l <= j} p_l (controller/batch.py), and
a model drafter, whose tokens are known only while it drafts, stops a row by `StopRule`.

Plain Python floats: every step calls this for every drafted token (a dozen numpy calls on
16-element arrays cost more than these loops).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

# equal-width bins over [0, 1]: 0.05 wide. Replayed at 10 and 40 (`autospec replay TRACE
# --knobs`, docs/controller.md): no effect beyond noise on any trace, so any of these serves
BINS = 20
# what the per-position mean is worth inside a bin, in verified tokens: the bin's own rate
# dominates after a few dozen tokens. Replayed at 1 and 16: no effect beyond noise
CALIBRATION_STRENGTH = 4.0


def bin_of(confidence: float) -> int:
    """The bin of a confidence in [0, 1] (1.0 in the last)."""
    b = int(confidence * BINS)
    return b if b < BINS else BINS - 1


def check_confidences(drafter: str, tokens: list[int], confidences) -> None:
    """A drafter's confidences: None (it has none), or one float in [0, 1] per token. A
    ValueError names the drafter and what is wrong."""
    if confidences is None:
        return
    if len(confidences) != len(tokens):
        raise ValueError(f"drafter {drafter!r} returned {len(confidences)} confidences for "
                         f"{len(tokens)} draft tokens (one per token, or None)")
    for j, c in enumerate(confidences):
        if not 0.0 <= c <= 1.0:  # NaN fails too
            raise ValueError(f"drafter {drafter!r} returned confidence {c!r} at draft position "
                             f"{j}: confidences must be in [0, 1]")


@dataclass
class Calibration:
    """Confidence -> P(accepted | the tokens before it were), per bin (module docstring).

    Besides the evidence, what the bins predicted for the tokens they scored, before each
    was folded in (`predicted`): the reliability table (`reliability`) compares an honest,
    out-of-sample prediction with what was observed."""
    kept: list[float] = field(default_factory=lambda: [0.0] * BINS)
    seen: list[float] = field(default_factory=lambda: [0.0] * BINS)
    predicted: list[float] = field(default_factory=lambda: [0.0] * BINS)
    strength: float = field(default_factory=lambda: CALIBRATION_STRENGTH)
    # the drafter's calibration over every workload, this one's prior (None: alpha_j is);
    # not part of the state: Learning.calibration_of links it
    parent: "Calibration | None" = field(default=None, repr=False, compare=False)

    def p(self, confidence: float, alpha: float) -> float:
        """P(accepted) of a token of this confidence, at a position whose mean is alpha."""
        b = bin_of(confidence)
        s, parent = self.strength, self.parent
        if parent is not None:
            alpha = (parent.kept[b] + s * alpha) / (parent.seen[b] + s)
        return (self.kept[b] + s * alpha) / (self.seen[b] + s)

    def alphas(self, confidences: list[float], means: list[float]) -> list[float]:
        """Each token's calibrated P(accepted), means[j] the per-position mean at its
        position (the last mean past their end)."""
        kept, seen, s, parent = self.kept, self.seen, self.strength, self.parent
        last = means[-1] if means else 0.5
        out = []
        for j, c in enumerate(confidences):
            b = int(c * BINS)
            if b >= BINS:
                b = BINS - 1
            alpha = means[j] if j < len(means) else last
            if parent is not None:
                alpha = (parent.kept[b] + s * alpha) / (parent.seen[b] + s)
            out.append((kept[b] + s * alpha) / (seen[b] + s))
        return out

    def update(self, confidences: list[float], accepted: int, means: list[float]) -> None:
        """One verified draft whose tokens had `confidences` (as far as they were verified)
        and of which the first `accepted` were kept: those are kept, the next one (if any)
        was rejected, later ones were never scored. `means` as for `alphas` (the prediction
        the reliability table keeps)."""
        scored = min(accepted + 1, len(confidences))
        if scored <= 0:
            return
        predictions = self.alphas(confidences[:scored], means)
        kept, seen, predicted = self.kept, self.seen, self.predicted
        for j in range(scored):
            b = bin_of(confidences[j])
            seen[b] += 1.0
            predicted[b] += predictions[j]
            if j < accepted:
                kept[b] += 1.0

    def merge(self, other: "Calibration") -> None:
        """Add another calibration's evidence (a warm start, a fleet)."""
        for mine, theirs in ((self.kept, other.kept), (self.seen, other.seen),
                             (self.predicted, other.predicted)):
            for b in range(BINS):
                mine[b] += theirs[b]

    def tokens(self) -> float:
        return sum(self.seen)

    def state(self) -> dict:
        """JSON: what restores it (the daemon's snapshot, the store's row)."""
        return {"kept": [round(x, 4) for x in self.kept], "seen": [round(x, 4) for x in self.seen],
                "predicted": [round(x, 4) for x in self.predicted]}

    @classmethod
    def from_state(cls, state: dict | None) -> "Calibration":
        """A kept state back; ValueError where it is not BINS numbers per list."""
        out = cls()
        if not state:
            return out
        for name in ("kept", "seen", "predicted"):
            values = state.get(name, [0.0] * BINS)
            if not isinstance(values, list) or len(values) != BINS:
                raise ValueError(f"calibration.{name}: expected {BINS} numbers, got {values!r}")
            setattr(out, name, [float(v) for v in values])
        return out

    def reliability(self) -> list[dict]:
        """Per bin with evidence: its confidence range, the tokens scored, the mean predicted
        P(accepted) (out of sample) and the observed rate."""
        rows = []
        for b in range(BINS):
            n = self.seen[b]
            if n > 0:
                rows.append({"bin": [round(b / BINS, 2), round((b + 1) / BINS, 2)],
                             "tokens": round(n, 1), "predicted": round(self.predicted[b] / n, 4),
                             "observed": round(self.kept[b] / n, 4)})
        return rows


def reliability_gap(rows: list[dict]) -> float | None:
    """The mean absolute gap between predicted and observed acceptance over a reliability
    table's bins, weighted by their tokens (None: no bins)."""
    total = sum(r["tokens"] for r in rows)
    if not total:
        return None
    return sum(r["tokens"] * abs(r["predicted"] - r["observed"]) for r in rows) / total


def sampling_gap(rows: list[dict]) -> float | None:
    """The gap `reliability_gap` shows from sampling alone: were each bin's n tokens kept with
    exactly the probability p predicted, its observed rate would still stray from p by about
    sqrt(2 / pi * p (1 - p) / n) (a binomial rate's mean absolute deviation, by its normal
    approximation), token-weighted as the gap is. A gap near it is calibration as good as the
    tokens can tell; a gap well over it is miscalibration (None: no bins)."""
    total = sum(r["tokens"] for r in rows)
    if not total:
        return None
    return sum(r["tokens"] * math.sqrt(2.0 / math.pi * r["predicted"] * (1.0 - r["predicted"])
                                       / r["tokens"]) for r in rows if r["tokens"] > 0) / total


def merged_table(tables: list[list[dict]]) -> list[dict]:
    """Several reliability tables (a drafter's, one per workload) as one, bin by bin."""
    merged: dict[tuple, list[float]] = {}
    for rows in tables:
        for row in rows:
            m = merged.setdefault(tuple(row["bin"]), [0.0, 0.0, 0.0])
            m[0] += row["tokens"]
            m[1] += row["tokens"] * row["predicted"]
            m[2] += row["tokens"] * row["observed"]
    return [{"bin": list(key), "tokens": n, "predicted": round(p / n, 4),
             "observed": round(o / n, 4)} for key, (n, p, o) in sorted(merged.items()) if n]


def gap_line(rows: list[dict]) -> str:
    """'N tokens, mean |predicted - observed| G (sampling alone ~S)' for one table."""
    return (f"{sum(r['tokens'] for r in rows):,.0f} tokens, mean |predicted - observed| "
            f"{reliability_gap(rows) or 0.0:.3f} (sampling alone ~{sampling_gap(rows) or 0.0:.3f})")


def reliability_lines(tables: dict[str, dict[str, list[dict]]], indent: str = "  ") -> list[str]:
    """{workload: {drafter: reliability table}} as text: a line per drafter with its tokens,
    mean gap and the gap sampling alone would show, then one per bin (predicted against
    observed acceptance)."""
    lines = []
    for workload, per_drafter in tables.items():
        for drafter, rows in per_drafter.items():
            lines.append(f"{indent}{workload} / {drafter}: {gap_line(rows)}")
            for r in rows:
                low, high = r["bin"]
                lines.append(f"{indent}  confidence {low:.2f}-{high:.2f}: {r['tokens']:>8.0f} "
                             f"tokens, predicted {r['predicted']:.3f}, observed {r['observed']:.3f}")
    return lines


@dataclass(frozen=True)
class StopRule:
    """Where a model drafter stops a row (its tokens are known only as it drafts them): after
    its j-th token, with survival g_j = prod_{l <= j} p_l (p from `calibration` at `means`):
    - the token is dropped, and drafting stops, where g_j < keep: its verify would cost more
      than it is expected to return (keep = R c, R the step's goodput in tokens per second
      and c a drafted token's verify seconds);
    - drafting stops after it where g_j < go: no later token (whose survival is at most g_j)
      can pay for its own drafting and verify (go = R (d + c), d a drafted token's seconds).
    The decision's K stays the bound."""
    calibration: Calibration
    means: list[float]
    keep: float
    go: float

    def survival(self, survival: float, position: int, confidence: float) -> float:
        means = self.means
        alpha = means[position] if position < len(means) else (means[-1] if means else 0.5)
        return survival * self.calibration.p(confidence, alpha)

    def step(self, survival: float, position: int, confidence: float) -> tuple[float, bool, bool]:
        """A drafting's next token: (its survival, whether it is kept, whether drafting goes
        on after it)."""
        g = self.survival(survival, position, confidence)
        return g, g >= self.keep, g >= self.go

    def run(self, confidences: list[float]) -> tuple[int, int]:
        """(tokens kept, tokens drafted) of a drafting the rule stops over a draft already
        made (replay): a dropped token was drafted, its forward run, and is not kept."""
        g = 1.0
        for j, c in enumerate(confidences):
            g = self.survival(g, j, c)
            if g < self.keep:
                return j, j + 1
            if g < self.go:
                return j + 1, j + 1
        return len(confidences), len(confidences)
