"""models/forward.py: the Llama forward over a RowCache computes what transformers' does (its
products by oneDNN round differently in the last bits: close, and the same argmax)."""
import pytest
import torch

from autospec.models import forward, products
from autospec.models.attention import pack_rows
from autospec.models.eagle_head import EagleHead
from autospec.models.forward import fits
from autospec.models.kv import RowCache, cache_kwarg
from autospec.models.pair import early_exit_view
from tests.conftest import random_llama

# a prefill of unequal prompts, then decode and verify steps of mixed widths (packed), then a
# prompt chunk beside decoding rows with a row scored in part
STEPS = [
    ([[(7 * i + 3 * j) % 60 + 2 for j in range(12 + 5 * i)] for i in range(4)], None),
    ([[11], [12, 13, 14], [15], [16]], None),
    ([[17, 17], [18], [19], [20] * 5], None),
    ([[21], [22] * 30, [23], [24, 25]], [1, 0, 1, 2]),
    ([[26]], None),  # one row, one token (a plain step at batch 1: MIN_PACKED_ONE's path)
]


@pytest.fixture(autouse=True)
def every_product_by_onednn(monkeypatch):
    """These models' weights are below MIN_PACKED: oneDNN for them too, as for SmolLM2's."""
    monkeypatch.setattr(products, "MIN_PACKED", 0)
    monkeypatch.setattr(products, "MIN_PACKED_ONE", 0)


def _forwards(model, ours: bool, keep_hidden: bool):
    model._autospec_fits = None if ours else False  # False: transformers' forward
    cache = RowCache(model, 4, 128, keep_hidden=keep_hidden)
    slots = [cache.claim() for _ in range(4)]
    outs = []
    with torch.inference_mode():
        for feeds, scored in STEPS:
            outs.append(cache.forward(model, cache_kwarg(model), slots[:len(feeds)], feeds, 128,
                                      scored=scored).clone())
            for slot, feed in zip(slots, feeds):
                cache.lengths[slot] += len(feed)
    model._autospec_fits = None
    return outs + ([cache.hidden.clone()] if keep_hidden else [])


