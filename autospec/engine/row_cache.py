"""A KV cache with a length per row, for continuous batching (engine/batch.py, the target's;
engine/batch_draft.py, the draft model's).

Rows have their own cache lengths, which transformers' DynamicCache cannot hold (its crop cuts
every row to one length), hence `RowCache`: per layer a preallocated (B_max, kv_heads, L_max, head_dim) K and V, a length per
slot, and roll-back = setting a length, as gpt-fast does (rejected entries are overwritten by
the next forward). A forward writes each row's real tokens at that row's own offset; row i's
query t sits at position length_i + t and sees cache positions <= that — its own valid prefix
and its own causal part, never another row's entries nor its padding. The mask is passed to the
model as a 4-D additive float mask (0 = attend, dtype min = not): transformers 5.x's
create_causal_mask returns a 4-D mask as it is (masking_utils._preprocess_mask_arguments), and
an additive mask is right for both the sdpa and the eager attention (eager adds it; a boolean
one would be added as 0/1). K and V are returned only up to the longest position any row of
the forward reads (`span`), not the full L_max: attention over unused slots costs as much as
over used ones, and on a CPU it is not free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from autospec.models.pair import kv_shape


@dataclass
class Bound:
    """Where the rows of the forward in progress sit in the cache (n rows, T tokens each)."""
    slots: torch.Tensor  # (n,) the rows' slots
    # the rows' first slot when they are consecutive slots in order (s, s+1, ...): then the
    # forward reads a view of the store; else (None) it gathers the rows, a copy of every
    # layer's K and V up to the span (at 16 rows it tripled a step: engine/batch.py feeds
    # its rows in slot order)
    first: int | None
    write_slot: torch.Tensor  # (N,) slot of each real (non-padding) input token
    write_pos: torch.Tensor  # (N,) its cache position
    valid: torch.Tensor  # (n, T) bool, a real token and not padding
    span: int  # cache positions read: max over rows of length_i + tokens_i

    def read(self, store: torch.Tensor) -> torch.Tensor:
        """(B_max, H, L_max, D) -> the forward's rows, (n, H, span, D)."""
        if self.first is not None:
            return store[self.first:self.first + len(self.slots), :, :self.span]
        return store[self.slots, :, :self.span]


class RowLayer(CacheLayerMixin):
    """One decoder layer's K and V for every slot: (B_max, kv_heads, L_max, head_dim)."""
    is_sliding = False

    def __init__(self, owner: "RowCache", shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        self.owner = owner
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass  # preallocated

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states (n, H, T, D): write each row's real tokens at its own offset; return the
        rows' K and V up to the span, (n, H, span, D)."""
        bound = self.owner.bound
        self.keys[bound.write_slot, :, bound.write_pos] = key_states.transpose(1, 2)[bound.valid]
        self.values[bound.write_slot, :, bound.write_pos] = value_states.transpose(1, 2)[bound.valid]
        return bound.read(self.keys), bound.read(self.values)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.bound.span, 0

    def get_seq_length(self) -> int:
        return max(self.owner.lengths)

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class RowCache(Cache):
    """A KV cache of `max_batch` slots with a length each; a request holds one slot."""

    def __init__(self, model, max_batch: int, max_len: int):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_len < 2:
            raise ValueError(f"max_len must be >= 2, got {max_len}")
        layers, kv_heads, head_dim = kv_shape(model)
        param = next(model.parameters())
        shape = (max_batch, kv_heads, max_len, head_dim)
        super().__init__(layers=[RowLayer(self, shape, param.dtype, param.device)
                                 for _ in range(layers)])
        self.max_batch, self.max_len = max_batch, max_len
        self.device, self.dtype = param.device, param.dtype
        self.lengths = [0] * max_batch  # tokens cached per slot
        self.free = list(range(max_batch))  # free slots, lowest first
        self.bound: Bound | None = None

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
        """Set up a forward of rows `slots` feeding n_tokens[i] real tokens each (padded to T).
        Returns position_ids (n, T) and the additive mask (n, 1, T, span)."""
        lengths = torch.tensor([self.lengths[s] for s in slots])
        counts = torch.tensor(list(n_tokens))
        offsets = torch.arange(int(counts.max()))
        valid = offsets[None, :] < counts[:, None]  # (n, T)
        positions = lengths[:, None] + offsets[None, :]  # (n, T)
        span = int((lengths + counts).max())
        if span > self.max_len:
            raise ValueError(f"a row would reach position {span}; rows hold {self.max_len} (max_len)")
        slot_ids = torch.tensor(list(slots))
        first = slots[0] if list(slots) == list(range(slots[0], slots[0] + len(slots))) else None
        self.bound = Bound(slot_ids.to(self.device), first,
                           slot_ids[:, None].expand_as(valid)[valid].to(self.device),
                           positions[valid].to(self.device), valid.to(self.device), span)
        # row i's query t (position length_i + t) sees cache positions 0 .. length_i + t
        allowed = torch.arange(span)[None, None, :] <= positions[:, :, None]  # (n, T, span)
        mask = torch.zeros(allowed.shape, dtype=self.dtype)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        # padding may run past the model's positions (learned embeddings): its output is unused
        position_ids = positions.clamp(max=position_limit - 1)
        return position_ids.to(self.device), mask[:, None].to(self.device)
