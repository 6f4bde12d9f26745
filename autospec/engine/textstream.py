"""Streaming detokenisation: token ids in, new text out — the one used by `autospec generate`
and `autospec serve`.

Byte-level BPE pieces only make sense together, so the whole output is decoded each time and
the new suffix is returned; text ending in an incomplete UTF-8 character ('\\ufffd') is held
back until the character completes (or the stream ends).
"""
from __future__ import annotations


class TextStream:
    """Token ids in, new text out; holds back an incomplete UTF-8 character."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = 0

    def add(self, tokens: list[int], final: bool = False) -> str:
        self.ids += tokens
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not final:
            return ""
        delta, self.sent = text[self.sent:], len(text)
        return delta
