"""DESIGN.md's formulas as pure functions over arrays.

alpha[j]   P(draft position j+1 accepted | positions 1..j accepted), j = 0..K_max-1
E(K)       expected tokens per round = 1 + sum_{k=1..K} prod_{j<=k} alpha_j
round(K)   seconds per round = draft_seconds_per_token * K + verify_seconds[K]
           (verify_seconds[K] = target forward over K+1 tokens; [0] is a plain step)
rate(K)    E(K) / round(K), tokens per second; plain decoding is rate(0) = 1 / verify_seconds[0]
"""
from __future__ import annotations

import numpy as np


def expected_tokens(alpha: np.ndarray) -> np.ndarray:
    """(K_max,) per-position acceptance -> (K_max+1,) E(K) for K = 0..K_max."""
    return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(alpha))])


def round_seconds(draft_seconds_per_token: float, verify_seconds: np.ndarray) -> np.ndarray:
    """(K_max+1,) seconds of one round for K = 0..K_max."""
    k = np.arange(len(verify_seconds))
    return draft_seconds_per_token * k + verify_seconds


def token_rates(alpha: np.ndarray, draft_seconds_per_token: float,
                verify_seconds: np.ndarray) -> np.ndarray:
    """(K_max+1,) expected tokens per second for K = 0..K_max."""
    return expected_tokens(alpha) / round_seconds(draft_seconds_per_token, verify_seconds)


def speedup(alpha: np.ndarray, c: float, v: np.ndarray) -> np.ndarray:
    """S(K) = E(K) / (c K + v(K)) in units of a plain step; v[0] = 1."""
    return token_rates(alpha, c, v)
