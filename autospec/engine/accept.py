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
        # it cost 13 ms a step
        target_tokens = [target_logits[i, :len(d) + 1].argmax(-1).tolist()
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


def rejection_accept(draft_tokens: list[int], draft_probs: torch.Tensor | None,
                     target_probs: torch.Tensor, generator: torch.Generator | None) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): output ~ target_probs exactly.

    draft_tokens: k ids, each drawn from the matching row of draft_probs.
    draft_probs: (k, V), or None for a deterministic drafter (n-gram): a point mass on the token.
    target_probs: (k+1, V) after the request's temperature / top-k / top-p.
    Token i is kept with probability min(1, target/draft); at the first rejection the
    recovered token is drawn from the residual max(0, target - draft), renormalised.
    """
    k = len(draft_tokens)
    uniforms = torch.rand(k, generator=generator).tolist() if k else []
    for i, token in enumerate(draft_tokens):
        p_target = float(target_probs[i, token])
        p_draft = 1.0 if draft_probs is None else float(draft_probs[i, token])
        if p_draft > 0 and uniforms[i] < min(1.0, p_target / p_draft):
            continue
        if draft_probs is None:
            residual = target_probs[i].clone()
            residual[token] = 0.0
        else:
            residual = (target_probs[i] - draft_probs[i]).clamp_min(0.0)
        total = float(residual.sum())
        # total == 0 only when target and draft agree to rounding: then the target itself is exact
        residual = residual / total if total > 1e-12 else target_probs[i]
        return i, int(torch.multinomial(residual, 1, generator=generator))
    return k, int(torch.multinomial(target_probs[k], 1, generator=generator))


def accept_rows(rounds: Sequence[Round], target_logits: torch.Tensor) -> list[tuple[int, int]]:
    """Step 3 for a whole step: target_logits (n, T, V), row i's first len(draft_i) + 1
    positions scoring its draft -> (accepted, next_token) per row. Greedy rows together (one
    argmax, one kernel launch on CUDA), sampled rows one by one, each with its own generator."""
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
            draft_probs = rnd.draft.draft_probs
            draft_probs = draft_probs[:n] if draft_probs is not None else None
            results[i] = rejection_accept(rnd.draft_tokens, draft_probs, target_probs,
                                          rnd.request.generator)
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
