"""RowCache's packed forward: rows of unequal widths computed as their real tokens only, with
the logits of the padded forward."""
import pytest
import torch

from autospec.engine.loop import Engine
from autospec.models.attention import ROWS_ATTENTION, Packing, pack_rows, packs
from autospec.models import quantized
from autospec.models.kv import RowCache, cache_kwarg
from conftest import assert_lossless, random_llama

WIDTHS = [[7, 8, 9], [11], [12, 13, 14, 15, 16], [17, 18]]


def _rows(model, packed: bool):
    """Four rows at their own lengths, two verify-like forwards of unequal widths: each row's
    logits (its real tokens), and the tokens the model was fed (a spy on its input_ids)."""
    seen = []
    hook = model.model.embed_tokens.register_forward_pre_hook(  # what every forward embeds
        lambda _, args: seen.append(tuple(args[0].shape)))
    kwarg = cache_kwarg(model)
    model.config._attn_implementation = ROWS_ATTENTION if packed else "sdpa"
    cache = RowCache(model, 4, 128)
    out = []
    try:
        with torch.inference_mode():
            for slot, length in enumerate([30, 50, 10, 70]):
                cache.claim()
                cache.forward(model, kwarg, [slot], [[t % 32 for t in range(3, 3 + length)]], 128, last=1)
                cache.lengths[slot] = length
            for inputs in (WIDTHS, [[1], list(range(2, 13)), [4], [5]]):
                logits = cache.forward(model, kwarg, [0, 1, 2, 3], inputs, 128)
                out += [logits[i, :len(ids)].clone() for i, ids in enumerate(inputs)]  # a view
                for slot, ids in enumerate(inputs):
                    cache.lengths[slot] += len(ids)
    finally:
        hook.remove()
    return out, seen[4:]


def test_packed_rows_give_the_padded_forwards_logits_from_their_real_tokens_only():
    model = random_llama(32, seed=3, layers=2)
    # both routes of a packed forward: WIDTHS (3 of 4 rows wide) one padded pass; the second
    # forward (1 of 4 wide, padding 3 x 10 positions) every row's first token, then the wide
    # row's others apart
    assert Packing.of([3, 1, 5, 2], "cpu").wide is None
    assert Packing.of([1, 11, 1, 1], "cpu").wide.tolist() == [1]
    assert Packing.of([1, 2, 1, 1], "cpu").wide is None  # saves 3 positions
    assert Packing.of([1, 11, 1, 1], "cpu", one_pass=11).wide is None  # the kernel's one pass
    padded, padded_inputs = _rows(model, packed=False)
    packed, packed_inputs = _rows(model, packed=True)
    assert padded_inputs == [(4, 5), (4, 11)]
    assert packed_inputs == [(1, 11), (1, 14)]  # the rows' tokens back to back
    for a, b in zip(padded, packed):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_an_engine_packs_its_target_and_other_forwards_keep_their_attention(reference_pair):
    engine = Engine(reference_pair, max_batch=2, max_len=256)
    assert engine.packed and packs(reference_pair.target)
    # outside a RowCache forward (transformers' own generate, the hf: peers) attention and
    # masks are sdpa's: the same tokens as before packing was enabled, prompt lookup included
    # (the near-tie rule: another implementation's forwards, trained weights)
    ids = torch.tensor([reference_pair.tokenizer.encode("def f(x):\n    return x\n\ndef f(")])
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        for extra in ({}, {"prompt_lookup_num_tokens": 4}):
            out = reference_pair.target.generate(ids, attention_mask=mask, max_new_tokens=12,
                                                 do_sample=False, **extra)
            first = engine.generate(ids[0].tolist(), drafter=None, max_new_tokens=12)
            assert_lossless(reference_pair, ids[0].tolist(), first.token_ids,
                            out[0, ids.shape[1]:].tolist())
    # a model whose attention is not sdpa is left as it is (padded forwards)
    eager = random_llama(32, seed=1)
    eager.config._attn_implementation = "eager"
    assert not pack_rows(eager) and eager.config._attn_implementation == "eager"


