"""The identity verdict of an engine we cannot ask for logits (vLLM): each parting's margin and
limit from the log-probabilities both runs reported (models/ties.py logprob_verdict)."""
from autospec.models.ties import NEAR_TIE, logprob_verdict


def lp(*pairs):
    return dict(pairs)


PLAIN = [[5, 6, 7]]
PLAIN_LP = [[lp((5, -0.1), (9, -3.0)), lp((6, -0.70), (8, -0.72)), lp((7, -0.2), (1, -2.0))]]


def test_identical_outputs_are_true():
    assert logprob_verdict(PLAIN, PLAIN, PLAIN_LP, PLAIN_LP) == (True, [])


def test_a_parting_at_a_near_tie_within_the_measured_spread_is_a_near_tie():
    # the runs agree on token 5, whose log-probability differs by 0.05 between them (bfloat16
    # rounding): a limit of 0.1; they part at position 1, where plain's margin is 0.02
    got, got_lp = [[5, 8, 3]], [[lp((5, -0.15), (9, -3.0)), lp((8, -0.69), (6, -0.71)), lp((3, -1.0))]]
    same, found = logprob_verdict(got, PLAIN, got_lp, PLAIN_LP)
    assert same == "near-tie"
    assert found[0]["position"] == 1 and abs(found[0]["margin"] - 0.02) < 1e-9
    assert abs(found[0]["limit"] - 0.1) < 1e-9


def test_a_parting_where_plain_was_sure_is_false():
    got, got_lp = [[9, 6, 7]], [[lp((9, -0.1)), lp((6, -0.7)), lp((7, -0.2))]]
    same, found = logprob_verdict(got, PLAIN, got_lp, PLAIN_LP)
    assert same is False and abs(found[0]["margin"] - 2.9) < 1e-9
    assert found[0]["limit"] == NEAR_TIE  # nothing agreed before it: no spread measured


def test_the_spread_counts_every_token_both_runs_report_where_they_agree():
    # the chosen token's log-probability moved by 0.05, the runner-up's by 0.2: a margin is
    # two tokens' difference, so the limit is 0.4 and plain's 0.3 at the parting a near-tie
    plain = [[5, 6]]
    plain_lp = [[lp((5, -0.1), (9, -2.0)), lp((6, -0.5), (8, -0.8))]]
    got, got_lp = [[5, 8]], [[lp((5, -0.15), (9, -2.2)), lp((8, -0.6), (6, -0.7))]]
    same, found = logprob_verdict(got, plain, got_lp, plain_lp)
    assert same == "near-tie" and abs(found[0]["limit"] - 0.4) < 1e-9
