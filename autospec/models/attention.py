"""Attention for RowCache forwards (models/kv.py): rows at their own offsets, packed.

Rows of a step have their own widths (k_i + 1 tokens: a row that decodes plain feeds one,
a row that speculates k feeds k + 1). Right-padded, every row computes the widest row's
positions in every projection and MLP; packed, the forward's input is the rows' real tokens
back to back, one sequence (1, N), and only attention, which must not mix rows, unpacks the
queries into the padded (n, H, T, D) layout against each row's own cache (RowLayer.update
returns them per row) and packs the result again. Attention is a small part of a step at
these lengths; the MLP is most of it, so a step costs about its real tokens, not n x T —
what lets one row speculate while the others decode plain (controller/batch.py).

models/forward.py's forward hands `rows_attention` the packing; transformers' forward calls it
through its attention interface, which has no argument for it: there it comes through
`_PACKED`, set around the model's call (`interface_packing`).
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from autospec.models import quantized

ROWS_ATTENTION = "autospec_rows"
_PACKED: contextvars.ContextVar = contextvars.ContextVar("autospec_packed", default=None)


@dataclass
class Packing:
    """Where a packed forward's rows sit: the real tokens' flat index in the padded (n * T)
    layout; and, where a few rows are wider than one token and padding the others would
    waste much (`two_passes`: a few rows speculate, the rest decode plain), each row's first
    token in the packed
    sequence (`starts`) and the wide rows (`wide`) with their other tokens' places in the
    packed sequence (`rest`) and in their own padded (n_wide * (T - 1)) layout (`rest_at`).
    A prompt chunk riding in a decode step (a row wider than SOLO_WIDTH beside others) attends
    on its own (`solo`: row, first and end token in the packed sequence); the other rows, with
    that row's first token only, as `inner` packs them (`inner_tokens`: their places in the
    packed sequence)."""
    flat: torch.Tensor
    n: int
    width: int
    starts: torch.Tensor | None = None
    wide: torch.Tensor | None = None
    rest: torch.Tensor | None = None
    rest_at: torch.Tensor | None = None
    solo: tuple[tuple[int, int, int], ...] = ()
    inner: "Packing | None" = None
    inner_tokens: torch.Tensor | None = None

    @classmethod
    def of(cls, counts: list[int], device, one_pass: int = 0) -> "Packing":
        """Where `counts` tokens a row sit; rows at most `one_pass` wide attend padded, in one
        pass (`one_pass_width`), whatever `two_passes` says."""
        n, width = len(counts), max(counts)
        flat = torch.tensor([i * width + t for i, c in enumerate(counts) for t in range(c)],
                            device=device)
        offsets = list(itertools.accumulate(counts, initial=0))
        solo = tuple((i, offsets[i], offsets[i + 1]) for i, c in enumerate(counts)
                     if c > SOLO_WIDTH) if n > 1 else ()
        if solo:
            inner = [1 if c > SOLO_WIDTH else c for c in counts]
            tokens = [offsets[i] + t for i, c in enumerate(inner) for t in range(c)]
            return cls(flat, n, width, solo=solo, inner=cls.of(inner, device),
                       inner_tokens=torch.tensor(tokens, device=device))
        wide = [i for i, c in enumerate(counts) if c > 1]
        if width <= one_pass or not two_passes(n, len(wide), width):
            return cls(flat, n, width)
        rest = [offsets[i] + t for i in wide for t in range(1, counts[i])]
        rest_at = [j * (width - 1) + t - 1 for j, i in enumerate(wide) for t in range(1, counts[i])]
        return cls(flat, n, width, *(torch.tensor(v, device=device)
                                     for v in (offsets[:-1], wide, rest, rest_at)))


def rows_attention(module, query, key, value, attention_mask, packed: Packing | None = None,
                   **kwargs):
    """Attention over rows at their own offsets (key/value (n, H_kv, span, D), the rows' mask
    (n, 1, T, span)), with transformers' attention interface's arguments. Packed (`packed`:
    where the rows sit), query (1, H, N, D) holds the rows' real tokens back to back; attended
    per row, the result is packed again, (1, N, H, D). Rows of a few tokens each (a verify step,
    one row's verify at batch 1) attend by `grouped_attention`; anything else (a prefill) by
    transformers' sdpa as before."""
    grouped = not any(kwargs.get(name) for name in UNGROUPED)
    if packed is None:
        # one row grouped only under its own mask: without one, transformers' sdpa is causal
        one_masked = (attention_mask is not None and attention_mask.shape[1] == 1
                      and not kwargs.get("dropout"))
        if query.shape[2] <= GROUPED_MAX_WIDTH and grouped and (query.shape[0] > 1 or one_masked):
            return grouped_attention(query, key, value, attention_mask, kwargs.get("scaling")), None
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)
    tokens = query[0].transpose(0, 1)  # (N, H, D)
    if not packed.solo:
        return _packed_attention(packed, module, tokens, key, value, attention_mask, grouped,
                                 kwargs)[None], None
    # a prompt chunk beside decoding rows: the rows (the chunk's first token among them) as
    # any packed step, then each chunk by sdpa over its own row — no row padded to the chunk
    out = query.new_empty(tokens.shape)
    inner = packed.inner
    out[packed.inner_tokens] = _packed_attention(inner, module, tokens[packed.inner_tokens],
                                                 key, value, attention_mask[:, :, :inner.width],
                                                 grouped, kwargs)
    for row, start, stop in packed.solo:
        chunk = tokens[start:stop].transpose(0, 1)[None]  # (1, H, c, D)
        attended, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](
            module, chunk, key[row:row + 1], value[row:row + 1],
            attention_mask[row:row + 1, :, :stop - start], **kwargs)
        out[start:stop] = attended[0]
    return out[None], None


