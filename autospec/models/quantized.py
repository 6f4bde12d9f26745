"""Products of a few rows by 4-bit and 8-bit weights: autospec's own CPU kernels
(quantized.cpp), built once.

torch's kernels read a quantized weight well below the copy peak once it streams from memory
(a forward's weights do: each is read once a step), and their time grows with the rows: the int4
one reads a weight once per four rows, so a verify of K + 1 tokens cost far more than a
one-token step; the 8-bit head read at half the peak. quantized.cpp streams each weight once for
up to eight rows, prefetching ahead, its inner loop a fused multiply-add per row over the
weight's values in float32, a 4-bit block's scale and zero (an 8-bit row's scale) applied once
(its header says how). From 3 rows, on a CPU with AMX, a 4-bit weight's values go through the
tile unit instead: their conversion is per weight, not per row (two bit operations a row of
the tile's operand: `pack4`'s layout), and the vector work and the tile products overlap, so 15
rows cost little more than 3; from 16, each block's values are dequantized once for up to 64
rows, so the tile products add up over the whole weight. Weights streamed from memory, 2
threads, ms (torch's / these):
- SmolLM2's 30 layers' products at int4: 1 row 3.8 / 2.5-2.7, 3 rows 5.7 / AMX 3.45-3.55, 5
  rows 11.6 / AMX 3.7-3.9, 8 rows 12.5 / AMX 4.7, 16 rows (oneDNN in bfloat16) 13.1 / AMX 5.8, 17
  rows (oneDNN) 14.0 / AMX 5.4, 32 rows 14.7 / AMX 6.8;
- its 8-bit head: 1 row 2.4 / 1.1, 3 rows 2.8 / 1.0, 5 rows 4.5 (oneDNN in bfloat16 2.4) / 1.4
  (AMX 1.0), 16 rows (oneDNN) 2.8 / AMX 1.4.

The kernels are C++ for AVX-512, built by torch's own extension builder the first time a process
needs them (~6-15 s, a line on stderr) into AUTOSPEC_CACHE, and loaded from there by later
starts. They register `torch.ops.autospec.int4_mm` and `int8_mm`, which the eager forward
(products.py) calls, and the compiled one (compiled.py) through their C entry points
(`C_SHIMS`). Where they cannot be built (no C++ compiler, a CPU without AVX-512) one warning
line names why, and every product runs torch's kernels over torch's forms, as before: `int4_forms`
and `int8_forms` give whichever forms the process runs, `mm` takes any, `widest` says how many
rows they pay for.

Lossless: a row's output is the same bits at any row count on one path (each row's arithmetic
is its own; the 4-bit kernel's paths are, on AMX, 1-2 rows, 3-15 and 16-64), and it is the
weight's product within bfloat16's rounding, as torch's kernels' are
(tests/models/test_quantized.py).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import sys
import time
from pathlib import Path

import torch

from autospec import paths
from autospec.models.weights import GROUP, Int4Blocks, cpu_flags

log = logging.getLogger("autospec.quantized")

TILE = 16  # outputs a tile: one AVX-512 register of float32
BLOCK_BYTES = GROUP // 2 * TILE + 2 * TILE * 2  # a tile's 32 inputs: values, scales, zeros
_SOURCE = Path(__file__).with_name("quantized.cpp")
_ATTENTION = Path(__file__).with_name("attention.cpp")  # built into the same library
_FLAGS = ("avx512f", "avx512bw", "avx512dq", "avx512vl")
_STATE: dict[str, object] = {}  # "ok": True / False once tried; "why": the reason it is off


def available() -> bool:
    """Whether this process runs quantized.cpp (built or loaded now if not yet tried): False,
    with one warning naming why, where it cannot be built or loaded."""
    if "ok" not in _STATE:
        try:
            _load()
            _STATE["ok"] = True
        except Exception as exc:  # noqa: BLE001 - whatever stops it, torch's kernel runs
            text = str(exc).strip().splitlines()
            _STATE["why"] = f"{type(exc).__name__}: {text[-1] if text else ''}"[:200]
            _STATE["ok"] = False
            log.warning("autospec's int4, 8-bit and attention kernels are off (%s): torch's "
                        "run instead",
                        _STATE["why"])
    return bool(_STATE["ok"])


# the most rows a product runs by these kernels: from one more, oneDNN over the weight's values
# in bfloat16 (products.py) is faster. Weights streamed, 2 threads, ms (this kernel / oneDNN):
# SmolLM2's 30 layers at int4 5 rows 6.5 / 12.3, 8 9.2 / 12.7, 9 11.4 / 12.2, 12 13.7 / 12.5; on
# AMX 16 rows 5.6 / 13.1, 17 5.4 / 14.0, 32 6.8 / 14.7, 64 9.6 / 17.0 (from 16 rows each block
# dequantized once for up to 64 rows: one pass, no step in the cost at 17 rows, where two
# passes of 16 took 12.8) — so a verify at the default k_max stays compiled, and a batch's step
# costs about its tokens up to 64; its 8-bit head 8 rows 2.0 / 2.4 (over 8 rows a tile is read
# again: 9 rows ~3.1), on AMX 16 rows 1.4-1.5 / 2.8, 64 2.3-2.5
WIDEST = {4: 11, 8: 8}
AMX_WIDEST = 64
# the rows from which quantized.cpp's AMX paths run a 4-bit weight (its AMX_FROM, WIDE_FROM): a
# row's bits are the same at any row count within each path (1-2, 3-15, 16-64)
AMX_FROM, AMX_WIDE_FROM = 3, 16
# torch's: the int4 kernel reads a weight once per 4 rows; the 8-bit one is slower than oneDNN
# in bfloat16 from 2 rows (SmolLM2's head, ms, 8-bit / oneDNN: 1 row 2.1 / 4.9, 3 rows 3.9 / 4.7)
TORCH_WIDEST = {4: 4, 8: 1}


def amx() -> bool:
    """Whether this process runs the kernels' AMX paths (the CPU has AMX, Linux granted its
    tile registers): the wide products and autospec::rows_attention (models/attention.py)."""
    return available() and bool(_STATE["amx"])


@functools.cache  # read by every quantized product: the process's kernels do not change
def widest(bits: int) -> int:
    """The most rows this process's kernel for `bits`-bit weights takes (WIDEST; on AMX
    AMX_WIDEST; torch's TORCH_WIDEST)."""
    if not available():
        return TORCH_WIDEST[bits]
    return AMX_WIDEST if _STATE["amx"] else WIDEST[bits]


