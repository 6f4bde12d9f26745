"""The SmolLM2 draft's distillation pieces on a minuscule target: the loss is what its
docstring says, the draft starts as the target's own layers over a head subset, the subset is
the most emitted tokens, and training resumes exactly."""
from dataclasses import replace

import numpy as np
import pytest
import torch

from autospec.training.distill import (RECIPE, choose_subset, distill_loss,
                                       generate_prompt_targets, load_answers, make_batch,
                                       make_draft, subset_coverage, top1_agreement, train_draft)
from conftest import random_llama

VOCAB = 32
RECIPE_TINY = replace(RECIPE, keep_layers=(0,), batch=2, steps=4, warmup=1, top_k=4,
                      prompt_positions=3)
EVERY_TOKEN = torch.arange(VOCAB)


def rows(n: int = 4, seed: int = 0) -> list[dict]:
    """Answers whose top-k is one-hot on the answer token (soft target = hard target)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        prompt, answer = rng.integers(0, VOCAB, 6).tolist(), rng.integers(0, VOCAB, 4).tolist()
        top_ids = torch.tensor([[t, *[(t + j) % VOCAB for j in range(1, 4)]] for t in answer])
        top_probs = torch.tensor([[1.0, 0.0, 0.0, 0.0]] * len(answer))
        out.append({"prompt": prompt, "answer": answer, "top_ids": top_ids.int(),
                    "top_probs": top_probs.half()})
    return out


@pytest.fixture(scope="module")
def target():
    return random_llama(VOCAB, seed=0, layers=1)


def test_one_hot_soft_targets_make_the_loss_plain_cross_entropy(target):
    draft = make_draft(target, RECIPE_TINY, EVERY_TOKEN)
    batch = make_batch(rows(), replace(RECIPE_TINY, prompt_weight=0.0), np.random.default_rng(0))
    for w in (0.0, 0.5, 1.0):
        loss, answer_ce = distill_loss(draft, batch, replace(RECIPE_TINY, soft_weight=w,
                                                             prompt_weight=0.0))
        assert float(loss.detach()) == pytest.approx(answer_ce, rel=1e-5)


def test_draft_starts_as_the_targets_layers_over_its_head_rows(target):
    subset = torch.tensor([1, 4, 9, 16, 25])
    draft = make_draft(target, RECIPE_TINY, subset)
    assert draft.get_input_embeddings() is target.get_input_embeddings()
    assert torch.equal(draft.lm_head.weight, target.lm_head.weight[subset])
    first, copied = target.model.layers[0], draft.model.layers[0]
    assert copied is not first  # a copy: training the draft leaves the target alone
    assert torch.equal(copied.mlp.up_proj.weight, first.mlp.up_proj.weight)


def test_out_of_subset_tokens_carry_no_loss(target):
    """A position whose next token the head cannot score is left out: adding a row whose
    answer lies wholly outside the subset leaves the loss as it was."""
    data, subset = rows(), torch.arange(VOCAB // 2)
    inside = [{**r, "answer": [t % (VOCAB // 2) for t in r["answer"]],
               "top_ids": r["top_ids"] % (VOCAB // 2)} for r in data[:2]]
    outside = {**data[2], "answer": [VOCAB // 2 + t % (VOCAB // 2) for t in data[2]["answer"]]}
    recipe = replace(RECIPE_TINY, prompt_weight=0.0)
    draft = make_draft(target, recipe, subset)
    loss, _ = distill_loss(draft, make_batch(inside, recipe, np.random.default_rng(0)), recipe)
    mixed, _ = distill_loss(draft, make_batch(inside + [outside], recipe,
                                              np.random.default_rng(0)), recipe)
    assert torch.isfinite(loss)
    assert float(mixed.detach()) == pytest.approx(float(loss.detach()), rel=1e-4)


def test_the_subset_is_the_most_emitted_tokens_and_always_eos():
    data = [{"prompt": [7, 7, 7], "answer": [1, 1, 1, 2, 2, 3]}]
    assert choose_subset(data, VOCAB, 2).tolist() == [1, 2]
    assert choose_subset(data, VOCAB, 2, always={30}).tolist() == [1, 30]
    assert choose_subset(data, VOCAB, 4).tolist() == [1, 2, 3, 7]  # then the prompt's
    assert subset_coverage(torch.tensor([1, 2]), data) == pytest.approx(5 / 6)


def test_training_resumes_from_its_checkpoint(target, tmp_path):
    data = rows(8)
    ckpt = tmp_path / "draft.pt"
    first = make_draft(target, RECIPE_TINY, EVERY_TOKEN)
    run = train_draft(first, data, RECIPE_TINY, ckpt, quiet=True, heldout=data[:2])
    assert run["steps"] == 4 and [h["step"] for h in run["history"]] == [4]
    again = make_draft(target, RECIPE_TINY, EVERY_TOKEN)  # fresh weights, then the checkpoint
    train_draft(again, data, RECIPE_TINY, ckpt, quiet=True)
    for a, b in zip(first.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    assert 0.0 <= top1_agreement(again, data[:2]) <= 1.0


def test_prompt_targets_are_the_targets_top_k_whatever_the_padding(target, tmp_path):
    """Teacher-forced over right-padded groups: each prompt position's top-k equals the
    target's on that prompt alone (causal attention keeps the padding out)."""
    answers = tmp_path / "answers"
    answers.mkdir()
    data = rows(3)
    data[1]["prompt"] = data[1]["prompt"][:3]  # shorter: padded in its group
    torch.save(data, answers / "shard-00000.pt")
    generate_prompt_targets(target, answers, tmp_path / "prompt-targets", RECIPE_TINY,
                            quiet=True, rows_per_forward=3)
    loaded = load_answers(answers)
    for row in loaded:
        with torch.no_grad():
            alone = torch.softmax(target(torch.tensor([row["prompt"]])).logits[0, :-1], -1)
        top = torch.topk(alone, RECIPE_TINY.top_k, -1)
        assert torch.equal(row["prompt_top_ids"], top.indices.int())
        assert torch.allclose(row["prompt_top_probs"].float(), top.values, atol=1e-3)
    # with them, a prompt position learns the target's argmax there, not the text's next token
    batch = make_batch(loaded, RECIPE_TINY, np.random.default_rng(0))
    term = batch["prompt"]
    for i, t, want in zip(term["rows"], term["pos"], term["next"]):
        assert int(want) == int(loaded[int(i)]["prompt_top_ids"][int(t), 0])
    loss, _ = distill_loss(make_draft(target, RECIPE_TINY, EVERY_TOKEN), batch, RECIPE_TINY)
    assert torch.isfinite(loss.detach())
