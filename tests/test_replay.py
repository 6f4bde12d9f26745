"""Trace record and replay: exact against live runs, and the controller against closed forms."""
import numpy as np
import pytest

from autospec.bench.harness import Prompt
from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.controller.formulas import speedup
from autospec.controller.trace import Trace, TraceRequest, record, replay
from autospec.engine.loop import StaticPolicy

PROMPTS = [Prompt("a", "def f(x):\n    return x\n" * 3, "copy"),
           Prompt("b", "import os\nimport sys\n", "code")]


@pytest.fixture(scope="module")
def tiny_trace(tiny_engine, tmp_path_factory):
    trace = record(tiny_engine, PROMPTS, ["ngram", "draft-model"], k_max=8, max_new_tokens=40)
    path = tmp_path_factory.mktemp("trace") / "t.json"
    trace.save(path)
    return Trace.load(path)


@pytest.mark.parametrize("drafter, k", [("ngram", 4), ("draft-model", 2), ("draft-model", 8)])
def test_replay_reproduces_live_steps_exactly(tiny_engine, tiny_trace, drafter, k):
    replayed = replay(tiny_trace, StaticPolicy(drafter, k))
    for prompt, rec in zip(PROMPTS, replayed):
        live = tiny_engine.generate(prompt.prompt, policy=StaticPolicy(drafter, k), max_new_tokens=40)
        assert [s.accepted for s in rec.step_records] == [s.accepted for s in live.telemetry.step_records]
        assert rec.output_tokens == len(live.token_ids)


def geometric_trace(alpha: float, c: float, n: int = 3000, seed: int = 0) -> Trace:
    """What the synthetic drafter records: each position accepted with probability alpha."""
    rng = np.random.default_rng(seed)
    accepted = rng.random((n, 8)) < alpha
    match = [int(np.argmin(row)) if not row.all() else 8 for row in accepted]
    output = list(rng.integers(0, 1000, n))
    verify = list(1.0 + 0.03 * np.arange(9))  # v(K) grows a little with K, as on a CPU
    request = TraceRequest("r", "synthetic", [1, 2, 3], [int(t) for t in output], {"synthetic": match})
    return Trace(8, verify, {"synthetic": c}, [request])


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.9])
@pytest.mark.parametrize("c", [0.05, 0.2])
def test_controller_finds_the_closed_form_optimum(alpha, c):
    trace = geometric_trace(alpha, c)
    ctl = AdaptiveController(ControllerSettings(drafters=("synthetic",), counterfactual=False))
    steps = replay(trace, ctl)[0].step_records
    best_k = int(np.argmax(speedup(np.full(8, alpha), c, np.array(trace.verify_seconds))))
    after_warmup = steps[50:]
    near = sum(abs(s.k - best_k) <= 1 for s in after_warmup) / len(after_warmup)
    assert near >= 0.9, (best_k, near)


def test_controller_picks_plain_for_a_useless_drafter():
    steps = replay(geometric_trace(0.0, 0.05), AdaptiveController(
        ControllerSettings(drafters=("synthetic",), counterfactual=False)))[0].step_records
    late = steps[50:]
    assert sum(s.k == 0 for s in late) / len(late) >= 0.9


def test_predictions_converge_to_measurements():
    """Predicted tokens per round and round seconds within 10 % of the replayed ones."""
    from autospec.controller.formulas import expected_tokens
    trace = geometric_trace(0.8, 0.1)
    ctl = AdaptiveController(ControllerSettings(drafters=("synthetic",), counterfactual=False,
                                                thompson=False))
    steps = replay(trace, ctl)[0].step_records[100:]
    k = max(set(s.k for s in steps), key=[s.k for s in steps].count)
    chosen = [s for s in steps if s.k == k]
    measured_tokens = np.mean([s.emitted for s in chosen])
    measured_seconds = np.mean([s.draft_seconds + s.verify_seconds for s in chosen])
    predicted_tokens = expected_tokens(np.full(8, 0.8))[k]
    predicted_seconds = ctl.costs.draft_seconds("synthetic", 0.1) * k + ctl.costs.verify_seconds()[k]
    assert measured_tokens == pytest.approx(predicted_tokens, rel=0.1)
    assert measured_seconds == pytest.approx(predicted_seconds, rel=0.1)


def test_malformed_trace_is_refused(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text('{"schema_version": 1, "k_max": 8}')
    with pytest.raises(ValueError, match="malformed"):
        Trace.load(bad)
    bad.write_text('{"schema_version": 7}')
    with pytest.raises(ValueError, match="schema_version 7"):
        Trace.load(bad)


def test_warm_start_reaches_steady_state_sooner():
    """A controller started from a Learner's snapshot (a daemon restart, a new serving
    process) decodes like a seasoned one from its first steps; a cold one needs a few."""
    from autospec.controller.learned import warm_vs_cold
    figures = warm_vs_cold(geometric_trace(0.8, 0.1, n=600), window=16, seeds=8)
    assert figures["warm_steps_to_steady"] == 0
    assert figures["cold_steps_to_steady"] > 0
    assert figures["tokens_per_s"]["warm"] == pytest.approx(figures["tokens_per_s"]["steady"], rel=0.02)


def test_learner_round_trips_through_store_estimates():
    from autospec.controller.learned import Learner
    trace = geometric_trace(0.7, 0.1, n=300)
    records = replay(trace, AdaptiveController(ControllerSettings(drafters=("synthetic",))))
    learner = Learner(k_max=8)
    for r in records:
        learner.observe(r)
    estimates: dict = {}
    for e in learner.estimates():
        estimates.setdefault(e.workload, {})[e.drafter] = e
    again = Learner(k_max=8).restore(estimates)
    assert again.snapshot()["acceptance"] == learner.snapshot()["acceptance"]
    assert again.costs.line() == pytest.approx(learner.costs.line(), rel=1e-6)
    assert np.mean(learner.acceptance["*"]["synthetic"].rates()[:3]) == pytest.approx(0.7, abs=0.1)
