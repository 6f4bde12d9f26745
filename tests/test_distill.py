"""The SmolLM2 draft's distillation pieces on a minuscule target: the loss is what its
docstring says, the draft starts from the target's embedding, and training resumes exactly."""
from dataclasses import replace

import numpy as np
import pytest
import torch

from autospec.training.distill import (RECIPE, distill_loss, make_batch, make_draft,
                                       top1_agreement, train_draft)
from conftest import random_llama

VOCAB = 32
RECIPE_TINY = replace(RECIPE, layers=1, hidden=8, heads=2, kv_heads=2, ffn=16, batch=2,
                      steps=4, warmup=1, top_k=4, prompt_positions=3)


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
    draft = make_draft(target, RECIPE_TINY)
    batch = make_batch(rows(), replace(RECIPE_TINY, prompt_weight=0.0), np.random.default_rng(0))
    for w in (0.0, 0.5, 1.0):
        loss, answer_ce = distill_loss(draft, batch, replace(RECIPE_TINY, soft_weight=w,
                                                             prompt_weight=0.0))
        assert float(loss.detach()) == pytest.approx(answer_ce, rel=1e-5)


def test_draft_embedding_is_the_targets_projected(target):
    draft = make_draft(target, RECIPE_TINY)
    emb, small = target.get_input_embeddings().weight, draft.get_input_embeddings().weight
    assert small.shape == (VOCAB, RECIPE_TINY.hidden)
    # a linear map of the target's embedding (its top principal directions, rescaled):
    # small = emb @ P exactly, for some P
    emb = emb.detach().double()
    solution = torch.linalg.lstsq(emb, small.detach().double()).solution
    assert torch.allclose(emb @ solution, small.detach().double(), atol=1e-6)


def test_training_resumes_from_its_checkpoint(target, tmp_path):
    data = rows(8)
    ckpt = tmp_path / "draft.pt"
    first = make_draft(target, RECIPE_TINY)
    run = train_draft(first, data, RECIPE_TINY, ckpt, quiet=True, heldout=data[:2])
    assert run["steps"] == 4 and [h["step"] for h in run["history"]] == [4]
    again = make_draft(target, RECIPE_TINY)  # fresh weights, then the checkpoint
    train_draft(again, data, RECIPE_TINY, ckpt, quiet=True)
    for a, b in zip(first.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    assert 0.0 <= top1_agreement(again, data[:2]) <= 1.0
