"""Real processes for the daemon and serve tests: start, talk HTTP (Unix socket or TCP), stop."""
from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path

from autospec.process import Child, spawn
from autospec.telemetry import StepRecord, summarise


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 30.0):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def request(url: str, method: str, path: str, body=None, headers=None, timeout: float = 30.0):
    """(status, parsed JSON or text) for one HTTP request to unix:PATH or http://host:port."""
    if url.startswith("unix:"):
        conn = UnixHTTPConnection(url[5:], timeout)
    else:
        host, port = url[len("http://"):].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json",
                                                       **(headers or {})})
        reply = conn.getresponse()
        raw = reply.read().decode()
    finally:
        conn.close()
    try:
        return reply.status, json.loads(raw)
    except ValueError:
        return reply.status, raw


class Proc(Child):
    """A test's child: `stop()` is a kill (clean-up; tests that want a warm shutdown signal)."""

    def stop(self) -> int:
        return self.kill()


def start(args: list[str], log: Path, env: dict | None = None, timeout: float = 120.0) -> Proc:
    """Start `python -m autospec ARGS`; wait for its 'listening on URL' line."""
    child = spawn(args, log, env, timeout)
    return Proc(child.popen, child.url, child.log)


def start_daemon(tmp: Path, *extra: str, db: Path | None = None, name: str = "daemon",
                 url: str | None = None) -> Proc:
    """A daemon on unix:TMP/NAME.sock over the SQLite file `db` (or the store at `url`)."""
    url = url or f"sqlite:///{db or tmp / 'store.db'}"
    sock = tmp / f"{name}.sock"
    return start(["daemon", "--listen", f"unix:{sock}", "--db", url,
                  "--flush-interval", "0.2", *extra], tmp / f"{name}.log",
                 env={"AUTOSPEC_DATA": str(tmp)})


def record(request_id: str, workload: str = "copy", steps: int = 12, drafter: str = "ngram",
           k: int = 4, accepted: int = 3):
    """A RequestRecord as the engine would write it: `steps` drafting steps, then a plain one."""
    records = [StepRecord(request_id, i, drafter, k, k, accepted, accepted + 1, 1e-4, 1e-2, k + 1,
                          20 + 4 * i, 10_000_000, 1.0) for i in range(steps)]
    records.append(StepRecord(request_id, steps, "none", 0, 0, 0, 1, 0.0, 9e-3, 1, 20 + 4 * steps,
                              10_000_000, 1.1))
    return summarise(request_id, 20, records, 0.2, workload)


def batch(batch_id: str, records, model_pair: str = "pair", hardware: str = "cpu:test") -> dict:
    return {"batch_id": batch_id, "model_pair": model_pair, "hardware": hardware,
            "records": [r.to_dict() for r in records], "peak_bandwidth_gbs": 10.0}


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """GET /metrics parsed by prometheus_client's own parser: (sample name, its labels) ->
    value, so a check reads a series whatever order its labels are written in."""
    from prometheus_client.parser import text_string_to_metric_families
    status, text = request(url, "GET", "/metrics")
    assert status == 200, text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(scraped: dict, name: str, **labels) -> float:
    """One series' value in a scrape (0 where it has not appeared yet)."""
    return scraped.get((name, frozenset((k, str(v)) for k, v in labels.items())), 0.0)

