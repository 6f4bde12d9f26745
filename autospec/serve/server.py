"""The serving process: aiohttp on the event loop, the engine on one decode thread.
/v1/completions and /v1/chat/completions share one path (a chat is rendered into prompt ids
first, on the decode thread; only the response bodies differ).

The engine batches (batcher.py): up to `max_batch` requests advance together, one target
forward per step, each with its own controller's (drafter, k); requests join free rows between
steps and wait in a queue of at most `max_queue` (past it: HTTP 429 with Retry-After). A
request too long for a row (prompt + max_tokens > the row's positions) is a 400 naming both.
Everything else happens on the event loop and never waits on the daemon: finished requests'
telemetry goes to the DaemonClient's bounded buffer, parameters are pulled every
`params_interval` seconds and applied on the decode thread between steps (the controllers are
the decode thread's alone, so they need no lock).

Tenants (`tenant_field`, see openai.py): each tenant's requests get drafter options of their
own, whose suffix options name the tenant, so their drafters read and feed that tenant's
shared index only — and all tenants share one batch. Why not one engine per tenant, as before
batching: each would hold a RowCache of max_batch rows (memory grows with the tenants, and
`--tenant-field user` may mean one tenant per end user), and tenants would step in separate
forwards, each paying the weights' read. Isolation lives in the drafters' state, not in the
target's rows, which never see each other (RowCache's mask), so one batch loses nothing.

Fleet sharing (`share_outputs`, with a daemon): the segments this process's requests hand to
their shared suffix indexes go to the daemon with the telemetry, and every `params_interval`
the other processes' are pulled and added, each to its tenant's index, on a worker thread
(a proposal waits for one segment's insertion at most). Why pulled and not queried per
proposal: autospec/drafters/suffix.py.
"""
from __future__ import annotations

import asyncio
import secrets
import dataclasses
import json
import logging
import os
import time
import functools

from aiohttp import web

from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.controller.factory import make_controller
from autospec.drafters.base import runnable_drafters
from autospec.drafters.suffix import SuffixOptions, export_handoffs, shared_index, shared_tokens
from autospec.engine.loop import Engine
from autospec.engine.request import Generation
from autospec.metrics import CONTENT_TYPE
from autospec.models.chat import ChatError, encode_chat
from autospec.models.pairs import not_a_chat_model
from autospec.models.sampling import SamplingParams
from autospec.policy import parameters_from_dict
from autospec.serve import openai
from autospec.serve.batcher import DecodeLoop, QueueFull, Row
from autospec.serve.client import DaemonClient
from autospec.serve.metrics import ServeMetrics
from autospec.serve.stops import cut_at_stop

log = logging.getLogger("autospec.serve")
SERVER = web.AppKey("server", object)
QUEUE_PER_ROW = 4  # default wait queue: this many requests per batch row


def default_max_batch() -> int:
    """Rows decoding at once when the operator gives none. On a CPU a forward's cost grows
    with its rows (this project's 2-core machine: 16 rows x 1 token cost 2.2x one row), so
    past ~8 rows more raise every request's inter-token latency for little throughput; a GPU
    forward stays memory-bound far longer."""
    import torch
    return 32 if torch.cuda.is_available() else 8


def settings_for(params: dict | None, workload: str | None) -> ControllerSettings:
    """ControllerSettings from GET /v1/params' resolved parameters for a workload."""
    if params is None:
        return ControllerSettings()
    resolved = (params["workloads"].get(workload) if workload else None) or params["parameters"]
    return parameters_from_dict(resolved)


