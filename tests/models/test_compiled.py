"""The compiled one-row forward (models/compiled.py) on the reference pair's target, float32:
eager's logits within the format's rounding spread, plain and speculative output unchanged;
its libraries kept on disk and loaded by a second start without compiling; a process that
cannot compile runs eager after one warning naming why.

The libraries go to the user's cache as in use (compiled once per machine and torch: ~40 s,
then loaded in milliseconds), so the suite pays the compile once, not every run."""
from __future__ import annotations

import pytest
import torch

from autospec.models import compiled
from autospec.models.forward import _PLANS, _plan
from autospec.models.kv import RowCache, cache_kwarg
from autospec.models.ties import NEAR_TIE, rounding_spread

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"


@pytest.fixture
def compiling(reference_pair, monkeypatch):
    """The reference target with its plan made while compiling is on; eager again after."""
    target = reference_pair.target
    monkeypatch.setenv("AUTOSPEC_COMPILE", "1")
    monkeypatch.setattr(compiled, "_FAILED", [])
    _PLANS.pop(target, None)
    yield target
    _PLANS.pop(target, None)


def _logits(model, ids: list[int], feeds: list[int]) -> torch.Tensor:
    """(T, V) float32 logits of `ids` fed in pieces of `feeds` tokens, over a fresh RowCache."""
    cache = RowCache(model, 1, len(ids) + 1)
    slot, out, at = cache.claim(), [], 0
    with torch.inference_mode():
        for n in feeds:
            out.append(cache.forward(model, cache_kwarg(model), [slot], [ids[at:at + n]],
                                     len(ids) + 1)[0].float().clone())
            cache.lengths[slot] += n
            at += n
    return torch.cat(out)


def test_compiled_logits_are_eagers_within_the_rounding_spread(compiling, reference_pair):
    ids = reference_pair.tokenizer.encode(PROMPT)
    # a prompt's first tokens eager (wider than a verify), then verifies of 3 and single steps
    feeds = [len(ids) - 15] + [3, 1] * 3 + [1] * 3
    eager_plan = _plan(compiling).graph
    _PLANS[compiling].graph = None
    eager = _logits(compiling, ids, feeds)
    _PLANS[compiling].graph = eager_plan
    assert eager_plan is not None and eager_plan.takes(1) and eager_plan.takes(3)
    got = _logits(compiling, ids, feeds)
    assert set(eager_plan.runners) == {0, 1}  # both libraries ran
    # float32: another order of the same arithmetic, as a verify's logits are a step's
    spread = rounding_spread(compiling, [ids])
    assert (got - eager).abs().max().item() <= max(4 * spread, NEAR_TIE / 10)
    assert torch.equal(got.argmax(-1), eager.argmax(-1))


def test_compiled_greedy_speculative_output_is_plains(compiling, reference_pair):
    from autospec.engine.loop import Engine
    engine = Engine(reference_pair)
    plain = engine.generate(PROMPT, drafter=None, max_new_tokens=24)
    for k in (2, 4):
        assert engine.generate(PROMPT, drafter="ngram", k=k, max_new_tokens=24).token_ids \
            == plain.token_ids
    assert _plan(compiling).graph.runners  # it ran compiled


def test_a_second_start_loads_the_library_without_compiling(compiling, reference_pair,
                                                           monkeypatch):
    ids = reference_pair.tokenizer.encode(PROMPT)
    first = _logits(compiling, ids, [len(ids) - 4, 3, 1])  # compiled, or loaded from disk
    graph = _plan(compiling).graph
    assert all(graph.package_path(which, torch.float32).is_file() for which in (0, 1))

    def refuse(*args):
        raise AssertionError("compiled again")
    monkeypatch.setattr(compiled.OneRowGraph, "_compile", refuse)
    _PLANS.pop(compiling)  # a new plan, as a new process makes: nothing loaded yet
    again = _logits(compiling, ids, [len(ids) - 4, 3, 1])
    assert _plan(compiling).graph.runners and torch.equal(again, first)


def test_a_process_that_cannot_compile_runs_eager_after_one_warning(compiling, reference_pair,
                                                                    monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOSPEC_CACHE", str(tmp_path))  # nothing kept: it must compile

    def fails(*args):
        raise RuntimeError("no C++ compiler found (g++)\nmore detail")
    monkeypatch.setattr(compiled.OneRowGraph, "_compile", fails)
    warned = []  # the logger's records, whatever handlers another test left on "autospec"
    monkeypatch.setattr(compiled.log, "warning", lambda text, *args: warned.append(text % args))
    ids = reference_pair.tokenizer.encode(PROMPT)
    got = _logits(compiling, ids, [len(ids) - 5, 1, 3, 1])
    assert warned == ["compiling the decode forward failed (RuntimeError: no C++ compiler found "
                      "(g++)): running it eager"]
    _PLANS[compiling].graph = None
    eager = _logits(compiling, ids, [len(ids) - 5, 1, 3, 1])
    assert torch.equal(got, eager)
    assert compiled.one_row_graph(_plan(compiling), "x") is None  # a new model: eager, silent


def test_a_feature_heads_one_row_drafting_runs_compiled_as_eager(compiling):
    """The eagle drafter's one-row forwards (a few pairs after an accept, one drafted token)
    run the compiled layer (forward.py head_one_row) and predict eager's features; a prompt's
    pairs, wider than a verify, run eager, into the same cache."""
    from autospec.drafters.eagle import BatchEagle
    from autospec.models.eagle_head import EagleHead
    from autospec.models.forward import _HeadPlan
    torch.manual_seed(0)
    head = EagleHead(compiling, torch.arange(0, compiling.config.vocab_size, 5)).eval()
    with torch.no_grad():  # away from fc's [I, I] / 2 start, so each half counts
        head.fc.weight.add_(0.1 * torch.randn_like(head.fc.weight))
    width = head.config.hidden_size
    ids, features = torch.randint(0, 100, (40,)).tolist(), torch.randn(40, width)
    feeds = [30, 3, 1, 1, 4, 1]

    def predicted() -> list[torch.Tensor]:
        drafter, out, at = BatchEagle(head, 1, 64), [], 0
        with torch.inference_mode():
            for n in feeds:
                out.append(drafter._forward([0], [ids[at:at + n]], [features[at:at + n]]))
                drafter.cache.lengths[0] += n
                at += n
        return out

    plan = _plan(head, _HeadPlan)
    graph, plan.graph = plan.graph, None
    eager = predicted()
    plan.graph = graph
    assert graph is not None
    got = predicted()
    assert graph.runners  # it ran compiled
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    _PLANS.pop(head, None)
