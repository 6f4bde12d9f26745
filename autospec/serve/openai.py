"""OpenAI /v1/completions and /v1/chat/completions: request validation and response bodies.

Completions: model, prompt (a string, a one-string list, or token ids), max_tokens, temperature,
top_p, seed, stream, n = 1, stop (serve/stops.py), logprobs (0..5 alternatives), and vLLM's
top_k. Chat completions: the same with messages (roles system, user, assistant; string content)
instead of prompt, max_completion_tokens as another name for max_tokens (whose default is then
the model's context: OpenAI's chat has no cap), and logprobs as a flag with top_logprobs
(0..20). Log-probabilities are the target's raw distribution (temperature 1, before top-k /
top-p: vLLM's default) at each output token, from the verify forward that emitted it; each
token's text is what it adds to the output's (TokenTexts), offsets the running sum of those. Fields OpenAI defines that
this server does not implement (echo, penalties, best_of, logit_bias, suffix; for chat also
tools, response_format) are refused with 400 unless they hold their no-op default — silently
ignoring them would return wrong output.
autospec's own field: "autospec": {"method": "adaptive" | "plain" | "static:DRAFTER:K",
"workload": NAME, "tenant": NAME}.

Tenants (`autospec serve --tenant-field FIELD`): the suffix drafter's shared index of earlier
outputs is kept apart per tenant, and the tenant is read from one request field the operator
names — `user` (what stock OpenAI SDKs send without extra fields; it then isolates each end
user) or `autospec.tenant` (a unit the operator chooses: an organisation, an API key). With
isolation on, a request without it is refused (a 400, not a silent fall-back to a pool shared
with others); with it off, `autospec.tenant` is refused (the client would believe it isolated)
and `user` is accepted and ignored, as OpenAI does.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from autospec.drafters.base import known_drafters
from autospec.drafters.suffix import MAX_TENANT_CHARS
from autospec.engine.accept import MAX_TOP_LOGPROBS  # chat's top_logprobs: the engine's bound
from autospec.engine.request import TokenLogprob
from autospec.engine.textstream import TextStream
from autospec.method import Method
from autospec.method import parse_method as parse_method_text
from autospec.models.chat import ChatError, check_messages
from autospec.serve.stops import MAX_STOPS, StopStream
from autospec.telemetry import RequestRecord

MAX_TOKENS_DEFAULT = 16  # OpenAI's default for /v1/completions
TENANT_FIELDS = ("user", "autospec.tenant")  # where --tenant-field may read the tenant
_NO_OP = {"echo": (False,), "suffix": (None, ""),
          "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "best_of": (None, 1),
          "logit_bias": (None, {}), "stream_options": (None, {}), "user": None}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "n", "stop",
           "autospec", "logprobs"}
MAX_LOGPROBS = 5  # OpenAI's limit for /v1/completions' logprobs
_FIELDS = {"prompt", *_COMMON, *_NO_OP}
_CHAT_NO_OP = {"presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
               "logit_bias": (None, {}), "stream_options": (None, {}), "tools": (None, []),
               "tool_choice": (None, "none"), "response_format": (None, {"type": "text"}),
               "user": None, "parallel_tool_calls": None}
_CHAT_FIELDS = {"messages", "max_completion_tokens", "top_logprobs", *_COMMON, *_CHAT_NO_OP}


class InvalidRequest(ValueError):
    """A 400: the message names the field and what is accepted (OpenAI's error shape)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Completion:
    prompt: str | list[int] | None  # chat: None until the messages are rendered into ids
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None  # None: the server draws one (outputs then vary from call to call)
    stream: bool
    method: Method  # kind "adaptive" | "plain" | "static"
    workload: str | None
    model: str
    messages: tuple[dict, ...] | None = None  # a chat request (/v1/chat/completions)
    tenant: str | None = None  # keys the shared suffix index (only with --tenant-field)
    stop: tuple[str, ...] = ()  # the output ends before the first match of any (serve/stops.py)
    logprobs: int | None = None  # alternatives per token (0: the token's own); None: none


def _number(payload: dict, name: str, default, lo: float, hi: float, integer: bool = False):
    value = payload.get(name, default)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        raise InvalidRequest(f"{name}: expected {kind} in [{lo:g}, {hi:g}], got {value!r}", name)
    return value


def parse_method(text) -> Method:
    """The methods a request may ask for: adaptive, plain, static:DRAFTER:K."""
    try:
        method = parse_method_text(text)
    except ValueError:
        method = None
    if method is not None and method.kind in ("adaptive", "plain", "static") \
            and method.policy_path is None:
        return method
    raise InvalidRequest(f"autospec.method: expected adaptive, plain or static:DRAFTER:K "
                         f"(DRAFTER in {', '.join(known_drafters())}, K >= 1), got {text!r}",
                         "autospec.method")


def parse_completion(payload, model_name: str, max_tokens_limit: int,
                     tenant_field: str | None = None) -> Completion:
    _check_fields(payload, _FIELDS, _NO_OP)
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                   and t >= 0 for t in prompt):
        pass
    elif not isinstance(prompt, str) or not prompt:
        raise InvalidRequest("prompt: expected a non-empty string (or one string in a list, or "
                             "a list of token ids)", "prompt")
    logprobs = _number(payload, "logprobs", None, 0, MAX_LOGPROBS, True)
    return _parse_common(payload, model_name, max_tokens_limit, MAX_TOKENS_DEFAULT, tenant_field,
                         prompt=prompt, logprobs=logprobs)


