"""Weight formats: what a decode step reads per token — float32, bfloat16 or int4.

Decoding is memory-bound: every token reads every weight, so the bytes a weight takes are
its speed. Three formats, the same for the target and every drafter of a pair:

- `float32`: the checkpoint as stored; 4 bytes a weight.
- `bfloat16`: the whole model (weights, KV cache, activations) in bfloat16; norms and
  softmax accumulate in float32 (models/forward.py). 2 bytes a weight.
- `int4`: the decoder layers' products read 4-bit values in blocks of 32 with a scale and an
  offset per block (`Int4Blocks`), computed by torch's int4 kernel with bfloat16 activations;
  the head 8-bit values with a scale per row (`_head_int8`, torch's 8-bit kernel at one row);
  everything else (embedding, norms, cache) as in `bfloat16`. A GGUF pair's int4 is the
  GGUF's own blocks (Q4_1 / Q4_0, read by models/gguf.py), kept beside the checkpoint at fetch
  (`BLOCKS_FILE`); any other model's layers are quantized at load by Q4_1's rule (per block:
  offset = min, scale = (max - min) / 15). The head is not 4-bit: SmolLM2's GGUF ships it as 8-bit
  (Q8_0, a scale per 32), which 4 bits would coarsen; torch's 8-bit kernel takes one scale
  per row, which costs nothing measurable.

The int4 kernel computes `(q - 8) * scale + zero` per block, with scale and zero in the
activations' dtype: Q4_1's `d * q + m` is `scale = d, zero = m + 8 d`, Q4_0's `d * (q - 8)`
is `zero = 0`. Its rows do not interact (a row's output is the same bits at 1, 3 or 16
rows), nor do oneDNN's bfloat16 products' — what keeps speculative output identical to plain
at these formats.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from autospec.models import AUTO, BLOCKS_FILE, FORMATS
from autospec.models.shared_draft import SubsetHead

GROUP = 32  # weights per block: Q4_0's and Q4_1's, and the int4 kernel's group size


class FormatError(ValueError):
    """An unknown weight format, or one a model cannot take."""


def check(name: str) -> str:
    if name not in FORMATS and name != AUTO:
        raise FormatError(f"unknown weight format '{name}' (accepted: {AUTO}, "
                          f"{', '.join(FORMATS)})")
    return name


def resolve(name: str, target: str | Path) -> str:
    """`name`, or for `auto` the target's own format: int4 where a GGUF's blocks were kept
    beside it at fetch (SmolLM2: its published model, whose measured cost against the float32
    copy is negligible, docs/weights.md), else float32 (the checkpoint as stored)."""
    if check(name) != AUTO:
        return name
    return "int4" if (Path(target) / BLOCKS_FILE).is_file() else "float32"


def compute_dtype(name: str) -> torch.dtype:
    """The dtype of a model's activations, cache and unquantized weights at format `name`."""
    return torch.float32 if check(name) == "float32" else torch.bfloat16