def _packed_attention(packed: Packing, module, tokens, key, value, attention_mask, grouped: bool,
                      kwargs) -> torch.Tensor:
    """The rows' real tokens (N, H, D) attended, each row against its own cache, (N, H, D)."""
    n, width, scaling = packed.n, packed.width, kwargs.get("scaling")
    heads, dim = tokens.shape[1], tokens.shape[2]
    if packed.wide is None or not grouped:  # every row padded to the widest
        rows = tokens.new_zeros((n * width, heads, dim))
        rows[packed.flat] = tokens
        rows = rows.view(n, width, heads, dim).transpose(1, 2)
        if grouped:
            out = grouped_attention(rows, key, value, attention_mask, scaling)
        else:
            out, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](module, rows, key, value, attention_mask, **kwargs)
        return out.reshape(n * width, heads, dim)[packed.flat]
    # a few wide rows: every row's first token in one pass over all rows (the cache read as
    # it is), the wide rows' other tokens in a second over their K and V only — no row
    # computes attention for another row's width
    out = tokens.new_empty(tokens.shape)
    first = tokens[packed.starts].unsqueeze(2)  # (n, H, 1, D)
    out[packed.starts] = grouped_attention(first, key, value, attention_mask[:, :, :1], scaling)[:, 0]
    wide = len(packed.wide)  # >= 1: rows of one width are not packed
    rows = tokens.new_zeros((wide * (width - 1), heads, dim))
    rows[packed.rest_at] = tokens[packed.rest]
    rows = rows.view(wide, width - 1, heads, dim).transpose(1, 2)
    # index_select, not key[wide]: advanced indexing of the cache's (sliced) view took ~0.1 ms
    # a layer for one row of the reference pair's, index_select a third of that
    attended = grouped_attention(rows, key.index_select(0, packed.wide),
                                 value.index_select(0, packed.wide),
                                 attention_mask[packed.wide, :, 1:], scaling)
    out[packed.rest] = attended.reshape(wide * (width - 1), heads, dim)[packed.rest_at]
    return out


def one_pass_width(group: int, head_dim: int, dtype: torch.dtype) -> int:
    """The widest rows of a model (`group` query heads a key/value head, `head_dim`, `dtype`)
    that attend padded, in one pass, whatever `two_passes` says: where its rows run autospec's
    kernel (`rows_kernel`), as wide as a key/value head's queries fill one pass of it (SmolLM2:
    5), since a pass reads each row's K and V once whatever its queries and the second pass of
    `two_passes` reads the wide rows' again (16 SmolLM2 rows, one or two of them 5 wide, ms:
    35.5 / 36-39 padded against 38-39 / 39-40); else 0."""
    return ONE_PASS // group if kernel_attends(dtype, head_dim) else 0


