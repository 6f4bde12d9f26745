"""K for a batch (controller/batch.py): the goodput optimum, the flip from speculating to not
as the forward fills, the one step cost (controller/cost.py), and the adaptive controller
deciding a batch."""
import itertools

import numpy as np
import pytest

from rows import row
from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.controller.batch import batch_ks
from autospec.controller.cost import Prices, StepCost
from autospec.engine.loop import Engine
from autospec.engine.request import Job
from autospec.telemetry import StepRecord
from autospec.controller.interface import PLAIN, Decision, Outcome, Step, decide_one, observe_one
from autospec.drafters.lookups import Lookups
from conftest import NEAR_TIE, divergences


def line_prices(rows: int, a: float, b: float, c: float, k_max: int = 16) -> Prices:
    """A batch step s = a + b B + c P over P = B + X packed tokens."""
    fixed = a + (b + c) * rows
    return Prices(rows, fixed, c, (0.0,) * (k_max + 1), fixed)


def ks_of(alpha: np.ndarray, draft_s: np.ndarray, a, b, c) -> np.ndarray:
    """batch_ks on arrays: per-position acceptance (B, K_max), draft seconds (B,)."""
    return np.array(batch_ks(alpha.tolist(), draft_s.tolist(), line_prices(len(alpha), a, b, c)))


def goodput(alpha, draft_s, a, b, c, ks, riding=0):
    """The step's tokens per second when row i drafts ks[i] (rows packed: their real tokens),
    `riding` prompt tokens in it (a joining prompt's chunk: each a token of the step)."""
    rows = len(ks)
    gains = np.cumprod(alpha, axis=1)
    tokens = rows + riding + sum(gains[i, :k].sum() for i, k in enumerate(ks))
    seconds = (a + b * rows + c * (rows + riding + sum(ks))
               + sum(draft_s[i] * k for i, k in enumerate(ks)))
    return tokens / seconds


@pytest.mark.parametrize("seed", range(20))
def test_batch_ks_is_the_goodput_optimum(seed):
    rng = np.random.default_rng(seed)
    rows, k_max = 3, 4
    alpha = rng.uniform(0.05, 0.98, (rows, k_max))
    draft_s = rng.uniform(0.0, 0.3, rows) * (rng.random(rows) < 0.7)  # some look-ups: free
    a, b, c = rng.uniform(0.2, 1.0), rng.uniform(0.01, 0.3), rng.uniform(0.005, 0.2)
    best = max(goodput(alpha, draft_s, a, b, c, ks)
               for ks in itertools.product(range(k_max + 1), repeat=rows))
    chosen = ks_of(alpha, draft_s, a, b, c)
    assert goodput(alpha, draft_s, a, b, c, chosen) == pytest.approx(best)


@pytest.mark.parametrize("seed", range(10))
def test_with_a_prompt_chunk_riding_batch_ks_is_the_goodput_optimum_counting_its_tokens(seed):
    """A joining prompt's chunk rides in the step: its tokens count among the step's and cost
    their price, so a drafted token must pay at the step's rate with the chunk in it."""
    rng = np.random.default_rng(seed)
    rows, k_max, riding = int(rng.integers(1, 4)), 4, int(rng.integers(1, 64))
    alpha = rng.uniform(0.05, 0.98, (rows, k_max))
    draft_s = rng.uniform(0.0, 0.3, rows) * (rng.random(rows) < 0.7)
    a, b, c = rng.uniform(0.2, 1.0), rng.uniform(0.01, 0.3), rng.uniform(0.005, 0.2)
    best = max(goodput(alpha, draft_s, a, b, c, ks, riding)
               for ks in itertools.product(range(k_max + 1), repeat=rows))
    chosen = batch_ks(alpha.tolist(), draft_s.tolist(), line_prices(rows, a, b, c), riding=riding)
    assert goodput(alpha, draft_s, a, b, c, chosen, riding) == pytest.approx(best)


def test_a_draft_that_pays_alone_waits_while_a_prompt_joins():
    """One row, a plain step 10 ms, a token 1 ms: a 0.3-likely token pays alone (1.3 tokens in
    11 ms against 1 in 10) and not beside a 32-token chunk (33.3 in 43 against 33 in 42)."""
    prices = line_prices(1, 0.009, 0.0, 0.001)
    assert batch_ks([[0.3]], [0.0], prices) == [1]
    assert batch_ks([[0.3]], [0.0], prices, riding=32) == [0]


