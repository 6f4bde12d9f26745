"""`autospec daemon` as a real process on a real Unix socket / loopback port, real SQLite."""
from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading

import pytest
from processes import batch, record, request, start, start_daemon, wait_for

from autospec.store import open_store

GOOD_POLICY = "schema_version: 1\nk_max: 8\n"


def stored(db) -> int:
    with open_store(f"sqlite:///{db}") as store:
        return store.count_requests()


def test_ingest_params_metrics_and_duplicates(tmp_path):
    daemon = start_daemon(tmp_path)
    try:
        status, body = request(daemon.url, "POST", "/v1/telemetry",
                               batch("b1", [record("r1"), record("r2", "prose")]))
        assert (status, body["stored"], body["duplicate"]) == (200, 2, False)
        status, body = request(daemon.url, "POST", "/v1/telemetry", batch("b1", [record("r1"), record("r2", "prose")]))
        assert (status, body["stored"], body["duplicate"]) == (200, 0, True)  # a re-send: once
        status, params = request(daemon.url, "GET", "/v1/params?model_pair=pair&hardware=cpu:test&workload=copy")
        assert status == 200
        assert params["parameters"]["k_max"] == 16 and params["workload"] == "copy"
        learnt = params["estimates"]["acceptance"]["copy"]["ngram"]
        assert learnt["rates"][:3] == [1.0, 1.0, 1.0] and learnt["rates"][3] == 0.0
        assert params["estimates"]["verify_line"] is not None
        status, text = request(daemon.url, "GET", "/metrics")
        assert 'autospec_requests_total{model_pair="pair",workload="copy"} 1' in text
        assert 'autospec_telemetry_batches_total{result="duplicate"} 1' in text
        assert "autospec_conditional_acceptance{" in text and "autospec_policy_info{" in text
        assert "autospec_bandwidth_utilisation" in text and "autospec_drafter_share{" in text
        assert request(daemon.url, "GET", "/healthz")[1]["status"] == "ok"
    finally:
        daemon.stop()
    assert stored(tmp_path / "store.db") == 2


@pytest.mark.parametrize("body, expected", [
    (b"{not json", "not valid JSON"),
    ([1, 2], "expected a JSON object"),
    ({"batch_id": 7, "model_pair": "p", "hardware": "h", "records": []}, "batch_id"),
    ({"batch_id": "b", "model_pair": "p", "hardware": "h", "records": [], "extra": 1}, "unknown field"),
    ({"batch_id": "b", "model_pair": "p", "hardware": "h", "records": []}, "records"),
    ({"batch_id": "b", "model_pair": "p", "hardware": "h", "records": [{"request_id": "x"}]}, "missing field"),
    ({"batch_id": "b", "model_pair": "p", "hardware": "h",
      "records": [{**record("r").to_dict(), "steps": "many"}]}, "RequestRecord.steps"),
    ({"batch_id": "b", "model_pair": "p", "hardware": "h",
      "records": [{**record("r").to_dict(), "surprise": 1}]}, "unknown field"),
    (b'{"batch_id": "b", "model_pair": "p", "hardware": "h", "records": [], "peak_bandwidth_gbs": NaN}',
     "not valid JSON"),
])
def test_bad_telemetry_is_refused_and_nothing_is_stored(daemon_module, body, expected):
    daemon, db = daemon_module
    before = stored(db)
    status, reply = request(daemon.url, "POST", "/v1/telemetry", body)
    assert status == 400 and expected in reply["error"], reply
    assert stored(db) == before
    assert request(daemon.url, "GET", "/healthz")[0] == 200


def test_oversized_body_is_refused(daemon_module):
    daemon, db = daemon_module
    status, reply = request(daemon.url, "POST", "/v1/telemetry", b"[" + b"0," * (9 << 20) + b"0]")
    assert status == 413 and "split the batch" in reply["error"]
    assert request(daemon.url, "GET", "/healthz")[0] == 200


def test_bad_params_queries(daemon_module):
    daemon, _ = daemon_module
    assert request(daemon.url, "GET", "/v1/params?model_pair=p")[0] == 400
    assert request(daemon.url, "GET", "/v1/params?model_pair=p&hardware=h&color=red")[0] == 400