def parse_chat(payload, model_name: str, max_tokens_limit: int,
               tenant_field: str | None = None) -> Completion:
    """A /v1/chat/completions request; its messages are rendered later, by the server."""
    _check_fields(payload, _CHAT_FIELDS, _CHAT_NO_OP)
    try:
        messages = check_messages(payload.get("messages"))
    except ChatError as exc:
        raise InvalidRequest(str(exc), exc.param) from None
    limit = payload.get("max_completion_tokens")
    if limit is not None:
        _number(payload, "max_completion_tokens", None, 1, max_tokens_limit, True)
        if payload.get("max_tokens") not in (None, limit):
            raise InvalidRequest(f"max_tokens ({payload['max_tokens']!r}) and "
                                 f"max_completion_tokens ({limit!r}) differ: give one",
                                 "max_completion_tokens")
        payload = {**payload, "max_tokens": limit}
    wanted = payload.get("logprobs")
    if wanted not in (None, True, False):
        raise InvalidRequest(f"logprobs: expected true or false, got {wanted!r:.80}", "logprobs")
    top = _number(payload, "top_logprobs", None, 0, MAX_TOP_LOGPROBS, True)
    if top is not None and not wanted:
        raise InvalidRequest("top_logprobs: needs logprobs: true", "top_logprobs")
    return _parse_common(payload, model_name, max_tokens_limit, max_tokens_limit, tenant_field,
                         prompt=None, messages=messages, logprobs=(top or 0) if wanted else None)


def _check_fields(payload, known: set, no_ops: dict) -> None:
    if not isinstance(payload, dict):
        raise InvalidRequest("expected a JSON object")
    unknown = sorted(set(payload) - known)
    if unknown:
        raise InvalidRequest(f"unknown field(s) {unknown}", unknown[0])
    for name, accepted in no_ops.items():
        if accepted is not None and name in payload and payload[name] not in accepted:
            raise InvalidRequest(f"{name}: not supported by this server (got {payload[name]!r})", name)


def _parse_common(payload: dict, model_name: str, max_tokens_limit: int, max_tokens_default: int,
                  tenant_field: str | None, **given) -> Completion:
    """The fields completions and chat completions share."""
    if payload.get("n", 1) != 1:
        raise InvalidRequest(f"n: only 1 is supported, got {payload['n']!r}", "n")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest(f"stream: expected true or false, got {stream!r}", "stream")
    extension = payload.get("autospec") or {}
    if not isinstance(extension, dict) or set(extension) - {"method", "workload", "tenant"}:
        raise InvalidRequest("autospec: expected {\"method\": ..., \"workload\": ..., "
                             "\"tenant\": ...}", "autospec")
    workload = extension.get("workload")
    if workload is not None and (not isinstance(workload, str) or not 0 < len(workload) <= 128):
        raise InvalidRequest(f"autospec.workload: expected a name of 1..128 characters, "
                             f"got {workload!r}", "autospec.workload")
    model = payload.get("model", model_name)
    if model not in (None, model_name):
        raise InvalidRequest(f"model: this server serves {model_name!r}, got {model!r}", "model")
    return Completion(
        **given,
        max_tokens=_number(payload, "max_tokens", max_tokens_default, 1, max_tokens_limit, True),
        temperature=float(_number(payload, "temperature", 1.0, 0, 2)),  # OpenAI's default: 1
        top_p=float(_number(payload, "top_p", 1.0, 1e-9, 1)),
        top_k=_number(payload, "top_k", 0, 0, 1 << 20, True),
        seed=_number(payload, "seed", None, 0, 2 ** 63 - 1, True),
        stream=stream, method=parse_method(extension.get("method", "adaptive")),
        stop=_stops(payload.get("stop")),
        workload=workload, model=model_name,
        tenant=_tenant({"user": payload.get("user"), "autospec.tenant": extension.get("tenant")},
                       tenant_field))


