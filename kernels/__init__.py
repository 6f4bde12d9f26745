"""Triton kernels for the hot loop, each with a pure-torch reference of the same signature.

The wrappers run Triton on CUDA tensors and the reference elsewhere (AUTOSPEC_KERNELS forces
one). TILING_SPACES is what `autospec tune` searches where a GPU is present.
"""
from autospec.kernels.ngram import ngram_match_batch, ngram_match_batch_reference, ngram_match_batch_triton
from autospec.kernels.ngram import TILING_SPACE as _NGRAM_SPACE
from autospec.kernels.verify import (GREEDY_TILING_SPACE, REJECTION_TILING_SPACE, greedy_verify,
                                     greedy_verify_reference, greedy_verify_triton, rejection_verify,
                                     rejection_verify_reference, rejection_verify_triton)

TILING_SPACES = {
    "greedy_verify": GREEDY_TILING_SPACE,
    "rejection_verify": REJECTION_TILING_SPACE,
    "ngram_match_batch": _NGRAM_SPACE,
}

__all__ = [
    "TILING_SPACES", "greedy_verify", "greedy_verify_reference", "greedy_verify_triton",
    "rejection_verify", "rejection_verify_reference", "rejection_verify_triton",
    "ngram_match_batch", "ngram_match_batch_reference", "ngram_match_batch_triton",
]