def int4_forms(blocks: Int4Blocks) -> tuple[torch.Tensor, ...]:
    """A 4-bit weight as this process's kernel reads it: quantized.cpp's tiles (one uint8
    tensor, `pack4`), else torch's packed values and scales (two)."""
    return (pack4(blocks),) if available() else blocks.packed()


def int8_forms(values: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """An 8-bit weight (values (N, K) int8, a bfloat16 scale a row) as this process's kernel
    reads it: quantized.cpp's tiles (one int8 tensor, `pack8`; N a multiple of 16, K of 32),
    else the two as they are."""
    n, k = values.shape
    if n % TILE or k % GROUP or not available():
        return values, scales
    return (pack8(values, scales),)


# the ops' C entry points in quantized.cpp, for AOTInductor (torch._inductor.config.aot_inductor.
# custom_ops_to_c_shims): a compiled library calls them directly, not through the dispatcher
C_SHIMS = {op: [f"AOTITorchError aoti_torch_cpu_{op}(AtenTensorHandle x, AtenTensorHandle tiles, "
                f"int64_t n, AtenTensorHandle* out)"] for op in ("int4_mm", "int8_mm")}
C_SHIMS["rows_attention"] = [  # attention.cpp's
    "AOTITorchError aoti_torch_cpu_rows_attention(AtenTensorHandle q, AtenTensorHandle k, "
    "AtenTensorHandle v, AtenTensorHandle seen, double scale, AtenTensorHandle* out)"]


def rows_argmax(x: torch.Tensor) -> torch.Tensor:
    """Each row's argmax of x (n, V): (n,) int64, the first maximal value's index (a NaN the
    largest), as torch's argmax(-1). bfloat16 by quantized.cpp's rows_argmax (SmolLM2's
    49,152 logits: ~5 us a row against 42 by max's indices and 175 by argmax), elsewhere by
    max's indices (the same index by torch's contract)."""
    if x.dtype == torch.bfloat16 and x.dim() == 2 and x.device.type == "cpu" and available():
        return torch.ops.autospec.rows_argmax(x)
    return x.max(-1).indices


def mm(x: torch.Tensor, weight: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """x (M, K) bfloat16 by a weight in any of `int4_forms`' and `int8_forms`' forms: (M, N)
    bfloat16."""
    first = weight[0]
    if len(weight) == 1:
        ops = torch.ops.autospec
        return (ops.int4_mm if first.dtype == torch.uint8 else ops.int8_mm)(
            x, first, first.shape[0] * TILE)
    if first.dtype == torch.int8:
        return torch._weight_int8pack_mm(x, first, weight[1])
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, first, GROUP, weight[1])


def shape(weight: tuple[torch.Tensor, ...]) -> tuple[int, int]:
    """(outputs, inputs) of a weight in `int4_forms`' or `int8_forms`' forms."""
    first = weight[0]
    if len(weight) == 2:  # torch's: 4-bit values two a byte, 8-bit one
        return first.shape[0], first.shape[1] * (2 if first.dtype == torch.uint8 else 1)
    if first.dtype == torch.uint8:
        return first.shape[0] * TILE, first.shape[1] // BLOCK_BYTES * GROUP
    return first.shape[0] * TILE, (first.shape[1] - 2 * TILE) // TILE


def pack4(blocks: Int4Blocks) -> torch.Tensor:
    """quantized.cpp's 4-bit layout (its header): (N / 16, K / 32 x 320) uint8, per tile of 16
    outputs its blocks in order, each the values of 16 pairs of inputs (low nibble the even input)
    then the tile's scales and zeros in bfloat16."""
    q = blocks.q
    n, k = q.shape
    tiles, per_tile = n // TILE, k // GROUP
    # (tile, output j, block, half h, chunk c, i): input 16 h + 2 c + i; a byte (chunk c, 2 j + i)
    # holds half 0's value in its low nibble, half 1's in its high one
    halves = q.view(tiles, TILE, per_tile, 2, GROUP // 4, 2)
    values = (halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)).permute(0, 2, 3, 1, 4)
    values = values.reshape(tiles, per_tile, -1)

    def numbers(t: torch.Tensor) -> torch.Tensor:
        t = t.to(torch.bfloat16).view(tiles, TILE, per_tile).permute(0, 2, 1).contiguous()
        return t.view(torch.uint8).reshape(tiles, per_tile, -1)

    return torch.cat([values, numbers(blocks.scale), numbers(blocks.zero)], -1).reshape(tiles, -1)


def pack8(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """An 8-bit weight (values (N, K) int8, scales (N,) bfloat16) in quantized.cpp's tiles:
    (N / 16, K x 16 + 32) int8, per tile of 16 outputs its values input by input, then its
    scales."""
    n, k = values.shape
    tiles = values.view(n // TILE, TILE, k).transpose(1, 2).reshape(n // TILE, -1)
    return torch.cat([tiles, scales.view(n // TILE, TILE).view(torch.int8)], -1).contiguous()


def _load() -> None:
    """Build quantized.cpp into AUTOSPEC_CACHE where it is not built yet, and load it
    (registering torch.ops.autospec.int4_mm and int8_mm, and their shapes for export)."""
    flags = cpu_flags()
    missing = [f for f in _FLAGS if f not in flags]
    if missing:
        raise RuntimeError(f"this CPU lacks {', '.join(missing)}")
    from torch.utils import cpp_extension
    sources = [_SOURCE, _ATTENTION]
    key = hashlib.sha256(repr((torch.__version__, *(f.read_bytes() for f in sources))).encode()
                         ).hexdigest()[:16]
    name = f"autospec_quantized_{key}"
    where = paths.compile_cache_dir() / "quantized" / key
    where.mkdir(parents=True, exist_ok=True)
    built = (where / f"{name}.so").is_file()
    if not built:
        print(f"building autospec's int4, 8-bit and attention kernels (once; kept in {where}) ...",
              file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    cpp_extension.load(name=name, sources=[str(f) for f in sources], build_directory=str(where),
                       extra_cflags=["-O3", "-fopenmp", *(f"-m{f}" for f in _FLAGS)],
                       is_python_module=False, verbose=False)
    # its C entry points visible to the libraries AOTInductor compiles (`C_SHIMS`)
    library = ctypes.CDLL(str(where / f"{name}.so"), mode=os.RTLD_GLOBAL)
    # AMX where the CPU has it and Linux grants this process its tile registers
    _STATE["amx"] = {"amx_tile", "amx_bf16"} <= flags and torch._C._cpu._init_amx()
    library.autospec_use_amx(int(_STATE["amx"]))
    if not built:
        print(f"built in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    for op in ("int4_mm", "int8_mm"):
        torch.library.register_fake(f"autospec::{op}")(
            lambda x, tiles, n: x.new_empty((x.shape[0], n)))
    torch.library.register_fake("autospec::rows_attention")(
        lambda q, k, v, seen, scale: q.new_empty((q.shape[0], q.shape[2], q.shape[1], q.shape[3])))
