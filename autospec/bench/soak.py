"""A soak: `autospec serve` and `autospec daemon` under N closed-loop clients for M minutes.

    python -m autospec.bench.daemon_measure soak --minutes 30 --clients 16

The clients stream completions over a mixed workload — the reference and agentic prompts, a
third of them drafting from the shared suffix index (the rest adaptive), every 10th request a
prompt that nearly fills a row, every 10th another one cancelled (the connection closed)
after its first chunks — and the run reports, per minute: output tokens/s,
inter-chunk latency p50/p99 and the server's resident memory; the same memory at start (after
a warm-up), middle and end; the shared suffix index's live tokens; telemetry sent,
acknowledged and stored (the daemon's SQLite file, read after both processes stop); and
every error other than the cancelled streams. Not in the test line: it runs for minutes.
"""
from __future__ import annotations

import http.client
import json
import signal
import sqlite3
import statistics
import threading
import time
import urllib.request
from pathlib import Path

from autospec.process import spawn, start_daemon

CANCEL_EVERY = 10  # every 10th request is cancelled after its first chunks
LONG_EVERY = 10  # and every 10th (offset by 5) nearly fills a row
SUFFIX_K = 8  # a third of the requests draft this many tokens from the shared suffix index


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _prompts(pair: str) -> tuple[list[str], str, int]:
    """The mixed workload's prompts, a near-row-limit prompt and its max_tokens."""
    from importlib.resources import files

    import autospec
    from autospec.bench.prompts import load_prompts
    workloads = Path(str(files("autospec.configs") / "workloads"))
    prompts = [p.prompt for name in ("reference", "agentic")
               for p in load_prompts(workloads / f"{name}.jsonl")]
    models = autospec.load(pair=pair).models
    text, max_tokens = prompts[0], 32
    while len(models.tokenizer.encode(text + "\n" + prompts[0])) + max_tokens \
            < models.max_positions - 16:
        text += "\n" + prompts[0]
    return prompts, text, max_tokens


class _Client(threading.Thread):
    """One closed-loop client: streams a request, records its chunks' arrival, sends the next."""

    def __init__(self, host: str, port: int, work, stop_at: float, log: dict, lock):
        super().__init__(daemon=True)
        self.host, self.port, self.work, self.stop_at = host, port, work, stop_at
        self.log, self.lock = log, lock

    def run(self) -> None:
        while time.time() < self.stop_at:
            kind, body = self.work()
            try:
                self._one(kind, body)
            except Exception as exc:  # noqa: BLE001 -- every failure is counted, none fatal
                with self.lock:
                    self.log["errors"].append(f"{kind}: {exc!r}"[:200])

    def _one(self, kind: str, body: dict) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        reply = conn.getresponse()
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {reply.read()[:200]!r}")
        last, chunks, tokens = time.time(), 0, 0
        gaps = []
        for line in reply:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            now = time.time()
            chunk = json.loads(line[6:])
            if chunks:
                gaps.append(now - last)
            last, chunks = now, chunks + 1
            tokens = chunk.get("usage", {}).get("completion_tokens", tokens)
            if kind == "cancel" and chunks >= 3:
                conn.close()  # the client goes away mid-stream
                break
        else:
            conn.close()
        with self.lock:
            self.log["done"].append((time.time(), kind, tokens, gaps))


def soak(tmp: Path, minutes: float, clients: int, pair: str = "reference",
         max_tokens: int = 96) -> dict:
    prompts, long_prompt, long_tokens = _prompts(pair)
    daemon, sock = start_daemon(tmp)
    serve = spawn(["serve", "--pair", pair, "--port", "0", "--daemon", f"unix:{sock}",
                   "--max-batch", str(clients), "--log-level", "warning"], tmp / "serve.log",
                  timeout=300)
    host, port = serve.url.split("//")[1].split(":")
    counter, lock = iter(range(1 << 30)), threading.Lock()
    log: dict = {"done": [], "errors": []}

    def work() -> tuple[str, dict]:
        with lock:
            i = next(counter)
        body = {"max_tokens": max_tokens, "temperature": 0, "stream": True,
                "prompt": prompts[i % len(prompts)]}
        if i % 3 == 1:  # a third draft from the shared suffix index, which grows with outputs
            body["autospec"] = {"method": f"static:suffix:{SUFFIX_K}"}
        if i % CANCEL_EVERY == 0:
            return "cancel", body
        if i % LONG_EVERY == 5:
            return "long", {**body, "prompt": long_prompt, "max_tokens": long_tokens}
        return "normal", body

    def health() -> dict:
        return json.loads(urllib.request.urlopen(f"{serve.url}/healthz", timeout=30).read())

    try:
        warm = _Client(host, int(port), work, time.time() + 20, {"done": [], "errors": []}, lock)
        warm.start()
        warm.join()
        pid = serve.popen.pid
        t0 = time.time()
        stop_at = t0 + minutes * 60
        threads = [_Client(host, int(port), work, stop_at, log, lock) for _ in range(clients)]
        for t in threads:
            t.start()
        memory = [(0.0, _rss_mb(pid))]
        while time.time() < stop_at:
            time.sleep(min(60.0, max(0.0, stop_at - time.time())))
            memory.append(((time.time() - t0) / 60, _rss_mb(pid)))
        for t in threads:
            t.join(600)
        time.sleep(5)  # the server's telemetry flush
        final = health()
    finally:
        serve.stop(60)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    with sqlite3.connect(tmp / "store.db") as db:
        stored = db.execute("SELECT COUNT(*) FROM autospec_requests").fetchone()[0]
    return _report(log, memory, final, stored, t0, minutes, clients)


def _report(log: dict, memory, final: dict, stored: int, t0: float, minutes: float,
            clients: int) -> dict:
    per_minute = []
    for m in range(int(minutes)):
        done = [d for d in log["done"] if m <= (d[0] - t0) / 60 < m + 1]
        gaps = sorted(g for d in done for g in d[3])
        per_minute.append({
            "minute": m + 1, "requests": len(done),
            "tokens_per_s": round(sum(d[2] for d in done) / 60, 1),
            "itl_p50_ms": round(1000 * statistics.median(gaps), 1) if gaps else None,
            "itl_p99_ms": round(1000 * gaps[int(0.99 * (len(gaps) - 1))], 1) if gaps else None,
            "rss_mb": round(next((mb for at, mb in memory if at >= m + 1), memory[-1][1]), 1)})
    rates = [p["tokens_per_s"] for p in per_minute]
    after5 = [mb for at, mb in memory if at >= 5] or [memory[-1][1]]
    telemetry = final.get("daemon", {})
    kinds = [d[1] for d in log["done"]]
    return {
        "minutes": minutes, "clients": clients,
        "requests": {k: kinds.count(k) for k in ("normal", "long", "cancel")},
        "errors": len(log["errors"]), "error_samples": log["errors"][:5],
        "rss_mb": {"start": round(memory[0][1], 1),
                   "middle": round(memory[len(memory) // 2][1], 1),
                   "end": round(memory[-1][1], 1)},
        "rss_growth_after_5_min": round(after5[-1] / after5[0] - 1, 4),
        "throughput_last5_over_first5": round(statistics.mean(rates[-5:])
                                              / statistics.mean(rates[:5]), 4) if rates else None,
        "suffix_index_tokens": final.get("suffix_index_tokens"),
        "telemetry": {"served": final.get("served"),
                      "acknowledged": telemetry.get("acknowledged_records"),
                      "dropped": telemetry.get("dropped_records"), "stored": stored,
                      "lost": (final.get("served") or 0) - stored},
        "per_minute": per_minute}
