"""Traces: record once what every drafter would have done, replay any controller exactly.

Under greedy decoding the target's output is fixed, so for each output position t and each
drafter we can record `match[t]`: how many of its next K_max proposed tokens (drafted from
prompt + output[:t]) agree with the target's output. A controller that drafts K tokens with
that drafter at t gets min(match[t], K) accepted plus one target token — exactly what the
live engine would do. Costs are measured once during recording (draft seconds per token per
drafter, verify seconds per forward size), and replay charges them, so controllers are
compared deterministically and in milliseconds (this is what `tune` searches over). Replay is
the live loop itself, `Engine.run`, over a recorded target (bench/recorded.py).

Under load (`replay_batch`, `autospec replay --rows N`): N closed-loop clients over the
trace's requests, every step charged the batch line s(B, P, W) of controller/batch.py as
`calibrate_batch` measured it on the target (recorded beside the batch-1 costs); and a
controller that knows the future (`HindsightController`): the ceiling of what any controller
that learns from evidence can reach at those costs.

File format (JSON): {"schema_version": 1, "k_max": int, "costs": {"verify_seconds": [K_max+1],
"draft_seconds_per_token": {drafter: float}, "batch_line": [a, b, c, j, w] (seconds; absent
in traces recorded before it), "overhead_seconds": float (absent: 0)}, "models": {"target", "draft", "pair"},
"requests": [{"id", "category", "prompt": [ids], "output": [ids], "match": {drafter: [ints]},
"proposed": {drafter: [ints]}, "prefill_seconds": float, "confidence": {drafter: [[floats]]}}]}

`confidence` holds, for each model drafter (a look-up drafter's are made again in replay, by
the real look-up), the confidence of each token of its K_max proposal at each output position
(Draft.confidences, 3 decimals): what a controller's StopRule cuts a draft by. A trace recorded
without them replays those drafters at the decision's K.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from autospec.controller.batch import Prices, step_features, batch_ks
from autospec.drafters.base import DraftContext, create_drafter, drafter_class
from autospec.engine.accept import agreeing_prefix
from autospec.engine.loop import Engine
from autospec.engine.request import Job
from autospec.controller.interface import (Controller, Decision, RowController,
                                           StaticController, Step)
from autospec.models.sampling import SamplingParams
from autospec.telemetry import StepRecord

SCHEMA_VERSION = 1


@dataclass
class TraceRequest:
    id: str
    category: str
    prompt: list[int]
    output: list[int]
    match: dict[str, list[int]]  # drafter -> (len(output),) agreeing draft tokens at each t
    # drafter -> (len(output),) tokens it proposed at each t when asked for K_max (a look-up
    # drafter may have fewer or none); absent in traces recorded before: K_max everywhere
    proposed: dict[str, list[int]] | None = None
    # seconds its live plain run spent outside its steps (the prompt's prefill, start and
    # finish): what a replay charges when it starts; absent in traces recorded before: 0
    prefill_seconds: float = 0.0
    # model drafter -> per output position, its proposal's confidences (the module docstring);
    # absent in traces recorded before: none
    confidence: dict[str, list[list[float]]] | None = None


@dataclass
class Trace:
    k_max: int
    verify_seconds: list[float]  # (k_max+1,) target forward over K+1 tokens
    draft_seconds_per_token: dict[str, float]
    requests: list[TraceRequest] = field(default_factory=list)
    models: dict = field(default_factory=dict)
    batch_line: list[float] | None = None  # (a, b, c, j, w) of a batch step (calibrate_batch)
    # seconds a live step spends outside its verify phase and drafting (the decision, the
    # loop: StepRecord.overhead_seconds), the median; 0 in traces recorded before it
    overhead_seconds: float = 0.0

    @property
    def pair(self) -> str | None:
        """The model-pair key (models.pair.pair_key) the trace was recorded on; None when the
        trace does not say. Traces recorded before they carried the key name the model
        directories: the shipped pair's layout (.../target, .../draft) is the reference pair
        wherever it was installed."""
        models = self.models or {}
        if models.get("pair") or not models.get("target"):
            return models.get("pair")
        from autospec.models.pair import pair_key
        target, draft = str(models["target"]), models.get("draft")
        key = pair_key(target, str(draft) if draft else None)
        if key != "reference" and (Path(target).name, Path(str(draft)).name) == ("target", "draft"):
            return "reference"
        return key

    def save(self, path: Path) -> None:
        requests = [{key: value for key, value in r.__dict__.items()
                     if not (key == "confidence" and value is None)} for r in self.requests]
        costs = {"verify_seconds": self.verify_seconds,
                 "draft_seconds_per_token": self.draft_seconds_per_token}
        if self.batch_line is not None:
            costs["batch_line"] = self.batch_line
        if self.overhead_seconds:
            costs["overhead_seconds"] = self.overhead_seconds
        payload = {"schema_version": SCHEMA_VERSION, "k_max": self.k_max, "costs": costs,
                   "models": self.models,
                   "requests": requests}
        Path(path).write_text(json.dumps(payload) + "\n")

    @classmethod
    def load(cls, path: Path) -> "Trace":
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read trace '{path}': {exc}") from None
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"trace '{path}': schema_version {raw.get('schema_version')!r}, "
                             f"expected {SCHEMA_VERSION}")
        try:
            return cls(raw["k_max"], raw["costs"]["verify_seconds"],
                       raw["costs"]["draft_seconds_per_token"],
                       [TraceRequest(**r) for r in raw["requests"]], raw.get("models", {}),
                       raw["costs"].get("batch_line"), raw["costs"].get("overhead_seconds", 0.0))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"trace '{path}': malformed ({exc})") from None


@torch.inference_mode()
def record(engine: Engine, prompts, drafters: list[str], k_max: int = 8,
           max_new_tokens: int = 128, progress=None, batch_rows: int = 16) -> Trace:
    """Greedy only. For every prompt: the plain output, then each drafter's matches; the
    forward's costs at batch 1 and over `batch_rows` rows (0: not)."""
    from autospec.bench.harness import prompt_ids
    draft_times: dict[str, list[float]] = {d: [] for d in drafters}
    requests, live = [], []
    live_draft: dict[str, list[float]] = {}  # a model drafter's seconds per token, live
    for i, p in enumerate(prompts):
        ids = prompt_ids(engine, p)
        n = p.max_new_tokens or max_new_tokens
        plain = engine.generate(ids, controller=StaticController(None, 0), max_new_tokens=n)
        output = plain.token_ids
        # the live step's costs at every width an n-gram draft reaches (steps, not forwards)
        live += plain.telemetry.step_records + engine.generate(
            ids, controller=StaticController("ngram", k_max), max_new_tokens=n).telemetry.step_records
        # a model drafter's token as the live step drafts it (its own cache, caught up once
        # a step): timed alone, a cold proposal per position, it cost 0.65 ms a token on the
        # reference pair's draft model against the live step's ~0.9
        for name in drafters:
            if not drafter_class(name).peekable:
                steps = engine.generate(ids, controller=StaticController(name, LIVE_K),
                                        max_new_tokens=n).telemetry.step_records
                live_draft.setdefault(name, []).extend(
                    s.draft_seconds / s.proposed for s in steps if s.proposed)
        hidden = _features_of(engine, ids + output)
        match, proposed, confidence = {}, {}, {}
        for name in drafters:
            counts, lengths, believed, times = proposals(engine, name, ids, output, hidden, k_max)
            match[name], proposed[name] = counts, lengths
            draft_times[name] += times
            if not drafter_class(name).peekable and any(believed):
                confidence[name] = believed
        steps = plain.telemetry.step_records
        prefill = plain.telemetry.wall_seconds - sum(
            s.draft_seconds + s.verify_seconds + (s.overhead_seconds or 0.0) + s.controller_seconds
            for s in steps)
        requests.append(TraceRequest(p.id, p.category, ids, output, match, proposed,
                                     max(0.0, prefill), confidence or None))
        if progress:
            progress(f"recorded {i + 1}/{len(prompts)}: {p.id}")
    verify = step_verify(live, calibrate_verify(engine, requests[0].prompt + requests[0].output,
                                                k_max))
    line = (calibrate_batch(engine, [r.prompt + r.output for r in requests], batch_rows)
            if batch_rows > 1 else None)
    overhead = statistics.median(s.overhead_seconds or 0.0 for s in live)
    draft_times.update((d, v) for d, v in live_draft.items() if v)
    return Trace(k_max, verify,
                 {d: statistics.median(v) if v else 0.0 for d, v in draft_times.items()},
                 requests, {"target": engine.models.target_name, "draft": engine.models.draft_name,
                            "pair": engine.models.key}, line, overhead)


