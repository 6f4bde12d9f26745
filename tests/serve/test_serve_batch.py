"""`autospec serve` batching (serve/batcher.py): concurrent requests share one forward and
still decode exactly as alone, the wait queue is bounded (429 + Retry-After), a request too
long for a row is a 400, and the telemetry the daemon gets is one record per request.

A real server in this process (aiohttp on a loopback port, its own event loop thread), real
HTTP clients on threads. The decode loop is held (a call that blocks on an Event) while the
requests arrive, so what the batch and the queue hold does not depend on timing."""
from __future__ import annotations

import asyncio
import http.client
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
from aiohttp import web

from autospec.daemon.app import parse_batch
from autospec.engine.loop import Engine
from autospec.serve.server import Server
from conftest import NEAR_TIE, REPO_ROOT, divergences
from processes import batch, wait_for

WORKLOAD = REPO_ROOT / "configs" / "workloads" / "reference.jsonl"
PROMPTS = [json.loads(line)["prompt"] for line in WORKLOAD.read_text().splitlines()][:8]
METHODS = ["plain", "static:ngram:4", "static:draft-model:2", "adaptive"]  # row i: METHODS[i % 4]
NEW = 16


class Telemetry:
    """Stands in for the DaemonClient: keeps what the server submits."""

    def __init__(self):
        self.records = []

    def submit(self, record) -> None:
        self.records.append(record)


