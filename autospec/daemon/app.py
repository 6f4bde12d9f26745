"""The daemon's HTTP API (aiohttp).

    POST /v1/telemetry  {"batch_id", "model_pair", "hardware", "records": [RequestRecord],
                         "peak_bandwidth_gbs"?}          -> 200 {"stored": n, "duplicate": bool}
    GET  /v1/params?model_pair=&hardware=[&workload=]    -> the policy's parameters + estimates
    GET  /v1/suffix?model_pair=&instance=&since=[&epoch=] -> other processes' finished outputs
    POST /v1/reload                                      -> 200, or 422 (last good policy kept)
    GET  /healthz                                        -> 200 {"status": "ok", ...}
    GET  /metrics                                        -> Prometheus text

A batch is acknowledged (200) only after it is committed: a client that got its 200 may
forget the batch; any other outcome means "keep it and send it again" (re-sends are stored
once, keyed by batch_id). Bad input gets a 4xx naming the problem and stores nothing.
A batch may carry its requests' outputs for the fleet's suffix drafters ("outputs", see
autospec/daemon/outputs.py); they are logged once the batch is stored.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging

from aiohttp import web

from autospec.daemon.outputs import BadOutputs, parse_outputs
from autospec.daemon.state import DaemonState, dumps
from autospec.metrics import CONTENT_TYPE, exposition
from autospec.store import StoreError
from autospec.telemetry import RequestRecord, TelemetryError

log = logging.getLogger("autospec.daemon")

MAX_BODY_BYTES = 16 * 1024 * 1024  # ~50k step records; larger batches are split by the client
MAX_RECORDS = 10_000
_ENVELOPE = {"batch_id": 128, "model_pair": 512, "hardware": 512}  # string field -> max length
_OPTIONAL = ("records", "peak_bandwidth_gbs", "outputs")
STATE = web.AppKey("state", DaemonState)
ON_BATCH = web.AppKey("on_batch", object)  # called after each acknowledged batch (--burst)


class BadRequest(ValueError):
    pass


def parse_batch(body: bytes) -> tuple[str, str, str, list[RequestRecord], float | None,
                                      tuple[str, list] | None]:
    """Validate a telemetry batch; BadRequest names the first problem found. The last item:
    (instance, [(tenant, tokens)]) when the batch carries outputs."""
    try:
        payload = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # deep nesting: fuzzing
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise BadRequest(f"expected a JSON object, got {type(payload).__name__}")
    unknown = sorted(set(payload) - set(_ENVELOPE) - set(_OPTIONAL))
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown} (accepted: "
                         f"{', '.join(sorted([*_ENVELOPE, *_OPTIONAL]))})")
    for name, limit in _ENVELOPE.items():
        value = payload.get(name)
        if not isinstance(value, str) or not 0 < len(value) <= limit:
            raise BadRequest(f"{name}: expected a non-empty string of at most {limit} "
                             f"characters, got {value!r:.80}")
    raw_records = payload.get("records")
    if not isinstance(raw_records, list) or not 0 < len(raw_records) <= MAX_RECORDS:
        raise BadRequest(f"records: expected a list of 1..{MAX_RECORDS} request records, "
                         f"got {type(raw_records).__name__}"
                         f"{f' of {len(raw_records)}' if isinstance(raw_records, list) else ''}")
    peak = payload.get("peak_bandwidth_gbs")
    if peak is not None and (isinstance(peak, bool) or not isinstance(peak, (int, float))
                             or not peak > 0):
        raise BadRequest(f"peak_bandwidth_gbs: expected a number > 0, got {peak!r}")
    records, seen = [], set()
    for i, raw in enumerate(raw_records):
        try:
            record = RequestRecord.from_dict(raw)
        except (TelemetryError, TypeError) as exc:
            raise BadRequest(f"records[{i}]: {exc}") from None
        if record.request_id in seen:
            raise BadRequest(f"records[{i}]: request_id {record.request_id!r} twice in one batch")
        seen.add(record.request_id)
        records.append(record)
    try:
        outputs = parse_outputs(payload["outputs"]) if "outputs" in payload else None
    except BadOutputs as exc:
        raise BadRequest(str(exc)) from None
    return payload["batch_id"], payload["model_pair"], payload["hardware"], records, peak, outputs


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _error(status: type[web.HTTPException], message: str) -> web.HTTPException:
    return status(text=dumps({"error": message}), content_type="application/json")


def _query(request: web.Request, required: tuple[str, ...], optional: tuple[str, ...]):
    """The request's query; a 400 naming unknown or missing parameters."""
    query = request.query
    unknown = sorted(set(query) - {*required, *optional})
    if unknown:
        raise _error(web.HTTPBadRequest, f"unknown query parameter(s) {unknown} "
                                         f"(accepted: {', '.join([*required, *optional])})")
    missing = [n for n in required if not query.get(n)]
    if missing:
        raise _error(web.HTTPBadRequest, f"missing query parameter(s) {missing}")
    return query