def _stops(value) -> tuple[str, ...]:
    """`stop`: null, a string or a list of up to 4 strings ("" and [] mean none)."""
    stops = [value] if isinstance(value, str) else value
    if stops is None:
        return ()
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or \
            not all(isinstance(s, str) for s in stops):
        raise InvalidRequest(f"stop: expected a string or a list of up to {MAX_STOPS} strings, "
                             f"got {value!r:.80}", "stop")
    return tuple(s for s in stops if s)


def _tenant(given: dict[str, object], tenant_field: str | None) -> str | None:
    """The request's tenant, from the field the server reads it from (see the module
    docstring). given: {field: value or None} for each of TENANT_FIELDS."""
    if tenant_field != "autospec.tenant" and given["autospec.tenant"] is not None:
        where = (f"reads the tenant from {tenant_field}" if tenant_field else
                 "does not keep tenants apart (start it with --tenant-field autospec.tenant)")
        raise InvalidRequest(f"autospec.tenant: this server {where}", "autospec.tenant")
    if tenant_field is None:
        return None
    value = given[tenant_field]
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TENANT_CHARS:
        raise InvalidRequest(f"{tenant_field}: required by this server, which keeps tenants' "
                             f"outputs apart: a string of 1..{MAX_TENANT_CHARS} characters, got "
                             f"{value!r:.80}", tenant_field)
    return value


def k_shares(record: RequestRecord) -> dict[str, float]:
    steps = record.step_records
    shares: dict[str, float] = {}
    for s in steps:
        shares[str(s.k)] = shares.get(str(s.k), 0.0) + 1 / len(steps)
    return shares


def metrics(record: RequestRecord) -> dict:
    """The request's speculative metrics, as each response carries them (its method too: the
    record's)."""
    summary = record.to_dict(with_steps=False)
    summary.pop("step_records")
    return {**summary, "k_shares": k_shares(record)}


class TokenTexts:
    """An output's TokenLogprobs with each token's text and offset, released as the client is
    sent their text. A token's text is what it adds to the decoded output: a character split
    over several byte-level tokens belongs to the token that completes it (the others' text
    is empty), so the texts joined are the output's text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.pending: list[tuple[TokenLogprob, str, int]] = []
        self.end = 0  # characters of the texts added
        self.open: list[int] = []  # tokens since the last one that ended a whole character

    def add(self, entries) -> None:
        for entry in entries:
            self.open.append(entry.token)
            piece = self.tokenizer.decode(self.open, skip_special_tokens=True)
            if piece.endswith("\ufffd"):
                piece = ""  # an incomplete character: its text comes with the next token
            else:
                self.open = []
            self.pending.append((entry, piece, self.end))
            self.end += len(piece)

    def release(self, sent: int, final: bool = False) -> list[tuple[TokenLogprob, str, int]]:
        """The tokens whose text lies within the first `sent` characters; `final`: also one
        that a stop string cut through, and none after."""
        out = []
        while self.pending and self.pending[0][2] + len(self.pending[0][1]) <= sent:
            out.append(self.pending.pop(0))
        if final:
            out += [item for item in self.pending if item[2] < sent]
            self.pending = []
        return out


class OutputStream:
    """A request's output as its client is sent it: tokens in; out, the text delta, the
    TokenTexts items of the tokens whose text it completes (`logprobs`), whether a stop string
    matched (the stream then ends: the caller ends the request)."""

    def __init__(self, tokenizer, stops: tuple[str, ...], logprobs: bool):
        self.text = TextStream(tokenizer)
        self.stops = StopStream(stops) if stops else None
        self.pieces = TokenTexts(tokenizer) if logprobs else None
        self.sent = 0  # characters passed on

    def feed(self, tokens: list[int], entries, done: bool) -> tuple[str, list, bool]:
        delta, hit = self.text.add(tokens, final=done), False
        if self.stops is not None:
            delta, hit = self.stops.feed(delta, final=done)
        self.sent += len(delta)
        if self.pieces is None:
            return delta, [], hit
        self.pieces.add(entries)
        return delta, self.pieces.release(self.sent, final=done or hit), hit


def logprobs_body(tokenizer, items, chat: bool, top: int) -> dict:
    """OpenAI's logprobs object for TokenTexts' `items` (chat: {"content": [...]};
    completions: the parallel lists); an alternative's text is its decoding as is."""
    decode = lambda t: tokenizer.decode([t])  # noqa: E731
    if chat:
        def one(text, logprob):
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
        return {"content": [{**one(piece, e.logprob),
                             "top_logprobs": [one(decode(t), lp) for t, lp in e.top]}
                            for e, piece, _ in items], "refusal": None}
    return {"tokens": [piece for _, piece, _ in items],
            "token_logprobs": [e.logprob for e, _, _ in items],
            "top_logprobs": [{decode(t): lp for t, lp in e.top} for e, _, _ in items]
            if top else None,
            "text_offset": [offset for _, _, offset in items]}


