"""K for every row of a step at once, from what the step's forward costs.

At batch 1 a verify forward is memory-bound: K more tokens cost little, and speculation pays
from a low acceptance. In a full batch the forward is compute-bound: drafted tokens cost,
and the same acceptance no longer pays (vLLM measured +23 % at batch 1 and -16 % at batch 32
at a flat acceptance). So K is chosen for the step's goodput — its tokens per second — not
for each row alone. Rows of unequal widths verify packed (models/kv.py): the forward
computes every row's real tokens and no padding, so a drafted token costs the same whichever
row drafts it, and a confident row can speculate while the others decode plain:

    step seconds   s(X)     the forward over B + X tokens (X drafted over all rows, at most
                            W - 1 in one), the per-step overhead in: `Prices`, from the one
                            step cost (controller/cost.py), a + b B + c (B + X) + j [X > 0]
                            + w B (W - 1) + the size's residual + o B
    goodput        (B + sum_i E_i(K_i)) / (s(sum_i K_i) + sum_i d_i K_i)

with E_i(K) = sum_{j<K} g_ij, g_ij = prod_{l<=j} alpha_il the chance row i's (j+1)-th drafted
token is kept, and d_i its drafter's seconds per drafted token. At a goodput R a token is
worth g_ij - R d_i; those fall along a row, so the best X tokens are the X best of them
(each row's a prefix of its positions), and the best X is the best ratio among those
prefixes; R is recomputed from it until it holds (Dinkelbach's iteration on the ratio), a few
rounds. Attention pads every row to the widest (w B (W - 1)), which a token's worth does not
see: where w is measured, the same is done with every row's K capped at 1, 2, 4, 8, 16, and
the best of those kept. At batch 1 this is the best K of one row against its measured
forward sizes; X = 0 (plain for every row) where no draft pays for its forward.

The same step prices each row's drafter choice (AdaptiveController.decide): a row pays its
share of the step, `Prices.shares`.
"""
from __future__ import annotations

from autospec.controller.cost import Prices
from autospec.controller.decide import best_k

# row-widths tried as a cap on every row's K where the padding has a price (batch_ks)
WIDTH_CAPS = (1, 2, 4, 8, 16, 32)

def batch_ks(means: list[list[float]], draft_seconds: list[float], prices: Prices,
             max_seconds: float | None = None, rounds: int = 8, riding: int = 0) -> list[int]:
    """K per row maximising the step's goodput: `best_batch`'s K."""
    return best_batch(means, draft_seconds, prices, max_seconds, rounds, riding)[1]


def best_batch(means: list[list[float]], draft_seconds: list[float], prices: Prices,
               max_seconds: float | None = None, rounds: int = 8,
               riding: int = 0) -> tuple[float, list[int]]:
    """(the goodput in tokens per second, K per row) maximising the step's goodput (the
    module docstring), in Python floats (it runs once a step: numpy's per-call cost was most
    of its time).

    means: per row, the chance of each token it may draft being kept given the ones before
    it were — its drafter's per-position means, or each proposed token's calibrated
    confidence (autospec/confidence.py) — as far as it may draft (a row that does not
    draft: []); draft_seconds: per row, a drafted token's cost to its drafter.
    max_seconds: no step (forward and drafting) predicted longer is chosen (a latency bound;
    plain for every row always stays). Where the widest row's padding has a price
    (`Prices.width`), the best is also sought with every row's K capped at each of WIDTH_CAPS
    (the worth of a token does not see what it widens), and the best of those kept.
    riding: a joining prompt's tokens in the step (its chunk): each counts as one of the step's
    tokens and costs its price (`Prices.token`), so while a prompt joins a drafted token must
    pay at the step's rate with the chunk in it — the chunk's wait priced, as a scheduler's
    token budget counts a prompt's tokens and a decode's alike.

    One row at its measured forward sizes (`Prices.table`) is the same objective over a prefix
    of one row, which `decide.best_k` walks once rather than by Dinkelbach's rounds."""
    if (len(means) == 1 and max_seconds is None and not riding
            and len(means[0]) < len(prices.table)):
        plain = 1.0 / prices.step(0)
        rate, k = best_k(means[0], draft_seconds[0], prices.table, len(means[0]))
        return (rate, [k]) if rate > plain else (plain, [0])
    gains = []
    for row in means:
        gain, running = [], 1.0
        for alpha in row:
            running *= alpha
            if running <= 0.0:
                break
            gain.append(running)
        gains.append(gain)
    longest = max(map(len, gains), default=0)
    caps = [longest]
    if prices.width > 0.0:
        caps = [cap for cap in WIDTH_CAPS if cap < longest] + caps
    best_rate, best = -1.0, [0] * len(means)
    for cap in caps:
        rate, ks = _best_ks([g[:cap] for g in gains], draft_seconds, prices, max_seconds, rounds,
                            riding)
        if rate > best_rate:
            best_rate, best = rate, ks
    return best_rate, best


def _best_ks(gains: list[list[float]], draft_seconds: list[float], prices: Prices,
             max_seconds: float | None, rounds: int, riding: int = 0) -> tuple[float, list[int]]:
    """(goodput, K per row) of batch_ks for rows whose kept-token chances are `gains`."""
    n = len(gains)
    base, chunk = n + riding, riding * prices.token  # the step's tokens with the chunk's
    step = prices.step
    rate = base / (step(0) + chunk)
    best: list[tuple] = []
    for _ in range(rounds):
        # every token worth drafting at this rate, best first (within a row in order: its
        # worth falls along it, and the sort is stable)
        tokens = []
        for i, (row, d) in enumerate(zip(gains, draft_seconds)):
            price = rate * d
            for g in row:
                if g <= price:
                    break
                tokens.append((g - price, g, d, i))
        tokens.sort(key=lambda t: -t[0])
        kept, gained, drafting, new_rate = 0, 0.0, 0.0, base / (step(0) + chunk)
        counts, widest = [0] * n, 0
        for x, (_, g, d, i) in enumerate(tokens, start=1):
            gained += g
            drafting += d
            counts[i] += 1
            widest = max(widest, counts[i])
            seconds = step(x, widest) + drafting
            if max_seconds is not None and seconds > max_seconds:
                continue
            goodput = (base + gained) / (seconds + chunk)
            if goodput > new_rate:
                kept, new_rate = x, goodput
        chosen = tokens[:kept]
        if chosen == best or abs(new_rate - rate) <= 1e-12 * rate:
            best, rate = chosen, new_rate
            break
        best, rate = chosen, new_rate
    ks = [0] * n
    for *_, i in best:
        ks[i] += 1
    return rate, ks
