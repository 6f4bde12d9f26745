"""bench's own arithmetic on hand-written numbers, and its results keyed by MethodAt values
(the harness end to end through the CLI is in test_cli)."""
import pytest

from autospec.bench.harness import Measurements, measure_costs, run_bench, theoretical_best
from autospec.bench.methods import MethodAt
from autospec.bench.prompts import Prompt
from autospec.method import parse_method, parse_methods
from autospec.telemetry import StepRecord, acceptance_per_position


def at(text, weights=""):
    return MethodAt(parse_method(text), weights)


def test_theoretical_best_is_formulas_speedup_over_the_measured_costs():
    measured = {"v": {"1": 1.1, "2": 1.2, "3": 1.3}, "c": {"ngram": 0.05, "early-exit": 0.4},
                "alpha": {"ngram": {"copy": [0.9, 0.8, 0.6, 0.5], "prose": [0.2, 0.05]},
                          "early-exit": {"copy": [0.5]}, "draft-model": {"copy": [0.99]}}}
    best = theoretical_best(measured)
    # E(K) = 1 + the cumulative alphas; S(K) = E(K) / (c K + v(K)); v stops at K = 3
    assert best["copy"]["drafter"] == "ngram" and best["copy"]["k"] == 3
    assert best["copy"]["speedup"] == pytest.approx(3.3 / (0.15 + 1.3))
    assert best["prose"] == {"drafter": "ngram", "k": 1, "speedup": pytest.approx(1.2 / 1.15)}


def _step(drafter, proposed, accepted, verify_tokens=None):
    return StepRecord("r", 0, drafter, proposed, proposed, accepted, accepted + 1, 0.001 * proposed,
                      0.01, verify_tokens or proposed + 1, 10, 0, 0.0)


def test_measured_alpha_counts_positions_like_telemetry():
    steps = [_step("ngram", 4, 4), _step("ngram", 4, 1), _step("ngram", 2, 0),
             _step("early-exit", 3, 2)]
    assert acceptance_per_position(steps[:3]) == [2 / 3, 1 / 3, 1 / 2, 1 / 2]
    data = Measurements()
    data.steps[at("plain")] = [("copy", _step("none", 0, 0))]
    data.steps[at("static:ngram:4")] = [("copy", s) for s in steps[:3]]
    data.steps[at("static:early-exit:3")] = [("prose", steps[3])]
    alpha = measure_costs(data, engine=None)["alpha"]
    assert alpha == {"ngram": {"copy": [0.6667, 0.3333, 0.5, 0.5]},
                     "early-exit": {"prose": [1.0, 1.0, 0.0]}}


def test_the_formula_charges_short_drafts_and_the_per_step_overhead():
    """An n-gram step with no match asked for K tokens and got none: per slot it counts as a
    rejection (per proposed position it is not counted at all). The overhead every step pays
    outside the forward is charged to plain and drafting steps alike."""
    from autospec.bench.harness import Cell, charged_speedup
    empty = StepRecord("r", 0, "ngram", 4, 0, 0, 1, 0.0, 0.01, 1, 10, 0, 0.0)
    steps = [_step("ngram", 4, 4), empty]
    assert acceptance_per_position(steps, per_slot=True) == [0.5, 0.5, 0.5, 0.5]
    assert acceptance_per_position(steps) == [1.0, 1.0, 1.0, 1.0]
    data = Measurements()
    data.steps[at("plain")] = [("copy", _step("none", 0, 0)) for _ in range(4)]
    data.cells[at("plain")]["copy"][0] = Cell(tokens=4, wall_s=0.05, steps=4)  # 12.5 ms a step
    data.steps[at("static:ngram:4")] = [("copy", s) for s in steps]
    measured = measure_costs(data, engine=None)
    assert measured["overhead"] == pytest.approx(0.25)  # 2.5 ms beyond a 10 ms forward
    rates = charged_speedup(measured, "ngram", "copy")
    # E(4) = 1 + 4 * 0.5 = 3; a step costs c K + v(4) + o over a plain one's 1 + o
    v4 = measured["v"]["4"]
    assert rates[4] == pytest.approx(3 * 1.25 / (measured["c"]["ngram"] * 4 + v4 + 0.25))


def test_a_method_at_a_format_is_keyed_by_its_spec_and_the_format():
    assert at("static:ngram:4").key == "static:ngram:4"
    assert at("static:ngram:4", "int4").key == "static:ngram:4@int4"
    assert at("plain", "int4") == at("plain", "int4") != at("plain", "float32")
    data = Measurements()
    data.steps[at("plain", "int4")] = [("copy", _step("none", 0, 0))]
    data.steps[at("plain", "float32")] = []
    assert list(data.at("int4").steps) == [at("plain", "int4")]


@pytest.fixture(scope="module")
def prompts():
    return [Prompt("a", "def f(x):\n    return x\n\ndef g(x):\n", "code"),
            Prompt("b", "x = 1\ny = 2\nx = 1\ny = 2\n", "copy")]


def test_the_reports_keys_are_the_methods_specs(tiny_engine, prompts):
    methods = parse_methods("static:ngram:2,ctl:fixed:ngram:1,adaptive,hf:generate,oracle,"
                            "oracle-per-category")
    report = run_bench(tiny_engine, prompts, methods, max_new_tokens=8)
    assert list(report["methods"]) == [m.spec for m in methods]
    assert report["methods"]["oracle"]["picked"] == "static:ngram:2"
    assert report["methods"]["oracle-per-category"]["picked"] == {"code": "static:ngram:2",
                                                                  "copy": "static:ngram:2"}
    assert set(report["predicted_static"]) <= {"static:ngram:2"}
    assert {m for m, stats in report["methods"].items() if "choices" in stats} == \
        {"ctl:fixed:ngram:1", "adaptive"}
    assert report["methods"]["plain"]["overall"]["speedup_vs_plain"] == 1.0
    assert set(report["sample_outputs"]) == {"a", "b"}


def test_with_several_formats_each_method_is_keyed_at_its_format(tiny_engine, prompts):
    """Here both "formats" are one engine: the keys and the plain each run is compared with
    are the point."""
    methods = parse_methods("static:ngram:2,oracle")
    report = run_bench({"float32": tiny_engine, "copy": tiny_engine}, prompts[:1], methods,
                       max_new_tokens=8)
    assert list(report["methods"]) == ["plain@float32", "static:ngram:2@float32", "plain@copy",
                                       "static:ngram:2@copy", "oracle"]
    assert report["methods"]["plain@float32"]["overall"]["speedup_vs_plain"] == 1.0
    assert report["methods"]["oracle"]["picked"] in ("static:ngram:2@float32", "static:ngram:2@copy")
    assert report["predicted_static"] == {}
    assert all(stats["overall"]["identical_to_plain"] for stats in report["methods"].values())
