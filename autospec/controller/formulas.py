"""The cost model of docs/controller.md as pure functions over arrays.

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


def rate_table(alphas: np.ndarray, draft_seconds: np.ndarray, verify_seconds: np.ndarray,
               extra_seconds: np.ndarray | None = None) -> np.ndarray:
    """Expected tokens per second of every (drafter, K), all drafters in one pass.

    alphas: (D, K_max) per-position acceptance; draft_seconds: (D,) per drafted token;
    verify_seconds: (K_max+1,); extra_seconds: (D,) added to every drafting round of that
    drafter (a one-off cost spread over rounds). Returns (D, K_max+1); column 0 is plain.
    """
    d, k_max = alphas.shape
    expected = np.ones((d, k_max + 1))
    expected[:, 1:] += np.cumsum(np.cumprod(alphas, axis=1), axis=1)
    seconds = draft_seconds[:, None] * np.arange(k_max + 1) + verify_seconds[:k_max + 1]
    if extra_seconds is not None:
        seconds[:, 1:] += extra_seconds[:, None]
    return expected / seconds


def speedup(alpha: np.ndarray, c: float, v: np.ndarray) -> np.ndarray:
    """S(K) = E(K) / (c K + v(K)) in units of a plain step (v[0] = 1), K = 0..K_max."""
    return rate_table(np.asarray(alpha, float)[None], np.array([c]), np.asarray(v, float))[0]
