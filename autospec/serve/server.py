"""The serving process: aiohttp on the event loop, the engine on one decode thread.
/v1/completions and /v1/chat/completions share one path (a chat is rendered into prompt ids
first, on the decode thread; only the response bodies differ).

The engine decodes one request at a time (batch 1, the regime speculative decoding is for);
requests queue for the decode thread. Everything else happens on the event loop and never
waits on the daemon: finished requests' telemetry goes to the DaemonClient's bounded buffer,
parameters are pulled every `params_interval` seconds and applied on the decode thread between
requests (the controllers are the decode thread's alone, so they need no lock).

Tenants (`tenant_field`, see openai.py): each tenant decodes through an Engine of its own over
the same models, whose suffix options name the tenant, so its drafters read and feed that
tenant's shared index only. An Engine over loaded models is a few attributes, and the engine
never branches on drafter type: the tenant reaches the drafter as an option like any other.

Fleet sharing (`share_outputs`, with a daemon): the segments this process's requests hand to
their shared suffix indexes go to the daemon with the telemetry, and every `params_interval`
the other processes' are pulled and added, each to its tenant's index, on a worker thread
(a proposal waits for one segment's insertion at most). Why pulled and not queried per
proposal: autospec/drafters/suffix.py.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.controller.factory import make_controller
from autospec.daemon.service import stop_on_signals
from autospec.drafters.base import known_drafters
from autospec.drafters.suffix import SuffixOptions, export_handoffs, shared_index
from autospec.engine.loop import Engine, Generation
from autospec.engine.textstream import TextStream
from autospec.models.chat import ChatError, encode_chat
from autospec.policy import parameters_from_dict
from autospec.serve import openai
from autospec.serve.client import DaemonClient

log = logging.getLogger("autospec.serve")
SERVER = web.AppKey("server", object)


def settings_for(params: dict | None, workload: str | None) -> ControllerSettings:
    """ControllerSettings from GET /v1/params' resolved parameters for a workload."""
    if params is None:
        return ControllerSettings()
    resolved = (params["workloads"].get(workload) if workload else None) or params["parameters"]
    return parameters_from_dict(resolved)


