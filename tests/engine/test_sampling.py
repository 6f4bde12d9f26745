"""Speculative sampling reproduces the target's distribution (statistical, on a tiny model).

A 3-token vocabulary and 3 new tokens per sample give 27 outcomes; the exact target
distribution over them comes from the target's own conditionals. With K = 2 every sample
goes through drafting, acceptance, rejection with a recovered token, and the bonus token.
The samples are requests of their own seeds run ROWS at a time by continuous batching (the
one decode step, whatever the batch; rows join and leave at different steps): each row's
output must follow the target's distribution whoever shares its step.
AUTOSPEC_SAMPLING_SAMPLES (default 25000) sets the sample count.
"""
import itertools
import os

import numpy as np
import pytest
import torch

from autospec.engine.loop import Engine

from autospec.controller.interface import StaticController
from autospec.engine.request import Job
from autospec.models.eagle_head import EagleHead
from autospec.models.pair import ModelPair
from autospec.models.sampling import SamplingParams
from conftest import IdTokenizer, random_llama
from scipy_free_stats import chi2_pvalue

VOCAB, NEW, K = 3, 3, 2
PROMPT = [0, 1, 2, 0, 1]
# 25k samples: the TV bound below widens as 1/sqrt(n) (0.02 here), and the chi-squared test
# keeps its power over 27 outcomes; 10^5 took ~10 CPU-minutes of a 2-core CI run
SAMPLES = int(os.environ.get("AUTOSPEC_SAMPLING_SAMPLES", "25000"))
# rows a step: one at a time the four drafters' checks took ~5 of the suite's 14 minutes
ROWS = 64


@pytest.fixture(scope="module")
def engine():
    target = random_llama(VOCAB, seed=0, scale=8.0, layers=1)
    draft = random_llama(VOCAB, seed=1, scale=8.0, layers=1)
    torch.manual_seed(2)  # a random feature head: its draws differ from the target's
    eagle = EagleHead(target, torch.arange(VOCAB)).eval()
    return Engine(ModelPair(target, IdTokenizer(), draft, eagle=eagle), max_batch=ROWS,
                  max_len=len(PROMPT) + NEW + K + 1)


@torch.no_grad()
def exact_distribution(target, temperature):
    probs = {}
    for seq in itertools.product(range(VOCAB), repeat=NEW):
        ids = torch.tensor([PROMPT + list(seq)])
        p = torch.softmax(target(ids).logits[0].float() / temperature, -1)
        pos = len(PROMPT) - 1
        probs[seq] = float(np.prod([p[pos + i, seq[i]] for i in range(NEW)]))
    return probs


@pytest.mark.parametrize("drafter", ["draft-model", "ngram", "eagle"])
def test_speculative_sampling_matches_target(engine, drafter):
    temperature = 1.0
    exact = exact_distribution(engine.models.target, temperature)
    outcomes = list(exact)
    index = {seq: i for i, seq in enumerate(outcomes)}
    counts = np.zeros(len(outcomes))
    proposed = rejected = 0
    jobs = [Job(PROMPT, NEW, SamplingParams(temperature), seed=seed) for seed in range(SAMPLES)]
    for out in engine.run(jobs, StaticController(drafter, K)):
        counts[index[tuple(out.token_ids)]] += 1
        proposed += out.telemetry.proposed
        rejected += out.telemetry.proposed - out.telemetry.accepted
    expected = np.array([exact[s] for s in outcomes])
    assert proposed > SAMPLES and rejected > SAMPLES // 20  # both paths were exercised
    tv = 0.5 * np.abs(counts / SAMPLES - expected).sum()
    # sampling noise in TV shrinks as 1/sqrt(n): 0.01 at the full 10^5 samples
    assert tv <= 0.01 * max(1.0, (100_000 / SAMPLES) ** 0.5), tv
    assert chi2_pvalue(counts, expected * SAMPLES) > 0.01


def test_sampling_is_exact_with_suffix(engine):
    """The check above with the suffix drafter (tests/drafters/test_suffix.py), drafting from
    earlier samples' outputs (a small budget: evictions all along)."""
    suffix = Engine(engine.models, {"suffix": {"budget_tokens": 64}}, max_batch=ROWS,
                    max_len=engine.max_positions)
    test_speculative_sampling_matches_target(suffix, "suffix")


def test_top_k_top_p_filter_then_renormalise():
    from autospec.models.sampling import SamplingParams, probs_from_logits
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.allclose(probs_from_logits(logits, SamplingParams(1.0, top_k=2)),
                          torch.tensor([0.625, 0.375, 0, 0]))
    assert torch.allclose(probs_from_logits(logits, SamplingParams(1.0, top_p=0.7)),
                          torch.tensor([0.625, 0.375, 0, 0]))
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(-1.0)
