"""Step 3 of the loop, as pure functions: which drafted tokens the target accepts.

Both return (accepted, next_token): `accepted` drafted tokens are kept, then one token from the
target itself — the *bonus* token when every draft was accepted, the *recovered* token at the
first rejection. So a round emits accepted + 1 tokens, and plain decoding is k = 0.
"""
from __future__ import annotations

from typing import Sequence

import torch

from autospec.drafters.base import agreeing_prefix  # its one definition; imported from here too
from autospec.engine.request import Round, TokenLogprob
from autospec.models.quantized import rows_argmax
from autospec.models.sampling import probs_from_logits


def greedy_accept(draft_tokens: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """Longest prefix of the draft that matches the target's argmax.

    draft_tokens: k ids. target_logits: (k+1, V), row i scores the token after position i.
    """
    target_tokens = target_logits.argmax(-1).tolist()  # (k+1,)
    accepted = agreeing_prefix(draft_tokens, target_tokens)
    return accepted, target_tokens[accepted]


def greedy_accept_rows(draft_tokens: list[list[int]], target_logits: torch.Tensor
                       ) -> list[tuple[int, int]]:
    """greedy_accept for every row of a step at once: draft_tokens[i] has k_i ids,
    target_logits (n, T, V) with T >= k_i + 1 (rows right-padded). Through
    autospec.kernels.greedy_verify: on CUDA the fused Triton kernel (one launch for the batch,
    no (n, T, V) argmax materialised on the host) — the same result as greedy_accept row by
    row, exactly (tests/kernels, tests/engine/test_accept.py)."""
    if not target_logits.is_cuda:
        # a host argmax per row over its own positions and a Python compare: cheaper than the
        # reference's tensor ops at the 1-16 rows of a step here, and the same result (the
        # reference's own oracle). Not one argmax over (n, T, V): a packed step's padding is
        # most of that tensor (16 rows, one 17 wide: 272 positions for 32 real), and reading
        # it cost 13 ms a step. quantized.rows_argmax: argmax's index, on the CPU in bfloat16
        # over SmolLM2's 49,152 logits ~5 against 175 us a position (torch's argmax)
        target_tokens = [rows_argmax(target_logits[i, :len(d) + 1]).tolist()
                         for i, d in enumerate(draft_tokens)]
        accepted = [agreeing_prefix(d, t) for d, t in zip(draft_tokens, target_tokens)]
        return [(a, t[a]) for a, t in zip(accepted, target_tokens)]
    return verify_rows(draft_tokens, target_logits)


def verify_rows(draft_tokens: list[list[int]], target_logits: torch.Tensor) -> list[tuple[int, int]]:
    """greedy_accept_rows through autospec.kernels.greedy_verify, the drafts padded to (n, T-1):
    the Triton kernel where the logits are on CUDA, its torch reference elsewhere."""
    from autospec.kernels.verify import greedy_verify  # imports triton: only when used
    n, width = target_logits.shape[:2]
    padded = torch.zeros((n, width - 1), dtype=torch.long)
    for i, tokens in enumerate(draft_tokens):
        padded[i, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    device = target_logits.device
    num_draft = torch.tensor([len(tokens) for tokens in draft_tokens], device=device)
    accepted, next_token = greedy_verify(padded.to(device), num_draft, target_logits)
    return list(zip(accepted.tolist(), next_token.tolist()))


MASK64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit ints that scatters every input bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def position_uniform(seed: int, position: int) -> float:
    """U[0, 1) for the output token at `position` of a request seeded `seed`: a function of
    the two alone (counter-based), so a request's draws do not depend on how many were made
    before, by whom, or in which step."""
    return (_mix64(_mix64(seed & MASK64) ^ ((position + 1) * 0x9E3779B97F4A7C15 & MASK64))
            >> 11) * 2.0 ** -53


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The token whose interval of the (V,) distribution's cumulative sum holds u: the first
    index whose cumulative mass exceeds u (a zero-mass token is never chosen)."""
    cdf = probs.double().cumsum(0)
    index = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64),
                                   right=True))
    return min(index, len(cdf) - 1)


def coupled_accept(draft_tokens: list[int], target_probs: torch.Tensor, seed: int,
                   position: int) -> tuple[int, int]:
    """Sampling verification that reproduces: the target's own sample at each drafted position
    (inverse CDF at `position_uniform(seed, position + i)`), the draft kept while it agrees.

    draft_tokens: k ids; target_probs: (k+1, V) after the request's temperature / top-k /
    top-p; position: the output index of the first of them. Every emitted token is the target's
    sample at its position — drawn from its distribution given the tokens before, exactly — so
    the output is a function of (prompt, sampling parameters, seed) alone: the same with any
    drafter, any K, in any batch, and plain decoding's (k = 0) too. A draft token is kept with
    probability p_target(token), the same as rejection sampling's min(1, p/q) for a point-mass
    drafter (n-gram, suffix); a drafter with a distribution q keeps less than rejection
    sampling's sum min(p, q) would (sum q p): the price of a seed that reproduces."""
    for i, token in enumerate(draft_tokens):
        sampled = inverse_cdf(target_probs[i], position_uniform(seed, position + i))
        if sampled != token:
            return i, sampled
    k = len(draft_tokens)
    return k, inverse_cdf(target_probs[k], position_uniform(seed, position + k))


def accept_rows(rounds: Sequence[Round], target_logits: torch.Tensor) -> list[tuple[int, int]]:
    """Step 3 for a whole step: target_logits (n, T, V), row i's first len(draft_i) + 1
    positions scoring its draft -> (accepted, next_token) per row. Greedy rows together (one
    argmax, one kernel launch on CUDA), sampled rows one by one, each by its own seed
    (coupled_accept)."""
    results: list[tuple[int, int] | None] = [None] * len(rounds)
    greedy = [i for i, rnd in enumerate(rounds) if rnd.request.sampling.greedy]
    if greedy:
        logits = target_logits if len(greedy) == len(rounds) else target_logits[greedy]
        for i, result in zip(greedy, greedy_accept_rows(
                [rounds[i].draft_tokens for i in greedy], logits)):
            results[i] = result
    for i, rnd in enumerate(rounds):
        if results[i] is None:
            n = len(rnd.draft_tokens)
            target_probs = probs_from_logits(target_logits[i, :n + 1], rnd.request.sampling)
            results[i] = coupled_accept(rnd.draft_tokens, target_probs, rnd.request.seed,
                                        len(rnd.request.output))
    return results


MAX_TOP_LOGPROBS = 20  # OpenAI's limit (chat's top_logprobs; completions allow 5)


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """TokenLogprob of each of `tokens`, scored by logits[j] (the row's (T, V) verify logits)."""
    logp = torch.log_softmax(logits[:len(tokens)].float(), dim=-1)
    chosen = logp[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()
    if top == 0:
        return [TokenLogprob(t, lp) for t, lp in zip(tokens, chosen)]
    values, ids = logp.topk(top, dim=-1)
    return [TokenLogprob(t, lp, tuple(zip(i, v)))
            for t, lp, i, v in zip(tokens, chosen, ids.tolist(), values.tolist())]
