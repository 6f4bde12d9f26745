"""Triton kernels for the hot loop, each with a pure-torch reference of the same signature.

The wrappers run Triton on CUDA tensors and the reference elsewhere (AUTOSPEC_KERNELS forces
one). A call may pass launch knobs (BLOCK_V, num_warps, num_stages); unset ones take the
kernel's defaults.
"""
from autospec.kernels.verify import greedy_verify, greedy_verify_reference, greedy_verify_triton

__all__ = ["greedy_verify", "greedy_verify_reference", "greedy_verify_triton"]
