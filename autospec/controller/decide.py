"""The decision, as pure functions: which (drafter, k) maximises expected tokens per second.

On the per-step path (decide + update must stay under 1 % of a step), so in Python floats: a
drafter's row is one loop over its positions that stops where the chance of surviving that
far is negligible, where a dozen numpy calls on 16-element arrays cost more than the loop.
`formulas.rate_table` is the same arithmetic over arrays (tests compare the two)."""
from __future__ import annotations

PLAIN = -1  # the drafter index of plain decoding in `decide_step`
NEGLIGIBLE = 1e-6  # survival below this adds under a millionth of a token: the row stops


def _floats(values) -> list:
    return values.tolist() if hasattr(values, "tolist") else list(values)


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
    """Step 1 of `decide_step`: the drafter index with the best expected rate under the
    posterior means (PLAIN when none beats plain decoding), a switch priced by
    `switch_seconds`.
    All arguments Python lists (verify: K_max+1 floats; limits: positions each can draft)."""
    plain_rate = 1.0 / verify[0]
    best_rates = [best_k(row, seconds, verify, limit, switch)[0] if limit > 0 else 0.0
                  for row, seconds, limit, switch in zip(means, draft_seconds, limits,
                                                         switch_seconds)]
    winner = max(range(len(best_rates)), key=best_rates.__getitem__)
    winner_rate = best_rates[winner]
    return PLAIN if winner_rate <= plain_rate else winner


def decide_step(means, draft_seconds, verify_seconds, k_limit: int, switch_seconds=None,
                available=None) -> tuple[int, int]:
    """One row's decision over D drafters, as (drafter index or PLAIN, k): what
    AdaptiveController.decide_batch does for a batch of one, on arrays.

    means: (D, K_max) posterior means; draft_seconds: (D,) per drafted token;
    verify_seconds: (K_max+1,); switch_seconds: (D,) the one-off cost of starting each drafter now (prefilling its cache
    with the context), already spread over the rounds it would serve; 0 for one in use;
    available: (D,) positions each drafter can draft this step (a look-up's proposal length;
    0: no option); None: all. Arrays or lists.
    1. the drafter: the best expected rate, plain decoding included;
    2. K for that drafter: the step's goodput optimum (batch.batch_ks), or plain decoding
       when no K beats it."""
    from autospec.controller.batch import Prices, batch_ks
    verify = _floats(verify_seconds)
    draft_seconds = _floats(draft_seconds)
    d = len(draft_seconds)
    k_limit = min(k_limit, len(verify) - 1)
    if d == 0 or k_limit < 1:
        return PLAIN, 0
    means = [_floats(row) for row in _floats(means)]
    switch = [0.0] * d if switch_seconds is None else _floats(switch_seconds)
    limits = [min(k_limit, len(means[i]) if available is None else available[i]) for i in range(d)]
    winner = choose_drafter(means, draft_seconds, verify, limits, switch)
    if winner == PLAIN:
        return PLAIN, 0
    prices = Prices(1, verify[0], 0.0, verify, verify, verify[0])
    k = batch_ks([means[winner][:limits[winner]]], [draft_seconds[winner]], prices)[0]
    return (winner, k) if k else (PLAIN, 0)