@pytest.mark.parametrize("seed", range(10))
def test_at_one_row_batch_ks_is_the_best_k_against_measured_sizes(seed):
    """Batch 1 prices each forward size as measured (not a line: on a CPU v(K) steps)."""
    rng = np.random.default_rng(seed)
    alpha = rng.uniform(0.2, 0.99, 8)
    verify = list(1.0 + np.cumsum(rng.uniform(0.0, 0.3, 9)) - 0.1)
    verify[3] += 0.4  # a size that costs more than the next
    d = float(rng.uniform(0.0, 0.1))
    rates = [(1 + np.cumprod(alpha)[:k].sum()) / (verify[k] + d * k) for k in range(9)]
    k = batch_ks([alpha.tolist()], [d], Prices.one_row(list(verify)))[0]
    assert rates[k] == pytest.approx(max(rates))


def test_the_same_acceptance_pays_at_batch_1_and_not_in_a_full_batch():
    """Acceptance flat, the forward memory-bound at one row (a position costs
    2 % of a step) and compute-bound at 16 (a position costs as much as a row's plain share)."""
    alpha = np.full((16, 8), 0.6)
    one = ks_of(alpha[:1], np.zeros(1), 0.98, 0.0, 0.02)
    full = ks_of(alpha, np.zeros(16), 0.0, 0.0, 0.2)
    assert one[0] >= 4
    assert (full == 0).all()


def test_one_confident_row_speculates_while_the_others_decode_plain():
    """Rows verify packed: in a compute-bound batch a row with a long sure draft drafts it in
    full, and the fifteen whose drafts are poor decode plain (padded, one long draft would
    have cost every row its width: K = 0 for all was the answer then)."""
    alpha = np.full((16, 8), 0.2)
    alpha[0] = 0.99
    ks = ks_of(alpha, np.zeros(16), 1.0, 0.0, 0.1)  # a plain step 2.6 s, a token 0.1 s
    assert ks[0] == 8 and (ks[1:] == 0).all()


def measured(controller: AdaptiveController, *steps: tuple[int, float]) -> None:
    """One-row steps (K, seconds), each observed twice, and nothing else (MIN_STEPS: 4)."""
    for _ in range(2):
        for k, seconds in steps:
            controller.cost.observe(1, k + 1, seconds)


