"""KV caches over transformers' Cache API (5.x names the argument `cache`, 4.x
`past_key_values`): `RowCache`, the one cache every decode-time forward uses (the engine's
target, the draft model, the early exit). A forward is planned (models/plan.py: the rows,
their positions and masks, the packing), then run (`cached_forward`).

A KV cache with a length per row (engine/loop.py, the target's; drafters/draft_model.py, a
draft model's or an early exit's).

Rows have their own cache lengths, which transformers' DynamicCache cannot hold (its crop cuts
every row to one length), hence `RowCache`: per layer a preallocated (B_max, kv_heads, L_max, head_dim) K and V, a length per
slot, and roll-back = setting a length, as gpt-fast does (rejected entries are overwritten by
the next forward). A forward writes each row's real tokens at that row's own offset; row i's
query t sits at position length_i + t and sees cache positions <= that — its own valid prefix
and its own causal part, never another row's entries nor its padding. The mask is passed to the
model as a 4-D additive float mask (0 = attend, dtype min = not): transformers 5.x's
create_causal_mask returns a 4-D mask as it is (masking_utils._preprocess_mask_arguments), and
an additive mask is right for both the sdpa and the eager attention (eager adds it; a boolean
one would be added as 0/1). The store grows by doubling (`capacity`, up to max_len) as rows
reach further, so an engine or a per-request drafter allocates what its rows hold, not the
model's whole position limit (SmolLM2: 8192 positions, 0.38 GB a row in float32). K and V are returned only up to the longest position any row of
the forward reads (`span`), not the full L_max: attention over unused slots costs as much as
over used ones, and on a CPU it is not free.
"""
from __future__ import annotations

import functools
import inspect
from typing import Sequence

import torch
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin

from autospec.models.attention import interface_packing, one_pass_width, packs
from autospec.models.forward import fits, llama_forward
from autospec.models.plan import ForwardBatch, fill, place, plan


def kv_shape(model: nn.Module) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of the model's KV cache."""
    cfg = model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers, kv_heads, head_dim


def kv_bytes_per_token(model: nn.Module) -> int:
    """Bytes of K and V one cached token occupies across all layers."""
    layers, kv_heads, head_dim = kv_shape(model)
    elem = next(model.parameters()).element_size()
    return 2 * layers * kv_heads * head_dim * elem


def cache_kwarg(model) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@functools.lru_cache(maxsize=None)
def keeps_logits(model_class) -> bool:
    """Whether the model's forward takes `logits_to_keep` (the head over some positions only)."""
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def cached_forward(model, kwarg: str, cache: "RowCache", batch: ForwardBatch):
    """Logits (n, T', V) of the batch's input, written into `cache` (holding `batch`); where
    the cache keeps hidden states, with the last hidden state after the final norm. A Llama
    model runs models/forward.py's forward, given the batch; every other model transformers'
    own, whose attention reads the packing through attention.py's `interface_packing`."""
    hidden = cache.hidden is not None
    if fits(model):
        return llama_forward(model, batch, cache, hidden)
    extra = {} if batch.logits_to_keep is None else {"logits_to_keep": batch.logits_to_keep}
    if hidden:
        extra["output_hidden_states"] = True
    with interface_packing(batch.packing):
        out = model(input_ids=batch.input_ids, use_cache=True, **{kwarg: cache},
                    position_ids=batch.position_ids, attention_mask=batch.mask, **extra)
    return (out.logits, out.hidden_states[-1]) if hidden else out.logits


# Positions per slot allocated at first; doubled as rows reach further (a handful of copies
# over a request's life, each of what the cache then holds).
INITIAL_CAPACITY = 256


