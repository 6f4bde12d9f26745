"""The decision, as pure functions: which (drafter, k) maximises expected tokens per second."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autospec.controller.formulas import rate_table


@dataclass(frozen=True)
class Choice:
    drafter: str | None  # None = plain decoding (k = 0)
    k: int
    rate: float  # expected tokens per second


def best_choice(alphas: dict[str, np.ndarray], draft_seconds: dict[str, float],
                verify_seconds: np.ndarray, k_limit: int) -> Choice:
    """Maximise expected tokens per second over drafters and K in 1..k_limit, against plain
    decoding (K = 0, rate 1 / verify_seconds[0])."""
    names = list(alphas)
    k_limit = min(k_limit, len(verify_seconds) - 1)
    plain = Choice(None, 0, 1.0 / float(verify_seconds[0]))
    if not names or k_limit < 1:
        return plain
    table = rate_table(np.stack([alphas[n][:k_limit] for n in names]),
                       np.array([draft_seconds[n] for n in names]), verify_seconds)
    row, k = np.unravel_index(int(np.argmax(table[:, 1:])), table[:, 1:].shape)
    best = Choice(names[row], int(k) + 1, float(table[row, k + 1]))
    return best if best.rate > plain.rate else plain
