import numpy as np

from autospec.drafters.ngram import ngram_match


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
