"""Each drafted token's confidence: calibrated into P(accepted), ranked by survival, and the
rule a model drafter stops by (autospec/confidence.py)."""
import dataclasses
import random

import pytest

from autospec.confidence import (BINS, Calibration, StopRule, bin_of, check_confidences, merged_table,
                                 reliability_gap, reliability_lines, sampling_gap)
from autospec.controller.batch import batch_ks, best_batch
from autospec.controller.cost import Prices


def test_calibration_recovers_a_known_relation_on_a_synthetic_drafter():
    """A drafter whose token of confidence c is kept with probability c^2 (given the tokens
    before it were): after 20 000 drafts each bin predicts its own rate, not the mean."""
    rng = random.Random(0)
    calibration = Calibration()
    means = [0.5] * 8  # the per-position means: wrong for every bin but the middle ones
    for _ in range(20000):
        confidences = [rng.random() for _ in range(8)]
        accepted = 0
        while accepted < 8 and rng.random() < confidences[accepted] ** 2:
            accepted += 1
        calibration.update(confidences, accepted, means)
    for b in range(BINS):
        centre = (b + 0.5) / BINS
        assert calibration.p(centre, 0.5) == pytest.approx(centre ** 2, abs=0.03)
    # the reliability table: the out-of-sample predictions track what was observed
    assert reliability_gap(calibration.reliability()) < 0.02


def test_the_sampling_gap_is_the_gap_of_a_calibrated_drafter_and_a_miscalibrated_one_exceeds_it():
    """Bins of 30 tokens each kept with exactly its predicted probability: over many draws
    the mean gap is the sampling gap (within 10 %); kept 0.15 more often than predicted,
    the gap is well over it."""
    rng = random.Random(0)

    def table(shift: float) -> list[dict]:
        rows = []
        for b in range(BINS):
            p = (b + 0.5) / BINS
            kept = sum(rng.random() < min(1.0, p + shift) for _ in range(30))
            rows.append({"bin": [b / BINS, (b + 1) / BINS], "tokens": 30, "predicted": p,
                         "observed": kept / 30})
        return rows

    calibrated = [table(0.0) for _ in range(300)]
    expected = sampling_gap(calibrated[0])
    mean_gap = sum(reliability_gap(t) for t in calibrated) / len(calibrated)
    assert mean_gap == pytest.approx(expected, rel=0.1)
    assert reliability_gap(table(0.15)) > 1.8 * expected
    # two workloads' tables merged bin by bin: the tokens add, the rates are token-weighted
    merged = merged_table([calibrated[0][:2], calibrated[1][:1]])
    assert [r["tokens"] for r in merged] == [60, 30]
    assert merged[0]["observed"] == pytest.approx(
        (calibrated[0][0]["observed"] + calibrated[1][0]["observed"]) / 2, abs=1e-4)
    # as `autospec report` and the bench print it: the gap beside sampling's
    line = reliability_lines({"chat": {"eagle": calibrated[0]}})[0]
    assert line.startswith("  chat / eagle: 600 tokens, mean |predicted - observed| ")
    assert f"(sampling alone ~{expected:.3f})" in line


def test_a_bin_without_evidence_is_the_per_position_mean():
    calibration = Calibration()
    assert calibration.alphas([0.9, 0.1, 0.5], [0.8, 0.6, 0.3]) == [0.8, 0.6, 0.3]
    calibration.update([0.95], 1, [0.5])  # one kept token in the top bin
    top = calibration.p(0.97, 0.5)
    assert 0.5 < top < 1.0 and calibration.p(0.1, 0.5) == 0.5


def test_a_new_workload_starts_from_the_drafters_calibration_over_every_workload():
    """Learning keeps each drafter's calibration over every workload (POOLED) as each
    workload's prior: a workload seen for the first time predicts by what the drafter's
    tokens showed elsewhere, not by the per-position mean; with nothing learnt anywhere, by
    the mean (a new drafter decides as before)."""
    from autospec.controller.learning import Learning
    from autospec.telemetry import POOLED
    learning = Learning(k_max=4)
    assert learning.calibration_of("new", "draft-model").alphas([0.95, 0.05], [0.5, 0.5]) == [0.5, 0.5]
    rng = random.Random(2)
    for _ in range(2000):  # confident tokens always kept, unconfident ones never
        confidences = [rng.choice([0.95, 0.05]) for _ in range(4)]
        accepted = 0
        while accepted < 4 and confidences[accepted] > 0.5:
            accepted += 1
        learning.learn("old", "draft-model", 4, accepted, confidences, [0.5] * 4)
    assert learning.calibration_of(POOLED, "draft-model").tokens() == \
        learning.calibration_of("old", "draft-model").tokens() > 0
    high, low = learning.calibration_of("new", "draft-model").alphas([0.95, 0.05], [0.5, 0.5])
    assert high > 0.99 and low < 0.01
    # a richer pooled calibration taken from a snapshot becomes the workloads' prior at once
    fresh = Learning(k_max=4)
    before = fresh.calibration_of("new", "draft-model").alphas([0.95], [0.5])
    assert before == [0.5]
    fresh.absorb(learning.snapshot())
    assert fresh.calibration_of("new", "draft-model").alphas([0.95], [0.5])[0] > 0.99
    # the daemon folds POOLED itself: its tokens are not counted twice
    daemon = Learning(k_max=4)
    daemon.learn("old", "ngram", 2, 1, [0.9, 0.1], [0.5] * 2, pooled_too=False)
    daemon.learn(POOLED, "ngram", 2, 1, [0.9, 0.1], [0.5] * 2, pooled_too=False)
    assert daemon.calibration_of(POOLED, "ngram").tokens() == 2