@dataclass(frozen=True)
class Int4Blocks:
    """One weight (N, K) as 4-bit values in blocks of GROUP along K:
    weight[n, k] = (q[n, k] - 8) * scale[n, k // GROUP] + zero[n, k // GROUP]."""

    q: torch.Tensor  # (N, K) uint8, each 0..15
    scale: torch.Tensor  # (N, K / GROUP) float32
    zero: torch.Tensor  # (N, K / GROUP) float32

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        n, k = self.q.shape
        q = self.q.view(n, k // GROUP, GROUP).to(torch.float32) - 8
        return (q * self.scale[..., None] + self.zero[..., None]).view(n, k).to(dtype)

    def packed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernel's forms: the values packed (N, K / 2) uint8, and scales and zeros
        (K / GROUP, N, 2) in bfloat16 (the activations' dtype)."""
        values = torch.ops.aten._convert_weight_to_int4pack_for_cpu(self.q.to(torch.int32), 1)
        scales = torch.stack([self.scale, self.zero], -1).transpose(0, 1)
        return values, scales.to(torch.bfloat16).contiguous()


def stack_blocks(blocks: list[Int4Blocks]) -> Int4Blocks:
    """Weights stacked along N (their outputs side by side)."""
    if len(blocks) == 1:
        return blocks[0]
    return Int4Blocks(*(torch.cat([getattr(b, f) for b in blocks]) for f in ("q", "scale", "zero")))


def quantize(weight: torch.Tensor) -> Int4Blocks:
    """Q4_1's rule per block of GROUP: offset the block's minimum, 15 steps to its maximum."""
    n, k = weight.shape
    blocks = weight.detach().to(torch.float32).reshape(n, k // GROUP, GROUP)
    low, high = blocks.amin(-1), blocks.amax(-1)
    d = (high - low) / 15
    step = torch.where(d > 0, d, torch.ones_like(d))
    q = torch.round((blocks - low[..., None]) / step[..., None]).clamp_(0, 15)
    return Int4Blocks(q.to(torch.uint8).reshape(n, k), d, low + 8 * d)


def quantizable(module: nn.Module) -> bool:
    return (type(module) is nn.Linear and module.bias is None
            and module.in_features % GROUP == 0 and module.out_features % 16 == 0)


def blocks_of(module: nn.Module) -> Int4Blocks | None:
    return module.__dict__.get("_autospec_int4")


# --- a model at a format ----------------------------------------------------------------------

def apply(model: nn.Module, name: str, blocks: dict[str, Int4Blocks] | None = None,
          skip: tuple[str, ...] = ("lm_head",)) -> nn.Module:
    """`model` (float32) at format `name`, in place. For int4 every quantizable Linear outside
    `skip` takes its blocks from `blocks` (by module name) or is quantized here; its weight
    becomes the blocks' values in bfloat16 (the function every other path computes too)."""
    check(name)
    if name == "int4":
        _check_kernel()
        given = blocks or {}
        chosen = {}
        for module_name, module in model.named_modules():
            if any(part in skip for part in module_name.split(".")) or not quantizable(module):
                continue
            if blocks_of(module) is not None:
                continue  # borrowed from a model already at this format (a shared draft's layers)
            chosen[module_name] = given.get(module_name) or quantize(module.weight)
    model.to(compute_dtype(name))
    if name == "int4":
        modules = dict(model.named_modules())
        for module_name, found in chosen.items():
            module = modules[module_name]
            module.__dict__["_autospec_int4"] = found
            with torch.no_grad():
                module.weight.data = found.dequantize(torch.bfloat16)
        head = getattr(model, "lm_head", None)
        if _head_quantizable(head) and int8_of(head) is None:
            _head_int8(head)
    model.__dict__["_autospec_weights"] = name
    return model


def _head_quantizable(head: nn.Module | None) -> bool:
    """A head `_head_int8` takes: a quantizable Linear, or a subset head (a shared draft's or
    feature head's rows of the target's head, models/shared_draft.py SubsetHead: its rows'
    8-bit values and scales are the target head's own, each row quantized alone). A feature
    head's 8,192 rows in 8 bits: 0.11 against 0.28 ms a drafted token's scores, SmolLM2."""
    if quantizable(head):
        return True
    weight = getattr(head, "weight", None)
    return (isinstance(head, SubsetHead) and isinstance(weight, torch.Tensor)
            and weight.dim() == 2 and weight.shape[1] % GROUP == 0 and weight.shape[0] % 16 == 0)


def _head_int8(head: nn.Module) -> None:
    """The head in 8 bits, one scale a row (torch's 8-bit kernel's form): its weight becomes
    their values in bfloat16, its own tensor (a head tied to the embedding is untied: the
    embedding keeps its values). SmolLM2's GGUF holds its head as Q8_0 (a scale per 32); a
    scale per row costs its held-out log-likelihood 0.0013 against float32 (docs/weights.md)."""
    weight = head.weight.detach().float()
    scale = (weight.abs().amax(1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    values = torch.round(weight / scale[:, None]).clamp(-127, 127)
    head.__dict__["_autospec_int8"] = (values.to(torch.int8).contiguous(), scale.to(torch.bfloat16))
    head.weight = nn.Parameter((values * scale[:, None]).to(torch.bfloat16), requires_grad=False)


def int8_of(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """An 8-bit head's (values (N, K) int8, scales (N,) bfloat16), or None."""
    return module.__dict__.get("_autospec_int8") if module is not None else None


def format_of(model: nn.Module) -> str:
    return model.__dict__.get("_autospec_weights", "float32")


def stored_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights as its format stores them (int4: half a byte a value plus
    two 2-byte numbers a block; its head a byte a value and a scale a row), each tensor once:
    what a step of one row that uses them all reads."""
    total, seen = 0, set()
    for module in model.modules():
        found, head = blocks_of(module), int8_of(module)
        if found is not None:
            seen.add(module.weight.data_ptr())
            total += found.q.numel() // 2 + 2 * 2 * found.scale.numel()
        elif head is not None:  # a step of one row reads the 8-bit values and a scale a row
            seen.add(module.weight.data_ptr())
            total += head[0].numel() + 2 * head[1].numel()
    for param in model.parameters():
        if param.data_ptr() not in seen:
            seen.add(param.data_ptr())
            total += param.numel() * param.element_size()
    return total


_KERNEL_CHECKED: list[bool] = []


def _check_kernel() -> None:
    """int4 needs torch's CPU int4 kernel; refuse with the reason where it is missing."""
    if not _KERNEL_CHECKED:
        try:
            blocks = quantize(torch.randn(16, GROUP))
            values, scales = blocks.packed()
            torch.ops.aten._weight_int4pack_mm_for_cpu(torch.ones(1, GROUP, dtype=torch.bfloat16),
                                                        values, GROUP, scales)
            _KERNEL_CHECKED.append(True)
        except (RuntimeError, AttributeError) as exc:
            raise FormatError(f"int4 needs torch's CPU int4 kernel, which this torch lacks "
                              f"({exc}); run --weights bfloat16 instead") from None


def warn_if_slow(name: str) -> str | None:
    """A line saying that `name` runs slowly on this CPU and what to run instead, or None."""
    if name == "float32":
        return None
    flags = cpu_flags()
    if flags and not ({"avx512_bf16", "amx_bf16"} & flags):
        return (f"--weights {name}: this CPU has neither avx512_bf16 nor AMX, so bfloat16 "
                f"products are emulated and slow; --weights float32 runs faster here")
    return None


def cpu_flags() -> set[str]:
    """This CPU's flags (/proc/cpuinfo), empty where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def save_blocks(blocks: dict[str, Int4Blocks], path: Path) -> None:
    """Two values a byte (low nibble first), scales and zeros in float32."""
    from safetensors.torch import save_file
    state = {}
    for name, b in blocks.items():
        q = b.q.view(b.q.shape[0], -1, 2)
        state[f"{name}.q"] = (q[..., 0] | (q[..., 1] << 4)).contiguous()
        state[f"{name}.scale"], state[f"{name}.zero"] = b.scale.contiguous(), b.zero.contiguous()
    save_file(state, str(path))


def load_blocks(path: Path) -> dict[str, Int4Blocks]:
    from safetensors.torch import load_file
    state = load_file(str(path))
    out = {}
    for key in state:
        if key.endswith(".q"):
            name = key[:-2]
            packed = state[key]
            q = torch.stack([packed & 0x0F, packed >> 4], -1).reshape(packed.shape[0], -1)
            out[name] = Int4Blocks(q, state[f"{name}.scale"], state[f"{name}.zero"])
    return out


def check_blocks(blocks: dict[str, Int4Blocks], model: nn.Module) -> float:
    """The largest difference between the blocks' values and the model's float32 weights
    (a GGUF pair's checkpoint is those blocks de-quantized: ~1e-6 where they agree)."""
    modules = dict(model.named_modules())
    worst = 0.0
    for name, b in blocks.items():
        module = modules.get(name)
        if module is None or tuple(module.weight.shape) != tuple(b.q.shape):
            raise FormatError(f"block tensor {name} {tuple(b.q.shape)} matches no weight of the "
                              f"model")
        worst = max(worst, (b.dequantize() - module.weight.float()).abs().max().item())
    return worst
