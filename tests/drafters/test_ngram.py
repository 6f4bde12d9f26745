import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autospec.drafters.ngram import NgramIndex, ngram_match


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


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(0, 5), min_size=1, max_size=60), k=st.integers(1, 8),
       n=st.tuples(st.integers(1, 3), st.integers(0, 3)))
def test_one_index_answers_for_every_earlier_prefix(tokens, k, n):
    """One index answers for any earlier prefix (the counterfactual scores a step looked up late)."""
    n_min, n_max = n[0], n[0] + n[1]
    index = NgramIndex(n_min, n_max)
    index.sync(tokens)
    for at in range(1, len(tokens) + 1):
        assert index.propose(k, at=at) == ngram_match(np.array(tokens[:at]), n_min, n_max, k)


def test_index_rebuilds_when_the_context_is_not_an_extension():
    index = NgramIndex(1, 2)
    index.sync([1, 2, 3, 1, 2])
    assert index.propose(2) == [3, 1]
    index.sync([7, 8, 7])
    assert index.propose(2) == [8, 7]