def grouped_llama():
    """4 query heads over 2 key/value heads, as SmolLM2's 9 over 3 (random_llama's are 2 and 2):
    the stacked Q, K, V product is split where the heads are."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(7)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        eos_token_id=None, bos_token_id=None, pad_token_id=None)).eval()


@pytest.mark.parametrize("keep_hidden", [False, True])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("grouped", [False, True])
def test_the_llama_forward_gives_transformers_logits_and_features(keep_hidden, packed, grouped):
    model = grouped_llama() if grouped else random_llama(64, seed=3, layers=3)
    if packed:
        assert pack_rows(model)
    assert fits(model)
    ours, theirs = _forwards(model, True, keep_hidden), _forwards(model, False, keep_hidden)
    assert len(ours) == len(theirs) == len(STEPS) + keep_hidden
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape
        if step < len(STEPS):  # each row's scored positions (a packed forward's padding is
            feeds, scored = STEPS[step]  # never read, and not written)
            counts = [c for c in (scored or map(len, feeds)) if c]
            a = torch.cat([row[:c] for row, c in zip(a, counts)])
            b = torch.cat([row[:c] for row, c in zip(b, counts)])
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        if step < len(STEPS):
            assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_a_shared_drafts_subset_head_gives_full_vocabulary_logits():
    """A shared draft's head scores a vocabulary subset (models/shared_draft.py): the forward
    widens its product to the vocabulary as SubsetHead does (a draft read as (B, T, N) logits
    drafted subset indices as token ids: the SmolLM2 draft and exit accepted nothing)."""
    from autospec.models.shared_draft import draft_from_target
    target = random_llama(64, seed=5, layers=2)
    draft = draft_from_target(target, [0, 1], torch.arange(1, 64, 3))
    assert fits(draft)
    ours, theirs = _forwards(draft, True, False), _forwards(draft, False, False)
    for a, b in zip(ours, theirs):
        assert a.shape[-1] == 64
        inside = torch.isfinite(b) & (b > torch.finfo(b.dtype).min)
        torch.testing.assert_close(a[inside], b[inside], rtol=1e-4, atol=1e-5)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_a_weight_changed_in_place_is_read_again():
    model = random_llama(64, seed=6, layers=2)
    first = _forwards(model, True, False)
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # the head's packed copy is stale: the logits flip
        model.model.layers[0].mlp.down_proj.weight.add_(0.5)
        model.model.layers[1].self_attn.k_proj.weight.add_(0.25)  # one of a stacked product's
        model.model.layers[1].mlp.up_proj.weight.mul_(2.0)
    ours, theirs = _forwards(model, True, False), _forwards(model, False, False)
    assert not torch.allclose(first[0], ours[0])
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-4, atol=1e-5)


def test_a_module_or_weight_replaced_is_read_again():
    """The forward looks a model's modules and weights up once (forward._Plan): a module or a
    weight put in place of another after a first forward is what the next forward reads."""
    model = random_llama(64, seed=8, layers=2)
    first = _forwards(model, True, False)
    with torch.no_grad():
        head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=False)
        head.weight.copy_(-model.lm_head.weight)
        model.lm_head = head
        mlp = model.model.layers[1].mlp
        mlp.gate_proj.weight = torch.nn.Parameter(mlp.gate_proj.weight * 3.0)
        model.model.layers[0].input_layernorm.weight = torch.nn.Parameter(
            model.model.layers[0].input_layernorm.weight + 1.0)
    ours, theirs = _forwards(model, True, False), _forwards(model, False, False)
    assert not torch.allclose(first[0], ours[0])
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours[-1][0, 0], theirs[-1][0, 0], rtol=1e-4, atol=1e-5)


def test_an_early_exit_view_fits_and_other_models_go_through_transformers():
    from transformers import GPT2Config, GPT2LMHeadModel
    model = random_llama(64, seed=4, layers=3)
    assert fits(early_exit_view(model, 2)) and fits(model)
    model.config._attn_implementation = "eager"  # switched after a first forward
    assert not fits(model)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2)).eval()
    assert not fits(gpt2)
    biased = random_llama(64, seed=5)
    biased.config.attention_bias = True
    biased._autospec_fits = None
    assert not fits(biased)


def _head_outputs(head, ours: bool):
    """A feature head's predicted features and subset logits over the STEPS' widths (rows
    right-padded, each at its own offset in the head's own RowCache), ours or transformers'."""
    torch.manual_seed(3)
    cache = RowCache(head, 4, 128)
    slots = [cache.claim() for _ in range(4)]
    outs = []
    with torch.inference_mode():
        for feeds, _ in STEPS:
            counts = [len(feed) for feed in feeds]
            ids = torch.tensor([feed + [0] * (max(counts) - len(feed)) for feed in feeds])
            features = torch.randn(len(feeds), max(counts), head.config.hidden_size)
            position_ids, mask = cache.bind(slots[:len(feeds)], counts, 128)
            if ours:
                predicted = forward.head_forward(head, ids, features, position_ids + 1, mask, cache)
                outs += [predicted, forward.head_scores(head, predicted)]
            else:
                predicted = head.transformers_forward(ids, features, position_ids + 1,
                                                 mask, cache)
                outs += [predicted, head.lm_head.subset_logits(predicted)]
            cache.bound = None
            for slot, count in zip(slots, counts):
                cache.lengths[slot] += count
    return outs


def test_a_feature_heads_forward_gives_transformers_features_and_scores(monkeypatch):
    """The eagle drafter's head over its own cache (head_forward, head_scores) computes what
    its transformers layer does, at every width the drafter feeds (a prompt, one token, a few
    after an accept), one row and many, grouped heads."""
    target = grouped_llama()
    head = EagleHead(target, torch.arange(0, 64, 3)).eval()
    with torch.no_grad():  # away from fc's [I, I] / 2 start, so each half counts
        head.fc.weight.add_(0.1 * torch.randn_like(head.fc.weight))
    ours, theirs = _head_outputs(head, True), _head_outputs(head, False)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)

