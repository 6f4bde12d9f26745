"""Trace record and replay: exact against live runs, and the controller against closed forms."""
import hashlib
import json

import numpy as np
import pytest

from autospec.bench.prompts import Prompt
from autospec.bench.trace import Trace, TraceRequest
from autospec.bench.record import record
from autospec.bench.recorded import replay
from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.controller.formulas import speedup
from autospec.controller.interface import Decision, RowController, StaticController
from conftest import NEAR_TIE, REPO_ROOT, divergences

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
    replayed = replay(tiny_trace, StaticController(drafter, k))
    for prompt, rec in zip(PROMPTS, replayed):
        live = tiny_engine.generate(prompt.prompt, controller=StaticController(drafter, k),
                                    max_new_tokens=40)
        assert [s.accepted for s in rec.step_records] == [s.accepted for s in live.telemetry.step_records]
        assert rec.output_tokens == len(live.token_ids)


class Scripted(RowController):
    """Replays a live run's decisions, request by request, step by step."""

    def __init__(self, records):
        self.steps = {r.request_id: [(s.drafter, s.k) for s in r.step_records] for r in records}

    def decide_row(self, request) -> Decision:
        drafter, k = self.steps[request.request_id][len(request.steps)]
        return Decision(None if drafter == "none" else drafter, k)


def test_replaying_a_live_runs_decisions_reproduces_its_acceptance(tiny_engine, tiny_trace):
    """The live loop at two rows, the adaptive controller deciding; the same loop over the
    recorded target, told the same decisions, accepts exactly what the live run accepted
    (on the trained tiny pair a request whose live output left the recorded one at a near-tie
    is not compared: the trace holds the other branch; one at a wider margin fails)."""
    from autospec.bench.recorded import replay_batch
    from autospec.controller.adaptive import AdaptiveController
    from autospec.engine.loop import Engine
    from autospec.engine.request import Job
    engine = Engine(tiny_engine.models, max_batch=2)
    jobs = [Job(r.prompt, len(r.output), request_id=r.id, workload=r.category)
            for r in tiny_trace.requests]
    generations = engine.run(jobs, AdaptiveController())
    live = [g.telemetry for g in generations]
    replayed, _ = replay_batch(tiny_trace, Scripted(live), 2)
    steps = lambda r: [(s.drafter, s.k, s.proposed, s.accepted, s.emitted, s.batch_size)  # noqa: E731
                       for s in r.step_records]
    diverged = {i for i, _, margin in divergences(
        tiny_engine.models, [r.prompt for r in tiny_trace.requests],
        [g.token_ids for g in generations], [r.output for r in tiny_trace.requests])
        if margin < NEAR_TIE}
    for i, (got, want) in enumerate(zip(replayed, live)):
        if i not in diverged:  # else the live run left the recorded output at a near-tie
            assert steps(got) == steps(want), tiny_trace.requests[i].id
    assert len(diverged) < len(live)
    assert sum(s.proposed for r in live for s in r.step_records) > 0  # it drafted


def test_replay_binds_the_controller_once_before_its_first_step(tiny_trace):
    """The recorded target is a host like the engine (Controller.bind): the recorded
    drafters, once, before the first decision, at one row and at several."""
    from autospec.bench.recorded import replay_batch

    class Binding(StaticController):
        def bind(self, drafters):
            events.append(("bind", drafters))

        def decide(self, step):
            events.append("decide")
            return super().decide(step)

    for rows in (1, 2):
        events = []
        replay_batch(tiny_trace, Binding("ngram", 4), rows)
        assert events[0] == ("bind", ("ngram", "draft-model")), rows
        assert events.count("decide") > 1 and sum(e != "decide" for e in events) == 1, rows


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
    ctl = AdaptiveController(ControllerSettings(drafters=("synthetic",)))
    steps = replay(trace, ctl)[0].step_records
    rates = speedup(np.full(8, alpha), c, np.array(trace.verify_seconds))
    best = [k for k, rate in enumerate(rates) if rate >= rates.max() * (1 - 1e-3)]  # ties: all
    after_warmup = steps[50:]
    near = sum(min(abs(s.k - k) for k in best) <= 1 for s in after_warmup) / len(after_warmup)
    assert near >= 0.9, (best, near)


