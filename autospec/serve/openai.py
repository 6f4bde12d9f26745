"""OpenAI /v1/completions: request validation and response bodies.

Supported: model, prompt (a string, a one-string list, or token ids), max_tokens, temperature,
top_p, seed, stream, n = 1, and vLLM's top_k. Fields OpenAI defines that this server does not
implement (stop, logprobs, echo, penalties, best_of, logit_bias, suffix) are refused with 400
unless they hold their no-op default — silently ignoring them would return wrong output.
autospec's own field: "autospec": {"method": "adaptive" | "plain" | "static:DRAFTER:K",
"workload": NAME}.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from autospec.drafters.base import known_drafters
from autospec.telemetry import RequestRecord

MAX_TOKENS_DEFAULT = 16  # OpenAI's default for /v1/completions
_NO_OP = {"stop": (None, [], ""), "logprobs": (None, 0), "echo": (False,), "suffix": (None, ""),
          "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "best_of": (None, 1),
          "logit_bias": (None, {}), "stream_options": (None, {}), "user": None}
_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream",
           "n", "autospec", *_NO_OP}


class InvalidRequest(ValueError):
    """A 400: the message names the field and what is accepted (OpenAI's error shape)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Completion:
    prompt: str | list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stream: bool
    method: str  # "adaptive" | "plain" | "static:DRAFTER:K"
    workload: str | None
    model: str


def _number(payload: dict, name: str, default, lo: float, hi: float, integer: bool = False):
    value = payload.get(name, default)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        raise InvalidRequest(f"{name}: expected {kind} in [{lo:g}, {hi:g}], got {value!r}", name)
    return value


def parse_method(method) -> str:
    if method in ("adaptive", "plain"):
        return method
    parts = method.split(":") if isinstance(method, str) else []
    if len(parts) == 3 and parts[0] == "static" and parts[1] in known_drafters():
        if parts[2].isdigit() and int(parts[2]) >= 1:
            return method
    raise InvalidRequest(f"autospec.method: expected adaptive, plain or static:DRAFTER:K "
                         f"(DRAFTER in {', '.join(known_drafters())}, K >= 1), got {method!r}",
                         "autospec.method")


def parse_completion(payload, model_name: str, max_tokens_limit: int) -> Completion:
    if not isinstance(payload, dict):
        raise InvalidRequest("expected a JSON object")
    unknown = sorted(set(payload) - _FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown field(s) {unknown}", unknown[0])
    for name, no_ops in _NO_OP.items():
        if no_ops is not None and name in payload and payload[name] not in no_ops:
            raise InvalidRequest(f"{name}: not supported by this server (got {payload[name]!r})", name)
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                   and t >= 0 for t in prompt):
        pass
    elif not isinstance(prompt, str) or not prompt:
        raise InvalidRequest("prompt: expected a non-empty string (or one string in a list, or "
                             "a list of token ids)", "prompt")
    if payload.get("n", 1) != 1:
        raise InvalidRequest(f"n: only 1 is supported, got {payload['n']!r}", "n")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest(f"stream: expected true or false, got {stream!r}", "stream")
    extension = payload.get("autospec") or {}
    if not isinstance(extension, dict) or set(extension) - {"method", "workload"}:
        raise InvalidRequest("autospec: expected {\"method\": ..., \"workload\": ...}", "autospec")
    workload = extension.get("workload")
    if workload is not None and (not isinstance(workload, str) or not 0 < len(workload) <= 128):
        raise InvalidRequest(f"autospec.workload: expected a name of 1..128 characters, "
                             f"got {workload!r}", "autospec.workload")
    model = payload.get("model", model_name)
    if model not in (None, model_name):
        raise InvalidRequest(f"model: this server serves {model_name!r}, got {model!r}", "model")
    return Completion(
        prompt=prompt,
        max_tokens=_number(payload, "max_tokens", MAX_TOKENS_DEFAULT, 1, max_tokens_limit, True),
        temperature=float(_number(payload, "temperature", 1.0, 0, 2)),  # OpenAI's default: 1
        top_p=float(_number(payload, "top_p", 1.0, 1e-9, 1)),
        top_k=_number(payload, "top_k", 0, 0, 1 << 20, True),
        seed=_number(payload, "seed", 0, 0, 2 ** 63 - 1, True),
        stream=stream, method=parse_method(extension.get("method", "adaptive")),
        workload=workload, model=model_name)


def k_shares(record: RequestRecord) -> dict[str, float]:
    steps = record.step_records
    shares: dict[str, float] = {}
    for s in steps:
        shares[str(s.k)] = shares.get(str(s.k), 0.0) + 1 / len(steps)
    return shares


def metrics(record: RequestRecord, method: str) -> dict:
    """The request's speculative metrics, as each response carries them."""
    summary = record.to_dict(with_steps=False)
    summary.pop("step_records")
    return {**summary, "method": method, "k_shares": k_shares(record)}


def completion_body(cid: str, model: str, text: str, finish_reason: str | None,
                    record: RequestRecord | None = None, method: str = "") -> dict:
    body = {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": None,
                         "finish_reason": finish_reason}]}
    if record is not None:
        body["usage"] = {"prompt_tokens": record.prompt_tokens,
                         "completion_tokens": record.output_tokens,
                         "total_tokens": record.prompt_tokens + record.output_tokens}
        body["autospec"] = metrics(record, method)
    return body


def new_id() -> str:
    return f"cmpl-{uuid.uuid4().hex[:24]}"


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}