@contextmanager
def serving(server: Server):
    """The server's app on 127.0.0.1:<free port>, its event loop on a thread of its own."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(server.app(), access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        server.decode.close()


@contextmanager
def held(server: Server):
    """The decode loop blocked (between steps) until the block ends."""
    go = threading.Event()
    server.decode.call(go.wait)
    try:
        yield
    finally:
        go.set()


def post(port: int, body: dict) -> tuple[int, dict, dict]:
    """(status, body, headers) of one POST /v1/completions; a stream's events are joined into
    {"text": ..., "events": [...]}."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        reply = conn.getresponse()
        raw = reply.read().decode()
        headers = dict(reply.getheaders())
    finally:
        conn.close()
    if headers.get("Content-Type", "").startswith("text/event-stream"):
        events = [json.loads(line[6:]) for line in raw.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        return reply.status, {"text": "".join(e["choices"][0]["text"] for e in events),
                              "events": events}, headers
    return reply.status, json.loads(raw), headers


def body(prompt, i: int = 0, **fields) -> dict:
    return {"prompt": prompt, "max_tokens": NEW, "temperature": 0,
            "autospec": {"method": METHODS[i % len(METHODS)]}, **fields}


@pytest.fixture(scope="module")
def plain(reference_pair):
    engine = Engine(reference_pair)
    return [engine.generate(p, drafter=None, max_new_tokens=NEW) for p in PROMPTS]


def test_8_concurrent_requests_batch_and_equal_plain(reference_pair, plain):
    telemetry = Telemetry()
    server = Server(Engine(reference_pair), "reference", telemetry, max_batch=4)
    tokens, finish = {}, server.batch.finish

    def finishing(request):  # the tokens behind each reply: the near-tie rule needs them
        tokens[request.request_id] = list(request.output)
        return finish(request)
    server.batch.finish = finishing
    with serving(server) as port, ThreadPoolExecutor(len(PROMPTS)) as clients:
        with held(server):  # all 8 wait: 4 rows start together, 4 join as rows free
            replies = [clients.submit(post, port, body(p, i, stream=i % 2 == 1))
                       for i, p in enumerate(PROMPTS)]
            assert wait_for(lambda: server.decode.waiting == len(PROMPTS), timeout=60)
        replies = [r.result() for r in replies]
    texts, asked, got = [], {}, []
    for i, (status, reply, _) in enumerate(replies):
        assert status == 200, reply
        texts.append(reply["text"] if "events" in reply else reply["choices"][0]["text"])
        last = reply["events"][-1] if "events" in reply else reply
        asked[last["autospec"]["request_id"]] = METHODS[i % len(METHODS)]
        got.append(tokens[last["autospec"]["request_id"]])
    # lossless under batching, streamed or not: each reply is its tokens' text, and the tokens
    # are plain's (the near-tie rule: trained weights)
    decode = reference_pair.tokenizer.decode
    assert texts == [decode(ids, skip_special_tokens=True) for ids in got]
    for _, _, margin in divergences(reference_pair, PROMPTS, got, [g.token_ids for g in plain]):
        assert margin < NEAR_TIE
    assert len(telemetry.records) == len(PROMPTS)
    # each record says the method its request ran with (the report keeps baselines apart)
    assert {r.request_id: r.method for r in telemetry.records} == asked
    sizes = [s.batch_size for r in telemetry.records for s in r.step_records]
    assert max(sizes) == 4 and min(sizes) >= 1
    assert all(s.batch_tokens >= s.batch_size for r in telemetry.records for s in r.step_records)
    assert sorted(server.batch.cache.free) == [0, 1, 2, 3]  # every row given back
    # what the daemon parses: these records, and the same without the batch fields and the
    # method (an older serving process's)
    new = batch("new", telemetry.records)
    old = json.loads(json.dumps(new))
    for r in old["records"]:
        del r["method"]
        for s in r["step_records"]:
            del s["batch_size"], s["batch_tokens"]
    parsed_new, parsed_old = parse_batch(json.dumps(new).encode())[3], parse_batch(json.dumps(old).encode())[3]
    assert max(s.batch_size for r in parsed_new for s in r.step_records) == 4
    assert {s.batch_size for r in parsed_old for s in r.step_records} == {1}
    assert {r.request_id: r.method for r in parsed_new} == asked
    assert {r.method for r in parsed_old} == {None}


def test_a_full_queue_answers_429_and_loses_no_accepted_request(reference_pair):
    telemetry = Telemetry()
    server = Server(Engine(reference_pair), "reference", telemetry, max_batch=1, max_queue=2)
    with serving(server) as port, ThreadPoolExecutor(3) as clients:
        with held(server):  # the decode thread held: its one row free, not yet claimed
            accepted = [clients.submit(post, port, body(p)) for p in PROMPTS[:3]]
            assert wait_for(lambda: server.decode.waiting == 3, timeout=60)  # the row's + 2
            status, reply, headers = post(port, body(PROMPTS[3]))
            assert status == 429, reply
            assert int(headers["Retry-After"]) >= 1
            assert "3 requests already wait" in reply["error"]["message"]
        assert [f.result()[0] for f in accepted] == [200, 200, 200]
    assert len(telemetry.records) == 3


def test_a_request_too_long_for_a_row_is_a_400_naming_the_numbers(reference_pair):
    server = Server(Engine(reference_pair), "reference", Telemetry(), max_batch=2)
    rows = server.batch.max_positions
    with serving(server) as port:
        for stream in (False, True):
            status, reply, _ = post(port, {"prompt": [5] * (rows - 4), "max_tokens": 10,
                                           "stream": stream})
            assert status == 400, reply
            assert (f"request needs {rows + 6} positions (prompt {rows - 4} + max_new_tokens 10); "
                    f"a row holds {rows} positions") in reply["error"]["message"]
        assert post(port, body(PROMPTS[0]))[0] == 200  # and the server goes on
    assert sorted(server.batch.cache.free) == [0, 1]


@pytest.mark.parametrize("flag", ["--max-batch", "--max-queue"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_a_non_positive_bound_is_a_click_error_naming_it(flag, value):
    from click.testing import CliRunner

    from autospec.cli import main
    result = CliRunner().invoke(main, ["serve", flag, value])
    assert result.exit_code == 2
    assert f"Invalid value for '{flag}'" in result.output and value in result.output


def test_bad_bounds_in_the_api_name_the_value(tiny_pair):
    with pytest.raises(ValueError, match="max_batch must be >= 1, got 0"):
        Server(Engine(tiny_pair), "tiny", max_batch=0)
    with pytest.raises(ValueError, match="max_queue must be >= 1, got 0"):
        Server(Engine(tiny_pair), "tiny", max_batch=1, max_queue=0)
