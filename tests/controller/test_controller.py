"""The controller's pure parts on hand-written arrays, and the controller on the tiny pair."""
import numpy as np
import pytest

from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.controller.batch import batch_ks
from autospec.controller.cost import Prices
from autospec.controller.decide import NO_DRAFTER, choose_drafter
from autospec.controller.cost import StepCost
from autospec.controller.estimates import AcceptanceEstimate
from autospec.controller.formulas import expected_tokens, speedup
from autospec.controller.interface import PLAIN, Decision, Outcome, Step, decide_one, observe_one
from conftest import assert_lossless


def test_expected_tokens_matches_closed_form_for_flat_alpha():
    alpha = 0.7
    e = expected_tokens(np.full(8, alpha))
    closed = [(1 - alpha ** (k + 1)) / (1 - alpha) for k in range(9)]
    assert np.allclose(e, closed)


def _decide(alphas, c, v) -> tuple[int, int]:
    """One row's (drafter index or NO_DRAFTER, K) as the controller decides a batch of one:
    the drafter (choose_drafter), then its K (batch_ks). c: seconds per drafted token, one
    for all drafters or one each."""
    alphas, v = [list(row) for row in alphas], list(v)
    c = list(c) if hasattr(c, "__len__") else [c] * len(alphas)
    winner = choose_drafter(alphas, c, v, [len(row) for row in alphas], [0.0] * len(alphas))
    if winner == NO_DRAFTER:
        return NO_DRAFTER, 0
    k = batch_ks([alphas[winner]], [c[winner]], Prices.one_row(v))[0]
    return (winner, k) if k else (NO_DRAFTER, 0)


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.9])
@pytest.mark.parametrize("c", [0.05, 0.2])
def test_best_choice_is_argmax_of_speedup(alpha, c):
    v = 1 + 0.03 * np.arange(9)  # verify cost grows a little with K, as on a CPU
    s = speedup(np.full(8, alpha), c, v)
    assert _decide([[alpha] * 8], c, v) == (0, int(np.argmax(s)))


def test_plain_wins_when_drafts_are_useless_or_too_dear():
    v = np.ones(9)
    assert _decide([[0.0] * 8], 0.01, v) == (NO_DRAFTER, 0)
    assert _decide([[0.5] * 8], 2.0, v) == (NO_DRAFTER, 0)


def test_acceptance_estimate_follows_a_phase_change():
    est = AcceptanceEstimate(4, discount=0.9)
    for _ in range(50):
        est.update(4, 4)
    assert est.mean()[0] > 0.9
    for _ in range(30):
        est.update(4, 0)
    assert est.mean()[0] < 0.2


def test_the_step_cost_fits_one_row_s_sizes_and_extrapolates_along_them():
    cost = StepCost(8)
    for _ in range(10):
        cost.observe(1, 1, 1.0)
        cost.observe(1, 5, 1.4)
    prices = cost.prices(1)
    assert prices.step(0) == pytest.approx(1.0, rel=1e-3)
    assert prices.step(4) == pytest.approx(1.4, rel=1e-3)
    assert prices.step(8) == pytest.approx(1.8, rel=0.02)  # the unmeasured size: the plane


def test_the_step_cost_clips_a_cold_start_outlier():
    cost = StepCost(8)
    for _ in range(10):
        cost.observe(1, 1, 1.0)
    cost.observe(1, 1, 50.0)
    assert cost.prices(1).step(0) < 1.3


def test_controller_settings_reject_unknown_drafters():
    with pytest.raises(ValueError, match="unknown drafter 'ngarm'"):
        ControllerSettings(drafters=("ngarm",))


