"""OpenAI's `stop`: up to 4 strings; the output ends before the first of them to complete.

Matched on text, not tokens, so a stop string found across token boundaries, or inside one
step's several accepted draft tokens, cuts the output at the same place. While streaming, the
tail that could still grow into a stop string is held back (a client never sees a partial
stop string); the whole response is the same text cut by `cut_at_stop`.
"""
from __future__ import annotations

MAX_STOPS = 4  # OpenAI's limit


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """(text before the stop string that completes first, whether one matched): decoding
    stops as soon as one completes, so of two that overlap the one ending first wins, not
    the one starting first ("\naa" with stops "a" and "\naa": "\n"), streamed or not; of
    those ending at the same place, the longest."""
    found = [(i + len(s), i) for s in stops for i in (text.find(s),) if i >= 0]
    return (text[:min(found)[1]], True) if found else (text, False)


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of `text` that are a proper prefix of some stop string."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


class StopStream:
    """Text deltas in, the deltas a client may see out (and whether a stop string matched)."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.text = ""  # everything received
        self.sent = 0  # characters passed on

    def feed(self, delta: str, final: bool = False) -> tuple[str, bool]:
        self.text += delta
        cut, hit = cut_at_stop(self.text, self.stops)
        end = len(cut) if hit or final else len(self.text) - held_back(self.text, self.stops)
        out, self.sent = self.text[self.sent:end], max(self.sent, end)
        return out, hit
