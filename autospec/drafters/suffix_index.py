"""A suffix trie over token streams, for suffix drafting: the definition and the index.

The question a suffix drafter asks: where did the tail of my context appear before, and what
followed it most often? Every token position s starts a *window*, the next `depth` tokens of
its segment (a segment is one request's tokens; windows never cross segments). For the
context's tail P:

- the match is the longest P[-m:], 1 <= m <= max_match (= depth // 2, so a full-length match
  still leaves depth - m >= depth // 2 tokens to draft), that starts some window which goes on
  after it;
- the draft walks on from there greedily: of the windows that start with (match + draft so far)
  and go on, the most frequent next token (ties: the most recent window), with confidence
  count(that token) / count(all that go on), stopping below `min_confidence`, at k tokens, or
  at the window depth.

`suffix_propose` is that definition, brute force over token lists (the test oracle).
`SuffixIndex` gives the same answers incrementally: a trie of every window, counts on its
nodes. Appending a token moves each of the <= depth windows still open down one level, O(depth);
a proposal walks the tail (a binary search over m, O(max_match log max_match)) and then k nodes.
Space is kept near O(tokens), not O(tokens x depth): a run of the trie that only one window
follows is not expanded into nodes but kept as a *leaf* — the window's start, whose tokens are
read from the stream. Two windows that agree for r tokens share r nodes, so the worst case is
text repeated exactly twice (depth / 2 nodes a token); more repeats share the same nodes.
FIFO eviction removes the oldest window: O(depth) count decrements along its path.
"""
from __future__ import annotations

from itertools import accumulate
from operator import mul

SEPARATOR = -1  # ends a segment in the stream; token ids are >= 0


