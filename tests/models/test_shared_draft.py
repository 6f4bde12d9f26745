"""A draft that borrows the target's embedding and scores a vocabulary subset
(autospec/models/shared_draft.py): what it computes is known by construction — kept whole, it
is the target; restricted, it is the target on the subset — and it ships without the embedding."""
import json

import pytest
import torch

from autospec.engine.loop import Engine

from autospec.controller.interface import StaticController
from autospec.models import ModelLoadError
from autospec.models.pair import ModelPair, load_pair, weight_bytes
from autospec.models.shared_draft import (SubsetHead, draft_from_target, is_shared_draft,
                                          load_shared_draft, own_state, save_shared_draft,
                                          subset_lookup)
from conftest import IdTokenizer, random_llama

VOCAB = 24


@pytest.fixture(scope="module")
def target():
    return random_llama(VOCAB, seed=0, scale=4.0, layers=2)


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_whole_draft_is_the_target(target):
    draft = draft_from_target(target, [0, 1], torch.arange(VOCAB))
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    assert torch.allclose(logits(draft, ids), logits(target, ids), atol=1e-5)
    # borrowed, not copied: one embedding module, and the draft does not train it
    assert draft.get_input_embeddings() is target.get_input_embeddings()
    assert not any(p.requires_grad for p in draft.get_input_embeddings().parameters())


def test_subset_head_scores_the_subset_and_nothing_else(target):
    subset = torch.tensor([0, 2, 3, 7, 11, 20])
    draft = draft_from_target(target, [0, 1], subset)
    ids = [5, 6, 7, 8]
    got, want = logits(draft, ids), logits(target, ids)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[subset] = False
    assert torch.allclose(got[:, subset], want[:, subset], atol=1e-5)
    assert (got[:, outside] == torch.finfo(got.dtype).min).all()
    assert torch.softmax(got, -1)[:, outside].sum() == 0  # a proposal never leaves the subset
    assert subset_lookup(subset, VOCAB).tolist() == [
        int((subset == t).nonzero()) if t in subset else -1 for t in range(VOCAB)]


def test_saved_without_the_embedding_and_loaded_onto_the_target(target, tmp_path):
    draft = draft_from_target(target, [1], torch.arange(0, VOCAB, 2))
    save_shared_draft(draft, tmp_path)
    assert is_shared_draft(tmp_path)
    assert not any("embed_tokens" in name for name in own_state(draft))
    loaded = load_shared_draft(tmp_path, target, torch.float32)
    assert loaded.get_input_embeddings() is target.get_input_embeddings()
    assert isinstance(loaded.lm_head, SubsetHead)
    ids = [1, 2, 3, 4, 5]
    # shipped in bf16: equal to the draft up to bf16 rounding, and the same argmax here
    assert torch.allclose(logits(loaded, ids), logits(draft, ids), atol=0.1)
    # weights read per token: not the borrowed embedding (a look-up reads one row)
    emb = target.get_input_embeddings().weight
    assert weight_bytes(loaded) == sum(t.numel() * t.element_size() for t in loaded.parameters()) \
        - emb.numel() * emb.element_size()


def test_a_draft_for_another_target_is_refused(target, tmp_path):
    save_shared_draft(draft_from_target(target, [0], torch.arange(VOCAB)), tmp_path)
    other = random_llama(VOCAB + 8, seed=3)
    with pytest.raises(ValueError, match="made for another target.*24 x 16.*32 x 16"):
        load_shared_draft(tmp_path, other, torch.float32)


