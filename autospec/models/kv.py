"""KV caches over transformers' Cache API (5.x names the argument `cache`, 4.x
`past_key_values`): `RowCache`, the one cache every decode-time forward uses (the engine's
target, the draft model, the early exit), and `cached_forward`.

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
import itertools
import inspect
from dataclasses import dataclass
from typing import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from autospec.models.attention import _PACKED, Packing, packs
from autospec.models.forward import fits, llama_forward
from autospec.models.pair import kv_shape


def cache_kwarg(model) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@functools.lru_cache(maxsize=None)
def keeps_logits(model_class) -> bool:
    """Whether the model's forward takes `logits_to_keep` (the head over some positions only)."""
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def cached_forward(model, input_ids: torch.Tensor, cache: Cache, kwarg: str,
                   last: int | None = None, **inputs: torch.Tensor) -> torch.Tensor:
    """Logits (B, n, V) for input_ids (B, n) appended after what the cache holds; with `last`,
    only the last `last` positions are scored (a prefill needs none or one: the LM head over a
    whole prompt costs as much as several decode steps). `inputs`: position_ids and a 4-D
    attention_mask where rows sit at their own offsets (RowCache.bind). A Llama model runs
    models/forward.py's forward, every other model transformers' own."""
    if isinstance(cache, RowCache) and fits(model):
        keep = inputs.get("logits_to_keep", last)
        return llama_forward(model, input_ids, cache, inputs["position_ids"],
                             inputs["attention_mask"], keep,
                             bool(inputs.get("output_hidden_states")))
    extra = {"logits_to_keep": last} if last is not None and keeps_logits(type(model)) else {}
    out = model(input_ids=input_ids, use_cache=True, **{kwarg: cache}, **extra, **inputs)
    if inputs.get("output_hidden_states"):  # and the last hidden state (after the final norm)
        return out.logits, out.hidden_states[-1]
    return out.logits


# Positions per slot allocated at first; doubled as rows reach further (a handful of copies
# over a request's life, each of what the cache then holds).
INITIAL_CAPACITY = 256


