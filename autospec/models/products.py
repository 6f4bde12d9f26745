"""The products of a decode-time forward (models/forward.py): a product by one or more bias-free
Linear modules, their weights stacked (a layer's Q, K and V in one product, its gate and up in
one). F.linear's BLAS call for a few rows reads a weight at a third to a half of the speed it
reads it for one (SmolLM2's head: 13 GB/s at one token, 3.5-5.5 at 2-9); by a large weight
(`MIN_PACKED`; for one token `MIN_PACKED_ONE`) a product runs oneDNN over the weight reordered
once into a blocked layout (`_Weights`: 15-22 GB/s at 1-3 tokens, 13-16 at 5-9; a copy of those
weights, made on first use and again when a weight changes — SmolLM2 in float32: ~0.5 GB
more). At int4 the products of up to `quantized.widest(bits)` rows by the 4-bit blocks and by
an 8-bit head (models/weights.py) run the 4- and 8-bit kernels (models/quantized.py)."""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from autospec.models import quantized
from autospec.models.weights import blocks_of, int8_of, stack_blocks


class Product:
    """A product by one or more bias-free modules, their outputs side by side
    (torch.cat([m(x) for m in modules], -1)): a layer's Q, K and V, its gate and up, in one
    product by their weights stacked (`_Weights`). By a weight of at least MIN_PACKED elements
    (MIN_PACKED_ONE for one token), on a CPU in float32 without autograd, by oneDNN over a copy
    of the weight reordered once into its blocked layout; elsewhere F.linear."""

    def __init__(self, *modules: nn.Linear):
        self.modules = modules
        self.weights = _weights(modules)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        modules, weights = self.modules, self.weights
        if torch.is_grad_enabled() and any(m.weight.requires_grad for m in modules):
            return torch.cat([F.linear(x, m.weight) for m in modules], -1)  # gradients reach each
        flat = x.reshape(-1, x.shape[-1])
        forms = self.quantized(x.dtype, flat.shape[0])
        if forms is not None:
            out = quantized.mm(flat.contiguous(), forms)
            return out.view(*x.shape[:-1], out.shape[-1])
        floor = MIN_PACKED if x.numel() > x.shape[-1] else MIN_PACKED_ONE
        if not (weights.packs and weights.size >= floor and x.dtype == weights.dtype):
            return F.linear(x, weights.plain(modules))
        out = torch.ops.mkldnn._linear_pointwise(flat.contiguous(), weights.packed(modules), None,
                                                 "none", [], "")
        return out.view(*x.shape[:-1], out.shape[-1])

    def quantized(self, dtype: torch.dtype, rows: int) -> tuple[torch.Tensor, ...] | None:
        """The weight in a quantized kernel's forms where a product of `rows` rows of `dtype` runs
        that kernel (an 8-bit head, or 4-bit blocks, at bfloat16, up to `quantized.widest`
        rows); None where it does not."""
        weights = self.weights
        if dtype != torch.bfloat16:
            return None
        if weights.int8 is not None:
            return weights.int8_packed() if rows <= quantized.widest(8) else None
        if weights.int4:
            return weights.int4_packed(self.modules) if rows <= quantized.widest(4) else None
        return None