def test_controller_picks_plain_for_a_useless_drafter():
    steps = replay(geometric_trace(0.0, 0.05), AdaptiveController(
        ControllerSettings(drafters=("synthetic",))))[0].step_records
    late = steps[50:]
    assert sum(s.k == 0 for s in late) / len(late) >= 0.9


def test_predictions_converge_to_measurements():
    """Predicted tokens per round and round seconds within 10 % of the replayed ones."""
    from autospec.controller.formulas import expected_tokens
    trace = geometric_trace(0.8, 0.1)
    ctl = AdaptiveController(ControllerSettings(drafters=("synthetic",)))
    steps = replay(trace, ctl)[0].step_records[100:]
    k = max(set(s.k for s in steps), key=[s.k for s in steps].count)
    chosen = [s for s in steps if s.k == k]
    measured_tokens = np.mean([s.emitted for s in chosen])
    measured_seconds = np.mean([s.draft_seconds + s.verify_seconds for s in chosen])
    predicted_tokens = expected_tokens(np.full(8, 0.8))[k]
    predicted_seconds = ctl.cost.draft["synthetic"] * k + ctl.cost.prices(1).step(k)
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
    from autospec.bench.warm_start import warm_vs_cold
    figures = warm_vs_cold(geometric_trace(0.8, 0.1, n=600), window=16,
                           yesterday=geometric_trace(0.8, 0.1, n=600, seed=1))
    assert figures["warm_steps_to_steady"] == 0
    assert figures["cold_steps_to_steady"] > 0
    # 4 %: at alpha 0.8 K = 5 and 6 are 0.7 % apart in expected rate, and a price 1e-5 s
    # apart (the warm one's sizes not yet measured) flips a request's choice between them
    assert figures["tokens_per_s"]["warm"] == pytest.approx(figures["tokens_per_s"]["steady"], rel=0.04)


def test_unlabelled_and_pooled_are_two_keys():
    """An unlabelled request informs only the Learner's pooled estimate; a controller
    warm-started from it keys that estimate as its unlabelled workload's prior."""
    from autospec.daemon.learner import Learner
    from autospec.telemetry import POOLED, UNLABELLED
    assert POOLED != UNLABELLED
    trace = geometric_trace(0.7, 0.1, n=200)
    unlabelled = TraceRequest("u", None, *[getattr(trace.requests[0], f) for f in
                                           ("prompt", "output", "match")])
    ctl = AdaptiveController(ControllerSettings(drafters=("synthetic",)))
    learner = Learner(k_max=8)
    for r in replay(trace, ctl, [unlabelled]):
        learner.observe(r)
    assert set(learner.acceptance) == {POOLED}
    assert set(ctl.priors) == {UNLABELLED}
    for r in replay(trace, ctl):  # workload "synthetic"
        learner.observe(r)
    assert set(learner.acceptance) == {POOLED, "synthetic"}
    fresh = AdaptiveController(ControllerSettings(drafters=("synthetic",)))
    assert fresh.warm_start(learner.snapshot()) == 2
    assert set(fresh.priors) == {UNLABELLED, "synthetic"}


def test_learner_round_trips_through_store_estimates():
    from autospec.daemon.learner import Learner
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
    # the store's rows keep one row's line (the plane itself is kept apart: daemon tests)
    assert again.cost.line() == pytest.approx(learner.cost.line(), rel=0.02)
    assert np.mean(learner.acceptance["*"]["synthetic"].rates()[:3]) == pytest.approx(0.7, abs=0.1)


# -- the decisions on the shipped traces, pinned -----------------------------------------------
# A refactor must not change one controller decision. Each digest is sha256 over every replayed
# step's (drafter, k, accepted, emitted), request by request, on configs/traces/*.json.
SHIPPED_TRACES = sorted((REPO_ROOT / "configs" / "traces").glob("*.json"))
PINNED_METHODS = ("plain", "adaptive", "adaptive:policies/default.yaml",
                  "adaptive:policies/mixed.yaml", "ctl:hf-heuristic", "ctl:ema",
                  "ctl:fixed:ngram:3", "static:ngram:4")