def proposals(engine: Engine, name: str, prompt: list[int], output: list[int],
              hidden: torch.Tensor | None, k_max: int):
    """What drafter `name` proposes, asked for k_max tokens after prompt + output[:t], at every
    output position t: (agreeing tokens, proposed tokens, the proposal's confidences (3
    decimals), seconds per drafted token of each non-empty proposal)."""
    drafter = create_drafter(name, engine.models, **engine.drafter_options.get(name, {}))
    counts, lengths, believed, times = [], [], [], []
    for t in range(len(output)):
        tokens = prompt + output[:t]
        t0 = time.perf_counter()
        features = None if hidden is None else hidden[:len(tokens) - 1]
        draft = drafter.propose(DraftContext(tokens, SamplingParams(), hidden=features), k_max)
        if draft.tokens:
            times.append((time.perf_counter() - t0) / len(draft.tokens))
        counts.append(agreeing_prefix(draft.tokens, output[t:t + len(draft.tokens)]))
        lengths.append(len(draft.tokens))
        believed.append([round(c, 3) for c in draft.confidences or []])
    return counts, lengths, believed, times


MIN_STEPS = 3  # live steps at a width before their median prices it
LIVE_K = 4  # the K of the live runs that price a model drafter's token


def step_verify(steps: list[StepRecord], forward: list[float]) -> list[float]:
    """v(K) as the live step's verify phase costs it (the forward, accept, roll back, the row's
    record: StepRecord.verify_seconds), the median at each width with MIN_STEPS steps; a
    width without them: its bare forward (`forward`, calibrate_verify) plus the median of
    the measured widths' step-minus-forward. The bare forward alone made a replayed n-gram
    run 24 % faster than its live run on the reference pair (heldout.jsonl)."""
    by_width: dict[int, list[float]] = {}
    for s in steps:
        by_width.setdefault(s.verify_tokens - 1, []).append(s.verify_seconds)
    measured = {k: statistics.median(v) for k, v in by_width.items()
                if k < len(forward) and len(v) >= MIN_STEPS}
    extra = statistics.median(measured[k] - forward[k] for k in measured) if measured else 0.0
    return [measured.get(k, forward[k] + extra) for k in range(len(forward))]


