"""Batched prompt lookup: autospec.drafters.ngram.ngram_match for B requests at once.

Per row the semantics are ngram_match's: the longest suffix n-gram (n from n_max down to n_min)
that occurred earlier, its most recent occurrence that is followed by at least one token, and up
to k of the tokens that followed. Both implementations reformulate the search over n as one pass:
for each end position e (1 <= e <= length-1, so tokens[e] exists) let m(e) be how many tokens
before e agree with the sequence's tail, read backwards and capped at n_max:

    m(e) = max{ j <= n_max : tokens[e-j:e] == tokens[length-j:length] }

An n-gram occurrence starting at i is exactly an end e = i + n with m(e) >= n, so the winning n
is max_e m(e) and the winning occurrence the largest e reaching it: one argmax over the key
m(e) * (L+1) + e. The proposal is tokens[e : min(e + k, length)].

Shapes: tokens (B, L) int, padded past lengths[b]; returns proposals (B, k) int64 padded with -1
and num (B,) int64.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autospec.kernels.dispatch import choose_backend, launch_context, resolve_tiling, row_major

TILING_SPACE = {"BLOCK_L": [128, 256, 512, 1024], "num_warps": [1, 2, 4, 8], "num_stages": [1, 2]}
DEFAULT_TILING = {"BLOCK_L": 256, "num_warps": 4, "num_stages": 1}


def _check(tokens, lengths, n_min, n_max, k):
    if tokens.dim() != 2 or lengths.shape != tokens.shape[:1]:
        raise ValueError(f"tokens must be (B, L) and lengths (B,), got {tuple(tokens.shape)} "
                         f"and {tuple(lengths.shape)}")
    if not 1 <= n_min <= n_max:
        raise ValueError(f"ngram needs 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")


def ngram_match_batch_reference(tokens: torch.Tensor, lengths: torch.Tensor, n_min: int,
                                n_max: int, k: int, *, BLOCK_L: int | None = None,
                                num_warps: int | None = None, num_stages: int | None = None):
    """Pure-torch batched n-gram match; tiling arguments are accepted and ignored.

    lengths are clamped to [0, L], as the kernel does.
    """
    _check(tokens, lengths, n_min, n_max, k)
    B, L = tokens.shape
    device = tokens.device
    proposals = torch.full((B, k), -1, dtype=torch.int64, device=device)
    num = torch.zeros(B, dtype=torch.int64, device=device)
    if L == 0 or k == 0:
        return proposals, num
    tokens = tokens.long()
    length = lengths.long().clamp(0, L)[:, None]                     # (B, 1)
    ends = torch.arange(L, device=device)                            # (L,) candidate end e
    valid = (ends >= 1) & (ends < length)                            # (B, L)
    agree = valid.clone()                                            # still matching the tail?
    m = torch.zeros(B, L, dtype=torch.int64, device=device)          # m(e)
    for j in range(n_max):
        src = ends - 1 - j                                           # the j-th token before e
        before = tokens[:, src.clamp(min=0)]                          # (B, L)
        tail = tokens.gather(1, (length - 1 - j).clamp(min=0))        # (B, 1): j-th from the end
        agree = agree & (src >= 0) & (before == tail)
        m += agree
    key = torch.where(valid, m * (L + 1) + ends, -1).max(1).values   # (B,)
    found = key >= 0
    best_n = torch.where(found, key // (L + 1), 0)
    start = torch.where(found, key % (L + 1), 0)
    found &= best_n >= n_min
    num = torch.where(found, (length[:, 0] - start).clamp(max=k), 0)
    offsets = torch.arange(k, device=device)
    follow = tokens.gather(1, (start[:, None] + offsets).clamp(max=L - 1))
    proposals = torch.where(offsets < num[:, None], follow, -1)
    return proposals, num


@triton.jit
def _ngram_match_kernel(tokens_ptr, lengths_ptr, proposals_ptr, num_ptr,
                        L, n_min, k, stride_tb, stride_pb,
                        N_MAX: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_K: tl.constexpr):
    # one program per request; tiles of end positions, each compared against the tail
    # N_MAX times (unrolled: n_max is small and fixed per drafter)
    b = tl.program_id(0).to(tl.int64)
    length = tl.minimum(tl.maximum(tl.load(lengths_ptr + b).to(tl.int32), 0), L)
    row = tokens_ptr + b * stride_tb
    best = tl.full([], -1, tl.int64)                                 # max key m(e) * (L+1) + e
    for e0 in range(1, length, BLOCK_L):                             # loop ends at the row's length
        ends = e0 + tl.arange(0, BLOCK_L)                            # (BLOCK_L,)
        valid = ends < length
        agree = valid
        m = tl.zeros([BLOCK_L], tl.int64)
        for j in tl.static_range(N_MAX):
            src = ends - 1 - j
            tail_pos = length - 1 - j                                # < 0 only when src < 0 too
            tail = tl.load(row + tl.maximum(tail_pos, 0))
            agree = agree & (src >= 0)
            before = tl.load(row + src, mask=agree, other=0)
            agree = agree & (before == tail)
            m += agree.to(tl.int64)
        key = tl.where(valid, m * (L + 1) + ends, -1)
        best = tl.maximum(best, tl.max(key))
    # decode only a non-negative key: integer // and % truncate toward zero on the GPU
    found = best >= 0
    safe = tl.maximum(best, 0)
    best_n = safe // (L + 1)
    start = safe % (L + 1)
    found = found & (best_n >= n_min)
    num = tl.where(found, tl.minimum(length - start, k), 0)
    offsets = tl.arange(0, BLOCK_K)
    follow = tl.load(row + start + offsets, mask=offsets < num, other=-1)
    tl.store(proposals_ptr + b * stride_pb + offsets, follow.to(tl.int64), mask=offsets < k)
    tl.store(num_ptr + b, num.to(tl.int64))


def ngram_match_batch_triton(tokens: torch.Tensor, lengths: torch.Tensor, n_min: int, n_max: int,
                             k: int, *, BLOCK_L: int | None = None, num_warps: int | None = None,
                             num_stages: int | None = None):
    """Triton version of ngram_match_batch_reference; same arguments, same results."""
    _check(tokens, lengths, n_min, n_max, k)
    tiling = resolve_tiling("ngram_match_batch", TILING_SPACE, DEFAULT_TILING,
                            dict(BLOCK_L=BLOCK_L, num_warps=num_warps, num_stages=num_stages))
    B, L = tokens.shape
    tokens = row_major(tokens)
    proposals = torch.full((B, k), -1, dtype=torch.int64, device=tokens.device)
    num = torch.zeros(B, dtype=torch.int64, device=tokens.device)
    if B and L and k:
        with launch_context(_ngram_match_kernel, tokens):
            _ngram_match_kernel[(B,)](
                tokens, lengths, proposals, num, L, n_min, k, tokens.stride(0), proposals.stride(0),
                N_MAX=n_max, BLOCK_K=triton.next_power_of_2(k), enable_fp_fusion=False, **tiling)
    return proposals, num


def ngram_match_batch(tokens: torch.Tensor, lengths: torch.Tensor, n_min: int, n_max: int, k: int,
                      *, BLOCK_L: int | None = None, num_warps: int | None = None,
                      num_stages: int | None = None):
    """Prompt lookup for a batch: (proposals (B, k) padded with -1, num (B,)). Triton on CUDA."""
    use_triton = choose_backend(tokens) == "triton"
    impl = ngram_match_batch_triton if use_triton else ngram_match_batch_reference
    return impl(tokens, lengths, n_min, n_max, k,
                BLOCK_L=BLOCK_L, num_warps=num_warps, num_stages=num_stages)
