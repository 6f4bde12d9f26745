"""The feature head's build on a minuscule target: the held-out rows are fixed by the number
of prompts alone and their shards are made first, so a build stopped early is judged on the
same rows as a complete one and never trains on them."""
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from autospec.training.eagle import (HELDOUT_ROWS, RECIPE, generate_features, load_rows,
                                     shard_order, split)
from autospec.training.eagle_train import train_and_ship
from conftest import random_llama

TINY = replace(RECIPE, gen_batch=4, max_new_tokens=3, vocab_subset=24, context_pairs=4,
               prompt_positions=2, steps=2, batch=2, warmup=1, refine_steps=2, refine_warmup=1)
N = 48  # 12 shards of 4


def test_a_build_stopped_early_holds_out_the_same_rows_and_trains_on_the_others(tmp_path):
    target = random_llama(40, seed=3)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 40, 3 + i % 5).tolist() for i in range(N)]
    held, trained = split(N, TINY)
    assert len(held) == HELDOUT_ROWS and sorted(held + trained) == list(range(N))
    owner = [k for k, picks in enumerate(shard_order(N, TINY)) for _ in picks]
    first = sorted({owner[i] for i in held})
    assert len(first) < 12  # some shards hold no held-out row

    features = tmp_path / "features"
    tokenizer = SimpleNamespace(pad_token_id=0)
    generate_features(target, tokenizer, prompts, TINY, features, quiet=True, limit=len(first))
    made = sorted(int(p.stem.split("-")[1]) for p in features.glob("shard-*.pt"))
    assert made == first
    early = load_rows(features, N, TINY)
    assert set(held) <= set(early) and len(early) < N
    for i, row in early.items():  # row i answers prompt i of the shards' order
        assert row["prompt"] == prompts[shard_order(N, TINY)[owner[i]][i - owner.index(owner[i])]]

    card = train_and_ship(target, None, early, (held, trained), TINY, tmp_path / "head",
                          tmp_path, quiet=True, log=lambda *_: None)
    assert card["prompts"] == len(early) - HELDOUT_ROWS
    assert card["refine"]["steps"] == 2 and (tmp_path / "head" / "model.safetensors").exists()

    generate_features(target, tokenizer, prompts, TINY, features, quiet=True)
    whole = load_rows(features, N, TINY)
    assert len(whole) == N
    assert all(whole[i]["answer"] == early[i]["answer"] for i in early)
    del whole[held[0]]
    with pytest.raises(ValueError, match="1 of the 32 held-out ones missing"):
        train_and_ship(target, None, whole, (held, trained), TINY, tmp_path / "head", tmp_path,
                       quiet=True, log=lambda *_: None)
