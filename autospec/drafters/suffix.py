"""Suffix drafting (SuffixDecoding, arXiv 2411.04975): draft what most often followed the tail
of the context — in this request, and in the outputs of earlier requests.

Two indexes (autospec/drafters/suffix_index.py), each proposing the most frequent continuation
of its longest match with a confidence per token (count of the chosen continuation / count of
all continuations at that node), cut where a confidence falls below `min_confidence`:
- the request's own: prompt + output, built as the request goes (never evicted; the target's
  position limit bounds it);
- a shared one per (model pair, tenant), of earlier requests' outputs, FIFO-evicted beyond
  `budget_tokens`. The pair is the ModelPair *object*: two pairs never share an index, even
  under one name (tests build many pairs called "target").
The draft is the one of the two with the larger expected accepted length Σ_j Π_{i<=j} conf_i
(ties: the request's own). Its confidences ride on the Draft (`Draft.confidences`), which the
controller calibrates into each token's chance of acceptance (autospec/confidence.py).

What enters the shared index, and when: a request's output, preceded by the last depth - 1
tokens of its prompt (so the shared index knows how answers *begin* after a prompt's
scaffold), as one segment when the request ends: Engine.finish calls `finish(ctx)`, so the
whole output (steps other drafters drafted included) is there before the caller's next
request starts. For callers that drive `step` and never call finish, the fallbacks: an EOS
token in what the target emitted, `reset()`, or the request's drafter being dropped (a
weakref.finalize, atexit off). Whichever comes first sends, once. Not incrementally: the shared
index then only holds evidence from *other*, finished requests (no double count of the running
request, which its own index already has), and each request is one FIFO unit. Whole prompts
are left out: in agentic traffic they are most of the tokens (files, tool results), would evict
the outputs that repeat, and the request that carries a prompt already indexes it itself.
A hand-over never blocks: it is queued and inserted under the index's lock by whoever holds it
next (a finalizer may run inside a proposal, in the same thread).
`share=False`: the request neither reads nor feeds the shared index.

Measured (`python -m autospec.drafters.suffix`, i.e. `measure()`: 10^6 tokens of
standard-library source through the reference tokenizer, in 512-token segments, depth 32, on
this project's 2-core machine while it trained a model):
- 11 µs a token appended (a request's own index, or a hand-over), 15 µs a proposal (K = 8, mean
  draft 7.3 tokens), 4 µs a token evicted;
- memory (tracemalloc): 293 bytes a token (293 MB per million) on code; the worst case, a
  stream in which every window occurs exactly twice, 1.2 KB a token. The default budget,
  800 000 tokens, is ~1 GB at that worst, ~0.25 GB on code.

Across processes (`autospec serve --share-outputs`; autospec/daemon/outputs.py): each serving
process keeps its own shared index, and the daemon relays segments — a process sends the ones
its requests hand over (`export_handoffs`) with its telemetry, and pulls the others' every few
seconds. Not a daemon-held index queried per proposal: a round trip on the daemon's Unix
socket is 0.16–0.21 ms at p50 idle (0.45 ms under ingest load, docs/benchmarks.md), 11–30× the 15 µs
proposal, it would put I/O on the fast path, and drafting would stop when the daemon does.
Not a snapshot pull either: a full index is ~3 MB of JSON and ~9 s to rebuild. Measured with
a real daemon (204 800 tokens of standard-library code in 512-token segments): 4 bytes of JSON
a token (a 4096-token vocabulary), pulling 0.23 µs a token, inserting 9.2 µs a token — a
pulled token costs what a local hand-over does; a process pays ~1 % of a core per 1 000
tokens/s the rest of the fleet emits, and holds the fleet's last `budget_tokens`, not more.
"""
from __future__ import annotations

import threading
import weakref
from collections import deque
from dataclasses import dataclass, fields
from functools import partial
from typing import Callable