def test_an_update_scores_tokens_only_as_far_as_the_first_rejection():
    calibration = Calibration()
    calibration.update([0.9, 0.9, 0.1, 0.1], 2, [0.5] * 4)  # two kept, the third rejected
    assert calibration.seen[bin_of(0.9)] == 2 and calibration.kept[bin_of(0.9)] == 2
    assert calibration.seen[bin_of(0.1)] == 1 and calibration.kept[bin_of(0.1)] == 0


def test_calibration_state_round_trips_and_refuses_a_bad_one():
    calibration = Calibration()
    calibration.update([0.3, 0.8], 1, [0.5, 0.5])
    assert Calibration.from_state(calibration.state()).state() == calibration.state()
    with pytest.raises(ValueError, match="calibration.kept"):
        Calibration.from_state({"kept": [1.0], "seen": [0.0] * BINS})


def test_confidences_of_the_wrong_length_or_range_are_refused_naming_the_drafter():
    check_confidences("mine", [1, 2], None)  # none: per-position behaviour
    check_confidences("mine", [1, 2], [0.0, 1.0])
    with pytest.raises(ValueError, match="drafter 'mine' returned 1 confidences for 2"):
        check_confidences("mine", [1, 2], [0.5])
    with pytest.raises(ValueError, match="drafter 'mine' returned confidence 1.5"):
        check_confidences("mine", [1, 2], [0.5, 1.5])
    with pytest.raises(ValueError, match="drafter 'mine'"):
        check_confidences("mine", [1], [float("nan")])


def _brute_force(tokens, prices, draft_seconds):
    """The best goodput over every prefix of every row (rows' chances `tokens`)."""
    import itertools
    best = (-1.0, None)
    for ks in itertools.product(*[range(len(row) + 1) for row in tokens]):
        gained = sum(sum(_survival(row)[:k]) for row, k in zip(tokens, ks))
        seconds = prices.step(sum(ks), max(ks)) + sum(d * k for d, k in zip(draft_seconds, ks))
        rate = (len(tokens) + gained) / seconds
        if rate > best[0] + 1e-12:
            best = (rate, list(ks))
    return best


def _survival(row):
    out, g = [], 1.0
    for p in row:
        g *= p
        out.append(g)
    return out


def test_survival_ranking_picks_the_known_best_token_set_on_a_constructed_step():
    """Three rows of a step at a compute-bound price: a confident look-up row, a row whose
    second token is doubtful, and one whose first is. The step verifies the tokens whose
    survival pays for their share of the forward — and only those — as brute force says."""
    prices = Prices(3, 0.030, 0.004, (0.0,) * 17, 0.012)  # 30 ms a plain step, 4 ms a drafted token
    tokens = [[0.98, 0.97, 0.97, 0.95], [0.95, 0.2, 0.9, 0.9], [0.1, 0.9, 0.9, 0.9]]
    draft_seconds = [0.0, 0.0, 0.0]
    rate, ks = best_batch(tokens, draft_seconds, prices)
    expected_rate, expected = _brute_force(tokens, prices, draft_seconds)
    assert ks == expected == [4, 1, 0]
    assert rate == pytest.approx(expected_rate)
    # per-position means would have drafted the rows alike: the tokens' own chances part them
    flat = [[sum(col) / 3 for col in zip(*tokens)]] * 3
    assert batch_ks(flat, draft_seconds, prices) != ks