TUNED_VALUES = {"k_min": 2, "k_max": 8, "drafters": ("ngram", "early-exit"),
                "priors.ngram": 0.8}


def _decisions_digest(records) -> str:
    steps = [[r.request_id, [(s.drafter, s.k, s.accepted, s.emitted) for s in r.step_records]]
             for r in records]
    return hashlib.sha256(json.dumps(steps).encode()).hexdigest()[:16]


def _replay_digests() -> dict[str, str]:
    from autospec.controller.factory import make_controller
    from autospec.daemon.learner import Learner
    from autospec.method import parse_method
    from autospec.tune.controller import build_controller, parameters_for
    out = {}
    for path in SHIPPED_TRACES:
        trace = Trace.load(path)
        for method in PINNED_METHODS:
            if method.startswith("adaptive:"):
                method_path = f"adaptive:{REPO_ROOT / method.split(':', 1)[1]}"
            else:
                method_path = method
            out[f"{path.name} {method}"] = _decisions_digest(
                replay(trace, make_controller(parse_method(method_path))))
        tuned = build_controller(parameters_for(TUNED_VALUES))
        out[f"{path.name} tuned"] = _decisions_digest(replay(trace, tuned))
        learner = Learner(k_max=trace.k_max)
        for r in replay(trace, make_controller(parse_method("adaptive"))):
            learner.observe(r)
        warm = make_controller(parse_method("adaptive"))
        warm.warm_start(learner.snapshot())
        out[f"{path.name} warm"] = _decisions_digest(replay(trace, warm))
    return out


PINNED_DIGESTS: dict[str, str] = {
    'heldout.json adaptive': '8b0418c965d32502',
    'heldout.json adaptive:policies/default.yaml': '8b0418c965d32502',
    'heldout.json adaptive:policies/mixed.yaml': '245d15b029f7c9b6',
    'heldout.json ctl:ema': '209c133caf495c4c',
    'heldout.json ctl:fixed:ngram:3': '77663757065c52ec',
    'heldout.json ctl:hf-heuristic': '6ff922a7a35c2180',
    'heldout.json plain': '14b5231eecd24b66',
    'heldout.json static:ngram:4': '7433d2e083db39c8',
    'heldout.json tuned': '53b6ce5a362eeffe',
    'heldout.json warm': '7b079c9367266282',
    'mixed.json adaptive': '89cfe25264347cce',
    'mixed.json adaptive:policies/default.yaml': '89cfe25264347cce',
    'mixed.json adaptive:policies/mixed.yaml': 'ec39d9eb71952540',
    'mixed.json ctl:ema': '04d70a1ae0ffc7ae',
    'mixed.json ctl:fixed:ngram:3': '087b2018e4f735a3',
    'mixed.json ctl:hf-heuristic': 'e414612228efcf5e',
    'mixed.json plain': '0c697110916a5d3f',
    'mixed.json static:ngram:4': '720984396261315b',
    'mixed.json tuned': '729f96c3764ff0b9',
    'mixed.json warm': '8ede8e982ffdb645',
    'reference.json adaptive': '7e42f1eef865c9e0',
    'reference.json adaptive:policies/default.yaml': '7e42f1eef865c9e0',
    'reference.json adaptive:policies/mixed.yaml': 'e377fa6a641081ab',
    'reference.json ctl:ema': 'a00ffbfdf8be5746',
    'reference.json ctl:fixed:ngram:3': '6c61f0b3ffc00233',
    'reference.json ctl:hf-heuristic': '3b19c4c998ae965e',
    'reference.json plain': 'e0807f303b20c56c',
    'reference.json static:ngram:4': '480d67b7c2608bb2',
    'reference.json tuned': '07a8d4a0039782b4',
    'reference.json warm': '37d337ed1044f93c',
    'smollm2-chat.json adaptive': 'b4577b34fe500df0',
    'smollm2-chat.json adaptive:policies/default.yaml': 'b4577b34fe500df0',
    'smollm2-chat.json adaptive:policies/mixed.yaml': '79ce33b9caeb6420',
    'smollm2-chat.json ctl:ema': 'd48af6a933db771e',
    'smollm2-chat.json ctl:fixed:ngram:3': 'b32e13f65e9f6408',
    'smollm2-chat.json ctl:hf-heuristic': '6f08e06b15156155',
    'smollm2-chat.json plain': '6a3305deb0435767',
    'smollm2-chat.json static:ngram:4': 'fdd889dda9ae0884',
    'smollm2-chat.json tuned': '52268eced5c93dc4',
    'smollm2-chat.json warm': '9adcd6ed914b2ccf',
}