from autospec.configcheck import knob, knobs, mapping, text
from autospec.drafters.contract import Draft, DraftContext, Drafter, Verified, register
from autospec.drafters.suffix_index import SuffixIndex, expected_accepted

# ~1 GB in the worst case measured (1.2 KB a token, see above), ~0.25 GB on code
DEFAULT_BUDGET_TOKENS = 800_000
MAX_TENANT_CHARS = 256  # a tenant's name, as a request or a daemon message gives it


@dataclass(frozen=True)
class SuffixOptions:
    """The suffix drafter's options (Engine(pair, drafter_options={"suffix": {...}}))."""
    budget_tokens: int = knob(DEFAULT_BUDGET_TOKENS, "tokens the shared index keeps (FIFO); 0 keeps none",
                              "int", low=0, section="drafter_options.suffix", tunable=False)
    share: bool = knob(True, "read and feed the shared index of earlier requests' outputs", "bool",
                       section="drafter_options.suffix", tunable=False)
    min_confidence: float = knob(0.1, "the draft stops at a token whose confidence is below this",
                                 "float", low=0.0, high=1.0, section="drafter_options.suffix",
                                 tunable=False)
    depth: int = knob(32, "window length indexed; matches use up to depth // 2 tokens", "int",
                      low=2, high=1024, section="drafter_options.suffix", tunable=False)
    tenant: str | None = None  # keys the shared index: tenants never see each other's outputs

    @classmethod
    def check(cls, options: dict, where: str = "drafter_options.suffix") -> "SuffixOptions":
        """Checked options; a ValueError (ConfigError) names the bad one and what is accepted."""
        mapping(where, options, accepted={f.name for f in fields(cls)})
        checked = {name: declared.check(f"{where}.{name}", options[name])
                   for name, (declared, _) in knobs(cls).items() if name in options}
        if options.get("tenant") is not None:
            checked["tenant"] = text(f"{where}.tenant", options["tenant"])
        return cls(**checked)


@dataclass
class SuffixDraft(Draft):
    """A Draft with the evidence behind it. Its confidences[j]: the count of token j's
    continuation / the count of all continuations at that point."""
    match_length: int = 0  # tokens of the context's tail the draft continues
    shared: bool = False  # from the shared index (else from the request's own)


class SharedSuffixIndex:
    """Earlier requests' outputs for one (model pair, tenant), within a FIFO token budget.
    Thread-safe; `add` never blocks (see the module docstring)."""

    def __init__(self, depth: int, budget_tokens: int):
        self.index = SuffixIndex(depth)
        self.budget_tokens = budget_tokens
        self._lock = threading.Lock()
        self._pending: deque[list[int]] = deque()
        self.export: Callable[[list[int]], None] | None = None  # see export_handoffs

    def handoff(self, tokens: list[int]) -> None:
        """A request of this process ended: add its segment, and export it (if asked to)."""
        self.add(tokens)
        if self.export is not None:
            self.export(tokens)

    def add(self, tokens: list[int]) -> None:
        """Queue one finished request's tokens (one segment); inserted now if the lock is free."""
        self._pending.append(list(tokens))
        if self._lock.acquire(blocking=False):
            try:
                self._insert_pending()
            finally:
                self._lock.release()

    def set_budget(self, budget_tokens: int) -> None:
        with self._lock:
            self.budget_tokens = budget_tokens
            self._insert_pending()

    def propose(self, context: list[int], k: int, min_confidence: float,
                hint: int = 0) -> tuple[list[int], list[float], int]:
        with self._lock:
            self._insert_pending()
            return self.index.propose(context, k, min_confidence, hint)

    def __len__(self) -> int:
        """Live tokens (what the budget bounds), queued ones included."""
        return self.index.live + sum(map(len, self._pending))

    def _insert_pending(self) -> None:  # the caller holds the lock
        while self._pending:
            self.index.extend(self._pending.popleft())
            self.index.close()
        self.index.evict(self.budget_tokens)


