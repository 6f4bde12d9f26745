"""The plan of a RowCache forward (models/kv.py), as a value: the rows it runs, where each token
is written and at what position, what each query sees, whether the rows are packed, which
logits the caller gets back. Pure functions of the cache's lengths and the request, so that
each decision is checked on hand-written cases (tests/models/test_plan.py) and the forward
only runs what they return.

Three steps: `fill` (the rows: filler rows in free slots), `place` (where they sit: what
RowCache.bind holds for a caller that feeds the model itself, the eagle head) and `plan` (the
model's input, the packing, the logits kept).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch

from autospec.models.attention import Packing


@dataclass(frozen=True)
class ForwardBatch:
    """One forward over a RowCache: n rows (filler rows included) of at most T tokens, N real
    tokens in all; right-padded to (n, T), or packed: the real tokens back to back, (1, N)."""
    slots: torch.Tensor  # (n,) long: each row's slot, in the forward's row order
    # the rows' first slot where they are consecutive slots in order (s, s+1, ...): the forward
    # reads a view of the store; None: it gathers the rows, a copy of every layer's K and V up
    # to the span (at 16 rows it tripled a step: engine/loop.py feeds its rows in slot order)
    first: int | None
    # one row (a batch of one, a prefill, a per-request drafter): (slot, start, stop), its
    # tokens written as a slice, the same entries as the indexed write — which made a plain
    # step at batch 1 on the reference pair 11.5 ms a token instead of 10.5 (9 %); None: rows
    window: tuple[int, int, int] | None
    span: int  # cache positions read: max over rows of length_i + tokens_i
    write_slot: torch.Tensor | None  # (N,) long: each real token's slot, row by row (None: window)
    write_pos: torch.Tensor | None  # (N,) long: its cache position (None: window)
    valid: torch.Tensor | None  # (n, T) bool: a real token, not padding (None: window)
    # (n, T) long: row i's token t at length_i + t, clamped to the model's last position
    # (padding may run past it: its output is unused); packed, (1, N): the real tokens'
    position_ids: torch.Tensor
    # (n, 1, T, span) additive, the model's dtype: 0 where row i's query t sees cache position
    # p <= length_i + t (its own prefix and causal part, never another row's entries nor its
    # padding), the dtype's min elsewhere
    mask: torch.Tensor
    # the model's input, (n, T) long right-padded with 0 or packed (1, N); None where the
    # caller feeds its own (RowCache.bind)
    input_ids: torch.Tensor | None = None
    packing: Packing | None = None  # packed: where the rows sit, for attention to unpack
    # what the head scores: the last k positions (int), the positions (K,) long of the
    # input's width, or all of them (None)
    logits_to_keep: int | torch.Tensor | None = None
    rows: list[int] | None = None  # padded: the rows whose logits come back; None: every row
    # packed, scored in part, by a head without logits_to_keep: the scored positions (K,) long
    # taken from its logits over every position
    picked: torch.Tensor | None = None
    # packed: the logits come back right-padded, (rows scored, most positions a row scored),
    # each scored position at its index (K,) long in that layout flattened
    unpacked: tuple[int, int] | None = None
    unpack: torch.Tensor | None = None

    def read(self, store: torch.Tensor) -> torch.Tensor:
        """A layer's (B_max, H, L_max, D) store -> the forward's rows, (n, H, span, D)."""
        if self.first is not None:
            return store[self.first:self.first + len(self.slots), :, :self.span]
        return store[:, :, :self.span].index_select(0, self.slots)  # 0.7x store[slots, :, :span]


def fill(slots: Sequence[int], inputs: Sequence[list[int]], scored: Sequence[int] | None
         ) -> tuple[Sequence[int], Sequence[list[int]], Sequence[int] | None]:
    """The rows a forward runs, their token lists and scored counts. Rows in slot order with a
    few free slots between them (a row left, no request took its slot) get a filler row in each
    — one token into the free slot, scored 0 — so the forward still reads a view of the store
    rather than gathering every layer's K and V (at 14 of 16 rows the gather took a step from
    ~30 to ~70 ms; the filler costs what a row does). The filler's write is overwritten when a
    request next claims the slot. Where the gaps outnumber the rows (a run's last few
    requests), the fillers cost more than the gather: over a 16-slot span, 3 rows took 97 ms
    with fillers and 45 gathered on SmolLM2, 13.6 and 7.6 on the reference pair; 8 rows
    100 / 84 and 13.4 / 14.0."""
    first, n = slots[0], len(slots)
    gaps = slots[-1] - first + 1 - n
    if not (0 < gaps <= n and sorted(slots) == list(slots)):
        return slots, inputs, scored
    given = dict(zip(slots, inputs))
    wanted = dict(zip(slots, scored if scored is not None else map(len, inputs)))
    full = list(range(first, slots[-1] + 1))
    return full, [given.get(s, [0]) for s in full], [wanted.get(s, 0) for s in full]


def place(lengths: Sequence[int], slots: Sequence[int], counts: Sequence[int],
          position_limit: int, dtype: torch.dtype, device) -> ForwardBatch:
    """Rows `slots` (holding lengths[slot] tokens) feeding counts[i] tokens each, padded: where
    each token is written, its position, what each query sees."""
    if len(slots) == 1:
        return _place_one(slots[0], lengths[slots[0]], counts[0], position_limit, dtype, device)
    held = torch.tensor([lengths[s] for s in slots])
    fed = torch.tensor(list(counts))
    offsets = torch.arange(int(fed.max()))
    valid = offsets[None, :] < fed[:, None]  # (n, T)
    positions = held[:, None] + offsets[None, :]  # (n, T)
    span = int((held + fed).max())
    slot_ids = torch.tensor(list(slots))
    first = slots[0] if list(slots) == list(range(slots[0], slots[0] + len(slots))) else None
    # row i's query t (position length_i + t) sees cache positions 0 .. length_i + t
    allowed = torch.arange(span)[None, None, :] <= positions[:, :, None]  # (n, T, span)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return ForwardBatch(slot_ids.to(device), first, None, span,
                        slot_ids[:, None].expand_as(valid)[valid].to(device),
                        positions[valid].to(device), valid.to(device),
                        positions.clamp(max=position_limit - 1).to(device),
                        mask[:, None].to(device))


def _place_one(slot: int, start: int, count: int, position_limit: int, dtype: torch.dtype,
               device) -> ForwardBatch:
    """`place` for one row: its tokens a window of its slot, its mask causal over them only —
    the same tensors as the rows' way, in a few ops (that way took ~0.2 ms, 2 % of the
    reference pair's plain step)."""
    span = start + count
    positions = torch.arange(start, span, device=device)[None].clamp(max=position_limit - 1)
    mask = torch.zeros((1, 1, count, span), dtype=dtype, device=device)
    if count > 1:  # query t sees its row up to position start + t
        later = torch.ones((count, count), dtype=torch.bool, device=device).triu_(1)
        mask[0, 0, :, start:].masked_fill_(later, torch.finfo(dtype).min)
    return ForwardBatch(torch.tensor([slot], device=device), slot, (slot, start, span), span,
                        None, None, None, positions, mask)


