"""The fleet's finished outputs, for the suffix drafter: what one serving process hands over,
the others pull (autospec/drafters/suffix.py says why this is pulled, not queried).

A serving process started with `--share-outputs` sends the segments its requests handed to
its shared suffix index (the output with the prompt's last depth - 1 tokens; see
suffix.py) inside its telemetry batches:

    "outputs": {"instance": ID, "segments": [{"tenant": NAME | null, "tokens": [int, ...]}]}

and pulls the others' with GET /v1/suffix?model_pair=&instance=&since=&epoch=. The daemon
keeps one log per model pair — never one across pairs — each entry numbered, tagged with its
tenant and its sender, within a FIFO token budget, in memory only: a restarted daemon starts
an empty log under a new `epoch`, and the serving processes keep what they already hold.
Every method runs on the event loop (after the batch's commit, so a re-sent batch, stored
once, is logged once): no lock.
"""
from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass

from autospec.drafters.suffix import DEFAULT_BUDGET_TOKENS, MAX_TENANT_CHARS

MAX_SEGMENT_TOKENS = 1 << 17  # a request's output (and prompt tail): far above a position limit
MAX_REPLY_TOKENS = 1 << 18  # ~1 MB of JSON a reply at ~4 bytes a token; the client asks again


class BadOutputs(ValueError):
    pass


@dataclass(frozen=True)
class Segment:
    seq: int  # numbered per pair from 0, in arrival order
    tenant: str | None
    instance: str  # the sender, whose own segments it never pulls back
    tokens: list[int]


def parse_outputs(raw) -> tuple[str, list[tuple[str | None, list[int]]]]:
    """(instance, [(tenant, tokens)]) from a batch's "outputs"; BadOutputs names the problem."""
    if not isinstance(raw, dict) or set(raw) != {"instance", "segments"}:
        raise BadOutputs('outputs: expected {"instance": ID, "segments": [...]}')
    instance, segments = raw["instance"], raw["segments"]
    if not isinstance(instance, str) or not 0 < len(instance) <= 256:
        raise BadOutputs(f"outputs.instance: expected a string of 1..256 characters, got {instance!r:.80}")
    if not isinstance(segments, list):
        raise BadOutputs(f"outputs.segments: expected a list, got {type(segments).__name__}")
    out = []
    for i, seg in enumerate(segments):
        where = f"outputs.segments[{i}]"
        if not isinstance(seg, dict) or set(seg) != {"tenant", "tokens"}:
            raise BadOutputs(f'{where}: expected {{"tenant": NAME or null, "tokens": [...]}}')
        tenant, tokens = seg["tenant"], seg["tokens"]
        if tenant is not None and (not isinstance(tenant, str) or not 0 < len(tenant) <= MAX_TENANT_CHARS):
            raise BadOutputs(f"{where}.tenant: expected null or a string of 1..{MAX_TENANT_CHARS} "
                             f"characters, got {tenant!r:.80}")
        if (not isinstance(tokens, list) or not 0 < len(tokens) <= MAX_SEGMENT_TOKENS
                or not all(type(t) is int and t >= 0 for t in tokens)):
            raise BadOutputs(f"{where}.tokens: expected a list of 1..{MAX_SEGMENT_TOKENS} token "
                             f"ids (integers >= 0)")
        out.append((tenant, tokens))
    return instance, out


class OutputLog:
    def __init__(self, budget_tokens: int = DEFAULT_BUDGET_TOKENS):
        self.budget_tokens = budget_tokens
        self.epoch = uuid.uuid4().hex[:12]  # this daemon run: a client that saw another resets
        self._logs: dict[str, deque[Segment]] = {}
        self._tokens: dict[str, int] = {}  # pair -> tokens logged (what the budget bounds)
        self._next: dict[str, int] = {}  # pair -> the next segment's seq

    def add(self, pair: str, instance: str, segments: list[tuple[str | None, list[int]]]) -> None:
        log = self._logs.setdefault(pair, deque())
        for tenant, tokens in segments:
            seq = self._next.get(pair, 0)
            self._next[pair] = seq + 1
            log.append(Segment(seq, tenant, instance, tokens))
            self._tokens[pair] = self._tokens.get(pair, 0) + len(tokens)
        while self._tokens.get(pair, 0) > self.budget_tokens:
            self._tokens[pair] -= len(log.popleft().tokens)

    def since(self, pair: str, instance: str, since: int, epoch: str | None) -> dict:
        """The pair's segments numbered >= since (all, if `epoch` is another run's), but the
        instance's own; at most ~MAX_REPLY_TOKENS (then "more": true). "next" is the `since`
        to ask with next time."""
        if epoch != self.epoch:
            since = 0
        segments, tokens = [], 0
        for seg in self._logs.get(pair, ()):
            if seg.seq < since:
                continue
            if tokens >= MAX_REPLY_TOKENS:
                return {"epoch": self.epoch, "next": seg.seq, "more": True, "segments": segments}
            if seg.instance != instance:
                segments.append({"tenant": seg.tenant, "tokens": seg.tokens})
                tokens += len(seg.tokens)
        return {"epoch": self.epoch, "next": self._next.get(pair, 0), "more": False,
                "segments": segments}

    def __len__(self) -> int:
        return sum(self._tokens.values())
