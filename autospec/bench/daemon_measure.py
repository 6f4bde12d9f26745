"""Measure the daemon (the figures in docs/benchmarks.md come from here):

    python -m autospec.bench.daemon_measure ingest   # step records/s sustained, params latency p50/p99
    python -m autospec.bench.daemon_measure faults   # kill -9 mid-ingest: sent/acknowledged/stored/lost
    python -m autospec.bench.daemon_measure serve    # serve+daemon vs the engine alone, tokens/s
    python -m autospec.bench.daemon_measure serve-load --clients 16   # batched serve vs the
                                                     # batched engine at the same concurrency
    python -m autospec.bench.daemon_measure soak --minutes 30 --clients 16   # bench/soak.py

Each starts its own daemon (and server) in a temp dir, on a Unix socket, with a fresh SQLite
file. Run on a quiet machine: these are timings.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from autospec.bench.soak import soak
from autospec.process import spawn, start_daemon
from autospec.telemetry import StepRecord, summarise


def synthetic_record(request_id: str, steps: int) -> dict:
    rows = [StepRecord(request_id, i, "ngram" if i % 4 else "draft-model", 4, 4, i % 5 if i % 5 < 4 else 4,
                       min(i % 5, 4) + 1, 2e-4, 8e-3, 5, 100 + 3 * i, 30_000_000, 3.5)
            for i in range(steps)]
    return summarise(request_id, 100, rows, 1.0, "copy-heavy" if steps % 2 else "prose").to_dict()


async def _post(session, body: bytes) -> int:
    async with session.post("http://localhost/v1/telemetry", data=body,
                            headers={"Content-Type": "application/json"}) as reply:
        await reply.read()
        return reply.status


async def ingest(sock: str, batches: int, records: int, steps: int, clients: int) -> dict:
    bodies = [json.dumps({"batch_id": f"load:{b}", "model_pair": "reference", "hardware": "cpu",
                          "records": [synthetic_record(f"{b}-{r}", steps) for r in range(records)]}
                         ).encode() for b in range(batches)]
    queue = list(range(batches))
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as session:
        async def client():
            while queue:
                assert await _post(session, bodies[queue.pop()]) == 200
        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        seconds = time.perf_counter() - t0
        latencies = []
        for _ in range(2000):
            t = time.perf_counter()
            async with session.get("http://localhost/v1/params",
                                   params={"model_pair": "reference", "hardware": "cpu",
                                           "workload": "copy-heavy"}) as reply:
                await reply.read()
            latencies.append((time.perf_counter() - t) * 1000)
    latencies.sort()
    return {"batches": batches, "records_per_batch": records, "steps_per_record": steps,
            "clients": clients, "seconds": round(seconds, 3),
            "step_records_per_s": round(batches * records * steps / seconds),
            "params_ms_p50": round(statistics.median(latencies), 3),
            "params_ms_p99": round(latencies[int(0.99 * len(latencies))], 3)}


async def faults(tmp: Path, kill_after: int) -> dict:
    """A client sends batches back to back; the daemon is killed -9 after `kill_after`
    acknowledgements; it restarts; the client re-sends what was not acknowledged."""
    proc, sock = start_daemon(tmp)
    sent, acknowledged = [], set()
    bodies = {}
    i = 0
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as session:
        while len(acknowledged) < kill_after + 20:
            batch_id = f"f:{i}"
            bodies[batch_id] = json.dumps({"batch_id": batch_id, "model_pair": "p", "hardware": "h",
                                           "records": [synthetic_record(f"{i}-{r}", 50) for r in range(16)]}).encode()
            sent.append(batch_id)
            if len(acknowledged) == kill_after:
                task = asyncio.ensure_future(_post(session, bodies[batch_id]))
                await asyncio.sleep(0.005)  # mid-ingest
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                try:
                    if await task == 200:
                        acknowledged.add(batch_id)
                except aiohttp.ClientError:
                    pass
                proc, sock = start_daemon(tmp)
                break
            if await _post(session, bodies[batch_id]) == 200:
                acknowledged.add(batch_id)
            i += 1
    integrity = sqlite3.connect(tmp / "store.db").execute("PRAGMA integrity_check").fetchone()[0]
    stored_before_resend = {r[0] for r in sqlite3.connect(tmp / "store.db").execute(
        "SELECT DISTINCT batch_id FROM autospec_requests")}
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as session:
        for batch_id in sent:  # the client's retry of whatever it holds unacknowledged
            if batch_id not in acknowledged:
                assert await _post(session, bodies[batch_id]) == 200
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(30)
    stored = {r[0] for r in sqlite3.connect(tmp / "store.db").execute(
        "SELECT DISTINCT batch_id FROM autospec_requests")}
    return {"sent": len(sent), "acknowledged_before_kill": len(acknowledged),
            "stored_after_restart": len(stored_before_resend),
            "acknowledged_but_lost": len(acknowledged - stored_before_resend),
            "integrity_check": integrity, "stored_after_client_retry": len(stored),
            "lost": len(set(sent) - stored), "sigterm_exit_code": code}


def serve_overhead(tmp: Path, prompts: int, max_tokens: int) -> dict:
    """The same greedy requests (static:ngram:8: no controller randomness), through
    `autospec serve` reporting to a daemon vs `Engine.generate` in this process, interleaved.
    Compared on decode tokens/s as the engine measures it (HTTP is outside both)."""
    import urllib.request

    import autospec
    from autospec.bench.prompts import load_prompts
    from autospec.models.pairs import PAIRS
    from autospec.controller.interface import StaticController
    proc, sock = start_daemon(tmp)
    serve = spawn(["serve", "--port", "0", "--daemon", f"unix:{sock}", "--log-level", "warning"],
                  tmp / "serve.log", timeout=300)
    url = serve.url
    engine = autospec.load()
    rows = load_prompts(PAIRS["reference"].workload("demo"))[:prompts]
    totals = {"serve": [0, 0.0], "engine": [0, 0.0]}
    try:
        for p in rows * 2:
            body = json.dumps({"prompt": p.prompt, "max_tokens": max_tokens, "temperature": 0,
                               "autospec": {"method": "static:ngram:8"}}).encode()
            with urllib.request.urlopen(urllib.request.Request(f"{url}/v1/completions", body), timeout=300) as r:
                m = json.loads(r.read())["autospec"]
            totals["serve"][0] += m["output_tokens"]
            totals["serve"][1] += m["wall_seconds"]
            out = engine.generate(p.prompt, controller=StaticController("ngram", 8), max_new_tokens=max_tokens)
            totals["engine"][0] += out.telemetry.output_tokens
            totals["engine"][1] += out.telemetry.wall_seconds
        health = json.loads(urllib.request.urlopen(f"{url}/healthz").read())
    finally:
        serve.stop(30)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    rate = {k: t / s for k, (t, s) in totals.items()}
    return {"requests": 2 * len(rows), "serve_tokens_per_s": round(rate["serve"], 2),
            "engine_tokens_per_s": round(rate["engine"], 2),
            "serve_over_engine": round(rate["serve"] / rate["engine"], 4),
            "telemetry_acknowledged": health["daemon"]["acknowledged_records"]}


def serve_load(tmp: Path, clients: int, max_tokens: int, method: str = "plain",
               pair: str = "reference", prompts: Path | None = None, limit: int | None = None) -> dict:
    """`autospec serve --pair P --max-batch N` under N closed-loop HTTP clients over a workload
    (default: the pair's bench workload; chat rows go to /v1/chat/completions), against the batched engine in this process over the same jobs (`Engine.run`
    with N rows): throughput of each (output tokens / wall), every served output against batch-1
    plain decoding of its prompt, and the telemetry the daemon acknowledged. Run alternately:
    engine, serve, engine — the engine figure is the mean of its two runs. Each is warmed by
    the same round of N 8-token requests first, and a controller (the server's, each engine
    run's own) keeps what it learnt there."""
    import threading
    import urllib.request

    import autospec
    from autospec.bench.prompts import load_prompts, prompt_ids
    from autospec.controller.factory import make_controller
    from autospec.engine.loop import Engine
    from autospec.engine.request import Job
    from autospec.method import parse_method
    from autospec.models.pairs import named_pair
    engine = autospec.load(pair=pair)
    rows = load_prompts(prompts or named_pair(pair).workload("bench"))[:limit]
    ids = [prompt_ids(engine, p) for p in rows]
    plain = [engine.generate(i, drafter=None, max_new_tokens=max_tokens) for i in ids]
    batched = Engine(engine.models, max_batch=clients, max_len=max(map(len, ids)) + max_tokens + 1)

    def engine_run() -> float:
        controller = make_controller(parse_method(method))
        # the same warm-up round the server gets below (its controller learns from it too)
        batched.run([Job(i, 8) for i in ids[:clients]], controller, max_batch=clients)
        t0 = time.perf_counter()
        out = batched.run([Job(i, max_tokens) for i in ids], controller, max_batch=clients)
        return sum(len(g.token_ids) for g in out) / (time.perf_counter() - t0)

    first = engine_run()
    proc, sock = start_daemon(tmp)
    serve = spawn(["serve", "--pair", pair, "--port", "0", "--daemon", f"unix:{sock}", "--log-level", "warning",
                   "--max-batch", str(clients)], tmp / "serve.log", timeout=300)
    outputs: dict[int, dict] = {}
    queue = list(range(len(ids)))
    lock = threading.Lock()

    def complete(i: int, tokens: int) -> dict:
        body = {"max_tokens": tokens, "temperature": 0, "autospec": {"method": method}}
        if rows[i].messages is None:
            body["prompt"], endpoint = rows[i].prompt, "completions"
        else:
            body["messages"], endpoint = list(rows[i].messages), "chat/completions"
        request = urllib.request.Request(f"{serve.url}/v1/{endpoint}", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as reply:
            return json.loads(reply.read())

    def text(reply: dict) -> str:
        choice = reply["choices"][0]
        return choice["text"] if "text" in choice else choice["message"]["content"]

    def client() -> None:
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop(0)
            outputs[i] = complete(i, max_tokens)
    try:
        # the server's first forwards pay one-off costs (the row cache, kernel selection) that
        # the engine's runs above have paid already: a warm-up round first, as bench does
        warm = [threading.Thread(target=complete, args=(i, 8)) for i in range(clients)]
        for t in warm:
            t.start()
        for t in warm:
            t.join()
        threads = [threading.Thread(target=client) for _ in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        time.sleep(3)  # the server's telemetry flush
        health = json.loads(urllib.request.urlopen(f"{serve.url}/healthz").read())
    finally:
        serve.stop(30)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    second = engine_run()
    served = sum(o["usage"]["completion_tokens"] for o in outputs.values()) / wall
    engine_rate = (first + second) / 2
    return {"pair": pair, "clients": clients, "method": method, "requests": len(ids),
            "serve_tokens_per_s": round(served, 2), "engine_tokens_per_s": round(engine_rate, 2),
            "serve_over_engine": round(served / engine_rate, 4),
            "identical_to_plain": sum(text(outputs[i]) == plain[i].text
                                      for i in range(len(ids))),
            "telemetry_acknowledged": health["daemon"]["acknowledged_records"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("what", choices=["ingest", "faults", "serve", "serve-load", "soak"])
    parser.add_argument("--minutes", type=float, default=30, help="soak: how long")
    parser.add_argument("--method", default="plain", help="serve-load: the method of every request")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--records", type=int, default=32)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--pair", default="reference", help="serve-load: the named pair")
    parser.add_argument("--workload", type=Path, help="serve-load: a workload JSONL (default: the pair's)")
    parser.add_argument("--limit", type=int, help="serve-load: the workload's first N rows")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="autospec-measure-") as tmp:
        tmp = Path(tmp)
        os.environ["AUTOSPEC_DATA"] = str(tmp)
        if args.what == "ingest":
            proc, sock = start_daemon(tmp)
            try:
                result = asyncio.run(ingest(sock, args.batches, args.records, args.steps, args.clients))
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
        elif args.what == "faults":
            result = asyncio.run(faults(tmp, kill_after=30))
        elif args.what == "serve":
            result = serve_overhead(tmp, args.prompts, args.max_tokens)
        elif args.what == "soak":
            result = soak(tmp, args.minutes, args.clients, args.pair, args.max_tokens)
        else:
            result = serve_load(tmp, args.clients, args.max_tokens, args.method, args.pair,
                                args.workload, args.limit)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
