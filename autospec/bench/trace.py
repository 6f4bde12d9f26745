"""Traces: record once what every drafter would have done, replay any controller exactly.

Under greedy decoding the target's output is fixed, so for each output position t and each
drafter we can record `match[t]`: how many of its next K_max proposed tokens (drafted from
prompt + output[:t]) agree with the target's output. A controller that drafts K tokens with
that drafter at t gets min(match[t], K) accepted plus one target token — exactly what the
live engine would do. Costs are measured once during recording (draft seconds per token per
drafter, verify seconds per forward size), and replay charges them, so controllers are
compared deterministically and in milliseconds (this is what `tune` searches over).

File format (JSON): {"schema_version": 1, "k_max": int, "costs": {"verify_seconds": [K_max+1],
"draft_seconds_per_token": {drafter: float}}, "models": {"target", "draft", "pair"},
"requests": [{"id", "category", "prompt": [ids], "output": [ids], "match": {drafter: [ints]}}]}
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from autospec.drafters.base import DraftContext, create_drafter
from autospec.engine.accept import agreeing_prefix
from autospec.engine.loop import Engine
from autospec.engine.request import Controller, StaticController, decide_batch, update_batch
from autospec.models.sampling import SamplingParams
from autospec.telemetry import StepRecord, summarise

SCHEMA_VERSION = 1


@dataclass
class TraceRequest:
    id: str
    category: str
    prompt: list[int]
    output: list[int]
    match: dict[str, list[int]]  # drafter -> (len(output),) agreeing draft tokens at each t


@dataclass
class Trace:
    k_max: int
    verify_seconds: list[float]  # (k_max+1,) target forward over K+1 tokens
    draft_seconds_per_token: dict[str, float]
    requests: list[TraceRequest] = field(default_factory=list)
    models: dict = field(default_factory=dict)

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
        payload = {"schema_version": SCHEMA_VERSION, "k_max": self.k_max,
                   "costs": {"verify_seconds": self.verify_seconds,
                             "draft_seconds_per_token": self.draft_seconds_per_token},
                   "models": self.models,
                   "requests": [r.__dict__ for r in self.requests]}
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
                       [TraceRequest(**r) for r in raw["requests"]], raw.get("models", {}))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"trace '{path}': malformed ({exc})") from None


@torch.inference_mode()
def record(engine: Engine, prompts, drafters: list[str], k_max: int = 8,
           max_new_tokens: int = 128, progress=None) -> Trace:
    """Greedy only. For every prompt: the plain output, then each drafter's matches."""
    from autospec.bench.harness import prompt_ids
    draft_times: dict[str, list[float]] = {d: [] for d in drafters}
    requests = []
    for i, p in enumerate(prompts):
        ids = prompt_ids(engine, p)
        plain = engine.generate(ids, controller=StaticController(None, 0),
                                max_new_tokens=p.max_new_tokens or max_new_tokens)
        output = plain.token_ids
        match = {}
        for name in drafters:
            drafter = create_drafter(name, engine.models, **engine.drafter_options.get(name, {}))
            counts = []
            for t in range(len(output)):
                tokens = ids + output[:t]
                t0 = time.perf_counter()
                draft = drafter.propose(DraftContext(tokens, SamplingParams()), k_max)
                if draft.tokens:
                    draft_times[name].append((time.perf_counter() - t0) / len(draft.tokens))
                counts.append(agreeing_prefix(draft.tokens, output[t:t + len(draft.tokens)]))
            match[name] = counts
        requests.append(TraceRequest(p.id, p.category, ids, output, match))
        if progress:
            progress(f"recorded {i + 1}/{len(prompts)}: {p.id}")
    verify = calibrate_verify(engine, requests[0].prompt + requests[0].output, k_max)
    return Trace(k_max, verify,
                 {d: statistics.median(v) if v else 0.0 for d, v in draft_times.items()},
                 requests, {"target": engine.models.target_name, "draft": engine.models.draft_name,
                            "pair": engine.models.key})


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


@dataclass
class SimRequest:
    """What a controller sees of a replayed request (the fields of engine.loop.Request it reads)."""
    request_id: str
    tokens: list[int]
    prompt_len: int
    workload: str | None
    finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len:]


def replay(trace: Trace, controller: Controller, requests: list[TraceRequest] | None = None):
    """Run `controller` over the trace; returns one RequestRecord per request (simulated
    seconds).

    The controller's decide/update are real, through the live loop's entry points (a batch
    of one: `decide_batch`, `update_batch`); each step is charged the recorded costs. The
    loop itself is a simulator's (no model runs), so it is not `Engine.advance`.
    """
    records = []
    verify = trace.verify_seconds
    for req in requests or trace.requests:
        sim = SimRequest(req.id, list(req.prompt), len(req.prompt), req.category)
        steps = []
        t = 0
        n = len(req.output)
        while t < n:
            drafter, k = decide_batch(controller, [sim])[0]
            k = max(0, min(k, trace.k_max, n - t - 1)) if drafter else 0
            drafter = drafter if k else None
            agree = min(req.match[drafter][t], k) if drafter else 0
            emitted = req.output[t:t + agree + 1]
            context = len(sim.tokens) - 1
            sim.tokens.extend(emitted)
            t += len(emitted)
            if t >= n:
                sim.finish_reason = "length"
            draft_s = trace.draft_seconds_per_token.get(drafter, 0.0) * k if drafter else 0.0
            record = StepRecord(req.id, len(steps), drafter or "none", k, k, agree, len(emitted),
                                draft_s, verify[k], k + 1, context, 0, 0.0)
            steps.append(record)
            update_batch(controller, [record], [sim])
        wall = sum(s.draft_seconds + s.verify_seconds for s in steps)
        records.append(summarise(req.id, len(req.prompt), steps, wall, req.category))
    return records