def two_passes(rows: int, wide: int, width: int) -> bool:
    """Whether a packed step's attention goes in two passes (every row's first token, then the
    wide rows' others over their own K and V, gathered) rather than one over every row padded
    to the widest: where the padding it saves, (rows - wide) (width - 1) query positions, is
    at least TWO_PASS_SAVING per wide row gathered. Measured at 16 rows (one forward, median
    of 5-9): both pairs' best path at every wide in 1..12 and K in 4, 8, 16 but one near-tie
    (the reference pair, 6 rows at K = 16: 28.3 ms against padded 27.0); the rule before,
    two passes wherever at most half the rows were wide, cost up to 5 ms of 22 on the
    reference pair and 10 of 101 on SmolLM2 at 8 rows wide."""
    return wide >= 1 and (rows - wide) * (width - 1) >= TWO_PASS_SAVING * wide


TWO_PASS_SAVING = 20  # padded query positions saved per wide row (two_passes)
# A packed row wider than a verify row at the default k_max (16 + 1) beside other rows is a
# prompt chunk riding in a decode step (Engine.advance): it attends on its own (Packing.solo)
SOLO_WIDTH = 17

# Query positions per row up to which rows attend by grouped_attention (a verify feeds k + 1
# <= 17); a longer query (a prefill) attends by sdpa, which never holds a (T, span) score matrix.
GROUPED_MAX_WIDTH = 64
# attention arguments grouped_attention does not implement: the model attends by sdpa then
UNGROUPED = ("sliding_window", "softcap", "s_aux")
# the rows that autospec::rows_attention attends (rows_kernel): head dims, and a key/value
# head's queries (its query heads x the row's positions; 16 a pass over its K and V, the later
# passes from the cache). 16 SmolLM2 rows (9 query heads over 3) over 300 / 600 cached
# positions, 2 threads, us a layer, torch's sdpa with the batch's mask / the kernel: T = 1
# 231 / 131, 473 / 246; T = 2 251 / 145, 467 / 243; T = 5 287 / 159, 520 / 282 (sdpa 1.5-2.6x
# that in other runs: the caches read at 9-14 GB/s); over 400: T = 6 479 / 346, T = 9 589 / 385,
# T = 17 967 / 656. A 16-row SmolLM2 step at int4 over the chat prompts, ms: 16 tokens 37-39 /
# 29, 32 tokens 42-44 / 34-35, 64 tokens 56-58 / 48-49
KERNEL_DIM, KERNEL_QUERIES = 64, 64
ONE_PASS = 16  # a key/value head's queries the kernel attends in one pass (attention.cpp LANES)


def kernel_attends(dtype: torch.dtype, head_dim: int, queries: int = ONE_PASS) -> bool:
    """Whether this process's autospec::rows_attention attends `queries` queries a key/value
    head (its query heads x a row's positions) of `dtype` and `head_dim`: bfloat16, KERNEL_DIM,
    at most KERNEL_QUERIES, on AMX — the rule grouped_attention, one_pass_width and the
    compiled one-row layer (models/compiled.py) all go by."""
    return (dtype == torch.bfloat16 and head_dim == KERNEL_DIM and queries <= KERNEL_QUERIES
            and quantized.amx())