class FakeClock:
    """A perf_counter that stands still until a test spends time on it: each second the engine
    or the controller measures is one the test chose, not one the machine took."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


DRAFT_S, VERIFY_S = 0.02, 0.05  # what the fake clock charges a proposal and a target forward


@pytest.fixture
def clock(monkeypatch):
    """The engine's clock, made a FakeClock; a drafter's proposal
    costs DRAFT_S on it and a target forward (prefill, verify) VERIFY_S, and nothing else
    costs anything. (Request.started keeps the real clock: wall_seconds is not looked at.)"""
    from autospec.drafters import lookups
    from autospec.engine import loop

    fake = FakeClock()
    monkeypatch.setattr(loop, "time", fake)  # Engine.clock too: advance's
    forward = loop.Engine._forward  # the target's forward: prefill and verify

    def costly_forward(*args, **kwargs):
        fake.spend(VERIFY_S)
        return forward(*args, **kwargs)

    create = lookups.create_drafter  # Lookups.drafter: every drafter a request runs

    def costly_drafter(*args, **kwargs):
        drafter = create(*args, **kwargs)
        propose = drafter.propose

        def costly_propose(*a, **kw):
            fake.spend(DRAFT_S)
            return propose(*a, **kw)

        drafter.propose = costly_propose
        return drafter

    monkeypatch.setattr(loop.Engine, "_forward", costly_forward)
    monkeypatch.setattr(lookups, "create_drafter", costly_drafter)
    return fake


def test_adaptive_falls_back_to_plain_with_a_useless_drafter(tiny_pair, clock):
    """On the fake clock (a forward costs the same for any K, a draft costs more than nothing)
    the decisions do not depend on how fast this machine runs the tiny pair."""
    from autospec.engine.loop import Engine
    engine = Engine(tiny_pair, drafter_options={"synthetic": {"alpha": 0.0}})
    ctl = AdaptiveController(ControllerSettings(drafters=("synthetic",)))
    for i in range(6):
        out = engine.generate(f"x{i} = {i}\n", controller=ctl, max_new_tokens=40)
    late = out.telemetry.step_records[-20:]
    assert sum(s.k == 0 for s in late) >= 0.8 * len(late)


def test_adaptive_output_is_identical_to_plain(tiny_engine):
    ctl = AdaptiveController()
    for prompt in ("def f(x):\n    return x\n" * 3, "import os\n", "class A:\n    pass\n"):
        plain = tiny_engine.generate(prompt, drafter=None, max_new_tokens=30)
        out = tiny_engine.generate(prompt, controller=ctl, max_new_tokens=30)
        assert_lossless(tiny_engine.models, prompt, plain.token_ids, out.token_ids)


def test_controller_seconds_are_the_time_in_decide_and_update(tiny_pair, clock):
    """The engine times the controller's decide + update per step (not draft or verify): on the
    fake clock a decide costs 2 ms, an update 1 ms, a draft DRAFT_S and a verify VERIFY_S, so
    each step's controller seconds are exactly 3 ms, and 0 with a controller that costs nothing."""
    from autospec.engine.loop import Engine
    from autospec.controller.interface import StaticController

    class Slow(StaticController):
        def decide(self, step):
            clock.spend(0.002)
            return super().decide(step)

        def observe(self, outcome):
            clock.spend(0.001)

    engine = Engine(tiny_pair)
    out = engine.generate("x = 1\n", controller=Slow("ngram", 2), max_new_tokens=6)
    fast = engine.generate("x = 1\n", drafter="ngram", k=2, max_new_tokens=6)
    for gen, controller_s in ((out, 0.003), (fast, 0.0)):
        steps = gen.telemetry.step_records
        assert len(steps) >= 2
        # the draft and verify seconds were spent inside the step: they are not the controller's
        assert [s.verify_seconds for s in steps] == pytest.approx([VERIFY_S] * len(steps))
        assert [s.draft_seconds for s in steps] == pytest.approx(
            [DRAFT_S if s.k else 0.0 for s in steps])
        assert any(s.k for s in steps)
        assert [s.controller_seconds for s in steps] == pytest.approx([controller_s] * len(steps),
                                                                        abs=1e-12)
        assert gen.telemetry.controller_seconds == pytest.approx(len(steps) * controller_s,
                                                                 abs=1e-12)