def plan(placed: ForwardBatch, inputs: Sequence[list[int]], scored: Sequence[int] | None,
         last: int | None, keep: torch.Tensor | None, packs: Callable[[], bool],
         keeps_logits: bool, one_pass: int = 0) -> ForwardBatch:
    """The forward of the rows' token lists `inputs` over rows `placed`. `scored`: per row, how
    many of its last positions the caller reads (None: all; 0 for a prompt chunk, 1 + k for a
    verify after the rest of a prompt: Engine.step_batch); `last`: the head over the last
    `last` positions only (a prefill needs none or one: the LM head over a whole prompt costs
    as much as several decode steps); `keep`: the caller's positions for the head
    (logits_to_keep); `packs`: whether the model's attention unpacks rows (rows_attention),
    asked only where the rows would pack (transformers' config takes ~3 us to read it, a
    third of planning a plain step); `keeps_logits`: its forward takes logits_to_keep;
    `one_pass`: rows up to this wide attend padded (attention.py `one_pass_width`)."""
    counts = [len(ids) for ids in inputs]
    width = max(counts)
    scored = counts if scored is None else list(scored)
    kept = [i for i, k in enumerate(scored) if k]
    partial = scored != counts
    whole = all(k in (0, c) for k, c in zip(scored, counts))  # rows scored all or not at all
    device = placed.mask.device
    # rows of unequal widths, or a row scored in part: packed, the linear layers computing
    # only the real tokens (a forward given `last` or `keep` stays padded)
    if not (last is None and keep is None and (min(counts) < width or not whole) and packs()):
        if not whole:
            raise ValueError("a row scored in part needs a packing model (rows attention)")
        return replace(placed, rows=kept if partial else None,
                       input_ids=torch.tensor([ids + [0] * (width - len(ids)) for ids in inputs],
                                              device=device),
                       logits_to_keep=keep if keep is not None else last if keeps_logits else None)
    packing = Packing.of(counts, device, one_pass)
    ids = torch.tensor([[t for row in inputs for t in row]], device=device)
    positions = (placed.position_ids if placed.valid is None  # one row: already (1, N)
                 else placed.position_ids[placed.valid][None])
    if not partial:
        return replace(placed, input_ids=ids, position_ids=positions, packing=packing,
                       unpacked=(len(counts), width), unpack=packing.flat)
    ends = list(itertools.accumulate(counts))
    # the scored positions in the packed sequence: the head over these only where it can (a
    # chunk's 64 positions through SmolLM2's 49k-word head would cost a third of a 16-row step)
    at = torch.tensor([p for i in kept for p in range(ends[i] - scored[i], ends[i])], device=device)
    shown = [scored[i] for i in kept]
    most = max(shown)
    unpack = [j * most + t for j, c in enumerate(shown) for t in range(c)]
    return replace(placed, input_ids=ids, position_ids=positions, packing=packing,
                   logits_to_keep=at if keeps_logits else None,
                   picked=None if keeps_logits else at, unpacked=(len(shown), most),
                   unpack=torch.tensor(unpack, device=device))