class RowLayer(CacheLayerMixin):
    """One decoder layer's K and V for every slot: (B_max, kv_heads, L_max, head_dim)."""
    is_sliding = False

    def __init__(self, owner: "RowCache", shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        self.owner = owner
        # zeros, not empty: a masked position's V still enters softmax(.) @ V as 0 * V
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.is_initialized = True

    def grow(self, capacity: int) -> None:
        """Room for `capacity` positions per slot, the cached ones copied."""
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((*old.shape[:2], capacity, old.shape[3]))
            new[:, :, :old.shape[2]] = old
            setattr(self, name, new)

    def lazy_initialization(self, key_states, value_states) -> None:
        pass  # preallocated

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states (n, H, T, D): write each row's real tokens at its own offset; return the
        rows' K and V up to the span, (n, H, span, D)."""
        bound = self.owner.bound
        if bound.window is not None:
            slot, start, stop = bound.window
            self.keys[slot, :, start:stop] = key_states[0]
            self.values[slot, :, start:stop] = value_states[0]
        elif bound.packing is not None:  # (1, H, N, D): the rows' real tokens back to back
            self.keys[bound.write_slot, :, bound.write_pos] = key_states[0].transpose(0, 1)
            self.values[bound.write_slot, :, bound.write_pos] = value_states[0].transpose(0, 1)
        else:
            self.keys[bound.write_slot, :, bound.write_pos] = key_states.transpose(1, 2)[bound.valid]
            self.values[bound.write_slot, :, bound.write_pos] = value_states.transpose(1, 2)[bound.valid]
        return bound.read(self.keys), bound.read(self.values)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.bound.span, 0

    def get_seq_length(self) -> int:
        return max(self.owner.lengths)

    def get_max_length(self) -> int:
        return self.owner.max_len


class RowCache(Cache):
    """A KV cache of `max_batch` slots with a length each; a request holds one slot."""

    def __init__(self, model, max_batch: int, max_len: int, keep_hidden: bool = False):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_len < 2:
            raise ValueError(f"max_len must be >= 2, got {max_len}")
        layers, kv_heads, head_dim = kv_shape(model)
        param = next(model.parameters())
        self.capacity = min(max_len, INITIAL_CAPACITY)
        shape = (max_batch, kv_heads, self.capacity, head_dim)
        super().__init__(layers=[RowLayer(self, shape, param.dtype, param.device)
                                 for _ in range(layers)])
        self.max_batch, self.max_len = max_batch, max_len
        self.device, self.dtype = param.device, param.dtype
        # rows up to this wide attend padded in one pass (attention.py one_pass_width)
        group = model.config.num_attention_heads // kv_heads
        self.one_pass = one_pass_width(group, head_dim, param.dtype) if max_batch > 1 else 0
        self.lengths = [0] * max_batch  # tokens cached per slot
        self.free = list(range(max_batch))  # free slots, lowest first
        # the forward in progress, for the layers' update as transformers' Cache interface
        # calls it (no argument for it there)
        self.bound: ForwardBatch | None = None
        self._unpacked: torch.Tensor | None = None  # a packed forward's padded logits (forward)
        # keep_hidden: the model's last hidden state (after its final norm: what its head
        # reads) at every cached position, (B_max, capacity, D), written by the same forward
        # as K and V and rolled back with them (a length per row) — the features a feature-
        # level drafter reads (drafters/eagle.py)
        self.hidden = (torch.zeros((max_batch, self.capacity, model.config.hidden_size),
                                   dtype=param.dtype, device=param.device)
                       if keep_hidden else None)

    def hidden_of(self, slot: int | None) -> torch.Tensor | None:
        """The row's features at its cached positions, (length, D): a view (None where the
        cache keeps none, or for no row)."""
        if self.hidden is None or slot is None:
            return None
        return self.hidden[slot, :self.lengths[slot]]

    def _keep_hidden(self, hidden: torch.Tensor) -> None:
        """Write the forward's last hidden states (padded (n, T, D) or packed (1, N, D)) at
        the rows' positions, as RowLayer.update writes K and V."""
        bound = self.bound
        if bound.window is not None:
            slot, start, stop = bound.window
            self.hidden[slot, start:stop] = hidden[0]
        elif bound.packing is not None:
            self.hidden[bound.write_slot, bound.write_pos] = hidden[0]
        else:
            self.hidden[bound.write_slot, bound.write_pos] = hidden[bound.valid]

    def claim(self) -> int:
        """The lowest free slot, emptied."""
        if not self.free:
            raise ValueError(f"the batch is full: all {self.max_batch} rows (max_batch) are in use")
        slot = self.free.pop(0)
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        if slot in self.free:
            raise ValueError(f"slot {slot} is not in use")
        self.lengths[slot] = 0
        self.free.append(slot)
        self.free.sort()

    def bind(self, slots: Sequence[int], n_tokens: Sequence[int],
             position_limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Hold a forward of rows `slots` feeding n_tokens[i] real tokens each, padded to T
        (plan.place), until its caller sets `bound` back to None. Returns position_ids (n, T)
        and the additive mask (n, 1, T, span)."""
        batch = place(self.lengths, slots, n_tokens, position_limit, self.dtype, self.device)
        self.reserve(batch.span)
        self.bound = batch
        return batch.position_ids, batch.mask

    def reserve(self, span: int) -> None:
        """Every slot's store holds `span` positions (grown, the cached ones copied)."""
        if span > self.max_len:
            raise ValueError(f"a row would reach position {span}; rows hold {self.max_len} (max_len)")
        if span > self.capacity:
            self.capacity = min(self.max_len, max(span, 2 * self.capacity))
            for layer in self.layers:
                layer.grow(self.capacity)
            if self.hidden is not None:
                old = self.hidden
                self.hidden = old.new_zeros((old.shape[0], self.capacity, old.shape[2]))
                self.hidden[:, :old.shape[1]] = old

    def forward(self, model, kwarg: str, slots: Sequence[int], inputs: Sequence[list[int]],
                position_limit: int, last: int | None = None, scored: Sequence[int] | None = None,
                logits_to_keep: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (n, T, V) of the rows' token lists, right-padded, each written at its row's
        own offset. Packed, the logits are a view valid until the next packed forward. The
        rows' lengths are the caller's to advance (a verify keeps only the accepted part).
        `last`, `scored` and `logits_to_keep` (`keep`) as plan.plan takes them (`scored`: the
        logits are then the scored rows' only, in order, each from its first scored position)."""
        slots, inputs, scored = fill(slots, inputs, scored)
        self.bind(slots, [len(ids) for ids in inputs], position_limit)
        try:
            batch = self.bound = plan(self.bound, inputs, scored, last, logits_to_keep,
                                      lambda: packs(model), keeps_logits(type(model)),
                                      self.one_pass)
            logits = cached_forward(model, kwarg, self, batch)
            if self.hidden is not None:
                logits, hidden = logits
                self._keep_hidden(hidden)
        finally:
            self.bound = None
        if batch.packing is None:
            return logits if batch.rows is None else logits[batch.rows]
        # back to (n, T, V), right-padded (the padding's logits are never read), into one buffer
        # reused from forward to forward: valid until this cache's next packed forward. A fresh
        # one (16 rows, one 17 wide, SmolLM2's 49k vocabulary: 53 MB) cost 10 ms a step in
        # page faults
        if batch.picked is not None:
            logits = logits[:, batch.picked]
        n, width = batch.unpacked
        size, vocab = n * width, logits.shape[-1]
        if self._unpacked is None or len(self._unpacked) < size or self._unpacked.shape[1] != vocab:
            self._unpacked = logits.new_empty((size, vocab))
        out = self._unpacked[:size]
        out.index_copy_(0, batch.unpack, logits[0])
        return out.view(n, width, -1)
