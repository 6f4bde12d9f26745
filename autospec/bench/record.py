"""Recording a trace (bench/trace.py): a workload decoded plain on the real target, what
every drafter would have proposed at each output position, and what the steps cost — at batch
1 from the live steps' verify phase, and the plane of the one step cost (controller/cost.py)
fitted to those and to forwards over many rows (`calibrate_batch`). `autospec bench --record PATH` runs it.

The costs are timed through the engine's public hooks (`Engine.trial_forward`: a forward
over rows, rolled back; `Engine.features`: the target's hidden states a feature head reads).
"""
from __future__ import annotations

import statistics
import time

import torch

from autospec.bench.trace import Trace, TraceRequest
from autospec.controller.cost import StepCost
from autospec.controller.interface import StaticController
from autospec.drafters.base import DraftContext, agreeing_prefix, create_drafter, drafter_class
from autospec.engine.loop import Engine
from autospec.models.sampling import SamplingParams
from autospec.telemetry import StepRecord


@torch.inference_mode()
def record(engine: Engine, prompts, drafters: list[str], k_max: int = 8,
           max_new_tokens: int = 128, progress=None, batch_rows: int = 16) -> Trace:
    """Greedy only. For every prompt: the plain output, then each drafter's matches; the
    forward's costs at batch 1 and over `batch_rows` rows (0: not)."""
    from autospec.bench.prompts import prompt_ids
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
        hidden = engine.features(ids + output)
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
    line = (calibrate_batch(engine, [r.prompt + r.output for r in requests], batch_rows,
                            one_row=verify) if batch_rows > 1 else None)
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


@torch.inference_mode()
def calibrate_verify(engine: Engine, tokens: list[int], k_max: int, repeats: int = 7) -> list[float]:
    """Median seconds of the engine's target forward over K+1 tokens after a real context,
    K = 0..k_max (a row of its own, rolled back after each forward)."""
    context = tokens[:max(1, len(tokens) - k_max - 1)]
    request = engine.start(context, max_new_tokens=k_max + 1)
    slot = request.slot
    out = []
    try:
        for k in range(k_max + 1):
            feed = tokens[len(context) - 1:len(context) + k]
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                engine.trial_forward([slot], [feed])
                times.append(time.perf_counter() - t0)
            out.append(statistics.median(times))
    finally:
        engine.abandon(request)
    return out


@torch.inference_mode()
def calibrate_batch(engine: Engine, contexts: list[list[int]], rows: int = 16,
                    repeats: int = 5, one_row: list[float] = ()) -> list[float]:
    """(a, b, c, j, w): the plane of the one step cost (controller/cost.py, a + b B + c P + j
    [drafted] + w B (W - 1) seconds), fitted by its own rule (`StepCost`, nothing forgotten)
    to the median seconds of the target's forward over `rows` and `rows` / 2 rows at the
    recorded contexts (cycled), at plain, uniform and mixed widths (each forward rolled
    back), and to one row's forward at each K (`one_row`, seconds at K = 0, 1, ...)."""
    widest = 9
    contexts = [tokens[:max(2, len(tokens) - widest)] for tokens in contexts]
    batch = Engine(engine.models, engine.drafter_options, max_batch=rows,
                   max_len=max(map(len, contexts)) + widest + 1)
    requests = [batch.start(contexts[i % len(contexts)], max_new_tokens=widest)
                for i in range(rows)]
    cost = StepCost(max(len(one_row), widest), forgetting=1.0)
    for k, seconds in enumerate(one_row):
        cost.observe(1, k + 1, seconds)
    try:
        slots = [request.slot for request in requests]
        for b in sorted({max(2, rows // 2), rows}):
            q = max(1, b // 4)
            for widths in ([1] * b, [2] * b, [3] * b, [2] * (b // 2) + [1] * (b - b // 2),
                           [5] * q + [1] * (b - q), [widest] + [1] * (b - 1),
                           [3] * q + [2] * q + [1] * (b - 2 * q)):
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    batch.trial_forward(slots[:b], [[requests[i].tokens[-1]] * w
                                                    for i, w in enumerate(widths)])
                    times.append(time.perf_counter() - t0)
                cost.observe(b, sum(widths), statistics.median(times), width=max(widths))
    finally:
        for request in requests:
            batch.abandon(request)
    return list(cost.plane())