def test_the_step_cost_recovers_the_plane_a_drafted_step_s_jump_and_the_padding():
    rng = np.random.default_rng(0)
    for jump, pad in ((0.0, 0.0), (0.004, 0.0002)):  # a CPU's first drafted token may cost
        cost = StepCost(16, forgetting=1.0)          # more; the widest row pads attention
        for _ in range(80):
            rows = int(rng.integers(1, 17))
            drafted = int(rng.integers(0, 3 * rows))
            width = 1 + (int(rng.integers(-(-drafted // rows), drafted + 1)) if drafted else 0)
            if rows == 1:
                width = drafted + 1
            cost.observe(rows, rows + drafted, 0.010 + 0.001 * rows + 0.0005 * (rows + drafted)
                         + (jump if drafted else 0.0) + pad * rows * (width - 1), width=width)
        assert cost.plane() == pytest.approx((0.010, 0.001, 0.0005, jump, pad), rel=0.05, abs=2e-5)
    assert StepCost(16).plane() is None  # nothing measured yet
    old = {"xtx": [1.0, 2.0, 3.0, 2.0, 5.0, 6.0, 3.0, 6.0, 9.0], "xty": [1.0, 2.0, 3.0],
           "observed": 5.0}  # a batch cost kept before the jump was a feature
    assert StepCost(16).restore(old).state()["xtx"][:3] == [1.0, 2.0, 3.0]


def test_a_priced_padding_caps_the_widest_row():
    """Attention pads every row to the widest (models/attention.py): where that has a price
    (Prices.width), one confident row no longer drafts 16 while the others draft 5 — every
    row is capped alike, as wide as the padding pays for — and plain is kept where none
    does."""
    means = [[0.99] * 16] + [[0.8] * 16] * 15
    def prices(width):
        fixed = 0.01 + 0.0012 * 16
        return Prices(16, fixed, 0.0002, (0.0,) * 17, fixed, 0.0, width)
    assert batch_ks(means, [0.0] * 16, prices(0.0)) == [16] + [5] * 15
    assert batch_ks(means, [0.0] * 16, prices(0.0005)) == [2] * 16
    assert batch_ks(means, [0.0] * 16, prices(0.002)) == [0] * 16


def test_the_controller_stops_speculating_when_the_batch_cost_says_so():
    controller = AdaptiveController(ControllerSettings(drafters=("ngram",)))
    period = list(range(100, 140))
    rows = [row(f"r{i}", period * 3, 120, "copy") for i in range(16)]
    # batch 1 measured: a flat forward, n-gram right every time
    for step in range(30):
        for request in rows[:1]:
            drafter, k, _ = decide_one(controller, request)
            observe_one(controller, StepRecord(request.request_id, step, drafter or "none", k, k, k,
                                         k + 1, 0.0, 0.010 + 0.0002 * k, k + 1, 100, 0, 0.0),
                              request)
    assert controller.decide(Step(rows[:1], Lookups().peek))[0][0] == "ngram"
    # a batch of 16 whose every drafted token costs more than a row's plain share (5 ms):
    # speculation no longer pays, even at full acceptance
    for _ in range(8):
        for request in rows:
            observe_one(controller, StepRecord(request.request_id, 0, "none", 0, 0, 0, 1, 0.0,
                                         0.001 * 16 * 5, 1, 100, 0, 0.0, batch_size=16,
                                         batch_tokens=16), request)
            observe_one(controller, StepRecord(request.request_id, 0, "ngram", 4, 4, 4, 5, 0.0,
                                         0.001 * 16 * 5 * 8, 5, 100, 0, 0.0, batch_size=16,
                                         batch_tokens=80), request)
    choices = controller.decide(Step(rows, Lookups().peek))
    assert all(k == 0 for _, k, _ in choices), choices


def test_a_batch_under_the_adaptive_controller_is_lossless(reference_pair):
    prompts = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n", "import os\nimport sys\n",
               "The cat sat on the mat. The cat sat on", "x = [1, 2, 3]\ny = [1, 2, 3]\n"]
    engine = Engine(reference_pair, max_batch=4, max_len=256)
    plain = [engine.generate(p, drafter=None, max_new_tokens=24).token_ids for p in prompts]
    controller = AdaptiveController(ControllerSettings())
    for _ in range(2):  # the second run decides with a measured batch cost
        out = engine.run([Job(p, 24) for p in prompts], controller, max_batch=4)
        for _, _, margin in divergences(reference_pair, prompts, [g.token_ids for g in out], plain):
            assert margin < NEAR_TIE  # trained weights: the near-tie rule
    assert controller.cost.observed > 0


def test_a_batch_step_s_overhead_is_learnt_once_per_step_per_row():
    """Engine.advance measures a step's overhead once (StepRecord.overhead_seconds, the same on
    every row); the controller learns it once per step, per row, as the steps' running median,
    so one pause (a garbage collection) does not price the next steps."""
    controller = AdaptiveController(ControllerSettings(drafters=("ngram",)))
    rows = [row(f"r{i}", [1, 2, 3, 4], 4, "w") for i in range(4)]

    def step(overhead: float) -> None:
        controller.observe(Outcome([StepRecord(r.request_id, 0, "none", 0, 0, 0, 1, 0.0, 0.01, 1,
                                               4, 0, 0.0, batch_size=4, batch_tokens=4,
                                               batch_width=1, overhead_seconds=overhead)
                                    for r in rows], rows))
    step(0.004)
    step(0.008)
    cost = controller.cost
    assert cost.row_overhead == pytest.approx((0.001 + 0.002) / 2)  # median of two steps
    assert StepCost(16).restore(cost.state()).row_overhead == cost.row_overhead
    for overhead in (0.004, 0.66, 0.004, 0.004):  # a 165 ms pause per row
        step(overhead)
    assert cost.row_overhead == pytest.approx(0.001)


def test_a_row_that_went_plain_for_want_of_a_match_drafts_at_the_next_match():
    """A row whose n-gram had no match went plain: it must not sit out the next steps that
    have one."""
    controller = AdaptiveController(ControllerSettings(drafters=("ngram",)))
    measured(controller, (0, 0.01), (0, 0.01))  # plain steps measured: decisions may begin
    no_match = row("r", [1, 2, 3, 4], 4, "w")
    assert decide_one(controller, no_match) == PLAIN
    no_match.tokens += [1, 2, 3]  # "1 2 3" recurs: n-gram has a proposal now
    drafter, k, _ = decide_one(controller, no_match)
    assert drafter == "ngram" and k >= 1


def test_a_batch_decodes_plain_until_its_cost_is_measured():
    """Before the step cost rests on MIN_STEPS steps every row decodes plain (those steps
    measure it); then a sure n-gram row drafts, at any batch size: the one-row steps price a
    batch until its own steps do (a memory-bound forward, the optimistic end)."""
    controller = AdaptiveController(ControllerSettings(drafters=("ngram",),
                                                       prior_means={"ngram": 0.95}))
    rows = _rows(4)
    for _ in range(3):
        controller.cost.observe(1, 1, 0.010)
        assert controller.decide(Step(rows, Lookups().peek)) == [PLAIN] * 4
    controller.cost.observe(1, 1, 0.010)
    assert all(drafter == "ngram" and k >= 1 for drafter, k, _ in controller.decide(Step(rows, Lookups().peek)))
    for _ in range(5):
        controller.cost.observe(4, 4, 0.012)  # 4 plain rows cost 1.2 rows: memory-bound
    assert all(drafter == "ngram" and k >= 1 for drafter, k, _ in controller.decide(Step(rows, Lookups().peek)))


def _costly_drafter_controller() -> AdaptiveController:
    """n-gram poorer but free, the draft model sure but costing 3 ms a token against a 10 ms
    step: at batch 1 the draft model pays (0.95 tokens for 3 ms of a 10 ms step)."""
    controller = AdaptiveController(ControllerSettings(
        drafters=("ngram", "draft-model"),
        prior_means={"ngram": 0.5, "draft-model": 0.95}))
    measured(controller, (0, 0.010), (4, 0.011))
    controller.cost.observe_draft("draft-model", 0.003, 1)
    return controller


def _measure_batch(controller: AdaptiveController) -> None:
    """Batch steps of 16 rows on the plane whose batch-1 cut is the single-row line above:
    s = 9.25 ms + 0.5 ms a row + 0.25 ms a position (compute-bound at 16 rows)."""
    for width in (1, 3, 5, 9) * 2:
        controller.cost.observe(16, 16 * width, 0.00925 + 0.0005 * 16 + 0.00025 * 16 * width,
                                width=width)


def _rows(n: int) -> list:
    return [row(f"r{i}", [7, 8, 9, 7, 8, 9, 7, 8], 8, "w") for i in range(n)]  # 7 8 recurs


def test_a_drafter_that_stalls_the_batch_is_priced_for_the_batch():
    """A second of drafting holds up every row of a batch: a drafter worth its cost alone is
    not in a batch of 16 — before the batch's cost is measured (a memory-bound forward
    assumed) and after, when the rows draft with n-gram instead."""
    controller = _costly_drafter_controller()
    assert decide_one(controller, _rows(1)[0])[0] == "draft-model"
    rows = _rows(16)
    assert "draft-model" not in {drafter for drafter, *_ in controller.decide(Step(rows, Lookups().peek))}
    _measure_batch(controller)
    choices = controller.decide(Step(rows, Lookups().peek))
    assert {drafter for drafter, *_ in choices} == {"ngram"} and all(k >= 1 for _, k, _ in choices)


def test_a_row_whose_drafter_the_batch_will_not_pay_for_drafts_with_ngram():
    """Each row's choice (at its share of the step) is the draft model; the step's goodput gives
    it K = 0: the rows draft n-gram's proposal rather than going plain."""
    controller = AdaptiveController(ControllerSettings(
        drafters=("ngram", "draft-model"),
        prior_means={"ngram": 0.3, "draft-model": 0.05}))
    measured(controller, (0, 0.010), (4, 0.011))
    controller.cost.observe_draft("draft-model", 0.003, 1)
    rows = _rows(16)
    _measure_batch(controller)
    choose = controller._choose
    controller._choose = lambda *args, **kwargs: ("draft-model", choose(*args, **kwargs)[1])
    choices = controller.decide(Step(rows, Lookups().peek))
    assert {drafter for drafter, *_ in choices} == {"ngram"} and all(k >= 1 for _, k, _ in choices)


def test_one_row_a_step_tries_a_model_drafter_nobody_has_run():
    """A model drafter that no request has run yet (its cache prefill unmeasured) is tried by
    one row of a batch, not by every row whose draw favours it: the batch waits for each
    row's prefill. Once one has run, the rows choose it on its measured costs."""
    controller = AdaptiveController(ControllerSettings(
        drafters=("draft-model",), 
        prior_means={"draft-model": 0.95}))
    measured(controller, (0, 0.010), (4, 0.011))
    controller.cost.observe_draft("draft-model", 0.0001, 1)  # cheap a token (a warm start)
    rows = _rows(8)
    _measure_batch(controller)
    chosen = [drafter for drafter, *_ in controller.decide(Step(rows, Lookups().peek))]
    assert chosen.count("draft-model") == 1, chosen
    controller.cost.observe_prefill("draft-model", 0.0001, 0, 8)  # its start-up, measured
    assert all(drafter == "draft-model" for drafter, *_ in controller.decide(Step(rows, Lookups().peek)))


def test_a_drafted_step_s_jump_goes_stale_without_drafted_steps():
    """One slow drafted step must not keep a batch plain for good: after `stale_after` plain
    steps what drafted steps cost is trusted less, the jump priced 0 after twice that, until a
    drafted step measures it afresh. The same rule at one row: the slope falls to the flat,
    memory-bound prior."""
    cost = StepCost(16, stale_after=8)
    for _ in range(6):
        cost.observe(16, 16, 0.019)
    cost.observe(16, 35, 0.039, width=3)  # a first drafted step, twice its usual cost
    assert cost.plane()[3] > 0.001
    for _ in range(8):
        cost.observe(16, 16, 0.019)
    assert 0.0 < cost.plane()[3]
    for _ in range(8):
        cost.observe(16, 16, 0.019)
    assert cost.plane()[3] == 0.0
    cost.observe(16, 35, 0.039, width=3)
    assert cost.plane()[3] > 0.001
    one_row = StepCost(16, stale_after=8)
    for _ in range(4):
        one_row.observe(1, 1, 0.010)
        one_row.observe(1, 9, 0.018)
    assert one_row.prices(1).step(8) == pytest.approx(0.018, rel=0.05)
    for _ in range(16):
        one_row.observe(1, 1, 0.010)
    assert one_row.prices(1).step(8) == pytest.approx(0.010, rel=0.05)


def test_a_step_cap_bounds_the_batch_s_step():
    """settings.step_cap: no step predicted longer than cap x a plain step; K = 0 for every row
    stays allowed."""
    alpha = [[0.99] * 8] * 4
    prices = line_prices(4, 1.0, 0.0, 0.01)  # a plain step of 4 rows: 1.04 s; a token 0.01 s
    assert batch_ks(alpha, [0.0] * 4, prices) == [8] * 4  # unbounded: all of it
    bounded = batch_ks(alpha, [0.0] * 4, prices, max_seconds=1.1 * 1.04)
    assert sum(bounded) == 10  # 1.04 + 0.01 x 10 = 1.14 <= 1.144 < 1.15
    assert batch_ks(alpha, [0.0] * 4, prices, max_seconds=1.0) == [0] * 4


def test_a_step_cap_bounds_the_controller_s_k_at_batch_1():
    """At batch 1 the cap limits K to the longest step within cap plain steps (the verify
    line here: 10 ms + 0.5 ms a drafted token)."""
    period = list(range(100, 140))
    for cap, k_bound in ((0.0, 16), (1.25, 5)):
        controller = AdaptiveController(ControllerSettings(drafters=("ngram",), step_cap=cap))
        request = row("r", period * 3, 120, "copy")
        ks = []
        for step in range(40):
            drafter, k, _ = decide_one(controller, request)
            ks.append(k)
            observe_one(controller, StepRecord("r", step, drafter or "none", k, k, k, k + 1, 0.0,
                                         0.010 + 0.0005 * k, k + 1, 100, 0, 0.0), request)
        assert max(ks[10:]) == k_bound, (cap, ks)  # once the verify line is measured


def test_under_a_step_cap_a_prompt_chunk_takes_the_room_above_a_plain_step():
    """chunk_budget: the prompt tokens that fit between a plain step and the cap at the step's
    per-token price (here 10 ms + 0.1 ms a token, cap 1.25: 25 tokens); told the chunk rides,
    the decision leaves it that room (the rows decode plain here); no cap, no bound."""
    period = list(range(100, 140))
    controller = AdaptiveController(ControllerSettings(drafters=("ngram",), step_cap=1.25))
    request = row("r", period * 3, 120, "copy")
    for step in range(40):
        drafter, k, _ = decide_one(controller, request)
        observe_one(controller, StepRecord("r", step, drafter or "none", k, k, k, k + 1, 0.0,
                                     0.010 + 0.0001 * k, k + 1, 100, 0, 0.0), request)
    assert controller.chunk_budget(1, 64) in (24, 25)
    assert controller.chunk_budget(1, 16) == 16
    assert controller.decide(Step([request], Lookups().peek))[0][1] >= 8
    assert controller.decide(Step([request], Lookups().peek, 25)) == [PLAIN]
    assert AdaptiveController(ControllerSettings(drafters=("ngram",))).chunk_budget(1, 64) == 64


def test_a_step_cap_below_a_plain_step_is_refused():
    with pytest.raises(ValueError, match="step_cap"):
        ControllerSettings(step_cap=0.5)


def test_a_step_s_price_at_a_size_its_steps_measured_follows_them():
    """The plane is one over every size; a CPU's step is not linear in the rows (here 1.5 ms
    a row to 6 rows, a 16-row step 16 ms where the small steps' plane says ~28). With most
    steps small, the plane's 16-row plain step is far off; the residuals of the steps
    measured at 16 rows (plain and drafted apart) bring both back; a size never measured
    moves by nothing, and a drafted width not measured at a size moves with its plain steps."""
    import random
    rng = random.Random(0)
    cost = StepCost(16)

    def seconds(rows, drafted):
        plain = 0.004 + 0.0015 * rows if rows <= 6 else 0.016
        return plain + (0.001 + 0.0003 * drafted if drafted else 0.0) + rng.gauss(0, 0.0002)

    def step(rows, drafted):
        taken = seconds(rows, drafted)
        for _ in range(rows):
            cost.observe(rows, rows + drafted, taken, 1.0 / rows, 2 if drafted else 1)

    for i in range(600):
        step(rng.randint(2, 6), rng.choice([0, 0, rng.randint(1, 8)]))
        if i % 12 == 0:
            step(16, 0)
            step(16, 20)
    a, b, c, jump, w = cost.plane()
    at_16 = cost.prices(16)
    assert abs(a + 16 * (b + c) - 0.016) > 0.001  # the plane alone is off at 16 rows
    assert at_16.step(0) == pytest.approx(0.016 + 16 * cost.row_overhead, rel=0.05)
    assert at_16.step(20, 1) == pytest.approx(0.016 + 0.001 + 0.006, rel=0.05)
    at_12 = cost.prices(12)
    assert at_12.step(0) == pytest.approx(a + 12 * (b + c))
    step(9, 0)  # plain only at 9 rows: its drafted steps move with it
    a, b, c, jump, w = cost.plane()
    at_9 = cost.prices(9)
    moved = at_9.step(0) - (a + 9 * (b + c))
    assert moved > 0.0
    assert at_9.step(4, 1) == pytest.approx(at_9.step(0) + 4 * c + jump + 9 * w)


def test_a_run_of_drafted_steps_keeps_what_a_plain_step_costs():
    """Plain and drafted steps are forgotten apart: after 150 drafted steps (16 rows, noisy)
    the line still prices a plain step of 16 rows at what the 10 plain ones before them cost
    (discounted together, it priced it 15 % over here, and the drafting jump under)."""
    import random
    rng = random.Random(0)
    cost = StepCost(16)
    for _ in range(10):
        cost.observe(16, 16, 0.085 + rng.gauss(0, 0.002))
    for _ in range(150):
        drafted, width = rng.randint(10, 40), rng.randint(2, 6)
        cost.observe(16, 16 + drafted, 0.105 + 0.0008 * drafted + 0.0032 * (width - 1)
                     + rng.gauss(0, 0.003), width=width)
    cost.seed(0.030, 0.0015)  # a batch-1 line pulling the other way
    a, b, c, jump, _ = cost.plane()
    assert a + 16 * b + 16 * c == pytest.approx(0.085, rel=0.05)
    assert jump > 0.010