def test_grouped_attention_is_sdpas_with_shared_kv_heads_and_the_rows_mask():
    """Rows of a few tokens attend by grouped_attention (several rows, or one, its mask
    additive or boolean): transformers' sdpa's outputs,
    query heads sharing key/value heads (SmolLM2: 9 over 3)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from autospec.models.attention import grouped_attention, rows_attention

    gen = torch.Generator().manual_seed(0)
    n, heads, kv_heads, width, span, dim = 5, 9, 3, 3, 40, 16
    query = torch.randn(n, heads, width, dim, generator=gen)
    key, value = (torch.randn(n, kv_heads, span, dim, generator=gen) for _ in range(2))
    lengths = torch.tensor([10, 37, 0, 20, 5])  # each row's cached tokens: its own mask
    allowed = torch.arange(span)[None, None, :] <= (lengths[:, None, None] + torch.arange(width)[None, :, None])
    mask = torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)[:, None]

    class Module:  # what transformers' sdpa reads off the attention module
        num_key_value_groups, training, is_causal = heads // kv_heads, False, False

    expected, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](Module(), query, key, value, mask, scaling=0.3, dropout=0.0)
    torch.testing.assert_close(grouped_attention(query, key, value, mask, 0.3), expected)
    out, _ = rows_attention(Module(), query, key, value, mask, scaling=0.3, dropout=0.0)
    torch.testing.assert_close(out, expected)
    for row in range(n):  # one row alone
        one = slice(row, row + 1)
        for row_mask in (mask[one], allowed[one][:, None]):
            out, _ = rows_attention(Module(), query[one], key[one], value[one], row_mask,
                                    scaling=0.3, dropout=0.0)
            torch.testing.assert_close(out, expected[one])
    last = slice(1, 2)  # its last query sees every position it holds: no mask needed
    out = grouped_attention(query[last, :, -1:], key[last, :, :40], value[last, :, :40], None, 0.3)
    torch.testing.assert_close(out, expected[last, -1:])


@pytest.mark.skipif(not quantized.amx(), reason="no AMX here: rows attend by sdpa")
@pytest.mark.parametrize("width,span", [(1, 5), (1, 16), (1, 300), (2, 33), (5, 301), (6, 40),
                                        (17, 200)])
def test_the_rows_kernel_is_sdpas_attention_within_bfloat16_rounding(width, span):
    """A batch's rows in bfloat16 on AMX attend by autospec::rows_attention (rows_kernel): sdpa's
    outputs under the rows' additive or boolean mask to bfloat16's rounding, each row at its
    own length (one seeing its whole span), spans not a multiple of 16 or 32 included, and the
    cache a view of a wider store, as RowCache hands it."""
    from autospec.models.attention import grouped_attention, rows_kernel, sdpa_grouped

    gen = torch.Generator().manual_seed(width * 1000 + span)
    n, heads, kv_heads, dim = 6, 9, 3, 64
    query = torch.randn(n, heads, width, dim, generator=gen).to(torch.bfloat16)
    store = [torch.randn(n, kv_heads, span + 20, dim, generator=gen).to(torch.bfloat16)
             for _ in range(2)]
    key, value = (t[:, :, :span] for t in store)
    lengths = torch.randint(0, span - width + 1, (n,), generator=gen)
    lengths[0] = span - width
    allowed = torch.arange(span)[None, None, :] <= (lengths[:, None, None]
                                                    + torch.arange(width)[None, :, None])
    additive = torch.zeros(allowed.shape, dtype=torch.bfloat16).masked_fill_(
        ~allowed, torch.finfo(torch.bfloat16).min)[:, None]
    expected = sdpa_grouped(query, key, value, additive, 0.125)
    for mask in (additive, allowed[:, None]):
        got = rows_kernel(query, key, value, mask, 0.125)
        assert got.shape == expected.shape == (n, width, heads, dim)
        torch.testing.assert_close(got.float(), expected.float(), atol=1.6e-2, rtol=1.6e-2)
    assert torch.equal(grouped_attention(query, key, value, additive, 0.125),
                       rows_kernel(query, key, value, additive, 0.125))


@pytest.mark.skipif(not quantized.amx(), reason="no AMX here: the layer attends by sdpa")
@pytest.mark.parametrize("width", [1, 3, 17])
def test_the_compiled_layer_attends_by_the_kernel_as_by_sdpa(width):
    """models/compiled.py's one-row layer with `kernel` (bfloat16, head dim 64, on AMX) gives
    sdpa's layer within bfloat16's rounding, SmolLM2's heads (9 over 3), its K and V written
    the same, the cache a view of a wider store at a start off the tiles' multiples."""
    from autospec.models.compiled import one_row_layer
    gen = torch.Generator().manual_seed(width)
    hidden, heads, kv_heads, dim, inner = 576, 9, 3, 64, 256

    def weight(n, k):
        return (torch.randn(n, k, generator=gen) * k ** -0.5).to(torch.bfloat16)
    weights = (torch.ones(hidden, dtype=torch.bfloat16), torch.ones(hidden, dtype=torch.bfloat16),
               weight((heads + 2 * kv_heads) * dim, hidden), weight(hidden, heads * dim),
               weight(2 * inner, hidden), weight(hidden, inner))
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    x = torch.randn(width, hidden, generator=gen).to(torch.bfloat16)
    start, capacity = 93, 160
    past = [torch.randn(1, kv_heads, capacity, dim, generator=gen).to(torch.bfloat16)
            for _ in range(2)]
    outs, caches = [], []
    for kernel in (False, True):
        key, value = (t.clone() for t in past)
        with torch.inference_mode():
            outs.append(one_row_layer(x, start, inv_freq, key, value, weights, 1e-5, kernel))
        caches.append((key, value))
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    torch.testing.assert_close(outs[1].float(), outs[0].float(), atol=3e-2, rtol=1.6e-2)