def test_replay_decisions_on_shipped_traces_are_pinned():
    assert SHIPPED_TRACES, "configs/traces/*.json not found"
    assert _replay_digests() == PINNED_DIGESTS


def batch_trace(requests: int = 12, n: int = 120) -> Trace:
    """Requests of unequal acceptance (0.2 .. 0.9) under a batch line where a drafted token
    costs 2 ms against a plain row's 5.5 (4 rows)."""
    traces = [geometric_trace(0.2 + 0.7 * i / (requests - 1), 0.0, n=n, seed=i)
              for i in range(requests)]
    reqs = [TraceRequest(f"r{i}", "synthetic", t.requests[0].prompt, t.requests[0].output,
                         t.requests[0].match) for i, t in enumerate(traces)]
    line = [0.01, 0.001, 0.002, 0.001, 0.0002]
    verify = [line[0] + line[1] + line[2] * (k + 1) + (line[3] if k else 0.0) + line[4] * k
              for k in range(9)]  # a row alone: the same line at B = 1
    return Trace(8, verify, {"synthetic": 0.0}, reqs, batch_line=line)


def test_the_recorded_trace_keeps_its_batch_line(tiny_trace):
    """record measures the target's forward over 16 and 8 rows: a wider step costs more."""
    from autospec.bench.recorded import trace_prices
    assert tiny_trace.batch_line is not None and len(tiny_trace.batch_line) == 5
    prices = trace_prices(tiny_trace, 16)
    assert prices.step(16, 1) > prices.step(0)


def test_replay_under_load_emits_every_output_and_hindsight_is_the_ceiling():
    """Every request's whole output comes out under any controller, and the controller that
    knows the outputs makes more tokens per simulated second than each fixed K and the
    adaptive controller (fails if the hindsight drafted anything the target rejects, or if
    the batch line were not charged per position)."""
    from autospec.bench.recorded import HindsightController, replay_batch
    trace = batch_trace()
    rates = {}
    for name, controller in [("plain", StaticController(None, 0)),
                             *[(f"static:{k}", StaticController("synthetic", k)) for k in (1, 2, 4, 8)],
                             ("adaptive", AdaptiveController(ControllerSettings(
                                 drafters=("synthetic",)))),
                             ("hindsight", HindsightController(trace))]:
        records, elapsed = replay_batch(trace, controller, rows=4)
        assert [r.output_tokens for r in records] == [len(r.output) for r in trace.requests]
        if name == "hindsight":  # only kept tokens drafted
            assert all(s.accepted == s.proposed for r in records for s in r.step_records)
        rates[name] = sum(r.output_tokens for r in records) / elapsed
    assert rates["static:8"] < rates["static:2"]  # drafted tokens have a price here
    assert rates["hindsight"] > max(rate for name, rate in rates.items() if name != "hindsight")


def test_replay_under_load_needs_a_batch_line(tmp_path):
    from autospec.bench.recorded import replay_batch
    from clirun import error_line, invoke
    trace = geometric_trace(0.5, 0.1, n=50)
    with pytest.raises(ValueError, match="no batch line"):
        replay_batch(trace, StaticController(None, 0), rows=4)
    trace.save(tmp_path / "old.json")
    assert "no batch line" in error_line(invoke(["replay", tmp_path / "old.json", "--rows", "4"]))
    batch_trace().save(tmp_path / "t.json")
    result = invoke(["replay", tmp_path / "t.json", "--rows", "4", "--controller", "plain",
                     "--controller", "hindsight"])
    assert result.exit_code == 0 and "| hindsight |" in result.output, result.output