_SHARED: dict[tuple, SharedSuffixIndex] = {}
_EXPORTS: dict[int, Callable[[str | None, list[int]], None]] = {}  # id(models) -> callback
_SHARED_LOCK = threading.Lock()


def shared_index(models, tenant: str | None = None, depth: int = 32,
                 budget_tokens: int = DEFAULT_BUDGET_TOKENS) -> SharedSuffixIndex:
    """The shared index for this ModelPair object, tenant and depth (made on first use, dropped
    with the pair). A later caller's budget replaces the index's (evicting at once if smaller)."""
    key = (id(models), tenant, depth)
    with _SHARED_LOCK:
        shared = _SHARED.get(key)
        if shared is None:
            shared = _SHARED[key] = SharedSuffixIndex(depth, budget_tokens)
            if models is not None:
                weakref.finalize(models, _SHARED.pop, key, None)
            if id(models) in _EXPORTS:
                shared.export = partial(_EXPORTS[id(models)], tenant)
    if shared.budget_tokens != budget_tokens:
        shared.set_budget(budget_tokens)
    return shared


def shared_tokens(models) -> int:
    """Live tokens in all of this ModelPair's shared indexes (every tenant's)."""
    with _SHARED_LOCK:
        indexes = [shared for key, shared in _SHARED.items() if key[0] == id(models)]
    return sum(map(len, indexes))


def export_handoffs(models, callback: Callable[[str | None, list[int]], None]) -> None:
    """Call callback(tenant, segment) for every segment a request of this process hands to
    one of this pair's shared indexes from now on (not for segments `add`ed from elsewhere:
    what serve pulls from the daemon is not sent back). It runs on the thread that ends the
    request (the decode thread, or a finalizer's): it must be quick and thread-safe."""
    with _SHARED_LOCK:
        _EXPORTS[id(models)] = callback
        weakref.finalize(models, _EXPORTS.pop, id(models), None)
        for (pair_id, tenant, _), shared in _SHARED.items():
            if pair_id == id(models):
                shared.export = partial(callback, tenant)


class _Handoff:
    """What a request gives the shared index when it ends; sent at most once (by the drafter's
    weakref.finalize, which must not hold the drafter itself)."""

    def __init__(self, shared: SharedSuffixIndex | None, index: SuffixIndex):
        self.shared, self.index, self.prompt_len = shared, index, None

    def send(self) -> None:
        tokens, prompt_len = self.index.tokens, self.prompt_len
        if self.shared is not None and prompt_len is not None and len(tokens) > prompt_len:
            self.shared.handoff(tokens[max(0, prompt_len - (self.index.depth - 1)):])


