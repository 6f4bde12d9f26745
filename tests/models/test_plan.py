"""models/plan.py: a RowCache forward's plan, checked value by value on hand-written rows."""
import pytest
import torch

from autospec.models.plan import fill, place, plan

M = torch.finfo(torch.float32).min  # a masked position
LIMIT = 100  # the model's positions


def _place(lengths, slots, counts, limit=LIMIT):
    return place(lengths, slots, counts, limit, torch.float32, "cpu")


def test_rows_in_slot_order_with_a_few_gaps_get_filler_rows():
    # slot 1 free between rows 0 and 2: one token into it, scored 0
    assert fill([0, 2, 3], [[5], [6, 7], [8]], None) == (
        [0, 1, 2, 3], [[5], [0], [6, 7], [8]], [1, 0, 2, 1])
    assert fill([0, 2, 3], [[5], [6, 7], [8]], [1, 0, 2]) == (
        [0, 1, 2, 3], [[5], [0], [6, 7], [8]], [1, 0, 0, 2])


@pytest.mark.parametrize("slots", [[0, 1, 2], [0, 4], [3, 0, 2]])
def test_consecutive_far_apart_or_unordered_rows_are_left_as_they_are(slots):
    # consecutive: a view already; gaps outnumbering the rows (0 and 4): gathered rather than
    # three filler rows; out of slot order: gathered
    inputs = [[7]] * len(slots)
    assert fill(slots, inputs, None) == (slots, inputs, None)


def test_rows_of_different_lengths_get_their_own_positions_and_mask():
    batch = _place([3, 1, 0, 5], [0, 1], [2, 1])
    assert batch.first == 0 and batch.window is None and batch.span == 5
    assert batch.slots.tolist() == [0, 1]
    assert batch.position_ids.tolist() == [[3, 4], [1, 2]]  # row 1's second: padding
    assert batch.valid.tolist() == [[True, True], [True, False]]
    assert batch.write_slot.tolist() == [0, 0, 1] and batch.write_pos.tolist() == [3, 4, 1]
    assert batch.mask.shape == (2, 1, 2, 5) and batch.mask.dtype == torch.float32
    assert batch.mask[:, 0].tolist() == [
        [[0, 0, 0, 0, M], [0, 0, 0, 0, 0]],  # row 0 at 3 and 4: its 3 cached, then causal
        [[0, 0, M, M, M], [0, 0, 0, M, M]]]  # row 1 at 1, its padding at 2


def test_three_rows_out_of_slot_order_are_gathered():
    batch = _place([3, 1, 0, 5], [3, 0, 2], [1, 2, 3])
    assert batch.first is None and batch.span == 6
    assert batch.slots.tolist() == [3, 0, 2]
    assert batch.position_ids.tolist() == [[5, 6, 7], [3, 4, 5], [0, 1, 2]]
    assert batch.write_slot.tolist() == [3, 0, 0, 2, 2, 2]
    assert batch.write_pos.tolist() == [5, 3, 4, 0, 1, 2]
    assert batch.mask[:, 0].tolist() == [
        [[0, 0, 0, 0, 0, 0], [0] * 6, [0] * 6],  # row at 5: sees 0..5, its padding too
        [[0, 0, 0, 0, M, M], [0, 0, 0, 0, 0, M], [0] * 6],
        [[0, M, M, M, M, M], [0, 0, M, M, M, M], [0, 0, 0, M, M, M]]]
    store = torch.arange(4 * 2 * 8.0).view(4, 1, 8, 2)  # (B_max, H, L_max, D)
    rows = batch.read(store)
    assert torch.equal(rows, store[[3, 0, 2], :, :6])
    assert rows.data_ptr() != store.data_ptr()  # a copy


def test_consecutive_rows_read_a_view_of_the_store():
    batch = _place([2, 4, 0], [1, 2], [1, 1])
    assert batch.first == 1
    store = torch.zeros(3, 1, 8, 2)
    rows = batch.read(store)
    assert rows.shape == (2, 1, 5, 2)
    assert rows.data_ptr() == store[1].data_ptr()  # a view


def test_positions_past_the_models_limit_are_clamped_but_written_where_they_are():
    batch = _place([0, 6], [0, 1], [1, 3], limit=7)
    assert batch.position_ids.tolist() == [[0, 1, 2], [6, 6, 6]]  # row 1 at 6, 7, 8 -> 6
    assert batch.write_pos.tolist() == [0, 6, 7, 8]


