"""Fused greedy verification (step 3 of the loop) over a batch of requests with ragged K.

The op comes three ways with one signature: `greedy_verify_reference` (pure torch: the CPU path
and the test oracle), `greedy_verify_triton` (one program per request, tiled over the
vocabulary), and the wrapper `greedy_verify` that picks one (see dispatch.py). Shapes, B
requests, K = K_max, V = vocabulary:
    draft_tokens (B, K) int, padded past num_draft[b]     num_draft (B,) int, 0..K
    target_logits (B, K+1, V): row i scores the token after draft i-1
It returns (accepted (B,), next_token (B,)) int64, as autospec.engine.accept.greedy_accept does
per request.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autospec.kernels.dispatch import choose_backend, launch_context, resolve_tiling, row_major

# The launch knobs greedy_verify takes, and what runs when a call leaves one unset. Every launch
# passes enable_fp_fusion=False: no a*b+c contracted into an FMA, so the kernel rounds exactly as
# the torch reference does (the PTX check in tests/kernels/test_kernels.py).
GREEDY_DEFAULT_TILING = {"BLOCK_V": 1024, "num_warps": 4, "num_stages": 2}


def _check_shapes(draft_tokens, num_draft, target, name):
    if draft_tokens.dim() != 2 or num_draft.shape != draft_tokens.shape[:1]:
        raise ValueError(f"draft_tokens must be (B, K_max) and num_draft (B,), got "
                         f"{tuple(draft_tokens.shape)} and {tuple(num_draft.shape)}")
    want = (draft_tokens.shape[0], draft_tokens.shape[1] + 1)
    if target.dim() != 3 or tuple(target.shape[:2]) != want:
        raise ValueError(f"{name} must be (B, K_max+1, V) = ({want[0]}, {want[1]}, V), "
                         f"got {tuple(target.shape)}")


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
    tiling = resolve_tiling("greedy_verify", GREEDY_DEFAULT_TILING,
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
