"""Methods are parsed once, into values; errors name the method and what is accepted."""

import pytest

from autospec.controller.factory import make_controller
from autospec.drafters.base import available_drafters
from autospec.drafters.lookups import Lookups
from autospec.method import (AUTOSPEC, FORMS, KNOWN, VLLM, Method, check_engine, is_adaptive,
                             kind_of, known, parse_method, parse_methods)
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
    ("vllm:ngram:3", ("vllm", "ngram", 3, None)),
    ("vllm:eagle:2", ("vllm", "eagle", 2, None)),
    ("vllm:dynamic:8=1/1=4", ("vllm", "ngram", None, None)),
    ("ours:plain", ("ours", None, None, None)),
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
                 "ctl:batch-table:ngram:8=1/1=4", "hf:assisted", "oracle", "vllm:ngram:2",
                 "ours:adaptive"):
        assert is_adaptive(text) == (parse_method(text).kind == "adaptive"), text
    assert is_adaptive("adaptive:/elsewhere/policy.yaml")  # not opened
    assert not is_adaptive("adaptivex") and not is_adaptive("static:adaptive:4")
    for text in ("plain", "static:ngram:4", "ctl:ema", "vllm:ngram:2", "ours:adaptive"):
        assert kind_of(text) == kind_of(f"{text}@int4") == parse_method(text).kind, text
    assert kind_of("nonsense:4") == ""


@pytest.mark.parametrize("text, error", [
    ("fast", "unknown method 'fast' (known: plain, static:DRAFTER:K"),
    ("static:ngarm:4", "unknown drafter 'ngarm' in method 'static:ngarm:4' (known: "),
    ("static:ngram:0", "K must be >= 1 in method 'static:ngram:0', got 0"),
    ("hf:assisted:x", "K must be an integer in method 'hf:assisted:x', got 'x'"),
    ("adaptive:nope.yaml", "method 'adaptive:nope.yaml': nope.yaml: cannot read"),
    ("ctl:batch-table:ngram:4", "batch table entry '4' in method 'ctl:batch-table:ngram:4' is not SIZE=K"),
    ("ctl:batch-table:ngram:0=2", "batch table entry '0=2' in method 'ctl:batch-table:ngram:0=2': SIZE must be >= 1"),
    ("ctl:batch-table:ngram:2=1/2=3", "lists a batch size twice"),
    ("vllm:ngram:0", "K must be >= 1 in method 'vllm:ngram:0', got 0"),
    ("vllm:eagle:x", "K must be an integer in method 'vllm:eagle:x', got 'x'"),
    ("vllm:medusa:2", "unknown method 'vllm:medusa:2' (known: plain, "),
    ("vllm:dynamic:4", "batch table entry '4' in method 'vllm:dynamic:4' is not SIZE=K"),
    ("ours:fast", "unknown method 'fast' (known: "),
    ("ours:vllm:ngram:2", "method 'ours:vllm:ngram:2': ours:METHOD runs METHOD on autospec's "
                          "engine, and 'vllm:ngram:2' runs inside vLLM only"),
    ("ours:ours:plain", "and 'ours:plain' runs inside vLLM only"),
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


def test_the_vllm_forms_carry_their_fields():
    assert parse_method("vllm:dynamic:8=1/1=4").table == ((1, 4), (8, 1))
    ours = parse_method("ours:static:ngram:4")
    assert ours.inner == parse_method("static:ngram:4") and ours.needs_drafters == ("ngram",)
    assert parse_method(f"adaptive:{POLICY}").engines == (AUTOSPEC, VLLM)


def test_one_list_names_every_form_and_each_engine_its_own():
    """KNOWN is every kind's forms; known(engine) those the engine runs; each kind's Method
    says the same."""
    assert KNOWN == ", ".join(form for forms, _ in FORMS.values() for form in forms)
    assert known(VLLM) == ("plain, adaptive, adaptive:POLICY.yaml, vllm:ngram:K, vllm:eagle:K, "
                           "vllm:dynamic:TABLE, ours:METHOD")
    assert "vllm:" not in known(AUTOSPEC) and "ours:" not in known(AUTOSPEC)
    for text in ("plain", "static:ngram:4", "ctl:ema", "hf:generate", "oracle", "vllm:ngram:2",
                 "ours:plain"):
        method = parse_method(text)
        assert method.engines == FORMS[method.kind][1]


@pytest.mark.parametrize("text, engine, error", [
    ("vllm:ngram:2", AUTOSPEC, "method 'vllm:ngram:2' runs inside vLLM only (autospec bench "
                               "--engine vllm; --engine autospec runs: plain, static:DRAFTER:K"),
    ("ours:static:ngram:4", AUTOSPEC, "method 'ours:static:ngram:4' runs beside vLLM only "
                                      "(autospec bench --engine vllm); on autospec's engine "
                                      "alone, give 'static:ngram:4'"),
    ("hf:generate", VLLM, "method 'hf:generate' runs on autospec's engine, not inside vLLM: "
                          "give 'ours:hf:generate' to run it beside vLLM, or --engine autospec "
                          "(--engine vllm runs: plain, adaptive, "),
])
def test_an_engine_refuses_the_other_engines_methods_naming_it(text, engine, error):
    with pytest.raises(ValueError) as err:
        parse_methods(f"plain,{text}", engine)
    assert error in str(err.value)
    other = VLLM if engine == AUTOSPEC else AUTOSPEC
    assert [m.spec for m in parse_methods(text, other)] == ["plain", text]
    assert check_engine(parse_method("plain"), engine).kind == "plain"


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