def test_rows_attend_padded_as_wide_as_one_pass_of_the_kernel():
    """A batch's rows of a model whose rows run the kernel attend padded up to a key/value
    head's queries in one pass (9 query heads over 3: 5 wide); a float32 model's, a model of
    other head dims, and one row's cache by the two_passes rule alone."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def llama(heads: int, kv_heads: int, dim: int, dtype):
        cfg = LlamaConfig(vocab_size=32, hidden_size=heads * dim, intermediate_size=32,
                          num_hidden_layers=1, num_attention_heads=heads,
                          num_key_value_heads=kv_heads, max_position_embeddings=64)
        return LlamaForCausalLM(cfg).to(dtype).eval()

    smol = llama(9, 3, 64, torch.bfloat16)
    assert RowCache(smol, 4, 64).one_pass == (5 if quantized.amx() else 0)
    assert RowCache(smol, 1, 64).one_pass == 0
    assert RowCache(llama(9, 3, 64, torch.float32), 4, 64).one_pass == 0
    assert RowCache(llama(4, 2, 32, torch.bfloat16), 4, 64).one_pass == 0


def test_the_rows_kernel_refuses_what_it_does_not_attend():
    if not quantized.available():
        pytest.skip("kernels not built here")
    q = torch.zeros(2, 9, 6, 32, dtype=torch.bfloat16)  # head dims 32, not 64
    kv = torch.zeros(2, 3, 10, 32, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"q \(n, H, T, 64\)"):
        torch.ops.autospec.rows_attention(q, kv, kv, torch.ones(2, 6, dtype=torch.int32), 0.1)


def test_one_rows_bind_gives_the_rows_positions_and_mask():
    """A row bound alone (plan.place: a window of its slot) gets the positions and causal mask the
    rows' way gives it beside another row: prefills, one token, a verify, past a start."""
    cache = RowCache(random_llama(64, seed=3, layers=2), 3, 100)
    for _ in range(3):
        cache.claim()
    for slot, start, count in ((0, 0, 7), (1, 5, 1), (2, 40, 4), (1, 9, 17)):
        cache.lengths[slot] = start
        positions, mask = cache.bind([slot], [count], 100)
        assert cache.bound.window == (slot, start, start + count)
        cache.bound = None
        other = (slot + 1) % 3
        cache.lengths[other] = 0
        rows = sorted([slot, other])
        both_positions, both_mask = cache.bind(rows, [count, count], 100)
        cache.bound = None
        row = rows.index(slot)
        assert torch.equal(positions, both_positions[row:row + 1])
        assert torch.equal(mask, both_mask[row:row + 1, :, :, :start + count])