class Server:
    def __init__(self, engine: Engine, model_name: str, daemon: DaemonClient | None = None,
                 params_interval: float = 5.0, max_tokens_limit: int | None = None,
                 tenant_field: str | None = None, share_outputs: bool = False,
                 max_batch: int | None = None, max_queue: int | None = None,
                 decode_thread: bool = True, api_keys=None, prefill_chunk: int | None = None):
        if tenant_field not in (None, *openai.TENANT_FIELDS):
            raise ValueError(f"tenant field {tenant_field!r}: expected one of "
                             f"{', '.join(openai.TENANT_FIELDS)}")
        self.engine = engine
        self.api_keys = api_keys if api_keys is not None and api_keys.enabled else None
        self.tenant_field = tenant_field
        self.suffix = SuffixOptions.check(engine.drafter_options.get("suffix", {}))
        if share_outputs and (daemon is None or not self.suffix.share):
            raise ValueError("sharing outputs across processes needs a daemon and sharing on")
        self.share_outputs = share_outputs
        if share_outputs:
            export_handoffs(engine.models, daemon.submit_output)
        self.tenant_options: dict[str, dict] = {}  # tenant -> its drafter options
        self.model_name = model_name
        self.daemon = daemon
        self.params_interval = params_interval
        max_batch = default_max_batch() if max_batch is None else max_batch
        self.batch = Engine(engine.models, engine.drafter_options, max_batch=max_batch,
                            prefill_chunk=prefill_chunk)
        self.max_tokens_limit = max_tokens_limit or self.batch.max_positions
        # decode_thread=False: the caller decodes (`self.decode.run_here()`, on the main thread)
        self.decode = DecodeLoop(self.batch, QUEUE_PER_ROW * max_batch if max_queue is None
                                 else max_queue, own_thread=decode_thread)
        # every registered drafter the pair can run: a policy may list suffix or a plugin
        self.available = runnable_drafters(engine.models)
        self.params: dict | None = None  # the last GET /v1/params answer
        self.controllers: dict[str | None, AdaptiveController] = {}
        self.served = 0
        self.metrics = ServeMetrics(self.model_name)

    # -- decode thread ---------------------------------------------------------------------
    def controller(self, workload: str | None) -> AdaptiveController:
        ctl = self.controllers.get(workload)
        if ctl is None:
            ctl = AdaptiveController(settings_for(self.params, workload))
            if self.params:
                ctl.warm_start(self.params["estimates"])
            self.controllers[workload] = ctl
        return ctl

    def apply_params(self, params: dict) -> None:
        old = self.params["policy"]["hash"] if self.params else None
        self.params = params
        if params["policy"]["hash"] != old:
            self.controllers = {}  # new settings: rebuilt on next use, warm from the estimates
            log.info("policy in force", extra={"fields": {"policy_hash": params["policy"]["hash"]}})
        else:
            for ctl in self.controllers.values():
                ctl.warm_start(params["estimates"])  # only where the fleet knows more

    def render(self, req: openai.Completion) -> openai.Completion:
        """A chat request with its messages rendered into prompt ids (the tokenizer is the
        decode thread's: a fast tokenizer used from two threads can fail)."""
        refused = not_a_chat_model(self.engine.models.key)
        if refused:
            raise openai.InvalidRequest(f"messages: {refused}", "messages")
        try:
            ids = encode_chat(self.engine.models, req.messages)
        except ChatError as exc:
            raise openai.InvalidRequest(str(exc), exc.param) from None
        limit = self.batch.max_positions
        if len(ids) >= limit:
            raise openai.InvalidRequest(f"messages: the rendered chat has {len(ids)} tokens; "
                                        f"a batch row holds {limit} positions", "messages")
        # chat's max_tokens defaults to the whole context (openai.py): what the row has left
        return dataclasses.replace(req, prompt=ids,
                                   max_tokens=min(req.max_tokens, limit - len(ids)))

    def options_for(self, tenant: str | None) -> dict[str, dict] | None:
        """Drafter options whose suffix drafter uses `tenant`'s shared index (None: the
        engine's)."""
        if tenant is None:
            return None
        options = self.tenant_options.get(tenant)
        if options is None:
            options = dict(self.batch.drafter_options)
            options["suffix"] = {**options.get("suffix", {}), "tenant": tenant}
            self.tenant_options[tenant] = options
        return options

    def check_method(self, req: openai.Completion) -> None:
        method = req.method
        if method.kind != "adaptive" and method.drafter not in (None, "synthetic", *self.available):
            raise openai.InvalidRequest(f"autospec.method: drafter {method.drafter!r} is not "
                                        f"available here (have: {', '.join(self.available)})")

    def admit(self, req: openai.Completion, on_text, engine: Engine) -> Row:
        """Start `req` in a free row of `engine` (on the decode thread, when one is free):
        its controller, its tenant's drafter options, its text stream."""
        controller = (self.controller(req.workload) if req.method.kind == "adaptive"
                      else make_controller(req.method))
        # a request's seed makes its output a function of (prompt, parameters, seed) alone:
        # without one, a fresh seed each time (engine/accept.py coupled_accept)
        seed = req.seed if req.seed is not None else secrets.randbits(63)
        request = engine.start(req.prompt, req.max_tokens,
                               SamplingParams(req.temperature, req.top_k, req.top_p), seed,
                               workload=req.workload, method=str(req.method),
                               logprobs=req.logprobs)
        request.drafter_options = self.options_for(req.tenant)
        out = openai.OutputStream(engine.models.tokenizer, req.stop,
                                  bool(on_text) and req.logprobs is not None) \
            if on_text or req.stop else None
        last = None  # when its last chunk was delivered (metrics)

        def on_tokens(tokens: list[int], done: bool) -> None:
            nonlocal last
            last = self.metrics.chunk(request.started, last, time.perf_counter())
            if out is None:
                return
            delta, items, hit = out.feed(tokens, request.logprobs[len(request.logprobs)
                                                                  - len(tokens):], done)
            if hit:  # the decode loop ends the request after this step
                request.finish_reason = "stop"
            if on_text:
                on_text(delta, items)
        return Row(request, controller, on_tokens)

    # -- event loop ------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, openai.parse_completion)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, openai.parse_chat)

    async def _serve(self, request: web.Request, parse) -> web.StreamResponse:
        """One request, either endpoint: they differ in parsing, the chat's rendering into
        prompt ids, and the response bodies (openai.Responder); decoding is shared."""
        try:
            payload = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # found by fuzzing:
            return _error(400, "body is not valid JSON")  # 2000-deep brackets were a 500
        loop = asyncio.get_running_loop()
        try:
            req = parse(payload, self.model_name, self.max_tokens_limit, self.tenant_field)
            self.check_method(req)
            if req.messages is not None:
                req = await asyncio.wrap_future(self.decode.call(self.render, req))
        except openai.InvalidRequest as exc:
            self.metrics.refuse("bad_request")
            return _error(400, str(exc), exc.param)
        deltas: asyncio.Queue = asyncio.Queue()  # (text, its tokens' logprobs) from on_tokens

        def on_text(delta: str, items: list) -> None:
            if delta or items:
                loop.call_soon_threadsafe(deltas.put_nowait, (delta, items))
        try:
            ticket = self.decode.submit(functools.partial(self.admit, req,
                                                          on_text if req.stream else None))
        except QueueFull as exc:
            self.metrics.refuse("queue_full")
            return _error(429, str(exc), kind="server_overloaded",
                          headers={"Retry-After": str(exc.retry_after)})
        try:  # refused before the first token (too long for a row): a plain 400, even streaming
            await asyncio.wrap_future(ticket.started)
        except ValueError as exc:  # openai.InvalidRequest too
            self.metrics.refuse("bad_request")
            return _error(400, str(exc), getattr(exc, "param", None))
        respond = openai.Responder(req.messages is not None, self.model_name,
                                   self.engine.models.tokenizer, req.logprobs)
        if not req.stream:
            generation = await self._finished(ticket)
            if isinstance(generation, web.Response):
                return generation
            text = cut_at_stop(generation.text, req.stop)[0]
            return web.json_response(respond.whole(text, generation.telemetry,
                                                   generation.logprobs))
        task = asyncio.ensure_future(self._finished(ticket))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        client_gone = False

        async def send(body: dict | str) -> None:
            nonlocal client_gone
            if client_gone:
                return
            data = body if isinstance(body, str) else json.dumps(body)
            try:
                await response.write(f"data: {data}\n\n".encode())
            except (ConnectionResetError, ConnectionError):
                client_gone = True  # the request still finishes (and reports telemetry)

        while not (task.done() and deltas.empty()):
            getter = asyncio.ensure_future(deltas.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                await send(respond.chunk(*getter.result()))
            else:
                getter.cancel()
        generation = task.result()
        if isinstance(generation, web.Response):  # failed while decoding
            await send(json.loads(generation.text))
        else:
            await send(respond.last(generation.telemetry))
        await send("[DONE]")
        if not client_gone:
            await response.write_eof()
        return response

    async def _finished(self, ticket) -> Generation | web.Response:
        """The request's Generation once it ends (its telemetry sent), or a 500."""
        try:
            generation = await asyncio.wrap_future(ticket.done)
        except Exception as exc:  # a failed step: the decode loop goes on with other requests
            log.exception("decoding failed", exc_info=exc)
            return _error(500, f"decoding failed: {exc}", kind="server_error")
        self.served += 1
        self.metrics.done(generation.telemetry)
        if self.daemon is not None:
            self.daemon.submit(generation.telemetry)
        return generation

    async def pull_params(self) -> bool:
        if self.daemon is None:
            return False
        params = await self.daemon.fetch_params()
        if params is None:
            return False
        await asyncio.wrap_future(self.decode.call(self.apply_params, params))
        return True

    async def pull_outputs(self) -> int:
        """Add the other processes' outputs logged since the last pull; how many segments."""
        if not self.share_outputs:
            return 0
        segments = await self.daemon.fetch_outputs()
        if segments:
            await asyncio.to_thread(self.add_outputs, segments)
        return len(segments or ())

    def add_outputs(self, segments: list[tuple[str | None, list[int]]]) -> None:
        opts = self.suffix
        for tenant, tokens in segments:
            shared_index(self.engine.models, tenant, opts.depth, opts.budget_tokens).add(tokens)

    async def params_loop(self) -> None:
        while True:
            await asyncio.sleep(self.params_interval)
            await self.pull_params()
            await self.pull_outputs()

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "owned_by": "autospec"}]})

    async def healthz(self, request: web.Request) -> web.Response:
        body = {"status": "ok", "model": self.model_name, "served": self.served,
                "pid": os.getpid(), "waiting": self.decode.waiting,
                "policy_hash": self.params["policy"]["hash"] if self.params else None,
                "suffix_index_tokens": shared_tokens(self.engine.models)}
        if self.daemon is not None:
            d = self.daemon
            body["daemon"] = {"url": d.url, "connected": d.connected,
                              "unacknowledged": d.unacknowledged, **vars(d.stats)}
        return web.json_response(body)

    async def metrics_page(self, request: web.Request) -> web.Response:
        cache = self.batch.cache
        body = self.metrics.render(self.decode.waiting, cache.max_batch - len(cache.free),
                                   cache.max_batch)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE,
                                                "X-Content-Type-Options": "nosniff"})

    def app(self) -> web.Application:
        keys = self.api_keys

        @web.middleware
        async def guard(request: web.Request, handler):
            if keys is not None and request.path.startswith("/v1/") and \
                    not keys.allows(request.headers.get("Authorization")):
                self.metrics.refuse("unauthorized")
                return _error(401, "missing or wrong API key (send Authorization: Bearer KEY)",
                              kind="authentication_error")
            return await handler(request)

        app = web.Application(client_max_size=4 * 1024 * 1024, middlewares=[guard])
        app[SERVER] = self
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.metrics_page)
        return app


def _error(status: int, message: str, param: str | None = None,
           kind: str = "invalid_request_error", headers: dict | None = None) -> web.Response:
    return web.json_response(openai.error_body(message, param, kind), status=status,
                             headers=headers)