def test_one_row_is_a_window_of_its_slot():
    batch = _place([0, 4], [1], [3])
    assert (batch.first, batch.window, batch.span) == (1, (1, 4, 7), 7)
    assert batch.write_slot is None and batch.write_pos is None and batch.valid is None
    assert batch.position_ids.tolist() == [[4, 5, 6]]
    assert batch.mask[0, 0].tolist() == [[0, 0, 0, 0, 0, M, M], [0, 0, 0, 0, 0, 0, M], [0] * 7]
    assert _place([0, 4], [1], [1]).mask.tolist() == [[[[0] * 5]]]


def _plan(placed, inputs, scored=None, last=None, keep=None, packs=True, keeps_logits=True):
    return plan(placed, inputs, scored, last, keep, lambda: packs, keeps_logits)


def test_rows_of_one_width_stay_padded():
    placed = _place([3, 1], [0, 1], [2, 2])
    batch = _plan(placed, [[5, 6], [7, 8]])
    assert batch.input_ids.tolist() == [[5, 6], [7, 8]]
    assert batch.packing is None and batch.rows is None and batch.logits_to_keep is None
    assert batch.position_ids is placed.position_ids and batch.mask is placed.mask
    assert placed.input_ids is None  # the placement is left as it was


def test_rows_of_unequal_widths_are_packed_where_the_model_unpacks():
    placed = _place([3, 1], [0, 1], [2, 1])
    padded = _plan(placed, [[5, 6], [7]], packs=False)
    assert padded.input_ids.tolist() == [[5, 6], [7, 0]] and padded.packing is None
    packed = _plan(placed, [[5, 6], [7]])
    assert packed.input_ids.tolist() == [[5, 6, 7]]  # back to back
    assert packed.position_ids.tolist() == [[3, 4, 1]]
    assert packed.packing.flat.tolist() == [0, 1, 2] and packed.unpack.tolist() == [0, 1, 2]
    assert packed.unpacked == (2, 2) and packed.logits_to_keep is None and packed.picked is None
    assert packed.mask is placed.mask  # attention unpacks the rows: their padded mask


@pytest.mark.parametrize("keeps_logits", [True, False])
def test_a_forward_given_last_or_positions_to_keep_stays_padded(keeps_logits):
    placed = _place([3, 1], [0, 1], [2, 1])
    batch = _plan(placed, [[5, 6], [7]], last=1, keeps_logits=keeps_logits)
    assert batch.packing is None and batch.input_ids.tolist() == [[5, 6], [7, 0]]
    assert batch.logits_to_keep == (1 if keeps_logits else None)  # else every position
    keep = torch.tensor([0, 1])
    assert _plan(placed, [[5, 6], [7]], keep=keep).logits_to_keep is keep


def test_filler_and_unscored_rows_are_dropped_from_a_padded_forwards_logits():
    slots, inputs, scored = fill([0, 2, 3], [[5], [6], [8]], [1, 0, 1])
    batch = _plan(_place([3, 0, 1, 2], slots, [1] * 4), inputs, scored)
    assert batch.packing is None and batch.rows == [0, 3]
    assert batch.input_ids.tolist() == [[5], [0], [6], [8]]


@pytest.mark.parametrize("keeps_logits", [True, False])
def test_a_row_scored_in_part_is_packed_and_only_its_scored_positions_come_back(keeps_logits):
    # a decoding row, a prompt chunk (scored 0), a verify after its prompt's last 1 (scored 2)
    placed = _place([3, 2, 0], [0, 1, 2], [1, 5, 3])
    inputs, scored = [[1], [2] * 5, [3, 4, 5]], [1, 0, 2]
    batch = _plan(placed, inputs, scored, keeps_logits=keeps_logits)
    assert batch.input_ids.tolist() == [[1, 2, 2, 2, 2, 2, 3, 4, 5]]
    assert batch.position_ids.tolist() == [[3, 2, 3, 4, 5, 6, 0, 1, 2]]
    at = [0, 7, 8]  # the scored positions in the packed sequence
    if keeps_logits:  # the head over those only
        assert batch.logits_to_keep.tolist() == at and batch.picked is None
    else:
        assert batch.logits_to_keep is None and batch.picked.tolist() == at
    assert batch.unpacked == (2, 2) and batch.unpack.tolist() == [0, 2, 3]
    with pytest.raises(ValueError, match="packing model"):
        _plan(placed, inputs, scored, packs=False)


def test_one_row_scored_in_part_keeps_its_positions():
    batch = _plan(_place([0, 4], [1], [4]), [[9, 8, 7, 6]], [2])
    assert batch.packing is not None and batch.window == (1, 4, 8)
    assert batch.position_ids.tolist() == [[4, 5, 6, 7]]
    assert batch.logits_to_keep.tolist() == [2, 3] and batch.unpack.tolist() == [0, 1]