@dataclass
class Bound:
    """Where the rows of the forward in progress sit in the cache (n rows, T tokens each)."""
    slots: torch.Tensor  # (n,) the rows' slots
    # the rows' first slot when they are consecutive slots in order (s, s+1, ...): then the
    # forward reads a view of the store; else (None) it gathers the rows, a copy of every
    # layer's K and V up to the span (at 16 rows it tripled a step: engine/loop.py feeds
    # its rows in slot order)
    first: int | None
    # (None for one row: its `window`)
    write_slot: torch.Tensor | None  # (N,) slot of each real (non-padding) input token
    write_pos: torch.Tensor | None  # (N,) its cache position
    valid: torch.Tensor | None  # (n, T) bool, a real token and not padding
    span: int  # cache positions read: max over rows of length_i + tokens_i
    # one row (a batch of one, a prefill, a per-request drafter): (slot, start, stop), its
    # tokens written as a slice, the same entries as the indexed write — which made a plain
    # step at batch 1 on the reference pair 11.5 ms a token instead of 10.5 (9 %)
    window: tuple[int, int, int] | None = None
    # packed: the forward's input is one sequence of the rows' real tokens back to back (no
    # padding), so the linear layers compute only those; attention unpacks (rows_attention)
    packed: bool = False

    def read(self, store: torch.Tensor) -> torch.Tensor:
        """(B_max, H, L_max, D) -> the forward's rows, (n, H, span, D)."""
        if self.first is not None:
            return store[self.first:self.first + len(self.slots), :, :self.span]
        return store[:, :, :self.span].index_select(0, self.slots)  # 0.7x store[slots, :, :span]


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
        elif bound.packed:  # (1, H, N, D): the rows' real tokens back to back
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
        self.lengths = [0] * max_batch  # tokens cached per slot
        self.free = list(range(max_batch))  # free slots, lowest first
        self.bound: Bound | None = None
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
        elif bound.packed:
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
        """Set up a forward of rows `slots` feeding n_tokens[i] real tokens each (padded to T).
        Returns position_ids (n, T) and the additive mask (n, 1, T, span)."""
        if len(slots) == 1:
            return self._bind_one(slots[0], n_tokens[0], position_limit)
        lengths = torch.tensor([self.lengths[s] for s in slots])
        counts = torch.tensor(list(n_tokens))
        offsets = torch.arange(int(counts.max()))
        valid = offsets[None, :] < counts[:, None]  # (n, T)
        positions = lengths[:, None] + offsets[None, :]  # (n, T)
        span = int((lengths + counts).max())
        self._room(span)
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

    def _bind_one(self, slot: int, count: int, position_limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`bind` for one row (a batch of one, a prefill, a per-request drafter): its tokens a
        window of its slot, its mask causal over them only — the same tensors as the rows'
        way, in a few ops (that way took ~0.2 ms, 2 % of the reference pair's plain step)."""
        start = self.lengths[slot]
        span = start + count
        self._room(span)
        self.bound = Bound(torch.tensor([slot], device=self.device), slot, None, None, None, span,
                           (slot, start, span))
        positions = torch.arange(start, span, device=self.device)[None].clamp(max=position_limit - 1)
        mask = torch.zeros((1, 1, count, span), dtype=self.dtype, device=self.device)
        if count > 1:  # query t sees its row up to position start + t
            later = torch.ones((count, count), dtype=torch.bool, device=self.device).triu_(1)
            mask[0, 0, :, start:].masked_fill_(later, torch.finfo(self.dtype).min)
        return positions, mask

    def _room(self, span: int) -> None:
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
                **extra) -> torch.Tensor:
        """Logits (n, T, V) of the rows' token lists, right-padded, each written at its row's
        own offset; rows fed in slot order read the store as a view. Packed, the logits are a
        view valid until the next packed forward. The rows' lengths are the caller's to advance
        (a verify keeps only the accepted part). `last` and `extra` (logits_to_keep) as
        cached_forward takes them. `scored`: per row, how many of its last positions the
        caller reads (0 for a prompt chunk, 1 + k for a verify after the rest of a prompt:
        Engine.step_batch); the logits are then those rows' only, in order, each from its
        first scored position."""
        first, n = slots[0], len(slots)
        gaps = slots[-1] - first + 1 - n
        if sorted(slots) == list(slots) and 0 < gaps <= n:
            # rows in slot order with a few free slots between them (a row left, no request
            # took its slot): a filler row for each gap — one token into the free slot, its
            # logits dropped — so the forward still reads a view of the store rather than
            # gathering every layer's K and V (at 14 of 16 rows the gather took a step from
            # ~30 to ~70 ms; the filler costs what a row does). The filler's write is
            # overwritten when a request next claims the slot. Where the gaps outnumber the
            # rows (a run's last few requests), the fillers cost more than the gather: over
            # a 16-slot span, 3 rows took 97 ms with fillers and 45 gathered on SmolLM2,
            # 13.6 and 7.6 on the reference pair; 8 rows 100 / 84 and 13.4 / 14.0
            given = dict(zip(slots, inputs))
            wanted = dict(zip(slots, scored if scored is not None else map(len, inputs)))
            full = list(range(first, slots[-1] + 1))
            return self.forward(model, kwarg, full, [given.get(s, [0]) for s in full],
                                position_limit, last, [wanted.get(s, 0) for s in full], **extra)
        counts = [len(ids) for ids in inputs]
        width = max(counts)
        scored = counts if scored is None else list(scored)
        keep = [i for i in range(n) if scored[i]]
        partial = scored != counts
        whole = all(k in (0, c) for k, c in zip(scored, counts))  # rows scored all or not at all
        # rows of unequal widths, or a row scored in part: packed, where the model's attention
        # unpacks (a forward given `last` or logits_to_keep stays padded)
        packed = last is None and not extra and (min(counts) < width or not whole) and packs(model)
        if not (whole or packed):
            raise ValueError("a row scored in part needs a packing model (rows attention)")
        position_ids, mask = self.bind(slots, counts, position_limit)
        bound = self.bound
        if packed:
            bound.packed = True
            input_ids = torch.tensor([[t for ids in inputs for t in ids]], device=self.device)
            position_ids = position_ids[bound.valid][None]
            packing = Packing.of(counts, self.device)
            token = _PACKED.set(packing)
            if partial:  # the scored positions in the packed sequence
                ends = list(itertools.accumulate(counts))
                positions = [p for i in keep for p in range(ends[i] - scored[i], ends[i])]
            if partial and keeps_logits(type(model)):
                # the head over the scored rows' positions only (a chunk's 64 positions
                # through SmolLM2's 49k-word head would cost a third of a 16-row step)
                extra = {"logits_to_keep": torch.tensor(positions, device=self.device)}
        else:
            input_ids = torch.tensor([ids + [0] * (width - len(ids)) for ids in inputs],
                                     device=self.device)
        try:
            if self.hidden is None:
                logits = cached_forward(model, input_ids, self, kwarg, last,
                                        position_ids=position_ids, attention_mask=mask, **extra)
            else:
                logits, hidden = cached_forward(model, input_ids, self, kwarg, last,
                                                position_ids=position_ids, attention_mask=mask,
                                                output_hidden_states=True, **extra)
                self._keep_hidden(hidden)
        finally:
            self.bound = None
            if packed:
                _PACKED.reset(token)
        if not packed:
            return logits[keep] if partial else logits
        # back to (n, T, V), right-padded (the padding's logits are never read), into one buffer
        # reused from forward to forward: valid until this cache's next packed forward. A fresh
        # one (16 rows, one 17 wide, SmolLM2's 49k vocabulary: 53 MB) cost 10 ms a step in
        # page faults
        if partial and "logits_to_keep" not in extra:
            logits = logits[:, positions]
        kept = [scored[i] for i in keep]
        n, width = len(kept), max(kept)
        flat = packing.flat if not partial else torch.tensor(
            [i * width + t for i, c in enumerate(kept) for t in range(c)], device=self.device)
        size, vocab = n * width, logits.shape[-1]
        if self._unpacked is None or len(self._unpacked) < size or self._unpacked.shape[1] != vocab:
            self._unpacked = logits.new_empty((size, vocab))
        out = self._unpacked[:size]
        out.index_copy_(0, flat, logits[0])
        return out.view(n, width, -1)
