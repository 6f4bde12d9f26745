import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from autospec.drafters.ngram import CONFIDENCE_OCCURRENCES, NgramIndex, ngram_match


def test_longest_suffix_wins_and_most_recent_occurrence():
    tokens = np.array([1, 2, 3, 9, 2, 3, 7, 8, 1, 2, 3])
    # suffix [1, 2, 3] occurred at 0 -> continuation 9, 2
    assert ngram_match(tokens, 1, 3, 2) == [9, 2]
    # with n_max = 2 the most recent earlier [2, 3] (at 4) wins -> 7, 8, 1
    assert ngram_match(tokens, 1, 2, 3) == [7, 8, 1]


def test_no_match_and_short_inputs():
    assert ngram_match(np.array([1, 2, 3, 4]), 1, 3, 4) == []
    assert ngram_match(np.array([5]), 1, 3, 4) == []
    assert ngram_match(np.array([5, 5]), 1, 3, 4) == [5]


def test_continuation_is_cut_at_k_and_at_the_end():
    tokens = np.array([4, 5, 6, 4])
    assert ngram_match(tokens, 1, 2, 10) == [5, 6, 4]
    assert ngram_match(tokens, 1, 2, 1) == [5]


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(0, 5), min_size=1, max_size=60), k=st.integers(1, 8),
       n=st.tuples(st.integers(1, 3), st.integers(0, 3)))
def test_incremental_index_equals_the_definition_at_every_length(tokens, k, n):
    n_min, n_max = n[0], n[0] + n[1]
    index = NgramIndex(n_min, n_max)
    for end in range(1, len(tokens) + 1):
        index.sync(tokens[:end])
        assert index.propose(k) == ngram_match(np.array(tokens[:end]), n_min, n_max, k)


def _confidence_by_definition(tokens, proposal, n, n_max, j):
    """confidence_j of drafters/ngram.py's docstring, by a scan of the whole list."""
    m = n + j
    tail = (tokens + proposal[:j])[-min(n_max, m):]
    nexts = [tokens[e] for e in range(len(tail), len(tokens))
             if tokens[e - len(tail):e] == tail][-CONFIDENCE_OCCURRENCES:]
    same = sum(1 for t in nexts if t == proposal[j])
    return (same + 0.5) / (len(nexts) + 1) * (1 - 0.5 ** m)


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), min_size=2, max_size=60), k=st.integers(1, 8),
       n=st.tuples(st.integers(1, 3), st.integers(0, 3)))
def test_confidences_equal_the_definition(tokens, k, n):
    """Each proposed token's confidence: the smoothed share of the tail's earlier occurrences
    followed by it, times 1 - 2^-(n + j)."""
    n_min, n_max = n[0], n[0] + n[1]
    index = NgramIndex(n_min, n_max)
    index.sync(tokens)
    proposal, matched = index.match(k)
    got = index.confidences(proposal, matched)
    assert len(got) == len(proposal) and all(0 < c < 1 for c in got)
    for j in range(len(proposal)):
        assert got[j] == pytest.approx(_confidence_by_definition(tokens, proposal, matched, n_max, j))


def test_a_match_seen_often_is_more_confident_than_one_seen_once():
    index = NgramIndex(1, 4)
    once = [1, 2, 3, 4, 5, 9, 1, 2, 3, 4]
    index.sync(once)
    proposal, n = index.match(1)
    single = index.confidences(proposal, n)[0]
    index = NgramIndex(1, 4)
    index.sync([1, 2, 3, 4, 5] * 5 + [1, 2, 3, 4])
    proposal, n = index.match(1)
    assert proposal == [5] and index.confidences(proposal, n)[0] > single


def test_index_rebuilds_when_the_context_is_not_an_extension():
    index = NgramIndex(1, 2)
    index.sync([1, 2, 3, 1, 2])
    assert index.propose(2) == [3, 1]
    index.sync([7, 8, 7])
    assert index.propose(2) == [8, 7]
