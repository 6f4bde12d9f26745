"""The decision, as pure functions: which (drafter, k) maximises expected tokens per second.

On the per-step path (decide + update must stay under 1 % of a step), so in Python floats: a
drafter's row is one loop over its positions that stops where the chance of surviving that
far is negligible, where a dozen numpy calls on 16-element arrays cost more than the loop.
`formulas.rate_table` is the same arithmetic over arrays (tests compare the two)."""
from __future__ import annotations

NO_DRAFTER = -1  # choose_drafter's answer where plain decoding beats every drafter
NEGLIGIBLE = 1e-6  # survival below this adds under a millionth of a token: the row stops


def best_k(alphas, draft_seconds: float, verify: list[float], k_limit: int,
           extra_seconds: float = 0.0) -> tuple[float, int]:
    """(best rate over K >= 1, that K) for one drafter: rate(K) = E(K) / (draft_seconds * K +
    verify[K] + extra_seconds); (0.0, 0) when k_limit < 1. Stops once survival is negligible:
    verify is non-decreasing in K, so no later K can gain more than that survival buys.
    Each alpha is clipped to [0, 1]."""
    best_rate, best = 0.0, 0
    expected = survive = 1.0
    for k in range(1, k_limit + 1):
        alpha = alphas[k - 1]
        if alpha < 1.0:
            survive *= alpha if alpha > 0.0 else 0.0
        expected += survive
        rate = expected / (draft_seconds * k + verify[k] + extra_seconds)
        if rate > best_rate:
            best_rate, best = rate, k
        if survive < NEGLIGIBLE:
            break
    return best_rate, best


def choose_drafter(means, draft_seconds: list[float], verify: list[float], limits: list[int],
                   switch_seconds: list[float]) -> int:
    """The drafter index with the best expected rate under each drafter's chance of keeping
    each token (NO_DRAFTER when none beats plain decoding), a switch priced by
    `switch_seconds`.
    All arguments Python lists (verify: K_max+1 floats; limits: positions each can draft)."""
    plain_rate = 1.0 / verify[0]
    best_rates = [best_k(row, seconds, verify, limit, switch)[0] if limit > 0 else 0.0
                  for row, seconds, limit, switch in zip(means, draft_seconds, limits,
                                                         switch_seconds)]
    winner = max(range(len(best_rates)), key=best_rates.__getitem__)
    winner_rate = best_rates[winner]
    return NO_DRAFTER if winner_rate <= plain_rate else winner