@register("suffix")
class SuffixDrafter(Drafter):
    cost_hint = 0.01  # tens of microseconds a proposal against milliseconds of target forward
    options_class = SuffixOptions  # checks its options by name (CLI: --drafter-option suffix.X=V)
    peekable = True  # index look-ups: the controller sees the proposal and its confidences

    def __init__(self, models=None, **options):
        self.options = opts = SuffixOptions.check(options)
        self._eos = frozenset(models.eos_ids) if models is not None else frozenset()
        self.shared = (shared_index(models, opts.tenant, opts.depth, opts.budget_tokens)
                       if opts.share else None)
        self._begin()

    def _begin(self) -> None:
        self.index = SuffixIndex(self.options.depth)  # this request: prompt + output
        self._handoff = _Handoff(self.shared, self.index)
        self._send = weakref.finalize(self, self._handoff.send)
        self._send.atexit = False
        self._last = (0, 0, 0)  # (context length, local match, shared match) at the last proposal

    def reset(self) -> None:
        self._send()  # the request that ends hands its output over (once)
        self._begin()

    def finish(self, ctx: DraftContext) -> None:
        self._sync(ctx)  # tokens of steps it did not draft (k = 0, another drafter) included
        self._send()  # once: a later reset, EOS or finalizer finds it sent

    def propose(self, ctx: DraftContext, k: int) -> SuffixDraft:
        tokens, opts = ctx.tokens, self.options
        self._sync(ctx)
        # a repeating run extends the last match by what was appended since: try that length first
        grown = len(tokens) - self._last[0]
        local = self.index.propose(tokens, k, opts.min_confidence, self._last[1] + grown)
        best, shared_match, from_shared = local, 0, False
        if self.shared is not None:
            shared = self.shared.propose(tokens, k, opts.min_confidence, self._last[2] + grown)
            shared_match = shared[2]
            if expected_accepted(shared[1]) > expected_accepted(local[1]):
                best, from_shared = shared, True
        self._last = (len(tokens), local[2], shared_match)
        draft, confidences, match_length = best
        return SuffixDraft(draft, confidences=confidences, match_length=match_length,
                           shared=from_shared)

    def observe(self, result: Verified) -> None:
        self.index.extend(result.emitted)
        if not self._eos.isdisjoint(result.emitted):
            self._send()  # the request has ended: hand over now, not when it is dropped

    def _sync(self, ctx: DraftContext) -> None:
        """Index ctx.tokens, which extend what is indexed (another request's context: reset)."""
        indexed, tokens = self.index.tokens, ctx.tokens
        n = len(indexed)
        if n > len(tokens) or (n and tokens[n - 1] != indexed[-1]):
            self.reset()
            n = 0
        if self._handoff.prompt_len is None:
            self._handoff.prompt_len = ctx.prompt_len
        self.index.extend(tokens[n:])


def measure(n_tokens: int = 1_000_000, depth: int = 32, segment: int = 512,
            proposals: int = 3000) -> dict:
    """µs per appended token and per proposal with n_tokens indexed, and bytes per token
    (tracemalloc, a second build: tracing slows allocation). The stream: the reference
    tokenizer over standard-library source, in `segment`-token requests; proposals continue
    64-token contexts from text past the indexed part. Also the worst case for memory: a
    stream in which every window occurs exactly twice."""
    import random
    import time
    import tracemalloc

    from tokenizers import Tokenizer

    from autospec.models.corpus import default_corpus_dir, iter_sources
    from autospec.paths import REFERENCE_DIR

    tokenizer = Tokenizer.from_file(str(REFERENCE_DIR / "target" / "tokenizer.json"))
    ids: list[int] = []
    for source in iter_sources(default_corpus_dir()):
        ids += tokenizer.encode(source.text).ids
        if len(ids) >= n_tokens + 64 + 7 * proposals:
            break
    stream, held_out = ids[:n_tokens], ids[n_tokens:]

    def build(tokens):
        index = SuffixIndex(depth)
        for i in range(0, len(tokens), segment):
            index.extend(tokens[i:i + segment])
            index.close()
        return index

    def bytes_per_token(tokens):
        tracemalloc.start()
        index = build(tokens)  # noqa: F841 (alive while measured)
        used = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return used / len(tokens)

    t0 = time.perf_counter()
    index = build(stream)
    append_us = 1e6 * (time.perf_counter() - t0) / n_tokens
    contexts = [held_out[i - 64:i] for i in range(64, min(len(held_out), 64 + 7 * proposals), 7)]
    t0 = time.perf_counter()
    drafted = sum(len(index.propose(c, 8, 0.1)[0]) for c in contexts)
    propose_us = 1e6 * (time.perf_counter() - t0) / len(contexts)
    half = index.live // 2
    t0 = time.perf_counter()
    index.evict(index.live - half)
    evict_us = 1e6 * (time.perf_counter() - t0) / half
    rng = random.Random(0)
    block = [rng.randrange(4096) for _ in range(n_tokens // 10)]
    return {"tokens": n_tokens, "append_us": append_us, "propose_us": propose_us,
            "mean_draft": drafted / len(contexts), "evict_us": evict_us,
            "bytes_per_token": bytes_per_token(stream),
            "bytes_per_token_repeated_twice": bytes_per_token(block + block)}


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000), indent=1))