def test_the_stop_rule_keeps_a_token_while_it_pays_and_drafts_on_while_the_next_could():
    sure = Calibration(kept=[0.0] * BINS, seen=[0.0] * BINS, strength=1e-9)
    for b in range(BINS):  # a calibration that believes each confidence exactly
        sure.seen[b], sure.kept[b] = 1e9, 1e9 * (b + 0.5) / BINS
    rule = StopRule(sure, [0.5] * 8, keep=0.3, go=0.5)
    assert rule.run([0.975] * 8)[0] == 8  # survival 0.975^8 = 0.82: every token pays
    assert rule.run([0.975, 0.425, 0.975, 0.975])[0] == 2  # 0.41: kept, but no later one pays
    assert rule.run([0.975, 0.275, 0.975])[0] == 1  # 0.27: not worth its verify, dropped
    assert rule.run([0.975, 0.525, 0.975])[0] == 3  # 0.51, then 0.499: kept, and the last
    # and what replay charges: a dropped token's forward ran (drafted), a stop after one did not
    assert rule.run([0.975, 0.275, 0.975]) == (1, 2)
    assert rule.run([0.975, 0.425, 0.975, 0.975]) == (2, 2)


def _drafted(request_id: str, confidences: list[list[float]], accepted: list[int], workload="copy"):
    """A RequestRecord whose steps drafted n-gram tokens of these confidences."""
    from autospec.telemetry import StepRecord, summarise
    steps = [StepRecord(request_id, i, "ngram", len(c), len(c), a, a + 1, 1e-5, 0.01, len(c) + 1,
                        100 + i, 0, 0.0, confidences=c)
             for i, (c, a) in enumerate(zip(confidences, accepted))]
    return summarise(request_id, 10, steps, 1.0, workload)


def test_the_daemon_round_trips_the_calibration_and_hands_it_to_a_new_process():
    """The Learner folds each step's confidences by the controller's own rule, the store's
    rows keep it, a restarted Learner serves it again, and a fresh controller starts from it."""
    from autospec.controller.adaptive import AdaptiveController
    from autospec.controller.settings import ControllerSettings
    from autospec.daemon.learner import Learner
    from autospec.telemetry import POOLED, UNLABELLED
    rng = random.Random(1)
    learner = Learner(k_max=8)
    for r in range(40):
        drafts = [[round(rng.random(), 3) for _ in range(4)] for _ in range(10)]
        kept = []
        for draft in drafts:
            a = 0
            while a < 4 and rng.random() < draft[a]:
                a += 1
            kept.append(a)
        learner.observe(_drafted(f"r{r}", drafts, kept))
    learnt = learner.calibration["copy"]["ngram"]
    assert learnt.tokens() > 300 and learner.calibration[POOLED]["ngram"].tokens() == learnt.tokens()
    estimates: dict = {}
    for e in learner.estimates():
        estimates.setdefault(e.workload, {})[e.drafter] = e
    again = Learner(k_max=8).restore(estimates)
    assert again.snapshot()["calibration"] == learner.snapshot()["calibration"]
    fresh = AdaptiveController(ControllerSettings(drafters=("ngram",)))
    fresh.warm_start(again.snapshot())
    assert fresh.learning.calibration["copy"]["ngram"].state() == learnt.state()
    assert fresh.learning.calibration[UNLABELLED]["ngram"].tokens() == learnt.tokens()
    # a store row from before calibrations (None) restores with none learnt
    old = {w: {d: dataclasses.replace(e, calibration=None) for d, e in per.items()}
           for w, per in estimates.items()}
    assert Learner(k_max=8).restore(old).snapshot()["calibration"] == {}


def test_a_trace_with_model_confidences_replays_their_stop_rule_and_an_older_one_its_means():
    """configs/traces/heldout.json records the model drafters' confidences: replayed, a model
    drafter runs to a StopRule (asked for up to k_max, cut where its tokens stop paying). The
    same trace without them (as traces recorded before) replays those drafters at K."""
    from autospec.bench.trace import Trace
    from autospec.bench.recorded import replay_batch
    from autospec.controller.adaptive import AdaptiveController
    from autospec.controller.settings import ControllerSettings
    from conftest import REPO_ROOT
    trace = Trace.load(REPO_ROOT / "configs" / "traces" / "heldout.json")
    assert all(r.confidence for r in trace.requests)
    models = ("draft-model", "early-exit")

    def model_steps(t):
        records, _ = replay_batch(t, AdaptiveController(ControllerSettings()), 1)
        return [s for r in records for s in r.step_records if s.drafter in models]

    cut = model_steps(trace)
    assert any(s.confidences for s in cut)
    assert any(s.k == trace.k_max and s.proposed < s.k for s in cut)  # stopped by its tokens
    older = Trace.load(REPO_ROOT / "configs" / "traces" / "heldout.json")
    for r in older.requests:
        r.confidence = None
    assert all(s.confidences is None and s.proposed == s.k for s in model_steps(older))
