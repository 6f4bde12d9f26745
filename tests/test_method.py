"""Methods are parsed once, into values; errors name the method and what is accepted."""

import pytest

from autospec.controller.factory import make_controller
from autospec.drafters.base import available_drafters
from autospec.drafters.lookups import Lookups
from autospec.method import Method, is_adaptive, parse_method, parse_methods
from autospec.controller.interface import PLAIN, Decision, Outcome, Step, decide_one, observe_one
from conftest import REPO_ROOT

POLICY = REPO_ROOT / "policies" / "mixed.yaml"


@pytest.mark.parametrize("text, fields", [
    ("plain", ("plain", None, None, None)),
    ("static:ngram:4", ("static", "ngram", 4, None)),
    ("adaptive", ("adaptive", None, None, None)),
    ("ctl:fixed", ("ctl", "draft-model", 4, "fixed")),
    ("ctl:fixed:ngram:3", ("ctl", "ngram", 3, "fixed")),
    ("ctl:hf-heuristic:ngram", ("ctl", "ngram", None, "hf-heuristic")),
    ("ctl:ema", ("ctl", "draft-model", None, "ema")),
    ("ctl:batch-table", ("ctl", "draft-model", None, "batch-table")),
    ("ctl:batch-table:ngram:8=1/1=4", ("ctl", "ngram", None, "batch-table")),
    ("hf:generate", ("hf", None, None, "generate")),
    ("hf:assisted", ("hf", None, 4, "assisted")),
    ("hf:prompt-lookup:2", ("hf", None, 2, "prompt-lookup")),
    ("oracle-per-category", ("oracle", None, None, "oracle-per-category")),
])
def test_a_method_is_parsed_into_its_fields(text, fields):
    method = parse_method(text)
    assert (method.kind, method.drafter, method.k, method.baseline) == fields
    assert str(method) == text


def test_a_policy_file_is_read_once_when_parsed(monkeypatch):
    import autospec.policy as policy
    reads = []
    load = policy.load_policy
    monkeypatch.setattr(policy, "load_policy", lambda path: reads.append(path) or load(path))
    method = parse_method(f"adaptive:{POLICY}")
    controller = make_controller(method)
    assert reads == [str(POLICY)]
    assert method.policy_path == str(POLICY) and controller.settings == method.settings
    assert controller.settings.k_max == 7


def test_is_adaptive_agrees_with_the_parse_and_reads_no_policy_file():
    """The report classifies stored methods by their text: a policy file named there may
    live on another machine."""
    for text in ("plain", "static:ngram:4", "adaptive", f"adaptive:{POLICY}", "ctl:ema",
                 "ctl:batch-table:ngram:8=1/1=4", "hf:assisted", "oracle"):
        assert is_adaptive(text) == (parse_method(text).kind == "adaptive"), text
    assert is_adaptive("adaptive:/elsewhere/policy.yaml")  # not opened
    assert not is_adaptive("adaptivex") and not is_adaptive("static:adaptive:4")


@pytest.mark.parametrize("text, error", [
    ("fast", "unknown method 'fast' (known: plain, static:DRAFTER:K"),
    ("static:ngarm:4", "unknown drafter 'ngarm' in method 'static:ngarm:4' (known: "),
    ("static:ngram:0", "K must be >= 1 in method 'static:ngram:0', got 0"),
    ("hf:assisted:x", "K must be an integer in method 'hf:assisted:x', got 'x'"),
    ("adaptive:nope.yaml", "method 'adaptive:nope.yaml': nope.yaml: cannot read"),
    ("ctl:batch-table:ngram:4", "batch table entry '4' in method 'ctl:batch-table:ngram:4' is not SIZE=K"),
    ("ctl:batch-table:ngram:0=2", "batch table entry '0=2' in method 'ctl:batch-table:ngram:0=2': SIZE must be >= 1"),
    ("ctl:batch-table:ngram:2=1/2=3", "lists a batch size twice"),
])
def test_bad_methods_name_the_method(text, error):
    with pytest.raises(ValueError) as err:
        parse_method(text)
    assert error in str(err.value)


def test_method_lists_start_with_plain_once():
    assert [str(m) for m in parse_methods("static:ngram:4, plain,static:ngram:4")] == \
        ["static:ngram:4", "plain"]
    assert [str(m) for m in parse_methods("adaptive")] == ["plain", "adaptive"]
    assert isinstance(parse_methods("plain")[0], Method)


def test_only_controllers_are_made():
    with pytest.raises(ValueError, match="method 'hf:generate' is not a controller"):
        make_controller(parse_method("hf:generate"))


def test_available_drafters_need_a_draft_model_only_for_draft_model(tiny_pair):
    import dataclasses
    assert available_drafters(tiny_pair) == ("ngram", "draft-model", "early-exit")  # no eagle head
    target_only = dataclasses.replace(tiny_pair, draft=None, draft_name=None)
    assert available_drafters(target_only) == ("ngram", "early-exit")


def test_batch_table_drafts_the_k_of_the_batch_size_and_nothing_above_the_table():
    """TensorRT-LLM's draft_len_schedule: the K of the smallest size >= the batch; K = 0
    (plain decoding, no drafter) above the largest size."""
    method = parse_method("ctl:batch-table:ngram:8=1/1=4/4=2")
    assert method.table == ((1, 4), (4, 2), (8, 1))
    controller = make_controller(method)
    assert [controller.k_for(b) for b in (1, 2, 4, 5, 8, 9, 16)] == [4, 2, 2, 1, 1, 0, 0]
    assert controller.decide(Step([None] * 3, Lookups().peek)) == [Decision("ngram", 2)] * 3
    assert controller.decide(Step([None] * 9, Lookups().peek)) == [PLAIN] * 9
    assert decide_one(controller, None) == Decision("ngram", 4)  # a request on its own
    assert make_controller(parse_method("ctl:batch-table")).table == ((1, 4), (4, 2), (8, 1))