def suffix_propose(segments: list[list[int]], context: list[int], k: int, depth: int,
                   min_confidence: float) -> tuple[list[int], list[float], int]:
    """The definition, by brute force: (draft tokens, their confidences, match length m).

    segments: the indexed token lists, oldest first (for a request's own index: [context]).
    context: the tokens drafted after; only its last depth // 2 tokens matter.
    """
    def windows_after(pattern):  # {next token: (count, latest start)} over windows starting with pattern
        found, n = {}, len(pattern)
        if n >= depth:
            return found
        for seg_no, seg in enumerate(segments):
            for start in range(len(seg) - n):
                if seg[start:start + n] == pattern:
                    count, _ = found.get(seg[start + n], (0, None))
                    found[seg[start + n]] = (count + 1, (seg_no, start))
        return found

    match = 0
    for m in range(min(depth // 2, len(context)), 0, -1):
        if windows_after(context[-m:]):
            match = m
            break
    if not match:
        return [], [], 0
    pattern, draft, confidences = list(context[-match:]), [], []
    while len(draft) < k:
        after = windows_after(pattern)
        if not after:
            break
        token, (count, _) = max(after.items(), key=lambda item: item[1])
        confidence = count / sum(c for c, _ in after.values())
        if confidence < min_confidence:
            break
        draft.append(token)
        confidences.append(confidence)
        pattern.append(token)
    return draft, confidences, match


def expected_accepted(confidences: list[float]) -> float:
    """Σ_j Π_{i<=j} confidence_i: the draft's expected accepted length, if each confidence is
    P(token j accepted | tokens before it accepted)."""
    return sum(accumulate(confidences, mul))


class _Node:
    """A string that starts at least two live windows (the root: the empty string).

    Children: none (best None), one (best = its token, `only` = it; most nodes of repeated
    text have one, and a dict would triple their size), or a dict (best None = recompute).
    A child is a _Node, or an int: a leaf, the start of the one window that goes that way."""
    __slots__ = ("count", "cont", "stamp", "best", "only", "children")

    def __init__(self, count: int, stamp: int):
        self.count = count  # windows that start with this string
        self.cont = 0  # of those, the ones that go on after it (= the children's counts summed)
        self.stamp = stamp  # start of the newest such window (FIFO eviction keeps it live)
        self.best = None  # token of the child with the highest (count, stamp)
        self.only = None  # the child, while there is exactly one
        self.children: dict | None = None  # token -> child, from the second child on


def _count_and_stamp(child) -> tuple[int, int]:
    return (1, child) if type(child) is int else (child.count, child.stamp)


def _child(node: _Node, token: int):
    if node.children is None:
        return node.only if node.best == token else None
    return node.children.get(token)


def _set_child(node: _Node, token: int, child) -> None:
    """Add or replace a child. Keeps `best` right for one child; with more, the caller's."""
    if node.children is not None:
        node.children[token] = child
    elif node.best is None or node.best == token:
        node.best, node.only = token, child
    else:  # a second child: to a dict (best stays the first until the caller says otherwise)
        node.children = {node.best: node.only, token: child}
        node.only = None


def _remove_child(node: _Node, token: int) -> None:
    if node.children is None:
        node.best = node.only = None
        return
    del node.children[token]
    if len(node.children) == 1:
        node.best, node.only = next(iter(node.children.items()))
        node.children = None
    elif node.best == token:
        node.best = None


def _best_child(node: _Node):
    """The token of the child with the highest (count, stamp); None without children."""
    if node.best is None and node.children:
        node.best = max(node.children, key=lambda t: _count_and_stamp(node.children[t]))
    return node.best


class SuffixIndex:
    """suffix_propose over a growing stream of segments, incrementally, with FIFO eviction.

    Positions are global (they keep counting after eviction); the stream list holds the live
    ones from `base` on. Only the last segment may be open (still being extended)."""

    def __init__(self, depth: int = 32):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 2:
            raise ValueError(f"suffix index depth must be an integer >= 2, got {depth!r}")
        self.depth = depth
        self.max_match = depth // 2
        self.tokens: list[int] = []  # the live stream; SEPARATOR closes a segment
        self.base = 0  # global position of tokens[0]
        self.oldest = 0  # global start of the oldest live window
        self.live = 0  # live tokens (separators not counted): what the budget bounds
        self.root = _Node(0, -1)
        # the open segment's windows that sit at a node, as [start, node]: only they move when a
        # token comes (the others run on alone, each in its own leaf, and stay ahead of any
        # window that follows them, so they never sit at a node again)
        self._at_node: list[list] = []
        self._closed_end = 0  # global end of the closed segments: what evict may touch

    @property
    def end(self) -> int:
        return self.base + len(self.tokens)

    # -- building --------------------------------------------------------------------------
    def extend(self, new_tokens) -> None:
        """Append tokens to the open segment (opening one if none is). O(windows at a node) a
        token: <= depth, a few on text that does not repeat."""
        tokens, root = self.tokens, self.root
        for token in new_tokens:
            token = int(token)
            pos = self.base + len(tokens)
            tokens.append(token)
            self.live += 1
            root.count += 1
            at_node = self._at_node
            at_node.append([pos, root])
            self._at_node = [window for window in at_node if self._descend(window, token, pos)]

    def _descend(self, window: list, token: int, pos: int) -> bool:
        """Move `window` (at its node, depth pos - start) down by `token`; True if it is at a
        node again and not yet full."""
        start, node = window
        depth = pos - start
        node.cont += 1
        child = _child(node, token)
        if child is None:  # nobody went this way: the window runs on alone, a leaf
            _set_child(node, token, start)
            count = 1
        elif type(child) is int:  # one window did (it is ahead of this one): a node for both
            other, count = child, 2
            child = _Node(2, start)
            nxt = other + depth + 1 - self.base  # where the other window goes on
            if depth + 1 < self.depth and nxt < len(self.tokens) and self.tokens[nxt] != SEPARATOR:
                _set_child(child, self.tokens[nxt], other)
                child.cont = 1
            _set_child(node, token, child)
        else:
            child.count += 1
            child.stamp = start
            count = child.count
        # `start` is newer than any window through a sibling, so a tie goes to `token`
        best = node.best
        if best is not None and best != token and count >= _count_and_stamp(_child(node, best))[0]:
            node.best = token
        if count == 1:
            return False
        window[1] = child
        return depth + 1 < self.depth

    def close(self) -> None:
        """End the open segment: later tokens start a new one, no window crosses the gap."""
        if self.tokens and self.tokens[-1] != SEPARATOR:
            self.tokens.append(SEPARATOR)
        self._at_node = []
        self._closed_end = self.end

    def evict(self, budget: int) -> None:
        """Drop the oldest windows (FIFO) until at most `budget` tokens are live. Only closed
        segments are evicted: call close() first."""
        while self.live > budget:
            start = self.oldest
            if start >= self._closed_end:
                raise RuntimeError("evict() reached the open segment: close() it first")
            self.oldest += 1
            if self.tokens[start - self.base] != SEPARATOR:
                self._remove_window(start)
                self.live -= 1
        while self.oldest < self.end and self.tokens[self.oldest - self.base] == SEPARATOR:
            self.oldest += 1
        dead = self.oldest - self.base
        if dead > 4096 and 2 * dead > len(self.tokens):  # amortised O(1) a token
            del self.tokens[:dead]
            self.base = self.oldest

    def _remove_window(self, start: int) -> None:
        node = self.root
        node.count -= 1
        for depth in range(self.depth):
            pos = start + depth - self.base
            if pos >= len(self.tokens) or self.tokens[pos] == SEPARATOR:
                return
            token = self.tokens[pos]
            node.cont -= 1
            child = _child(node, token)
            if type(child) is int:  # the window's own leaf
                _remove_child(node, token)
                return
            child.count -= 1
            if node.children is not None and node.best == token:
                node.best = None  # maybe still the best: recomputed when next asked
            if child.count == 1:  # one window left below: a leaf again (FIFO: the newest)
                _set_child(node, token, child.stamp)
                return
            node = child

    # -- proposing -------------------------------------------------------------------------
    def _find(self, pattern: list[int]):
        """(node, None) or (None, leaf start) where `pattern` ends, if a window starting with
        it goes on after it; None otherwise. O(len(pattern))."""
        node, n = self.root, len(pattern)
        for i, token in enumerate(pattern):
            child = _child(node, token)
            if child is None:
                return None
            if type(child) is int:  # one window from here: compare the rest with the stream
                at = child + n - self.base  # where it would go on
                if (at >= len(self.tokens) or self.tokens[at] == SEPARATOR
                        or self.tokens[at - n + i + 1:at] != pattern[i + 1:]):
                    return None
                return None, child
            node = child
        return (node, None) if node.cont else None

    def match(self, context: list[int], hint: int = 0) -> tuple[int, object]:
        """The longest match (m, where) of context's tail; (0, None) if none. Whether a length
        matches is monotone in it, so: try `hint` (the caller's last m plus what it appended:
        in a repeating run, right at once), then binary search."""
        hi = min(self.max_match, len(context))
        lo, found = 0, None
        hint = min(hint, hi)
        if hint > 0:
            where = self._find(context[len(context) - hint:])
            if where is None:
                hi = hint - 1
            else:
                lo, found = hint, where
        while lo < hi:
            mid = (lo + hi + 1) // 2
            where = self._find(context[len(context) - mid:])
            if where is None:
                hi = mid - 1
            else:
                lo, found = mid, where
        return lo, found

    def propose(self, context: list[int], k: int, min_confidence: float,
                hint: int = 0) -> tuple[list[int], list[float], int]:
        """Same answer as suffix_propose(segments, context, k, depth, min_confidence)."""
        m, where = self.match(context, hint)
        draft: list[int] = []
        confidences: list[float] = []
        if where is None:
            return draft, confidences, 0
        node, leaf = where
        tokens, base = self.tokens, self.base
        for depth in range(m, min(self.depth, m + k)):
            if leaf is None:
                if not node.cont:
                    break
                token = _best_child(node)
                child = _child(node, token)
                confidence = _count_and_stamp(child)[0] / node.cont
                if type(child) is int:
                    leaf = child
                else:
                    node = child
            else:  # one window: its own next token, every time it was seen (once)
                at = leaf + depth - base
                if at >= len(tokens) or tokens[at] == SEPARATOR:
                    break
                token, confidence = tokens[at], 1.0
            if confidence < min_confidence:
                break
            draft.append(token)
            confidences.append(confidence)
        return draft, confidences, m
