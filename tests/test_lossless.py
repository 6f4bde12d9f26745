"""Greedy speculative output is token-identical to plain greedy output, for every drafter and K.

On the freshly trained tiny pair (real tokenizer, real training, poor weights) with random
prompts (hypothesis) and with the shipped workload's prompts; and on a GPT-2-style target.
"""
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autospec.engine.loop import Engine, StaticPolicy

DRAFTERS = ["ngram", "draft-model", "early-exit", "synthetic"]
KS = [1, 2, 4, 8]
WORKLOAD = Path(__file__).resolve().parents[1] / "configs" / "workloads" / "reference.jsonl"


def plain_and_speculative(engine, prompt, drafter, k, n=24):
    plain = engine.generate(prompt, policy=StaticPolicy(None, 0), max_new_tokens=n)
    spec = engine.generate(prompt, policy=StaticPolicy(drafter, k), max_new_tokens=n)
    return plain, spec


@pytest.mark.parametrize("drafter", DRAFTERS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(0, 383), min_size=1, max_size=40), k=st.sampled_from(KS))
def test_greedy_identical_on_random_prompts(tiny_engine, drafter, prompt, k):
    plain, spec = plain_and_speculative(tiny_engine, prompt, drafter, k)
    assert spec.token_ids == plain.token_ids


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("k", KS)
def test_greedy_identical_on_workload_prompts(tiny_engine, drafter, k):
    rows = [json.loads(line) for line in WORKLOAD.read_text().splitlines()]
    for category in ("copy-heavy", "completion", "prose"):
        row = next(r for r in rows if r["category"] == category)
        plain, spec = plain_and_speculative(tiny_engine, row["prompt"], drafter, k, n=40)
        assert spec.token_ids == plain.token_ids, (row["id"], drafter, k)


def test_repetitive_prompt_exercises_acceptance(tiny_engine):
    """Guard against a vacuous pass: the drafts must actually be accepted sometimes."""
    prompt = "def f(x):\n    return x\n" * 6
    _, spec = plain_and_speculative(tiny_engine, prompt, "ngram", 4, n=32)
    assert spec.telemetry.accepted > 0
    _, spec = plain_and_speculative(tiny_engine, prompt, "draft-model", 4, n=32)
    assert 0 < spec.telemetry.accepted


@pytest.mark.parametrize("drafter", ["ngram", "early-exit", "synthetic"])
def test_gpt2_style_target(tiny_pair, drafter):
    from transformers import GPT2Config, GPT2LMHeadModel
    import torch
    from autospec.models.pair import ModelPair
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tiny_pair.tokenizer), n_positions=256, n_embd=32, n_layer=3,
                     n_head=2, eos_token_id=tiny_pair.tokenizer.eos_token_id)
    engine = Engine(ModelPair(GPT2LMHeadModel(cfg).eval(), tiny_pair.tokenizer))
    for k in KS:
        plain, spec = plain_and_speculative(engine, "x = [1, 2, 3]\nx = [1, 2, 3]\nx =", drafter, k)
        assert spec.token_ids == plain.token_ids