def test_hindsight_of_some_drafters_only(tmp_path):
    """`hindsight:ngram`: foresight of n-gram's agreement alone, on the shipped SmolLM2 trace
    (four drafters recorded): above every fixed n-gram K, below foresight of n-gram and the
    feature head (fails if the restriction were ignored, or if it let another drafter draft);
    a drafter the trace did not record is refused by name."""
    from clirun import error_line, invoke
    trace = REPO_ROOT / "configs" / "traces" / "smollm2-chat.json"
    out = tmp_path / "r.json"
    result = invoke(["replay", trace, "--controller",
                     "static:ngram:2,static:ngram:6,hindsight:ngram,hindsight:ngram+eagle",
                     "--json", out])
    assert result.exit_code == 0, result.output
    rate = {name: stats["overall"]["tokens_per_s"] for name, stats in json.loads(out.read_text()).items()}
    assert max(rate["static:ngram:2"], rate["static:ngram:6"]) < rate["hindsight:ngram"]
    assert rate["hindsight:ngram"] < rate["hindsight:ngram+eagle"]
    assert "hindsight over drafter 'suffix'" in error_line(
        invoke(["replay", trace, "--controller", "hindsight:suffix"]))


def test_hindsight_picks_the_drafter_worth_most_not_the_longest():
    """Where a costly drafter agrees one token longer than a free one, foresight drafts the
    free one's three tokens (fails if it picked by agreement alone); restricted to the costly
    one, it never drafts the free one."""
    from autospec.bench.recorded import HindsightController
    from rows import row
    output = [7] * 8
    request = TraceRequest("r", "synthetic", [1, 2, 3], output,
                           {"free": [3] * 8, "costly": [4] * 8})
    verify = [0.010 + 0.0001 * k for k in range(9)]
    trace = Trace(8, verify, {"free": 0.0, "costly": 0.02}, [request])
    decision = HindsightController(trace).decide_row(row("r", [1, 2, 3], 3, "synthetic"))
    assert (decision.drafter, decision.k) == ("free", 3)
    only = HindsightController(trace, ("costly",)).decide_row(row("r", [1, 2, 3], 3, "synthetic"))
    assert only.drafter in ("costly", None)


def test_a_drafter_that_proposes_nothing_costs_nothing_in_replay():
    """A look-up drafter with no match proposes no tokens: the step verifies one token, as
    live (fails if replay charged the K asked for rather than the tokens proposed)."""
    from autospec.bench.recorded import replay_batch
    trace = batch_trace(requests=4, n=40)
    for request in trace.requests:
        request.proposed = {"synthetic": [0] * len(request.output)}
    plain = replay(trace, StaticController(None, 0))
    none = replay(trace, StaticController("synthetic", 4))
    assert [r.wall_seconds for r in none] == [r.wall_seconds for r in plain]
    steps = [s for r in none for s in r.step_records]
    assert all(s.proposed == 0 for s in steps) and sum(s.k == 4 for s in steps) > len(steps) / 2
    assert replay_batch(trace, StaticController("synthetic", 4), 4)[1] == pytest.approx(
        replay_batch(trace, StaticController(None, 0), 4)[1])


def test_the_controller_and_the_daemon_learn_by_one_rule():
    """The steps a controller folded, handed to a Learner that keeps evidence whole, leave it
    with the controller's own pooled acceptance, costs and drafter seconds (Learning.fold,
    controller/learning.py; the synthetic drafter: nothing counterfactual to add)."""
    from autospec.daemon.learner import Learner
    ctl = AdaptiveController(ControllerSettings(drafters=("synthetic",)))
    records = replay(geometric_trace(0.7, 0.1, n=400), ctl)
    learner = Learner(k_max=ctl.settings.k_max, discount=1.0)
    for r in records:
        learner.observe(r)
    ours, theirs = ctl.learning.estimate("synthetic", "synthetic"), learner.acceptance["synthetic"]["synthetic"]
    assert theirs.mean() == pytest.approx(ours.mean())
    # the same evidence; priced afresh, each (a model re-prices every REFRESH steps, so the
    # controller's last prices may predate its last steps)
    for cost in (learner.cost, ctl.cost):
        cost._changed()
    assert learner.cost.prices(1).table == pytest.approx(ctl.cost.prices(1).table)
    assert learner.cost.draft == pytest.approx(ctl.cost.draft)