class Server:
    def __init__(self, engine: Engine, model_name: str, daemon: DaemonClient | None = None,
                 params_interval: float = 5.0, max_tokens_limit: int | None = None,
                 tenant_field: str | None = None, share_outputs: bool = False):
        if tenant_field not in (None, *openai.TENANT_FIELDS):
            raise ValueError(f"tenant field {tenant_field!r}: expected one of "
                             f"{', '.join(openai.TENANT_FIELDS)}")
        self.engine = engine
        self.tenant_field = tenant_field
        self.suffix = SuffixOptions.check(engine.drafter_options.get("suffix", {}))
        if share_outputs and (daemon is None or not self.suffix.share):
            raise ValueError("sharing outputs across processes needs a daemon and sharing on")
        self.share_outputs = share_outputs
        if share_outputs:
            export_handoffs(engine.models, daemon.submit_output)
        self.engines: dict[str, Engine] = {}  # tenant -> its engine (the decode thread's)
        self.model_name = model_name
        self.daemon = daemon
        self.params_interval = params_interval
        self.max_tokens_limit = max_tokens_limit or engine.models.max_positions
        self.decode = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autospec-decode")
        # every registered drafter the pair can run: a policy may list suffix or a plugin
        self.available = engine.models.available_drafters(tuple(known_drafters()))
        self.params: dict | None = None  # the last GET /v1/params answer
        self.controllers: dict[str | None, AdaptiveController] = {}
        self.served = 0

    # -- decode thread ---------------------------------------------------------------------
    def controller(self, workload: str | None) -> AdaptiveController:
        ctl = self.controllers.get(workload)
        if ctl is None:
            ctl = AdaptiveController(settings_for(self.params, workload), available=self.available)
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
        try:
            ids = encode_chat(self.engine.models, req.messages)
        except ChatError as exc:
            raise openai.InvalidRequest(str(exc), exc.param) from None
        limit = self.engine.models.max_positions
        if len(ids) >= limit:
            raise openai.InvalidRequest(f"messages: the rendered chat has {len(ids)} tokens; "
                                        f"the target's limit is {limit} positions", "messages")
        return dataclasses.replace(req, prompt=ids)

    def engine_for(self, tenant: str | None) -> Engine:
        """The engine whose suffix drafters use `tenant`'s shared index (None: the server's)."""
        if tenant is None:
            return self.engine
        engine = self.engines.get(tenant)
        if engine is None:
            options = dict(self.engine.drafter_options)
            options["suffix"] = {**options.get("suffix", {}), "tenant": tenant}
            engine = self.engines[tenant] = Engine(self.engine.models, options)
        return engine

    def generate(self, req: openai.Completion, on_text) -> Generation:
        method = req.method
        if method.kind == "adaptive":
            controller = self.controller(req.workload)
        else:
            if method.drafter not in (None, "synthetic", *self.available):
                raise openai.InvalidRequest(f"autospec.method: drafter {method.drafter!r} is not "
                                            f"available here (have: {', '.join(self.available)})")
            controller = make_controller(method)
        text = TextStream(self.engine.models.tokenizer) if on_text else None
        callback = (lambda tokens: on_text(text.add(tokens))) if on_text else None
        generation = self.engine_for(req.tenant).generate(
            req.prompt, controller=controller, max_new_tokens=req.max_tokens,
            temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, seed=req.seed,
            workload=req.workload, on_tokens=callback)
        if on_text:
            on_text(text.add([], final=True))
        return generation

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
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "body is not valid JSON")
        loop = asyncio.get_running_loop()
        try:
            req = parse(payload, self.model_name, self.max_tokens_limit, self.tenant_field)
            if req.messages is not None:
                req = await loop.run_in_executor(self.decode, self.render, req)
        except openai.InvalidRequest as exc:
            return _error(400, str(exc), exc.param)
        respond = openai.Responder(req.messages is not None, self.model_name, str(req.method))
        if not req.stream:
            generation = await self._run(loop, req, None)
            if isinstance(generation, web.Response):
                return generation
            return web.json_response(respond.whole(generation.text, generation.telemetry))
        deltas: asyncio.Queue = asyncio.Queue()
        on_text = lambda delta: delta and loop.call_soon_threadsafe(deltas.put_nowait, delta)  # noqa: E731
        task = asyncio.ensure_future(self._run(loop, req, on_text))
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
                await send(respond.chunk(getter.result()))
            else:
                getter.cancel()
        generation = task.result()
        if isinstance(generation, web.Response):  # refused before the first token
            await send(json.loads(generation.text))
        else:
            await send(respond.last(generation.telemetry))
        await send("[DONE]")
        if not client_gone:
            await response.write_eof()
        return response

    async def _run(self, loop, req: openai.Completion, on_text):
        try:
            generation = await loop.run_in_executor(self.decode, self.generate, req, on_text)
        except openai.InvalidRequest as exc:
            return _error(400, str(exc), exc.param)
        except ValueError as exc:  # prompt too long for the model, and the like
            return _error(400, str(exc))
        self.served += 1
        if self.daemon is not None:
            self.daemon.submit(generation.telemetry)
        return generation

    async def pull_params(self) -> bool:
        if self.daemon is None:
            return False
        params = await self.daemon.fetch_params()
        if params is None:
            return False
        await asyncio.get_running_loop().run_in_executor(self.decode, self.apply_params, params)
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
                "pid": os.getpid(),
                "policy_hash": self.params["policy"]["hash"] if self.params else None}
        if self.daemon is not None:
            d = self.daemon
            body["daemon"] = {"url": d.url, "connected": d.connected,
                              "unacknowledged": d.unacknowledged, **vars(d.stats)}
        return web.json_response(body)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app[SERVER] = self
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/healthz", self.healthz)
        return app


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    return web.json_response(openai.error_body(message, param), status=status)


async def run_serve(server: Server, host: str, port: int, announce=print,
                    drain_timeout: float = 5.0) -> int:
    """Serve until SIGTERM/SIGINT (second signal: exit at once); flush telemetry at exit."""
    stop = asyncio.Event()
    stop_on_signals(asyncio.get_running_loop(), stop, log)
    tasks = []
    if server.daemon is not None:
        warm = await server.pull_params()
        await server.pull_outputs()
        log.info("parameters from the daemon" if warm else
                 "daemon not reachable: starting on the policy defaults",
                 extra={"fields": {"daemon": server.daemon.url}})
        tasks = [asyncio.create_task(server.daemon.run()), asyncio.create_task(server.params_loop())]
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]
    announce(f"autospec serve listening on http://{host}:{bound}")
    try:
        await stop.wait()
    finally:
        await runner.cleanup()  # in-flight requests finish first
        for task in tasks:
            task.cancel()
        if server.daemon is not None:
            sent = await server.daemon.drain(drain_timeout)
            if not sent:
                log.warning("telemetry not delivered at exit", extra={"fields": {
                    "records": server.daemon.unacknowledged}})
            await server.daemon.close()
        server.decode.shutdown(wait=True)
    return 0
