"""Which implementation a kernel wrapper runs, and the checks every Triton launch shares.

Triton on CUDA tensors, the pure-torch reference everywhere else. `AUTOSPEC_KERNELS=triton`
or `=reference` forces one. Triton on CPU tensors only works under `TRITON_INTERPRET=1`, which
triton reads when a function is *decorated* — its own tl.sum / tl.max / tl.cumsum included — so
it must be set before triton is first imported, not merely before autospec.kernels.
"""
from __future__ import annotations

import contextlib
import os

import torch
from triton.runtime.interpreter import InterpretedFunction

BACKENDS = ("reference", "triton")


def choose_backend(tensor: torch.Tensor) -> str:
    """'triton' or 'reference' for an op whose inputs live where `tensor` lives."""
    forced = os.environ.get("AUTOSPEC_KERNELS", "").strip().lower()
    if forced in ("", "auto"):
        return "triton" if tensor.is_cuda else "reference"
    if forced not in BACKENDS:
        raise ValueError(f"unknown AUTOSPEC_KERNELS={forced!r} (known: auto, {', '.join(BACKENDS)})")
    return forced


def resolve_tiling(op: str, default: dict[str, int],
                   given: dict[str, int | None]) -> dict[str, int]:
    """Fill unset tiling knobs from `default` (which names every knob the op takes); block
    sizes must be powers of two (tl.arange)."""
    for name in given:
        if name not in default:
            raise ValueError(f"{op}: unknown tiling knob {name!r} (known: {', '.join(default)})")
    tiling = {name: default[name] if value is None else int(value) for name, value in given.items()}
    for name, value in tiling.items():
        if value < 1 or (name.startswith("BLOCK_") and value & (value - 1)):
            raise ValueError(f"{op}: {name}={value} must be a positive power of two "
                             f"(default {default[name]})")
    return tiling


def launch_context(kernel, tensor: torch.Tensor):
    """The device context a Triton launch needs; a clear error where it cannot run at all."""
    if tensor.is_cuda:
        # triton launches on the *current* device: make it the tensor's (matters on multi-GPU hosts)
        return torch.cuda.device(tensor.device)
    if not isinstance(kernel, InterpretedFunction):
        raise RuntimeError(f"Triton kernel on a {tensor.device} tensor needs TRITON_INTERPRET=1 set "
                           "before triton is imported (or AUTOSPEC_KERNELS=reference)")
    return contextlib.nullcontext()


def row_major(tensor: torch.Tensor) -> torch.Tensor:
    """Kernels index the last dim with unit stride; copy only when that does not hold."""
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()
