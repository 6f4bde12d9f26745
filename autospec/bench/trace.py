"""Traces: what every drafter would have done on a workload, as a file (the format only).

Under greedy decoding the target's output is fixed, so for each output position t and each
drafter a trace holds `match[t]`: how many of its next K_max proposed tokens (drafted from
prompt + output[:t]) agree with the target's output. A controller that drafts K tokens with
that drafter at t gets min(match[t], K) accepted plus one target token — exactly what the
live engine would do. Costs are measured once while recording (bench/record.py: draft seconds
per token per drafter, verify seconds per forward size, the batch line), and replay charges
them (bench/recorded.py: the live loop, `Engine.run`, over a recorded target), so
controllers are compared deterministically and in milliseconds (what `tune` searches over).

File format (JSON): {"schema_version": 1, "k_max": int, "costs": {"verify_seconds": [K_max+1],
"draft_seconds_per_token": {drafter: float}, "batch_line": [a, b, c, j, w] (seconds; absent
in traces recorded before it), "overhead_seconds": float (absent: 0)}, "models": {"target",
"draft", "pair"}, "requests": [{"id", "category", "prompt": [ids], "output": [ids], "match":
{drafter: [ints]}, "proposed": {drafter: [ints]}, "prefill_seconds": float, "confidence":
{drafter: [[floats]]}}]}

`confidence` holds, for each model drafter (a look-up drafter's are made again in replay, by
the real look-up), the confidence of each token of its K_max proposal at each output position
(Draft.confidences, 3 decimals): what a controller's StopRule cuts a draft by. A trace recorded
without them replays those drafters at the decision's K.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from autospec.models.pair import pair_key

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