class _Weights:
    """One product's weight, the modules' stacked: made when first read, again when a module's
    weight changed (its address or version). Only the forms read are kept: a stacked plain
    copy where F.linear reads it (weights under the oneDNN floors: small), the oneDNN copy where
    oneDNN does; a single module's plain weight is its own."""

    def __init__(self, modules: tuple[nn.Linear, ...]):
        self.key = _key(modules)
        self.size = sum(m.weight.numel() for m in modules)
        weight = modules[0].weight
        self.dtype = weight.dtype
        self.packs = PACKS and weight.dtype in PACKED_DTYPES and weight.device.type == "cpu"
        # int4 where every module carries blocks (models/weights.py): the kernel's forms
        self.int4 = all(blocks_of(m) is not None for m in modules) and weight.device.type == "cpu"
        # an 8-bit head (models/weights.py): its values and row scales, for one row
        self.int8 = int8_of(modules[0]) if len(modules) == 1 and weight.device.type == "cpu" else None
        self._plain: torch.Tensor | None = None
        self._packed: torch.Tensor | None = None
        self._int4: tuple[torch.Tensor, ...] | None = None
        self._int8_forms: tuple[torch.Tensor, ...] | None = None

    def plain(self, modules: tuple[nn.Linear, ...]) -> torch.Tensor:
        if self._plain is None:
            self._plain = _stack(modules)
        return self._plain

    def packed(self, modules: tuple[nn.Linear, ...]) -> torch.Tensor:
        if self._packed is None:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(_stack(modules), PACK_HINT)
        return self._packed

    def int4_packed(self, modules: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
        """The stacked modules' blocks (their outputs side by side, as stacking along N
        gives) in the int4 kernel's forms (models/quantized.py `int4_forms`)."""
        if self._int4 is None:  # packed once stacked: the packing interleaves blocks of rows
            self._int4 = quantized.int4_forms(stack_blocks([blocks_of(m) for m in modules]))
        return self._int4

    def int8_packed(self) -> tuple[torch.Tensor, ...]:
        """An 8-bit head's values and scales in the int8 kernel's forms (`int8_forms`)."""
        if self._int8_forms is None:
            self._int8_forms = quantized.int8_forms(*self.int8)
        return self._int8_forms


def _key(modules: tuple[nn.Linear, ...]) -> tuple:
    return tuple((m.weight.data_ptr(), m.weight._version) for m in modules)


def _stack(modules: tuple[nn.Linear, ...]) -> torch.Tensor:
    with torch.no_grad():
        weights = [m.weight.detach() for m in modules]
        return weights[0] if len(weights) == 1 else torch.cat(weights)


def _weights(modules: tuple[nn.Linear, ...]) -> _Weights:
    """The product's `_Weights`, kept by its first module and the number stacked."""
    kept = _PRODUCTS.get(modules[0])
    if kept is None:
        kept = _PRODUCTS[modules[0]] = {}
    weights = kept.get(len(modules))
    if weights is None or weights.key != _key(modules):
        weights = kept[len(modules)] = _Weights(modules)
    return weights


# first module -> {modules stacked: _Weights}; beside the modules, not on them: an opaque
# oneDNN tensor cannot be deep-copied, saved or moved as a module's own tensors are
_PRODUCTS: "weakref.WeakKeyDictionary[nn.Module, dict[int, _Weights]]" = weakref.WeakKeyDictionary()


# oneDNN's reorder takes the batch it is laid out for; 2-32 read SmolLM2's and the reference
# pair's weights alike (within the spread) from 1 to 33 tokens, 1 at half that speed from 2
# tokens up (GB/s of weight read, SmolLM2's MLP and head shapes, each hint against the others)
PACK_HINT = 4
# weights of fewer elements stay with F.linear: a oneDNN call costs ~30 us whatever its size
# (a 16 x 16 weight at 3 tokens 32 against 4.4 us; 320 x 320, the reference pair's attention,
# 62 against 55), which a larger weight's faster read repays (864 x 320: 61 against 123 us)
MIN_PACKED = 1 << 18
# one token (a plain step at batch 1) by oneDNN only from weights of this many elements:
# SmolLM2's MLP and head (0.9M, 28M), the reference pair's head (1.3M), not its MLP (0.28M).
# A one-row forward at one token, medians of 8 rounds of 10 (ms, F.linear for one token /
# oneDNN from 2^18 / from 2^19 elements): SmolLM2 76.6 / 69.6 / 69.0, the reference pair
# 10.9 / 11.3 / 10.5 (oneDNN's reads: SmolLM2's head 19-22 GB/s against F.linear's 11)
MIN_PACKED_ONE = 1 << 19
PACKS = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
# the weights oneDNN's prepacked products take: float32, and bfloat16 (--weights bfloat16,
# and an int4 model's head): SmolLM2's 121 products at one row 13.8 ms against 28.6 in
# float32 and 22.8 by F.linear in bfloat16, quiet machine, 2 threads
PACKED_DTYPES = (torch.float32, torch.bfloat16)