@pytest.fixture(scope="module")
def daemon_module(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("daemon")
    daemon = start_daemon(tmp)
    yield daemon, tmp / "store.db"
    daemon.stop()


def run_cli(*args, env=None):
    import os
    return subprocess.run([sys.executable, "-m", "autospec", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def test_non_loopback_needs_the_flag_and_a_token(tmp_path):
    out = run_cli("daemon", "--listen", "0.0.0.0:0", "--db", f"sqlite:///{tmp_path}/s.db")
    assert out.returncode == 2 and "--allow-remote" in out.stderr
    out = run_cli("daemon", "--listen", "0.0.0.0:0", "--allow-remote", "--db",
                  f"sqlite:///{tmp_path}/s.db", env={"AUTOSPEC_DAEMON_TOKEN": ""})
    assert out.returncode == 2 and "token" in out.stderr


def test_bearer_token(tmp_path):
    daemon = start(["daemon", "--listen", "127.0.0.1:0", "--db", f"sqlite:///{tmp_path}/s.db"],
                   tmp_path / "d.log", env={"AUTOSPEC_DAEMON_TOKEN": "s3cret"})
    try:
        body = batch("b", [record("r")])
        assert request(daemon.url, "POST", "/v1/telemetry", body)[0] == 401
        assert request(daemon.url, "POST", "/v1/telemetry", body,
                       {"Authorization": "Bearer wrong"})[0] == 401
        assert request(daemon.url, "GET", "/healthz")[0] == 200
        # Prometheus scrapes without the token, as /healthz; everything under /v1 needs it
        assert request(daemon.url, "GET", "/metrics")[0] == 200
        assert request(daemon.url, "GET", "/v1/params?model_pair=p&hardware=h")[0] == 401
        assert stored(tmp_path / "s.db") == 0
        assert request(daemon.url, "POST", "/v1/telemetry", body,
                       {"Authorization": "Bearer s3cret"})[0] == 200
    finally:
        daemon.stop()


def test_policy_reload_keeps_the_last_good_one(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(GOOD_POLICY)
    daemon = start_daemon(tmp_path, "--policy", str(policy))
    try:
        params = lambda: request(daemon.url, "GET", "/v1/params?model_pair=p&hardware=h")[1]  # noqa: E731
        good_hash = params()["policy"]["hash"]
        assert params()["parameters"]["k_max"] == 8
        policy.write_text("schema_version: 1\nk_max: 0\n")
        status, reply = request(daemon.url, "POST", "/v1/reload")
        assert status == 422 and "k_max" in reply["error"] and str(policy) in reply["error"]
        assert params()["policy"]["hash"] == good_hash
        assert request(daemon.url, "GET", "/healthz")[0] == 200
        policy.write_text("schema_version: 1\nk_max: 12\n")  # picked up by the file watch
        assert wait_for(lambda: params()["parameters"]["k_max"] == 12)
        assert params()["policy"]["hash"] != good_hash
    finally:
        daemon.stop()
    assert "policy reload refused" in daemon.log.read_text()
    with open_store(f"sqlite:///{tmp_path}/store.db") as store:
        assert len(store.applied_policies()) == 2


def test_an_invalid_policy_at_start_is_a_named_error(tmp_path):
    policy = tmp_path / "bad.yaml"
    policy.write_text("schema_version: 1\ndrafters: [ngarm]\n")
    out = run_cli("daemon", "--listen", f"unix:{tmp_path}/d.sock", "--policy", str(policy),
                  "--db", f"sqlite:///{tmp_path}/s.db")
    assert out.returncode == 1 and "ngarm" in out.stderr and "bad.yaml" in out.stderr


def test_sigterm_flushes_and_exits_zero_then_restarts_warm(tmp_path):
    daemon = start_daemon(tmp_path, "--flush-interval", "3600")  # only the exit flush
    body = batch("b", [record(f"r{i}") for i in range(5)])
    assert request(daemon.url, "POST", "/v1/telemetry", body)[0] == 200
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    with open_store(f"sqlite:///{tmp_path}/store.db") as store:
        assert store.count_requests() == 5
        learnt = store.load_estimates("pair", "cpu:test")
    assert learnt["copy"]["ngram"].observations[0] > 3
    # warm start: a new daemon serves what the old one learnt, before any new telemetry
    again = start_daemon(tmp_path, name="again")
    try:
        params = request(again.url, "GET", "/v1/params?model_pair=pair&hardware=cpu:test")[1]
        assert params["estimates"]["acceptance"]["copy"]["ngram"]["observations"][0] > 3
    finally:
        again.stop()


def test_the_step_cost_survives_a_restart(tmp_path):
    """Batched steps teach the step cost's plane (controller/cost.py); the store keeps it per
    pair and hardware and a restarted daemon serves it (a new server's controller starts from
    it: warm_start)."""
    import dataclasses
    batched = []
    for i in range(8):
        r = record(f"b{i}")
        steps = [dataclasses.replace(s, batch_size=4, batch_tokens=4 * s.verify_tokens,
                                     verify_seconds=0.01 + 0.001 * 4 * s.verify_tokens)
                 for s in r.step_records]
        batched.append(dataclasses.replace(r, step_records=steps))
    daemon = start_daemon(tmp_path, "--flush-interval", "3600")
    assert request(daemon.url, "POST", "/v1/telemetry", batch("b", batched))[0] == 200
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    again = start_daemon(tmp_path, name="again")
    try:
        params = request(again.url, "GET", "/v1/params?model_pair=pair&hardware=cpu:test")[1]
        saved = params["estimates"]["step_cost"]
        assert saved["observed"] > 4
        from autospec.controller.adaptive import AdaptiveController
        controller = AdaptiveController()
        controller.warm_start(params["estimates"])
        a, b, c, jump, pad = controller.cost.plane()
        # seconds per token of the batched forward: rows of one width pad nothing, so a
        # drafted token's cost is c + w there, however the fit splits it
        assert c + pad == pytest.approx(0.001, rel=0.1)
    finally:
        again.stop()


def test_once_exits_after_one_batch(tmp_path):
    daemon = start_daemon(tmp_path, "--once")
    assert request(daemon.url, "POST", "/v1/telemetry", batch("b", [record("r")]))[0] == 200
    assert daemon.wait() == 0


def test_kill_9_mid_ingest_loses_no_acknowledged_batch(tmp_path):
    daemon = start_daemon(tmp_path)
    acknowledged, sent = [], []
    stop = threading.Event()

    def client():
        i = 0
        while not stop.is_set():
            batch_id = f"k{i}"
            sent.append(batch_id)
            try:
                status, _ = request(daemon.url, "POST", "/v1/telemetry",
                                    batch(batch_id, [record(f"{batch_id}-{j}") for j in range(20)]),
                                    timeout=5)
            except OSError:
                break
            if status == 200:
                acknowledged.append(batch_id)
            i += 1

    thread = threading.Thread(target=client)
    thread.start()
    assert wait_for(lambda: len(acknowledged) >= 5, timeout=60)
    daemon.signal(signal.SIGKILL)
    daemon.wait()
    stop.set()
    thread.join(10)
    db = tmp_path / "store.db"
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    again = start_daemon(tmp_path, name="again")  # a stale socket file is no obstacle
    try:
        assert request(again.url, "GET", "/healthz")[0] == 200
    finally:
        again.stop()
    con = sqlite3.connect(db)
    batches = {row[0] for row in con.execute("SELECT DISTINCT batch_id FROM autospec_requests")}
    assert set(acknowledged) <= batches  # every acknowledged batch is stored ...
    per_batch = dict(con.execute("SELECT batch_id, COUNT(*) FROM autospec_requests GROUP BY batch_id"))
    assert all(n == 20 for n in per_batch.values())  # ... whole: no half-stored batch
    print(f"sent {len(sent)}, acknowledged {len(acknowledged)}, stored {len(batches)}, "
          f"lost {len(set(acknowledged) - batches)}")


def test_a_store_that_refuses_writes_gets_503_and_the_batch_lands_on_retry(tmp_path):
    """The store cannot take the write (here: another process holds it locked past the busy
    timeout; a full disk or a read-only file take the same path): 503, nothing acknowledged,
    so the client keeps the batch; once the store takes writes again, the re-send is stored."""
    daemon = start_daemon(tmp_path)
    db = tmp_path / "store.db"
    try:
        assert request(daemon.url, "POST", "/v1/telemetry", batch("ok", [record("a")]))[0] == 200
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            status, reply = request(daemon.url, "POST", "/v1/telemetry",
                                    batch("later", [record("b")]), timeout=60)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert status == 503 and "send it again" in reply["error"], reply
        assert request(daemon.url, "GET", "/healthz")[0] == 200
        assert request(daemon.url, "POST", "/v1/telemetry", batch("later", [record("b")]))[0] == 200
        assert stored(db) == 2
    finally:
        daemon.stop()
