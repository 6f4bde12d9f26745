"""Fused verification (step 3 of the loop) over a batch of requests with ragged K.

Each op comes three ways with one signature: `*_reference` (pure torch: the CPU path and the
test oracle), `*_triton` (one program per request, tiled over the vocabulary), and a wrapper that
picks one (see dispatch.py). Shapes, B requests, K = K_max, V = vocabulary:
    draft_tokens (B, K) int, padded past num_draft[b]     num_draft (B,) int, 0..K
    target_logits / target_probs (B, K+1, V): row i scores the token after draft i-1
Both return (accepted (B,), next_token (B,)) int64, as autospec.engine.accept does per request.

Rejection sampling takes its random numbers as inputs, so kernel and reference agree bit for bit.
Two choices make that possible on any hardware, whatever order a GPU sums in:
- accept iff uniforms * draft_p < target_p, in float64: a float32 product is exact there, so this is
  exactly uniforms < target_p / draft_p with no division to round (Triton's fp32 `/` is approximate);
- the recovered/bonus token is drawn by inverse CDF over probabilities in 2^-40 fixed point (int64).
  Integer sums are associative, so the tiled scan and torch.cumsum give identical prefix sums.
  Quantising drops mass below 2^-40 per token: far below float32's own rounding of a softmax.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autospec.kernels.dispatch import choose_backend, launch_context, resolve_tiling, row_major

# Searched by `autospec tune` where a GPU is present; the defaults are what runs untuned.
# Every launch passes enable_fp_fusion=False: no a*b+c contracted into an FMA, so the kernels
# round exactly as the torch references do (the PTX check in tests/kernels/test_kernels.py).
GREEDY_TILING_SPACE = {"BLOCK_V": [256, 512, 1024, 2048], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3]}
GREEDY_DEFAULT_TILING = {"BLOCK_V": 1024, "num_warps": 4, "num_stages": 2}
REJECTION_TILING_SPACE = {"BLOCK_V": [256, 512, 1024, 2048], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3]}
REJECTION_DEFAULT_TILING = {"BLOCK_V": 1024, "num_warps": 4, "num_stages": 2}

FIXED_ONE = 2.0 ** 40  # one unit of probability in fixed point; V * 2^40 stays far below 2^63
_FIXED_ONE = tl.constexpr(FIXED_ONE)


def _check_shapes(draft_tokens, num_draft, target, name):
    if draft_tokens.dim() != 2 or num_draft.shape != draft_tokens.shape[:1]:
        raise ValueError(f"draft_tokens must be (B, K_max) and num_draft (B,), got "
                         f"{tuple(draft_tokens.shape)} and {tuple(num_draft.shape)}")
    want = (draft_tokens.shape[0], draft_tokens.shape[1] + 1)
    if target.dim() != 3 or tuple(target.shape[:2]) != want:
        raise ValueError(f"{name} must be (B, K_max+1, V) = ({want[0]}, {want[1]}, V), "
                         f"got {tuple(target.shape)}")


def _check_rejection_shapes(draft_tokens, num_draft, draft_probs, target_probs, uniforms,
                            recover_uniforms):
    _check_shapes(draft_tokens, num_draft, target_probs, "target_probs")
    (B, K), V = draft_tokens.shape, target_probs.shape[-1]
    if draft_probs is not None and tuple(draft_probs.shape) != (B, K, V):
        raise ValueError(f"draft_probs must be (B, K_max, V) = ({B}, {K}, {V}) or None, "
                         f"got {tuple(draft_probs.shape)}")
    if tuple(uniforms.shape) != (B, K) or tuple(recover_uniforms.shape) != (B,):
        raise ValueError(f"uniforms must be ({B}, {K}) and recover_uniforms ({B},), got "
                         f"{tuple(uniforms.shape)} and {tuple(recover_uniforms.shape)}")


# -----------------------------------------------------------------------------
# greedy: longest prefix of the draft equal to the target's argmax, then argmax at that position

def greedy_verify_reference(draft_tokens: torch.Tensor, num_draft: torch.Tensor,
                            target_logits: torch.Tensor, *, BLOCK_V: int | None = None,
                            num_warps: int | None = None, num_stages: int | None = None):
    """Per row, exactly autospec.engine.accept.greedy_accept(draft[:n], logits[:n+1]).

    Tiling arguments are accepted and ignored (same signature as the kernel). num_draft is
    clamped to [0, K_max], as the kernel does.
    """
    _check_shapes(draft_tokens, num_draft, target_logits, "target_logits")
    B, K = draft_tokens.shape
    n = num_draft.long().clamp(0, K)[:, None]                       # (B, 1)
    target_tokens = target_logits.argmax(-1)                         # (B, K+1), first max; NaN wins
    pos = torch.arange(K, device=draft_tokens.device)
    mismatch = (pos < n) & (draft_tokens != target_tokens[:, :K])
    # the first mismatch, or n when every drafted token matched; the extra column covers K = 0
    accepted = torch.cat([torch.where(mismatch, pos, n), n], 1).min(1).values
    return accepted, target_tokens.gather(1, accepted[:, None]).squeeze(1)


@triton.jit
def _row_argmax(row_ptr, V, BLOCK_V: tl.constexpr):
    """torch.argmax of one row of V logits: the first maximum, or the first NaN if any."""
    best = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.zeros([], tl.int32)
    first_nan = tl.zeros([], tl.int32) + V
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)                              # (BLOCK_V,)
        x = tl.load(row_ptr + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        tile_max, tile_idx = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        # strict > keeps the earlier tile on ties: torch.argmax returns the first maximum
        better = tile_max > best
        best = tl.where(better, tile_max, best)
        best_idx = tl.where(better, v0 + tile_idx, best_idx)
        # torch.argmax treats NaN as the largest value; tl.max skips it
        first_nan = tl.minimum(first_nan, tl.min(tl.where(x != x, cols, V), axis=0))
    return tl.where(first_nan < V, first_nan, best_idx)


@triton.jit
def _greedy_verify_kernel(draft_ptr, num_draft_ptr, logits_ptr, accepted_ptr, next_ptr,
                          K_max, V, stride_db, stride_lb, stride_lk, BLOCK_V: tl.constexpr):
    # one program per request, walking the verify positions in order and stopping at the first
    # mismatch: only rows 0..accepted are read, (accepted+1) * V logits instead of (K+1) * V
    b = tl.program_id(0).to(tl.int64)  # int64: b * stride overflows int32 for big batches
    n = tl.minimum(tl.maximum(tl.load(num_draft_ptr + b).to(tl.int32), 0), K_max)
    i = 0
    target_token = tl.zeros([], tl.int32)
    searching = True
    while searching:
        target_token = _row_argmax(logits_ptr + b * stride_lb + i * stride_lk, V, BLOCK_V)
        drafted = tl.load(draft_ptr + b * stride_db + i, mask=i < n, other=-1)
        searching = (i < n) & (drafted == target_token)                # matched: look one further
        i += 1
    tl.store(accepted_ptr + b, (i - 1).to(tl.int64))   # the row that stopped us is the next token
    tl.store(next_ptr + b, target_token.to(tl.int64))


def greedy_verify_triton(draft_tokens: torch.Tensor, num_draft: torch.Tensor,
                         target_logits: torch.Tensor, *, BLOCK_V: int | None = None,
                         num_warps: int | None = None, num_stages: int | None = None):
    """Triton version of greedy_verify_reference; same arguments, same results."""
    _check_shapes(draft_tokens, num_draft, target_logits, "target_logits")
    if target_logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        # the kernel compares in float32: exact for these, not for float64 (ties after rounding)
        raise ValueError(f"greedy_verify_triton: target_logits dtype {target_logits.dtype} "
                         "(supported: float32, bfloat16, float16)")
    tiling = resolve_tiling("greedy_verify", GREEDY_TILING_SPACE, GREEDY_DEFAULT_TILING,
                            dict(BLOCK_V=BLOCK_V, num_warps=num_warps, num_stages=num_stages))
    B, K = draft_tokens.shape
    V = target_logits.shape[-1]
    draft_tokens, target_logits = row_major(draft_tokens), row_major(target_logits)
    accepted = torch.empty(B, dtype=torch.int64, device=draft_tokens.device)
    next_token = torch.empty_like(accepted)
    if B:
        with launch_context(_greedy_verify_kernel, target_logits):
            _greedy_verify_kernel[(B,)](
                draft_tokens, num_draft, target_logits, accepted, next_token,
                K, V, draft_tokens.stride(0), target_logits.stride(0), target_logits.stride(1),
                enable_fp_fusion=False, **tiling)
    return accepted, next_token


def greedy_verify(draft_tokens: torch.Tensor, num_draft: torch.Tensor, target_logits: torch.Tensor,
                  *, BLOCK_V: int | None = None, num_warps: int | None = None,
                  num_stages: int | None = None):
    """Greedy acceptance for a batch: (accepted (B,), next_token (B,)). Triton on CUDA."""
    impl = greedy_verify_triton if choose_backend(target_logits) == "triton" else greedy_verify_reference
    return impl(draft_tokens, num_draft, target_logits,
                BLOCK_V=BLOCK_V, num_warps=num_warps, num_stages=num_stages)


# -----------------------------------------------------------------------------
# rejection sampling: accepted, then a recovered token (first rejection) or a bonus token

def _fixed_point(probs: torch.Tensor) -> torch.Tensor:
    return (probs * FIXED_ONE).long()  # x * 2^40 is exact in float32; .long() truncates, as the kernel


def rejection_verify_reference(draft_tokens: torch.Tensor, num_draft: torch.Tensor,
                               draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                               uniforms: torch.Tensor, recover_uniforms: torch.Tensor, *,
                               BLOCK_V: int | None = None, num_warps: int | None = None,
                               num_stages: int | None = None):
    """Speculative sampling for a batch with the random numbers given: output ~ target_probs.

    draft_probs (B, K_max, V), or None for a point-mass drafter (n-gram). uniforms (B, K_max):
    token i is accepted iff uniforms[i] < min(1, target_p / draft_p) (and draft_p > 0).
    recover_uniforms (B,): inverse-CDF draw of the recovered token from max(0, target - draft)
    (point mass: target with the drafted token zeroed), or of the bonus token from target_probs[K].
    A residual with no mass left (target == draft to rounding) falls back to target_probs, as
    autospec.engine.accept.rejection_accept does.
    """
    _check_rejection_shapes(draft_tokens, num_draft, draft_probs, target_probs, uniforms,
                            recover_uniforms)
    B, K = draft_tokens.shape
    device = draft_tokens.device
    n = num_draft.long().clamp(0, K)                                  # (B,)
    pos = torch.arange(K, device=device)
    drafted = pos < n[:, None]                                        # (B, K)
    tokens = torch.where(drafted, draft_tokens.long(), 0)             # padding may hold anything

    # 1. accept or reject each drafted token (float64: the product below is exact)
    target_p = target_probs[:, :K].gather(2, tokens[..., None]).squeeze(2).float().double()
    draft_p = (torch.ones_like(target_p) if draft_probs is None
               else draft_probs.gather(2, tokens[..., None]).squeeze(2).float().double())
    ok = (draft_p > 0) & (uniforms.double() * draft_p < target_p)
    accepted = torch.cat([torch.where(drafted & ~ok, pos, n[:, None]), n[:, None]], 1).min(1).values

    # 2. the distribution the next token comes from: residual at a rejection, target at the bonus
    rows = torch.arange(B, device=device)
    bonus = accepted == n                                             # (B,)
    target_row = target_probs[rows, accepted].float()                 # (B, V)
    if draft_probs is None:
        padded = torch.cat([tokens, tokens.new_full((B, 1), -1)], 1)  # (B, K+1): bonus -> -1
        rejected = torch.where(bonus, -1, padded.gather(1, accepted[:, None]).squeeze(1))
        cols = torch.arange(target_row.shape[1], device=device)
        residual = torch.where(cols == rejected[:, None], 0.0, target_row)
    elif K == 0:
        residual = target_row                                         # nothing drafted: all bonus
    else:
        draft_row = draft_probs[rows, accepted.clamp(max=K - 1)].float()
        residual = torch.where(bonus[:, None], target_row, (target_row - draft_row).clamp_min(0.0))

    # 3. inverse CDF in fixed point: the token is the number of prefix sums <= threshold
    mass = _fixed_point(residual)
    mass = torch.where((mass.sum(1) == 0)[:, None], _fixed_point(target_row), mass)
    total = mass.sum(1)
    threshold = torch.minimum((recover_uniforms.double() * total.double()).long(), total - 1)
    next_token = (mass.cumsum(1) <= threshold[:, None]).sum(1)
    return accepted, next_token


@triton.jit
def _residual_tile(target_row, draft_row, cols, in_vocab, draft_len, zeroed, rejecting,
                   HAS_DRAFT_PROBS: tl.constexpr):
    """One (BLOCK_V,) tile: target probabilities and the residual a rejection samples from
    (max(0, target - draft), or target with the rejected point-mass token zeroed)."""
    target = tl.load(target_row + cols, mask=in_vocab, other=0.0).to(tl.float32)
    if HAS_DRAFT_PROBS:
        draft = tl.load(draft_row + cols, mask=cols < draft_len, other=0.0).to(tl.float32)
        residual = tl.where(rejecting, tl.maximum(target - draft, 0.0), target)
    else:
        residual = tl.where(cols == zeroed, 0.0, target)
    return target, residual


@triton.jit
def _rejection_verify_kernel(draft_ptr, num_draft_ptr, draft_probs_ptr, target_probs_ptr,
                             uniforms_ptr, recover_ptr, accepted_ptr, next_ptr,
                             K_max, V, stride_db, stride_ub, stride_dpb, stride_dpk,
                             stride_tpb, stride_tpk,
                             HAS_DRAFT_PROBS: tl.constexpr, BLOCK_K: tl.constexpr,
                             BLOCK_V: tl.constexpr):
    # one program per request: a gather per drafted token decides acceptance, then two passes
    # over the one row that matters (total mass, then the prefix-sum count)
    b = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(num_draft_ptr + b).to(tl.int32), 0), K_max)
    pos = tl.arange(0, BLOCK_K)
    drafted = pos < n
    tokens = tl.load(draft_ptr + b * stride_db + pos, mask=drafted, other=0).to(tl.int64)

    # 1. accept iff u * draft_p < target_p, in float64 (exactly u < target_p / draft_p)
    target_p = tl.load(target_probs_ptr + b * stride_tpb + pos * stride_tpk + tokens,
                       mask=drafted, other=0.0).to(tl.float32).to(tl.float64)
    if HAS_DRAFT_PROBS:
        draft_p = tl.load(draft_probs_ptr + b * stride_dpb + pos * stride_dpk + tokens,
                          mask=drafted, other=0.0).to(tl.float32).to(tl.float64)
    else:
        draft_p = tl.full([BLOCK_K], 1.0, tl.float64)  # point mass on the drafted token
    u = tl.load(uniforms_ptr + b * stride_ub + pos, mask=drafted, other=0.0).to(tl.float64)
    ok = (draft_p > 0) & (u * draft_p < target_p)
    accepted = tl.min(tl.where(drafted & ~ok, pos, n))
    rejecting = accepted < n                                          # scalar: recovered, not bonus
    rejected = tl.sum(tl.where(drafted & (pos == accepted), tokens, 0))

    # the residual zeroes this column (point mass) / reads the draft row only when rejecting;
    # folded into an index and a length, since the interpreter cannot AND a scalar into a mask
    zeroed = tl.where(rejecting, rejected, -1)
    draft_len = tl.where(rejecting, V, 0)
    target_row = target_probs_ptr + b * stride_tpb + accepted.to(tl.int64) * stride_tpk
    draft_row = draft_probs_ptr + b * stride_dpb + accepted.to(tl.int64) * stride_dpk

    # 2. pass one: fixed-point mass of the residual, and of the target (the fallback)
    residual_total = tl.full([], 0, tl.int64)
    target_total = tl.full([], 0, tl.int64)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        in_vocab = cols < V
        target, residual = _residual_tile(target_row, draft_row, cols, in_vocab, draft_len,
                                          zeroed, rejecting, HAS_DRAFT_PROBS)
        residual_total += tl.sum((residual * _FIXED_ONE).to(tl.int64))
        target_total += tl.sum((target * _FIXED_ONE).to(tl.int64))
    use_target = residual_total == 0
    total = tl.where(use_target, target_total, residual_total)
    u_recover = tl.load(recover_ptr + b).to(tl.float64)
    threshold = tl.minimum((u_recover * total.to(tl.float64)).to(tl.int64), total - 1)

    # 3. pass two: the token is the count of prefix sums <= threshold (exact: integer scan)
    running = tl.full([], 0, tl.int64)
    count = tl.full([], 0, tl.int64)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        in_vocab = cols < V
        target, residual = _residual_tile(target_row, draft_row, cols, in_vocab, draft_len,
                                          zeroed, rejecting, HAS_DRAFT_PROBS)
        mass = tl.where(use_target, target, residual)
        mass = (mass * _FIXED_ONE).to(tl.int64)                       # (BLOCK_V,)
        prefix = running + tl.cumsum(mass, axis=0)
        count += tl.sum((in_vocab & (prefix <= threshold)).to(tl.int64))
        running += tl.sum(mass)
    tl.store(accepted_ptr + b, accepted.to(tl.int64))
    tl.store(next_ptr + b, count)


def rejection_verify_triton(draft_tokens: torch.Tensor, num_draft: torch.Tensor,
                            draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                            uniforms: torch.Tensor, recover_uniforms: torch.Tensor, *,
                            BLOCK_V: int | None = None, num_warps: int | None = None,
                            num_stages: int | None = None):
    """Triton version of rejection_verify_reference; same arguments, same results."""
    _check_rejection_shapes(draft_tokens, num_draft, draft_probs, target_probs, uniforms,
                            recover_uniforms)
    B, K = draft_tokens.shape
    V = target_probs.shape[-1]
    tiling = resolve_tiling("rejection_verify", REJECTION_TILING_SPACE, REJECTION_DEFAULT_TILING,
                            dict(BLOCK_V=BLOCK_V, num_warps=num_warps, num_stages=num_stages))
    draft_tokens, target_probs, uniforms = map(row_major, (draft_tokens, target_probs, uniforms))
    has_draft = draft_probs is not None and K > 0
    # a point-mass drafter passes no draft_probs: the kernel never reads the stand-in pointer
    draft_probs = row_major(draft_probs) if has_draft else target_probs
    accepted = torch.empty(B, dtype=torch.int64, device=draft_tokens.device)
    next_token = torch.empty_like(accepted)
    if B:
        with launch_context(_rejection_verify_kernel, target_probs):
            _rejection_verify_kernel[(B,)](
                draft_tokens, num_draft, draft_probs, target_probs, uniforms, recover_uniforms,
                accepted, next_token, K, V, draft_tokens.stride(0), uniforms.stride(0),
                draft_probs.stride(0), draft_probs.stride(1),
                target_probs.stride(0), target_probs.stride(1),
                HAS_DRAFT_PROBS=has_draft, BLOCK_K=triton.next_power_of_2(K + 1),
                enable_fp_fusion=False, **tiling)
    return accepted, next_token


def rejection_verify(draft_tokens: torch.Tensor, num_draft: torch.Tensor,
                     draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                     uniforms: torch.Tensor, recover_uniforms: torch.Tensor, *,
                     BLOCK_V: int | None = None, num_warps: int | None = None,
                     num_stages: int | None = None):
    """Rejection-sampling acceptance for a batch: (accepted (B,), next_token (B,)). Triton on CUDA."""
    use_triton = choose_backend(target_probs) == "triton"
    impl = rejection_verify_triton if use_triton else rejection_verify_reference
    return impl(draft_tokens, num_draft, draft_probs, target_probs, uniforms, recover_uniforms,
                BLOCK_V=BLOCK_V, num_warps=num_warps, num_stages=num_stages)