def _features_of(engine: Engine, tokens: list[int]) -> torch.Tensor | None:
    """The target's last hidden state at every position but the last of `tokens`, where the
    engine keeps them (a pair with a feature head: what `eagle` drafts from); else None."""
    if engine.cache.hidden is None:
        return None
    request = engine.start(tokens, max_new_tokens=1)
    try:
        return engine.cache.hidden_of(request.slot).clone()
    finally:
        engine.abandon(request)


@torch.inference_mode()
def calibrate_verify(engine: Engine, tokens: list[int], k_max: int, repeats: int = 7) -> list[float]:
    """Median seconds of the engine's target forward over K+1 tokens after a real context,
    K = 0..k_max (a row of its own, rolled back after each forward)."""
    context = tokens[:max(1, len(tokens) - k_max - 1)]
    request = engine.start(context, max_new_tokens=k_max + 1)
    slot, base = request.slot, engine.cache.lengths[request.slot]
    out = []
    try:
        for k in range(k_max + 1):
            feed = tokens[len(context) - 1:len(context) + k]
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                engine._forward([slot], [feed])
                times.append(time.perf_counter() - t0)
                engine.cache.lengths[slot] = base
            out.append(statistics.median(times))
    finally:
        engine.abandon(request)
    return out


@torch.inference_mode()
def calibrate_batch(engine: Engine, contexts: list[list[int]], rows: int = 16,
                    repeats: int = 5) -> list[float]:
    """(a, b, c, j, w): the batch line of controller/batch.py (a + b B + c P + j [drafted] +
    w B (W - 1) seconds) fitted by least squares to the median seconds of the target's
    forward over `rows` and `rows` / 2 rows at the recorded contexts (cycled), at plain,
    uniform and mixed widths (each forward rolled back)."""
    widest = 9
    contexts = [tokens[:max(2, len(tokens) - widest)] for tokens in contexts]
    batch = Engine(engine.models, engine.drafter_options, max_batch=rows,
                   max_len=max(map(len, contexts)) + widest + 1)
    requests = [batch.start(contexts[i % len(contexts)], max_new_tokens=widest)
                for i in range(rows)]
    features, seconds = [], []
    try:
        slots = [request.slot for request in requests]
        base = [batch.cache.lengths[slot] for slot in slots]
        for b in sorted({max(2, rows // 2), rows}):
            q = max(1, b // 4)
            for widths in ([1] * b, [2] * b, [3] * b, [2] * (b // 2) + [1] * (b - b // 2),
                           [5] * q + [1] * (b - q), [widest] + [1] * (b - 1),
                           [3] * q + [2] * q + [1] * (b - 2 * q)):
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    batch._forward(slots[:b], [[requests[i].tokens[-1]] * w
                                               for i, w in enumerate(widths)])
                    times.append(time.perf_counter() - t0)
                    for slot, length in zip(slots, base):
                        batch.cache.lengths[slot] = length
                features.append(step_features(b, sum(widths), max(widths)))
                seconds.append(statistics.median(times))
    finally:
        for request in requests:
            batch.abandon(request)
    x = torch.tensor(features, dtype=torch.float64)
    y = torch.tensor(seconds, dtype=torch.float64).unsqueeze(1)
    kept = list(range(x.shape[1]))
    while True:  # least squares with b, c, j, w >= 0: a negative one is dropped, the rest refit
        fitted = [0.0] * x.shape[1]
        for i, value in zip(kept, torch.linalg.lstsq(x[:, kept], y).solution.squeeze(1).tolist()):
            fitted[i] = value
        negative = [i for i in kept[1:] if fitted[i] < 0]
        if not negative:
            return fitted
        kept.remove(min(negative, key=fitted.__getitem__))


def trace_prices(trace: Trace, rows: int) -> Prices:
    """The step's prices the trace's costs give at `rows` rows (the batch line past one)."""
    if rows == 1:
        v = trace.verify_seconds
        return Prices(1, v[0], 0.0, v, v, v[0])
    a, b, c, jump, width = _batch_line(trace)
    return Prices(rows, a + (b + c) * rows, c, [], [], a + b + c, jump, width)


def _batch_line(trace: Trace) -> list[float]:
    if trace.batch_line is None:
        raise ValueError("the trace has no batch line (recorded before batches were "
                         "calibrated): record it again (autospec bench --record)")
    return trace.batch_line


class HindsightController(RowController):
    """Knows every request's future (the trace's outputs): each row drafts, with the drafter
    that agrees longest there, only tokens the target keeps, and every row's K is chosen for
    the step's goodput over those certain tokens (batch_ks at the trace's prices). No
    controller that learns from evidence can pass it at the same costs: its figure is the
    ceiling a live one is measured against (`autospec replay --controller hindsight`)."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.requests = {r.id: r for r in trace.requests}

    def decide_row(self, request) -> Decision:
        return self.decide(Step([request], None))[0]

    def decide(self, step: Step) -> list[Decision]:
        costs = self.trace.draft_seconds_per_token
        picks = []
        for request in step.rows:
            recorded = self.requests[request.request_id]
            at = len(request.tokens) - request.prompt_len
            picks.append(max(((d, matches[at]) for d, matches in recorded.match.items()),
                             key=lambda pick: (pick[1], -costs.get(pick[0], 0.0))))
        ks = batch_ks([[1.0] * agree for _, agree in picks],
                      [costs.get(d, 0.0) for d, _ in picks],
                      trace_prices(self.trace, len(step.rows)))
        return [Decision(d, k) if k else Decision(None, 0) for (d, _), k in zip(picks, ks)]


def replay(trace: Trace, controller: Controller, requests: list[TraceRequest] | None = None):
    """Run `controller` over the trace, one request at a time: one RequestRecord per request
    (simulated seconds)."""
    return replay_batch(trace, controller, 1, requests)[0]


def replay_batch(trace: Trace, controller: Controller, rows: int,
                 requests: list[TraceRequest] | None = None) -> tuple[list, float]:
    """`rows` closed-loop clients over the trace's requests (each sends the next when its last
    ends): the live loop, `Engine.run`, over the recorded target (bench/recorded.py). (one
    RequestRecord per request in order, simulated seconds of the whole run)"""
    from autospec.bench.recorded import RecordedEngine
    engine = RecordedEngine(trace, rows, requests)
    jobs = [Job(r.prompt, len(r.output), request_id=r.id, workload=r.category)
            for r in engine.requests]
    generations = engine.run(jobs, controller)
    return [g.telemetry for g in generations], engine.now
