"""The decision, as pure functions: which (drafter, k) maximises expected tokens per second."""
from __future__ import annotations

import numpy as np

from autospec.controller.formulas import rate_table


PLAIN = -1  # the drafter index of plain decoding in `decide_step`


def decide_step(draws: np.ndarray, means: np.ndarray, draft_seconds: np.ndarray,
                verify_seconds: np.ndarray, k_limit: int, current: int | None,
                hysteresis: float, switch_seconds: np.ndarray | None = None) -> tuple[int, int]:
    """One step's decision over D drafters, as (drafter index or PLAIN, k).

    draws: (D, K_max) acceptance drawn from each drafter's posterior (Thompson), or the means;
    means: (D, K_max) posterior means; draft_seconds: (D,) per drafted token;
    verify_seconds: (K_max+1,); current: the drafter index in use (PLAIN, or None at start);
    switch_seconds: (D,) the one-off cost of starting each drafter now (prefilling its cache
    with the context), already spread over the rounds it would serve; 0 for one in use.
    1. the drafter: the best expected rate under the draws, plain decoding included;
    2. hysteresis: keep `current` while its best rate is within `hysteresis` of the winner's;
    3. K for that drafter from the means (changing K costs nothing: no exploration there),
       or plain decoding when no K beats it."""
    k_limit = min(k_limit, len(verify_seconds) - 1, draws.shape[1])
    plain_rate = 1.0 / float(verify_seconds[0])
    d = draws.shape[0]
    if d == 0 or k_limit < 1:
        return PLAIN, 0
    # one table for both: rows 0..D-1 under the draws (with the switch charge), D..2D-1 under
    # the means (without it) — one pass over the small arrays instead of two
    extra = np.zeros(2 * d)
    if switch_seconds is not None:
        extra[:d] = switch_seconds
    table = rate_table(np.concatenate((draws[:, :k_limit], means[:, :k_limit])),
                       np.concatenate((draft_seconds, draft_seconds)), verify_seconds, extra)
    best_rates = table[:d, 1:].max(axis=1).tolist()
    winner = max(range(d), key=best_rates.__getitem__)
    winner_rate = best_rates[winner]
    if winner_rate <= plain_rate:
        winner, winner_rate = PLAIN, plain_rate
    if current is not None and current != winner:
        kept = plain_rate if current == PLAIN else max(best_rates[current], plain_rate)
        if kept * (1 + hysteresis) >= winner_rate:
            winner = current
    if winner == PLAIN:
        return PLAIN, 0
    row = table[d + winner]
    k = int(np.argmax(row[1:])) + 1
    return (winner, k) if row[k] > plain_rate else (PLAIN, 0)


def k_for(means: np.ndarray, draft_seconds: float, verify_seconds: np.ndarray,
          k_limit: int) -> int:
    """The best K for one drafter under its posterior means (0: plain decoding pays more).
    `rate_table`'s arithmetic for one row, in Python floats: on the per-step path, where a
    dozen numpy calls on 16-element arrays cost more than the loop."""
    k_limit = min(k_limit, len(verify_seconds) - 1, len(means))
    verify = verify_seconds.tolist()
    best_k, best_rate = 0, 1.0 / verify[0]
    expected, survive = 1.0, 1.0
    for k, alpha in enumerate(means[:k_limit].tolist(), start=1):
        survive *= alpha
        expected += survive
        rate = expected / (draft_seconds * k + verify[k])
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k
