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
