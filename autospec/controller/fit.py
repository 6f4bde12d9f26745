"""The step cost's numerics (controller/cost.py): a weighted running median, and the small
least-squares systems it solves, in Python floats (on the per-step path)."""
from __future__ import annotations

from collections import deque

FEATURES = 5  # 1, B, P, drafted, B (W - 1) (cost.step_features)


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


def normal_equations(flat: list[float] | None = None,
                      v: list[float] | None = None) -> tuple[list[list[float]], list[float]]:
    """(X'X, X'y) over FEATURES, from a kept state's (`flat` row-major X'X, possibly over
    fewer features: the others 0) or empty."""
    flat, v = [float(x) for x in flat or []], [float(x) for x in v or []]
    n = int(round(len(flat) ** 0.5))
    xtx = [[flat[i * n + j] if i < n and j < n else 0.0 for j in range(FEATURES)]
           for i in range(FEATURES)]
    return xtx, v[:n] + [0.0] * (FEATURES - n)


def solve(m: list[list[float]], v: list[float]) -> list[float]:
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
