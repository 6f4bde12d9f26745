"""bench's own arithmetic on hand-written numbers (the harness end to end is in test_cli)."""
import pytest

from autospec.bench.harness import Measurements, measure_costs, theoretical_best
from autospec.telemetry import StepRecord, acceptance_per_position


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
    data.steps["plain"] = [("copy", _step("none", 0, 0))]
    data.steps["static:ngram:4"] = [("copy", s) for s in steps[:3]]
    data.steps["static:early-exit:3"] = [("prose", steps[3])]
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
    data.steps["plain"] = [("copy", _step("none", 0, 0)) for _ in range(4)]
    data.cells["plain"]["copy"][0] = Cell(tokens=4, wall_s=0.05, steps=4)  # 12.5 ms a step
    data.steps["static:ngram:4"] = [("copy", s) for s in steps]
    measured = measure_costs(data, engine=None)
    assert measured["overhead"] == pytest.approx(0.25)  # 2.5 ms beyond a 10 ms forward
    rates = charged_speedup(measured, "ngram", "copy")
    # E(4) = 1 + 4 * 0.5 = 3; a step costs c K + v(4) + o over a plain one's 1 + o
    v4 = measured["v"]["4"]
    assert rates[4] == pytest.approx(3 * 1.25 / (measured["c"]["ngram"] * 4 + v4 + 0.25))