def grouped_attention(query, key, value, mask, scaling: float | None) -> torch.Tensor:
    """softmax(q k^T * scaling + mask) v for n rows of a few query positions (n, H, T, D) over
    their caches (n, H_kv, span, D) under their additive or boolean mask (n, 1, T, >= span;
    None: every position visible), (n, T, H, D): torch's sdpa with each key/value head's query
    heads as its queries, so no key/value head is copied per query head.

    transformers' sdpa with a mask copies K and V to every query head: a SmolLM2 verify's
    attention at one row (9 query heads over 3) took 190-320 us a layer that way and 75-180
    this way (T = 2-8, span 150-400), the same values to the last bits; at 16 rows, one of them
    2 tokens wide, 111 ms a step against 13 at 1 token each. Against the same arithmetic
    written out in matmuls (which copied the caches' strided K and V every layer), 16 rows over
    a 300-token cache, 2 threads, us a layer (sdpa / matmuls): SmolLM2 in bfloat16 at T = 1, 2,
    5, 17: 245 / 585, 279 / 573, 378 / 694, 937 / 1182; the reference pair's shape in float32
    283 / 301, 548 / 537 at T = 5, 1415 / 2961 at T = 17.

    A batch's rows in bfloat16 on a CPU with AMX attend by autospec's own kernel instead
    (`rows_kernel`, KERNEL_DIM / KERNEL_QUERIES say which), ~1.8x faster than sdpa under the
    batch's mask; one row stays on sdpa (the compiled forward's)."""
    n, heads, width, dim = query.shape
    kv_heads, span = key.shape[1], key.shape[2]
    group = heads // kv_heads
    if (n > 1 and mask is not None and key.dtype == query.dtype
            and key.stride(-1) == 1 and key.stride(-2) == dim and value.stride(-1) == 1
            and value.stride(-2) == dim and kernel_attends(query.dtype, dim, group * width)):
        return rows_kernel(query, key, value, mask, scaling)
    return sdpa_grouped(query, key, value, mask, scaling)


def rows_kernel(query, key, value, mask, scaling: float | None) -> torch.Tensor:
    """grouped_attention by autospec::rows_attention (models/attention.cpp), for a batch's rows
    in bfloat16 on AMX: the visible positions of each query counted from its row of the mask,
    which is a prefix of the row's cache (models/kv.py: its own positions and causal part)."""
    span, dim = key.shape[2], query.shape[3]
    rows = mask[:, 0, :, :span]
    seen = (rows if rows.dtype == torch.bool else rows == 0).sum(-1, dtype=torch.int32)
    return torch.ops.autospec.rows_attention(query.contiguous(), key, value, seen,
                                             scaling if scaling is not None else dim ** -0.5)


def sdpa_grouped(query, key, value, mask, scaling: float | None) -> torch.Tensor:
    """grouped_attention by torch's sdpa (every shape, dtype and machine)."""
    n, heads, width, dim = query.shape
    kv_heads, span = key.shape[1], key.shape[2]
    group = heads // kv_heads
    if mask is not None:  # query (g, t) of a key/value head: query t's row of the mask
        mask = mask[..., :span]
        if group > 1:
            mask = mask.expand(n, group, width, span).reshape(n, 1, group * width, span)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(n, kv_heads, group * width, dim), key, value, attn_mask=mask,
        scale=scaling if scaling is not None else dim ** -0.5)
    return out.reshape(n, heads, width, dim).transpose(1, 2)


@contextlib.contextmanager
def interface_packing(packed: Packing | None):
    """`packed` for rows_attention while transformers' forward calls it (`_interface`)."""
    token = _PACKED.set(packed)
    try:
        yield
    finally:
        _PACKED.reset(token)


def _interface(module, query, key, value, attention_mask, **kwargs):
    """rows_attention as transformers' attention interface calls it: packed as `_PACKED` says."""
    return rows_attention(module, query, key, value, attention_mask, _PACKED.get(), **kwargs)


AttentionInterface.register(ROWS_ATTENTION, _interface)
# and sdpa's masks: transformers makes none for an attention it has no mask function for
# (its generate() over left-padded rows, or a verify after a cache, would then attend wrongly)
AttentionMaskInterface.register(ROWS_ATTENTION, sdpa_mask)


def pack_rows(model) -> bool:
    """Let RowCache forwards of `model` pack their rows (rows_attention); False, and nothing
    changed, where its attention is not sdpa (what rows_attention attends with). Forwards
    outside a RowCache are unchanged: sdpa as before."""
    config = model.config
    if config._attn_implementation == ROWS_ATTENTION:
        return True
    if config._attn_implementation != "sdpa":
        return False
    model.set_attn_implementation(ROWS_ATTENTION)
    return config._attn_implementation == ROWS_ATTENTION


def packs(model) -> bool:
    return model.config._attn_implementation == ROWS_ATTENTION
