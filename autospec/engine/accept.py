"""Step 3 of the loop, as pure functions: which drafted tokens the target accepts.

Both return (accepted, next_token): `accepted` drafted tokens are kept, then one token from the
target itself — the *bonus* token when every draft was accepted, the *recovered* token at the
first rejection. So a round emits accepted + 1 tokens, and plain decoding is k = 0.
"""
from __future__ import annotations

import torch

from autospec.drafters.base import agreeing_prefix  # its one definition; imported from here too


def greedy_accept(draft_tokens: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """Longest prefix of the draft that matches the target's argmax.

    draft_tokens: k ids. target_logits: (k+1, V), row i scores the token after position i.
    """
    target_tokens = target_logits.argmax(-1).tolist()  # (k+1,)
    accepted = agreeing_prefix(draft_tokens, target_tokens)
    return accepted, target_tokens[accepted]


def fused_greedy_accept(draft_tokens: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """greedy_accept through autospec.kernels.greedy_verify: the fused Triton kernel on CUDA
    (one launch, no (k+1, V) argmax materialised on the host), its torch reference elsewhere.
    Same result as greedy_accept, exactly (tests/kernels/test_kernels.py, tests/engine/test_accept.py)."""
    if not draft_tokens:
        return greedy_accept(draft_tokens, target_logits)
    from autospec.kernels.verify import greedy_verify  # imports triton: only when used
    draft = torch.tensor([draft_tokens], device=target_logits.device)  # (1, k)
    num_draft = torch.tensor([len(draft_tokens)], device=target_logits.device)
    accepted, next_token = greedy_verify(draft, num_draft, target_logits[None])
    return int(accepted[0]), int(next_token[0])


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
