"""A seed makes a sampled request's output a function of (prompt, sampling parameters, seed)
alone: the same tokens decoded plain, with any drafter and K, and in a batch beside others."""
from autospec.controller.adaptive import AdaptiveController
from autospec.engine.loop import Engine
from autospec.engine.request import Job
from autospec.models.sampling import SamplingParams

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"
HOT = SamplingParams(0.8, 0, 0.95)


def test_a_seed_gives_the_same_tokens_plain_speculative_and_in_a_batch(reference_pair):
    engine = Engine(reference_pair)
    plain = engine.generate(PROMPT, drafter=None, max_new_tokens=40, temperature=0.8,
                            top_p=0.95, seed=123).token_ids
    for drafter, k in (("ngram", 4), ("draft-model", 3), ("early-exit", 2)):
        out = engine.generate(PROMPT, drafter=drafter, k=k, max_new_tokens=40, temperature=0.8,
                              top_p=0.95, seed=123)
        assert out.token_ids == plain, (drafter, k)
    batch = Engine(reference_pair, max_batch=4)
    jobs = [Job("import os\n", 40, HOT, seed=1), Job(PROMPT, 40, HOT, seed=123),
            Job("class A:\n", 40, HOT, seed=2), Job(PROMPT, 40, HOT, seed=124)]
    outs = batch.run(jobs, AdaptiveController())
    assert outs[1].token_ids == plain
    assert outs[3].token_ids != plain  # another seed, another sample
