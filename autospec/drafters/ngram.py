"""Prompt lookup (n-gram) drafting: copy what followed the last time the context's tail appeared.

`ngram_match` is the definition, a pure function over a token array. `NgramIndex` gives the
same answers incrementally for an append-only token list (a request's context only grows):
a dict from each n-gram to every place it ended, so a proposal costs O(n_max + log hits)
instead of a scan of the whole context — the controller scores n-gram counterfactually every
step, so this is on the hot path. Keeping every end (not only the latest) answers for any
earlier prefix too (`propose(k, at=...)`): the controller scores a step it looked up late
(its counterfactual after the first step) from the one index.
"""
from __future__ import annotations

from bisect import bisect_left

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from autospec.drafters.base import Draft, DraftContext, Drafter, register


def ngram_match(tokens: np.ndarray, n_min: int, n_max: int, k: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest suffix
    n-gram (n from n_max down to n_min) of `tokens`; [] when no suffix recurs.

    tokens: (L,) int array, prompt + output so far.
    """
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[length - n:]
        # windows start at i = 0..L-n-1, so each match is followed by at least one token
        windows = sliding_window_view(tokens[:length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []


class NgramIndex:
    """ngram_match over an append-only token list, incrementally, for the whole list or any
    prefix of it."""

    def __init__(self, n_min: int = 1, n_max: int = 4):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"ngram needs 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self._ends: dict[tuple, list[int]] = {}  # n-gram -> ends (exclusive), increasing

    def extend(self, new_tokens) -> None:
        tokens, ends = self.tokens, self._ends
        for token in new_tokens:
            tokens.append(int(token))
            end = len(tokens)
            for n in range(self.n_min, min(self.n_max, end) + 1):
                gram = tuple(tokens[end - n:end])
                seen = ends.get(gram)
                if seen is None:
                    ends[gram] = [end]
                else:
                    seen.append(end)

    def sync(self, tokens: list[int]) -> None:
        """Index `tokens`, which extend what is indexed (rebuilt if they do not)."""
        n = len(self.tokens)
        if n > len(tokens) or (n and tokens[n - 1] != self.tokens[-1]):
            self.__init__(self.n_min, self.n_max)
            n = 0
        self.extend(tokens[n:])

    def propose(self, k: int, at: int | None = None) -> list[int]:
        """Same answer as ngram_match(tokens[:at], n_min, n_max, k) (at: default all)."""
        return self.match(k, at)[0]

    def match(self, k: int, at: int | None = None) -> tuple[list[int], int]:
        """(propose(k, at), n): n the length of the suffix that matched (0: none) — a
        proposal after a 4-token match is likelier right than one after a 1-token match, so
        the controller keeps n-gram's acceptance per n."""
        tokens = self.tokens
        length = len(tokens) if at is None else at
        for n in range(min(self.n_max, length - 1), self.n_min - 1, -1):
            ends = self._ends.get(tuple(tokens[length - n:length]))
            if ends is None:
                continue
            # the latest end before `length` (an end at `length` is the suffix itself)
            i = len(ends) - 1 if ends[-1] < length else bisect_left(ends, length) - 1
            if i >= 0:
                end = ends[i]
                return tokens[end:min(end + k, length)], n
        return [], 0


@register("ngram")
class NgramDrafter(Drafter):
    cost_hint = 0.01  # microseconds of dict look-ups against milliseconds of target forward
    peekable = True

    def __init__(self, models=None, n_min: int = 1, n_max: int = 4):
        self.index = NgramIndex(n_min, n_max)

    def reset(self) -> None:
        self.index = NgramIndex(self.index.n_min, self.index.n_max)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self.index.sync(ctx.tokens)
        return Draft(self.index.propose(k))
