"""The decision, as a pure function: which (drafter, k) maximises expected tokens per second."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autospec.controller.formulas import token_rates


@dataclass(frozen=True)
class Choice:
    drafter: str | None  # None = plain decoding (k = 0)
    k: int
    rate: float  # expected tokens per second


def best_choice(alphas: dict[str, np.ndarray], draft_seconds: dict[str, float],
                verify_seconds: np.ndarray, k_limit: int) -> Choice:
    """Maximise E(K) / (draft_seconds * K + verify_seconds[K]) over drafters and K in 1..k_limit,
    against plain decoding (K = 0, rate 1 / verify_seconds[0]).

    alphas: drafter -> (K_max,) per-position acceptance. verify_seconds: (K_max+1,).
    """
    best = Choice(None, 0, 1.0 / float(verify_seconds[0]))
    k_limit = min(k_limit, len(verify_seconds) - 1)
    if k_limit < 1:
        return best
    for drafter, alpha in alphas.items():
        rates = token_rates(alpha[:k_limit], draft_seconds[drafter], verify_seconds[:k_limit + 1])
        k = int(np.argmax(rates[1:])) + 1
        if rates[k] > best.rate:
            best = Choice(drafter, k, float(rates[k]))
    return best