def completion_body(cid: str, model: str, text: str, finish_reason: str | None,
                    record: RequestRecord | None = None, logprobs: dict | None = None) -> dict:
    body = {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs,
                         "finish_reason": finish_reason}]}
    return _with_usage(body, record)


def _with_usage(body: dict, record: RequestRecord | None) -> dict:
    if record is not None:
        body["usage"] = {"prompt_tokens": record.prompt_tokens,
                         "completion_tokens": record.output_tokens,
                         "total_tokens": record.prompt_tokens + record.output_tokens}
        body["autospec"] = metrics(record)
    return body


def new_id() -> str:
    return f"cmpl-{uuid.uuid4().hex[:24]}"


@dataclass
class Responder:
    """The response bodies of one request: a whole response, stream chunks, the last chunk
    (which carries the finish reason, usage and autospec's metrics). Text completions keep
    completion_body's shape; chat ones are chat.completion / chat.completion.chunk."""
    chat: bool
    model: str
    tokenizer: object = None  # for the logprobs' token texts
    top: int | None = None  # the request's logprobs (alternatives per token); None: none
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    _role_sent: bool = False  # chat streams name the role in their first delta

    def __post_init__(self):
        self.id = self.id or (f"chatcmpl-{uuid.uuid4().hex[:24]}" if self.chat else new_id())

    def whole(self, text: str, record: RequestRecord, entries=None) -> dict:
        """The whole response; `entries` the output's TokenLogprobs (Generation.logprobs)."""
        logprobs = None
        if self.top is not None and entries is not None:
            pieces = TokenTexts(self.tokenizer)
            pieces.add(entries)
            logprobs = logprobs_body(self.tokenizer, pieces.release(len(text), final=True),
                                     self.chat, self.top)
        if not self.chat:
            return completion_body(self.id, self.model, text, record.finish_reason, record,
                                   logprobs)
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": logprobs, "finish_reason": record.finish_reason}
        return _with_usage(self._body("chat.completion", choice), record)

    def chunk(self, text: str, items=()) -> dict:
        """A stream chunk: its text and TokenTexts' items of the tokens it completes."""
        logprobs = logprobs_body(self.tokenizer, items, self.chat, self.top) if items else None
        if not self.chat:
            return completion_body(self.id, self.model, text, None, logprobs=logprobs)
        return self._body("chat.completion.chunk", self._delta(text, None, logprobs))

    def last(self, record: RequestRecord) -> dict:
        if not self.chat:
            return completion_body(self.id, self.model, "", record.finish_reason, record)
        return _with_usage(self._body("chat.completion.chunk",
                                      self._delta(None, record.finish_reason)), record)

    def _delta(self, text: str | None, finish_reason: str | None,
               logprobs: dict | None = None) -> dict:
        delta = {} if text is None else {"content": text}
        if not self._role_sent:
            delta, self._role_sent = {"role": "assistant", **delta}, True
        return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def _body(self, kind: str, choice: dict) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": [choice]}


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}