def test_load_pair_wires_a_shared_draft_and_names_a_broken_one(tiny_dir, tmp_path):
    pair = load_pair(str(tiny_dir / "target"), None)
    out = tmp_path / "draft"
    save_shared_draft(draft_from_target(pair.target, [0], torch.arange(64)), out)
    pair.tokenizer.save_pretrained(out)
    loaded = load_pair(str(tiny_dir / "target"), str(out))
    assert loaded.draft.get_input_embeddings() is loaded.target.get_input_embeddings()
    config = json.loads((out / "config.json").read_text())
    (out / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ModelLoadError, match=f"cannot load draft model '{out}'"):
        load_pair(str(tiny_dir / "target"), str(out))
    assert config["autospec_draft"]["vocab_subset"] == 64


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_through_a_subset_draft_is_lossless(target, k):
    """Half the vocabulary out of the draft's reach: every proposal of an outside token is
    impossible, every output token still the target's; kept whole, every draft is accepted."""
    plain = Engine(ModelPair(target, IdTokenizer()))
    prompt = [1, 2, 3, 1, 2]
    want = plain.generate(prompt, controller=StaticController(None, 0), max_new_tokens=24)
    for subset, total in ((torch.arange(0, VOCAB, 2), False), (torch.arange(VOCAB), True)):
        draft = draft_from_target(target, [0, 1], subset)
        out = Engine(ModelPair(target, IdTokenizer(), draft)).generate(
            prompt, controller=StaticController("draft-model", k), max_new_tokens=24)
        assert out.token_ids == want.token_ids
        if total:
            assert out.telemetry.accepted == out.telemetry.proposed > 0


def test_a_trained_exit_borrows_the_targets_first_layers(target, tmp_path):
    """keep_layers (0, 1) with layer 0 borrowed: the exit is the target again, runs the
    target's own layer 0, trains and ships only layer 1, its norm and head."""
    exit_model = draft_from_target(target, [0, 1], torch.arange(VOCAB), borrowed=1)
    assert exit_model.model.layers[0] is target.model.layers[0]
    assert exit_model.model.layers[1] is not target.model.layers[1]
    assert not any(p.requires_grad for p in exit_model.model.layers[0].parameters())
    ids = [4, 4, 2, 7, 1]
    assert torch.allclose(logits(exit_model, ids), logits(target, ids), atol=1e-5)
    assert not any(name.startswith("model.layers.0.") for name in own_state(exit_model))
    save_shared_draft(exit_model, tmp_path)
    loaded = load_shared_draft(tmp_path, target, torch.float32)
    assert loaded.model.layers[0] is target.model.layers[0]
    with pytest.raises(ValueError, match=r"must start \[0, 1\], got \[0, 5\]"):
        draft_from_target(target, [0, 5], torch.arange(VOCAB), borrowed=2)


def test_early_exit_runs_the_trained_exit_at_its_depth_and_stays_lossless(target):
    exit_model = draft_from_target(target, [0, 1], torch.arange(VOCAB), borrowed=1)
    pair = ModelPair(target, IdTokenizer(), exit_model=exit_model)
    assert pair.default_exit_layer == 1 and pair.early_exit_view(1) is exit_model
    assert pair.early_exit_view(1) is not ModelPair(target, IdTokenizer()).early_exit_view(1)
    prompt = [2, 3, 5, 7]
    want = Engine(ModelPair(target, IdTokenizer())).generate(
        prompt, controller=StaticController(None, 0), max_new_tokens=20)
    out = Engine(pair).generate(prompt, controller=StaticController("early-exit", 3),
                                max_new_tokens=20)
    assert out.token_ids == want.token_ids
    assert out.telemetry.accepted == out.telemetry.proposed > 0  # the exit is the whole target


def test_load_pair_takes_a_trained_exit_and_refuses_a_plain_model_dir(tiny_dir, tmp_path):
    pair = load_pair(str(tiny_dir / "target"), None)
    layers = pair.target.config.num_hidden_layers
    out = tmp_path / "exit"
    save_shared_draft(draft_from_target(pair.target, list(range(layers)), torch.arange(64),
                                        borrowed=1), out)
    loaded = load_pair(str(tiny_dir / "target"), None, exit=str(out))
    assert loaded.default_exit_layer == 1
    assert loaded.exit_model.model.layers[0] is loaded.target.model.layers[0]
    with pytest.raises(ModelLoadError, match="not a draft made for a target"):
        load_pair(str(tiny_dir / "target"), None, exit=str(tiny_dir / "draft"))


def test_the_bench_counts_a_shared_drafts_own_parameters_only(target):
    from autospec.bench.harness import own_params
    draft = draft_from_target(target, [1], torch.arange(8))
    assert own_params(draft, target) == sum(t.numel() for n, t in own_state(draft).items()
                                            if not n.endswith("token_ids"))