def test_the_drafter_choice_on_arrays():
    verify = [1.0] * 9  # memory-bound: a forward costs the same for any K
    strong, weak = [0.9] * 8, [0.3] * 8
    cheap = [0.01, 0.01]
    # the better drafter wins
    assert choose_drafter([weak, strong], cheap, verify, [8, 8], [0.0, 0.0]) == 1
    # a switch's price: a drafter that must first prefill its cache loses a near tie
    near = [[0.89] * 8, strong]
    assert choose_drafter(near, cheap, verify, [8, 8], [0.0, 0.0]) == 1
    assert choose_drafter(near, cheap, verify, [8, 8], [0.0, 1.0]) == 0
    # useless drafts, or drafts dearer than a forward: plain decoding
    assert choose_drafter([[0.0] * 8] * 2, cheap, verify, [8, 8], [0.0, 0.0]) == NO_DRAFTER
    assert choose_drafter([weak, strong], [2.0, 2.0], verify, [8, 8], [0.0, 0.0]) == NO_DRAFTER
    # K the longest (flat verify, cheap drafts)
    assert _decide([strong], 0.01, verify) == (0, 8)


def test_ngram_is_drafted_only_as_far_as_its_proposal_reaches():
    """The n-gram proposal is known before deciding: no match -> not n-gram; else K <= its length."""
    from rows import row
    ctl = AdaptiveController(ControllerSettings(drafters=("ngram",),
                                                prior_means={"ngram": 0.95}))
    for _ in range(4):
        ctl.cost.observe(1, 1, 0.01)
    ctl.cost.observe_draft("ngram", 1e-6, 1)
    fresh = row("a", [5, 6, 7, 8], 4, None)  # no suffix recurs: nothing to propose
    assert decide_one(ctl, fresh) == PLAIN
    # the suffix (7, 8) recurred with three tokens after it (9, 7, 8): at most 3 can be drafted
    short = row("b", [7, 8, 9, 7, 8], 5, None)
    drafter, k, _ = decide_one(ctl, short)
    assert drafter == "ngram" and 1 <= k <= 3


def test_lazy_discount_equals_the_discounted_counts():
    """The estimate keeps its counts in units of a running scale (the per-step path's cost):
    after any sequence of updates, and across the scale's renormalisation, the evidence is
    the plainly discounted count and the Beta parameters the formula's."""
    rng = np.random.default_rng(0)
    est = AcceptanceEstimate(6, prior_mean=0.4, prior_strength=3.0, discount=0.5)
    ev_a, ev_b = np.zeros(6), np.zeros(6)
    for _ in range(400):  # 0.5 ** 400: the scale renormalises several times
        proposed = int(rng.integers(1, 8))
        accepted = int(rng.integers(0, proposed + 1))
        est.update(proposed, accepted)
        ev_a, ev_b = ev_a * 0.5, ev_b * 0.5
        ev_a[:min(accepted, 6)] += 1
        if accepted < proposed and accepted < 6:
            ev_b[accepted] += 1
    assert np.allclose(est.ev_a, ev_a) and np.allclose(est.ev_b, ev_b)
    pooled = (ev_a.sum() + 3.0 * 0.4) / (ev_a.sum() + ev_b.sum() + 3.0)
    a, b = est.beta()
    assert np.allclose(a, ev_a + 8 * pooled) and np.allclose(b, ev_b + 8 * (1 - pooled))
    assert np.allclose(est.mean_list(), a / (a + b))


def test_python_decision_agrees_with_the_rate_table():
    """decide.py's loops and batch_ks at one row (Python floats) choose what the array
    formula's argmax chooses, on random drafters, costs and proposal lengths."""
    from autospec.controller.formulas import rate_table
    rng = np.random.default_rng(1)
    for _ in range(200):
        d = int(rng.integers(1, 4))
        alphas = rng.uniform(0, 1, (d, 16)) ** rng.uniform(0.2, 3)
        draft_s = rng.uniform(0, 0.3, d)
        verify = 1 + rng.uniform(0, 0.1) * np.arange(17)
        table = rate_table(alphas, draft_s, verify)
        best = [int(np.argmax(row[1:])) + 1 for row in table]
        winner, k = _decide(alphas, draft_s, verify)
        rates = table[:, 1:].max(axis=1)
        if rates.max() <= table[0, 0]:
            assert (winner, k) == (NO_DRAFTER, 0)
            continue
        assert winner == int(np.argmax(rates))
        # the loop stops at survival < 1e-6: a K past that gains under a millionth of a token
        assert table[winner, k] == pytest.approx(table[winner, best[winner]], rel=1e-5)