async def telemetry(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = await request.read()  # over MAX_BODY_BYTES: aiohttp answers 413 itself
    try:
        batch_id, pair, hardware, records, peak, outputs = await asyncio.to_thread(parse_batch, body)
    except BadRequest as exc:
        state.counters.rejected["bad_telemetry"] += 1
        log.warning("telemetry refused", extra={"fields": {"error": str(exc)[:300]}})
        raise _error(web.HTTPBadRequest, str(exc)) from None
    loop = asyncio.get_running_loop()
    try:
        stored = await loop.run_in_executor(state.worker, state.ingest, batch_id, pair,
                                            hardware, records, peak)
    except StoreError as exc:  # disk full, locked, read-only: nothing stored, send it again
        state.counters.rejected["store_error"] += 1
        log.error("store refused a batch", extra={"fields": {"batch_id": batch_id,
                                                             "error": str(exc)}})
        raise _error(web.HTTPServiceUnavailable, f"{exc}; keep the batch and send it again") from None
    if outputs and stored:  # a re-sent batch (stored once) is logged once
        state.outputs.add(pair, *outputs)
    request.app[ON_BATCH]()
    return web.json_response({"stored": stored, "duplicate": stored == 0, "batch_id": batch_id})


async def params(request: web.Request) -> web.Response:
    state = request.app[STATE]
    query = _query(request, ("model_pair", "hardware"), ("workload",))
    payload = state.params(query["model_pair"], query["hardware"], query.get("workload") or None)
    return web.Response(text=dumps(payload), content_type="application/json")


async def suffix_outputs(request: web.Request) -> web.Response:
    query = _query(request, ("model_pair", "instance"), ("since", "epoch"))
    since = query.get("since", "0")
    if not since.isdigit():
        raise _error(web.HTTPBadRequest, f"since: expected an integer >= 0, got {since!r:.40}")
    reply = request.app[STATE].outputs.since(query["model_pair"], query["instance"], int(since),
                                             query.get("epoch"))
    return web.Response(text=dumps(reply), content_type="application/json")


async def reload(request: web.Request) -> web.Response:
    state = request.app[STATE]
    loop = asyncio.get_running_loop()
    ok, message = await loop.run_in_executor(state.worker, state.reload_policy)
    if not ok:
        raise _error(web.HTTPUnprocessableEntity, f"{message} (the last good policy stays in force)")
    return web.json_response({"ok": True, "message": message,
                              "policy_hash": state.policy.policy_hash})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].health())


async def prometheus(request: web.Request) -> web.Response:
    return web.Response(body=exposition(request.app[STATE].registry),
                        headers={"Content-Type": CONTENT_TYPE})


# answered without the token: a health check and Prometheus' scrape, which carry counts and
# estimates, never a request's text (the same rule as `autospec serve` and vLLM)
OPEN = ("/healthz", "/metrics")


def make_app(state: DaemonState, token: str | None = None, on_batch=lambda: None) -> web.Application:
    @web.middleware
    async def guard(request: web.Request, handler):
        if token and request.path not in OPEN:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                state.counters.rejected["unauthorised"] += 1
                raise _error(web.HTTPUnauthorized, "missing or wrong bearer token")
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            state.counters.rejected["too_large"] += 1
            return web.json_response({"error": f"body over {MAX_BODY_BYTES} bytes: split the "
                                               f"batch"}, status=413)

    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[guard])
    app[STATE] = state
    app[ON_BATCH] = on_batch
    app.router.add_post("/v1/telemetry", telemetry)
    app.router.add_get("/v1/params", params)
    app.router.add_get("/v1/suffix", suffix_outputs)
    app.router.add_post("/v1/reload", reload)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", prometheus)
    return app



