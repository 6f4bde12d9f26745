"""The one-row decode-time forward, compiled ahead of time: a plain step and a verify in C++.

A one-token step of SmolLM2 at int4 spent more than half its time neither reading weights nor
attending: ~300 small ops a step (norms, rotary, cache writes, views), each dispatched from
Python. `one_row_layer` is llama_forward's decoder layer for one row (models/forward.py: the
same arithmetic, its cache write and grouped_attention inlined) as a pure function of tensors;
torch.export traces it once and AOTInductor compiles it into a shared library (the small ops
fused into a few C++ loops, the products called from it), kept on disk (`package_path`, under
AUTOSPEC_CACHE) and loaded by later starts in milliseconds. The library is one layer, its
weights and cache inputs, called once per layer: a call costs a few microseconds, and a
library of one layer compiles in a fifth of the time of SmolLM2's thirty (12 against 55-75 s
a bucket on a busy 2-core machine), the same library serving every layer (and an early exit
over them). The embedding, the final norm and the head stay forward.py's, so what the caller
scores is unchanged. In bfloat16 with head dim 64 on AMX the layer attends by autospec's own
kernel (models/attention.py's rows_kernel, called through its C entry point), elsewhere by
sdpa (`OneRowGraph.kernel`).

Why ahead of time: torch.compile's just-in-time graphs measured slower here — each call paid
dynamo's guards over every weight (~0.3 ms a call) and Python between the kernels; a loaded
library takes the tensors and runs (SmolLM2 int4, one token, 1 thread: eager 21.5,
torch.compile 20.3, this 15.8-17 ms).

Shapes. The row's cache (1, kv_heads, capacity, head_dim) and the start (a 0-d tensor) are
dynamic, so one library serves every context and capacity. One library per width bucket
(`bucket`): one token (a plain step, no mask), and a verify's 2 .. MAX_WIDTH tokens — at int4
up to the int4 kernel's widest (models/quantized.py `widest`), its products all by that
kernel, which AOTInductor calls directly (`quantized.C_SHIMS`); wider, products.py's oneDNN
over the blocks' values is faster. Other widths (a prompt, a long int4 verify) run eager.

The first start compiles each bucket when first met (a line on stderr each, ~10-25 s); a
process that cannot (no C++ compiler, an op it cannot export) warns once, naming why, and runs
eager from then on. AUTOSPEC_COMPILE=0 turns it off.

Lossless: its logits are eager's within the format's rounding spread (tests/models/
test_compiled.py), another order of the same arithmetic, as a verify's already are of a
one-token step's; plain decoding and verification both run it.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from autospec import paths
from autospec.models import quantized

log = logging.getLogger("autospec.compiled")

MAX_WIDTH = 17  # a verify at the default k_max (16) + 1
_SOURCE = Path(__file__).read_bytes()  # the code a library is compiled from: part of its name


def enabled() -> bool:
    """Whether one-row forwards compile: AUTOSPEC_COMPILE (1 / 0), on when unset (the suite
    sets it to 0 for its many small models: tests/conftest.py; this module's tests turn it
    on)."""
    return os.environ.get(paths.COMPILE_ENV, "1") not in ("0", "", "false", "no")


def bucket(width: int, int4: bool) -> int | None:
    """The library a one-row forward of `width` tokens runs: 0 one token, 1 a verify; None
    eager (wider than `widest`: at int4, products.py's oneDNN)."""
    if width == 1:
        return 0
    return 1 if width <= widest(int4) else None


def widest(int4: bool) -> int:
    """The widest verify the verify library takes: MAX_WIDTH, at int4 at most the int4
    kernel's widest (models/quantized.py `widest`)."""
    return min(MAX_WIDTH, quantized.widest(4)) if int4 else MAX_WIDTH


def one_row_graph(plan, name: str) -> "OneRowGraph | None":
    """The compiled decoder loop of a model's plan (forward.py's _Plan), or None where one-row
    forwards run eager: compiling is off, or failed before in this process, or the model is
    not one one_row_layer computes (not on the CPU, a scaling of its own)."""
    if not enabled() or _FAILED:
        return None
    first = plan.layers[0] if plan.layers else None
    if (first is None or plan.embed.weight.device.type != "cpu"
            or first.scaling != first.head_dim ** -0.5
            or 2 * plan.rotary.inv_freq.shape[0] != first.head_dim):
        return None
    return OneRowGraph(plan, name)


class OneRowGraph:
    """A model's one-row decoder loop, compiled: a library of one decoder layer per bucket
    (compiled or loaded when first needed), run over the model's layers one after another,
    each with its own weights and cache. None from a call once compiling failed."""

    def __init__(self, plan, name: str):
        self.name, self.eps, self.inv_freq = name, plan.eps, plan.rotary.inv_freq
        self.kv_heads, self.head_dim = plan.layers[0].kv_heads, plan.layers[0].head_dim
        self.group = plan.layers[0].heads // self.kv_heads
        self.int4 = plan.layers[0].qkv.weights.int4
        self.hidden = plan.embed.weight.shape[1]
        self.weights = [_layer_weights(layer) for layer in plan.layers]
        self.runners: dict[int, object] = {}

    def takes(self, width: int) -> bool:
        """Whether a one-row forward of `width` tokens runs compiled (`bucket`)."""
        return bucket(width, self.int4) is not None and not _FAILED

    def kernel(self, dtype: torch.dtype) -> bool:
        """Whether the layer attends by autospec::rows_attention (models/attention.py's
        rows_kernel: bfloat16, head dim 64, every verify's queries in one kernel pass, AMX)
        rather than sdpa: one row over 200-400 positions, SmolLM2's heads, us a layer (sdpa /
        kernel): 1 token 17-23 / 11-14, 3 tokens 22-29 / 11-15, 9 tokens 34-43 / 19-26."""
        from autospec.models.attention import kernel_attends
        return kernel_attends(dtype, self.head_dim, self.group * widest(self.int4))

    def prepare(self, dtype: torch.dtype) -> None:
        """Every bucket's library loaded (compiled first where none is kept)."""
        for which in (0, 1):
            if which not in self.runners and not _FAILED:
                self._load(which, dtype)

    def __call__(self, x: torch.Tensor, start: int, cache_layers, slot: int):
        """x (1, T, D), one row's T embedded tokens (T `takes`), through every decoder layer,
        their K and V written into `cache_layers` (a RowCache's layers) at slot `slot` from
        `start`; None where compiling failed."""
        which = bucket(x.shape[1], self.int4)
        run = self.runners.get(which) or self._load(which, x.dtype)
        if run is None:
            return None
        x, start, inv_freq = x[0], torch.tensor(start), self.inv_freq
        for weights, layer in zip(self.weights, cache_layers):
            x = run([x, start, inv_freq, layer.keys[slot:slot + 1], layer.values[slot:slot + 1],
                     *weights])[0]
        return x[None]

    def package_path(self, which: int, dtype: torch.dtype) -> Path:
        """Where bucket `which`'s library is kept: named by everything it was compiled from
        (torch, this module's code, the CPU's instruction set, the shapes and constants)."""
        key = hashlib.sha256(repr((
            torch.__version__, _SOURCE, torch.backends.cpu.get_cpu_capability(),
            which, str(dtype), widest(self.int4), self.eps, self.kernel(dtype),
            tuple(self.inv_freq.shape),
            [(tuple(w.shape), str(w.dtype)) for w in self.weights[0]])).encode()).hexdigest()[:20]
        return paths.compile_cache_dir() / f"one-row-{which}-{key}.pt2"

    def _load(self, which: int, dtype: torch.dtype):
        """Bucket `which`'s library: loaded from disk, else compiled there first (a line on
        stderr); None, with one warning and eager from then on, where that fails."""
        path = self.package_path(which, dtype)
        try:
            if not path.is_file():
                self._compile(which, dtype, path)
            # the loader itself (torch._inductor's load_package imports inductor: ~3 s)
            runner = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
            runner = self.runners[which] = runner.run
        except Exception as exc:  # noqa: BLE001 - whatever stops it, the forward runs eager
            _FAILED.append(_reason(exc))
            log.warning("compiling the decode forward failed (%s): running it eager", _FAILED[-1])
            return None
        return runner

    def _compile(self, which: int, dtype: torch.dtype, path: Path) -> None:
        """Export one_row_layer for bucket `which` over scratch inputs and compile it into
        `path` (written aside and renamed: another process may be compiling it too)."""
        from torch.export import Dim
        wide = widest(self.int4)
        print(f"compiling {self.name}'s one-row forward, "
              f"{'one token' if which == 0 else f'2-{wide} tokens'} (once; kept in "
              f"{path.parent}) ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        _use_cache_dir()
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's own, about its pytree
            key, value = (torch.zeros((1, self.kv_heads, 16, self.head_dim), dtype=dtype)
                          for _ in range(2))
            x = torch.zeros((1 if which == 0 else 2, self.hidden), dtype=dtype)
            capacity = Dim("capacity", min=2, max=1 << 20)
            width = Dim("width", min=2, max=wide) if which else None
            program = torch.export.export(
                _Exported(self.eps, self.kernel(dtype)),
                (x, torch.tensor(3), self.inv_freq, key, value, self.weights[0]),
                dynamic_shapes=({0: width} if width else None, None, None, {2: capacity},
                                {2: capacity}, [None] * len(self.weights[0])),
                strict=False,
                # a stride's min(64, 192 T) at int4 that its solver cannot settle for T >= 2
                prefer_deferred_runtime_asserts_over_guards=True)
            aside = path.with_name(f"{path.stem}.{os.getpid()}.tmp.pt2")
            path.parent.mkdir(parents=True, exist_ok=True)
            shims = ({getattr(torch.ops.autospec, op).default: declared
                      for op, declared in quantized.C_SHIMS.items()}
                     if quantized.available() else {})
            with torch._inductor.config.patch({"aot_inductor.custom_ops_to_c_shims": shims}):
                torch._inductor.aoti_compile_and_package(program, package_path=str(aside))
        os.replace(aside, path)
        print(f"compiled in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


class _Exported(torch.nn.Module):
    """one_row_layer as torch.export takes it: the start as a 0-d tensor."""

    def __init__(self, eps: float, kernel: bool):
        super().__init__()
        self.eps, self.kernel = eps, kernel

    def forward(self, x, start, inv_freq, key_store, value_store, weights):
        start = start.item()
        torch._check(start >= 0)
        for store in (key_store, value_store):  # what RowCache.reserve ensures: the row fits
            torch._check(start + x.shape[0] <= store.shape[2])
        return one_row_layer(x, start, inv_freq, key_store, value_store, weights, self.eps,
                             self.kernel)


def _layer_weights(layer) -> list[torch.Tensor]:
    """A decoder layer's tensors as one_row_layer reads them: its norms, then per product
    (QKV, O, gate-up, down) its weight or, at int4, its forms (models/quantized.py `int4_forms`)."""
    out = [layer.input_norm, layer.post_norm]
    for product in (layer.qkv, layer.o, layer.gate_up, layer.down):
        weights = product.weights
        out += (weights.int4_packed(product.modules) if weights.int4
                else (weights.plain(product.modules),))
    return out


def _reason(exc: Exception) -> str:
    """The first line of what failed, its type named."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


_FAILED: list[str] = []  # the process's compile failures, in order: after one, eager


def _use_cache_dir() -> None:
    """Inductor's own caches (its compiled kernels, precompiled headers) under AUTOSPEC_CACHE
    too (it reads the variable at each use)."""
    wanted = str(paths.compile_cache_dir() / "inductor")
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") != wanted:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = wanted
        from torch._inductor.utils import clear_caches
        clear_caches()


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm's arithmetic (forward.py's _norm), float32 inside."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def one_row_layer(x: torch.Tensor, start: int, inv_freq: torch.Tensor, key_store: torch.Tensor,
                  value_store: torch.Tensor, weights: tuple, eps: float,
                  kernel: bool = False) -> torch.Tensor:
    """x (T, D), one row's hidden states at positions start .. start + T - 1, through one
    decoder layer (`weights`: _layer_weights), its K and V written into key_store /
    value_store (1, kv_heads, capacity, head_dim), attending to positions < start + T. The
    head counts come from the weights' shapes (static): the rotary's angles give head_dim, O's
    input the query heads, QKV's output the key/value heads."""
    per = (len(weights) - 2) // 4  # a product's tensors: its weight, or its int4 forms
    products = [weights[i:i + per] for i in range(2, len(weights), per)]
    input_norm, post_norm = weights[:2]
    qkv_w, o_w, gate_up_w, down_w = products
    head_dim = 2 * inv_freq.shape[0]
    half, scaling = head_dim // 2, head_dim ** -0.5  # LlamaAttention's scaling
    heads = _shape(o_w)[1] // head_dim
    kv_heads = (_shape(qkv_w)[0] // head_dim - heads) // 2
    split = _shape(gate_up_w)[0] // 2  # gate's rows, then up's
    group = heads // kv_heads
    width = x.shape[0]
    span = start + width
    # rotary: transformers' LlamaRotaryEmbedding (float32 angles, then the activations' dtype)
    positions = torch.arange(start, span, device=x.device)
    angles = positions[:, None].float() * inv_freq[None, :].float()
    angles = torch.cat((angles, angles), -1)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)  # (T, head_dim)
    mask = None
    # query t sees positions <= start + t (the kernel counts them, sdpa takes a mask: each
    # key/value head's group of queries)
    if width > 1 and not kernel:
        seen = torch.arange(span, device=x.device)[None, :] <= positions[:, None]
        mask = torch.zeros((width, span), dtype=x.dtype, device=x.device)
        mask = mask.masked_fill(~seen, torch.finfo(x.dtype).min)
        mask = mask[None, None].expand(1, group, width, span).reshape(1, 1, group * width, span)

    h = _norm(x, input_norm, eps)
    qkv = _product(h, qkv_w).view(width, heads + 2 * kv_heads, head_dim).transpose(0, 1)
    qk = qkv[:heads + kv_heads]  # Q's heads and K's, rotated at once
    qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), -1) * sin
    key_store[0, :, start:span] = qk[heads:]
    value_store[0, :, start:span] = qkv[heads + kv_heads:]
    if kernel:  # grouped_attention's rows_kernel: query t sees start + t + 1 positions
        seen = (positions + 1).to(torch.int32)[None]
        out = torch.ops.autospec.rows_attention(qk[:heads][None].contiguous(),
                                                key_store[:, :, :span], value_store[:, :, :span],
                                                seen, scaling).reshape(width, heads * head_dim)
    else:  # grouped_attention: each key/value head's query heads as its queries
        query = qk[:heads].reshape(1, kv_heads, group * width, head_dim)
        out = F.scaled_dot_product_attention(query, key_store[:, :, :span],
                                             value_store[:, :, :span], attn_mask=mask,
                                             scale=scaling)
        out = out.reshape(heads, width, head_dim).transpose(0, 1).reshape(width, heads * head_dim)
    x = x + _product(out, o_w)
    h = _norm(x, post_norm, eps)
    gate_up = _product(h, gate_up_w)
    return x + _product(F.silu(gate_up[:, :split]) * gate_up[:, split:], down_w)


def _shape(weight) -> tuple[int, int]:
    """(outputs, inputs) of a product's weight: int4 forms (uint8) or (weight (N, K),)."""
    return quantized.shape(weight) if weight[0].dtype == torch.uint8 else tuple(weight[0].shape)


def _product(x: torch.Tensor, weight) -> torch.Tensor:
    """x (T, K) by one product's weight (_shape's forms): the int4 kernel where it has blocks
    (`bucket` keeps such a library to its widest rows), else its values by F.linear."""
    if weight[0].dtype == torch.uint8:
        return quantized.mm(x, weight)
    return F.linear(x, weight[0])
