"""The one telemetry schema: what each step and each request saw.

Used by the engine (produces it), the controller (reads steps), the daemon and store (persist
requests and steps), and the tuner (replays them). Plain dataclasses with `to_dict` /
`from_dict`, so JSON is the wire and file format and a malformed record fails loudly.

Definitions, fixed here once:
- a *step* is one target verify forward; `k` tokens were asked of the drafter, `proposed` came
  back (0..k), `accepted` of those were kept, and the step emitted `accepted + 1` tokens (the
  bonus or recovered token) unless a stop (EOS, max tokens) cut it short: `emitted` counts what
  was actually appended.
- `mean_accepted_length` = emitted tokens per step, *including* the bonus token (plain decoding
  = 1.0, the convention of SGLang and vLLM's "acceptance length").
- `acceptance_rate` = accepted / proposed over the request (drafted tokens that survived).
- `acceptance_per_position[j]` = P(draft position j+1 accepted | it was proposed): what a
  request saw. Not to be confused with what the controller learns, `conditional_acceptance[j]`
  = P(position j+1 accepted | positions 1..j accepted) (controller/estimates.py, the store).
- `controller_seconds`: the controller's decide + update.
- `method`: the method the request ran with, as `autospec.method.Method` prints it ("adaptive",
  "plain", "static:ngram:4", "adaptive:policies/x.yaml", ...); None = not said (telemetry from
  before the field, or a caller that embeds the engine with a controller of its own).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

# Two workload keys, never one for both: a request that named no workload is UNLABELLED (the
# controller's priors, the daemon's counters, the report); an estimate pooled over every
# workload is POOLED (the Learner, the store's rows).
UNLABELLED = "unlabelled"
POOLED = "*"


@dataclass
class StepRecord:
    request_id: str
    step: int
    drafter: str  # "none" for a plain step (k = 0)
    k: int
    proposed: int
    accepted: int
    emitted: int
    draft_seconds: float
    verify_seconds: float
    verify_tokens: int  # tokens in the verify forward (proposed + 1)
    context_tokens: int  # tokens in the target's KV cache before the step
    bytes_moved: int  # target weights + KV read by the verify, + the drafter's reads
    bandwidth_gbs: float  # bytes_moved / (draft + verify seconds), GB/s
    controller_seconds: float = 0.0  # the controller's decide + update for this step
    # the verify forward this step shared (engine/loop.py): rows in it, the positions it
    # computed over all rows (their real tokens: rows of unequal widths are packed; rows x
    # width where the model cannot pack) and its width (the longest row); a batch-1 step
    # (and a record from before batching) is 1, verify_tokens, verify_tokens
    batch_size: int = 1
    batch_tokens: int | None = None
    batch_width: int | None = None
    # the step's seconds outside its verify forward and its drafting (the decision, accept,
    # roll back, telemetry), as the live loop measured them (Engine.advance); None where
    # nothing measured them (replay, a step driven without the loop)
    overhead_seconds: float | None = None
    # the drafted tokens' confidences (Draft.confidences, one per proposed token, in [0, 1]):
    # what the controller and the daemon calibrate (autospec/confidence.py); None where the
    # drafter gave none, or the step drafted nothing
    confidences: list[float] | None = None

    def __post_init__(self):
        if self.batch_tokens is None:
            self.batch_tokens = self.verify_tokens
        if self.batch_width is None:
            self.batch_width = self.verify_tokens
        if self.confidences is not None and (
                len(self.confidences) != self.proposed
                or not all(0.0 <= c <= 1.0 for c in self.confidences)):
            raise TelemetryError(f"StepRecord.confidences: expected {self.proposed} numbers in "
                                 f"[0, 1] (one per proposed token), got {self.confidences!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "StepRecord":
        return _from_dict(cls, raw)


@dataclass
class RequestRecord:
    request_id: str
    prompt_tokens: int
    output_tokens: int
    steps: int
    proposed: int
    accepted: int
    acceptance_rate: float
    mean_accepted_length: float
    acceptance_per_position: list[float]
    drafter_shares: dict[str, float]
    draft_seconds: float
    verify_seconds: float
    wall_seconds: float
    tokens_per_s: float
    bytes_moved: int
    bandwidth_gbs: float
    controller_seconds: float = 0.0
    workload: str | None = None
    finish_reason: str = "length"  # "length" | "stop"
    method: str | None = None  # the request's method ("plain", "adaptive", ...); None: not said
    step_records: list[StepRecord] = field(default_factory=list)

    def to_dict(self, with_steps: bool = True) -> dict:
        out = dataclasses.asdict(self)
        out["step_records"] = [s.to_dict() for s in self.step_records] if with_steps else []
        return out

    @classmethod
    def from_dict(cls, raw: dict) -> "RequestRecord":
        if not isinstance(raw, dict):
            raise TelemetryError(f"RequestRecord: expected an object, got {type(raw).__name__}")
        raw = dict(raw)
        steps = raw.pop("step_records", None) or []
        if not isinstance(steps, list):
            raise TelemetryError(f"RequestRecord.step_records: expected a list, got {steps!r}")
        record = _from_dict(cls, raw)
        record.step_records = [StepRecord.from_dict(s) for s in steps]
        return record


class TelemetryError(ValueError):
    """A telemetry record that does not match the schema."""


_NUMBER = (int, float)


def _is_number(value) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool) and math.isfinite(value)


def _check(cls_name: str, name: str, expected: str, value) -> None:
    """Type-check one field against its annotation (as written in the dataclass)."""
    where = f"{cls_name}.{name}"
    if expected.endswith(" | None"):
        if value is None:
            return
        expected = expected.removesuffix(" | None")
    if expected in ("int", "float"):
        if not _is_number(value):
            raise TelemetryError(f"{where}: expected a finite number, got {value!r}")
        if expected == "int" and value != int(value):
            raise TelemetryError(f"{where}: expected an integer, got {value!r}")
        if value < 0:
            raise TelemetryError(f"{where}: expected a number >= 0, got {value!r}")
    elif expected == "str" and not isinstance(value, str):
        raise TelemetryError(f"{where}: expected a string, got {value!r}")
    elif expected == "list[float]" and (not isinstance(value, list)
                                        or not all(_is_number(v) for v in value)):
        raise TelemetryError(f"{where}: expected a list of finite numbers, got {value!r}")
    elif expected == "dict[str, float]" and (
            not isinstance(value, dict)
            or not all(isinstance(k, str) and _is_number(v) for k, v in value.items())):
        raise TelemetryError(f"{where}: expected an object of name: number, got {value!r}")


def _from_dict(cls, raw: dict):
    if not isinstance(raw, dict):
        raise TelemetryError(f"{cls.__name__}: expected an object, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise TelemetryError(f"{cls.__name__}: unknown field(s) {unknown}")
    missing = sorted(n for n, f in fields.items() if n not in raw and
                     f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    if missing:
        raise TelemetryError(f"{cls.__name__}: missing field(s) {missing}")
    for name, value in raw.items():
        _check(cls.__name__, name, fields[name].type, value)
    return cls(**raw)


def acceptance_per_position(steps: list[StepRecord], per_slot: bool = False) -> list[float]:
    """[P(draft position j+1 accepted | it was proposed)] over `steps`, j = 0..longest draft-1:
    the one count behind RequestRecord.acceptance_per_position and bench's measured alpha.
    per_slot: P(accepted | the step asked for more than j tokens) instead, j < largest K — a
    look-up with no match, or a proposal shorter than K, counts as not accepted there."""
    asked = (lambda s: s.k) if per_slot else (lambda s: s.proposed)
    longest = max((asked(s) for s in steps), default=0)
    tried = [0] * longest
    kept = [0] * longest
    for s in steps:
        for j in range(asked(s)):
            tried[j] += 1
            kept[j] += j < s.accepted
    return [kp / tr for kp, tr in zip(kept, tried)]


def summarise(request_id: str, prompt_tokens: int, steps: list[StepRecord], wall_seconds: float,
              workload: str | None = None, finish_reason: str = "length",
              method: str | None = None) -> RequestRecord:
    """Fold a request's step records into its RequestRecord."""
    output_tokens = sum(s.emitted for s in steps)
    proposed = sum(s.proposed for s in steps)
    accepted = sum(s.accepted for s in steps)
    shares: dict[str, float] = {}
    for s in steps:
        shares[s.drafter] = shares.get(s.drafter, 0) + 1 / len(steps)
    draft_s = sum(s.draft_seconds for s in steps)
    verify_s = sum(s.verify_seconds for s in steps)
    moved = sum(s.bytes_moved for s in steps)
    return RequestRecord(
        request_id=request_id,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        steps=len(steps),
        proposed=proposed,
        accepted=accepted,
        acceptance_rate=accepted / proposed if proposed else 0.0,
        mean_accepted_length=output_tokens / len(steps) if steps else 0.0,
        acceptance_per_position=acceptance_per_position(steps),
        drafter_shares=shares,
        draft_seconds=draft_s,
        verify_seconds=verify_s,
        wall_seconds=wall_seconds,
        tokens_per_s=output_tokens / wall_seconds if wall_seconds > 0 else 0.0,
        bytes_moved=moved,
        bandwidth_gbs=moved / (draft_s + verify_s) / 1e9 if draft_s + verify_s > 0 else 0.0,
        controller_seconds=sum(s.controller_seconds for s in steps),
        workload=workload,
        finish_reason=finish_reason,
        method=method,
        step_records=steps,
    )
