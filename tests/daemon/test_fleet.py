"""A fleet: two `autospec daemon` processes on one real PostgreSQL store (pgserver).

First with three clients posting telemetry as `autospec serve` sends it (processes.batch), so
the evidence is known in closed form: every acknowledged batch is stored once fleet-wide, a
batch re-sent to the other daemon too, and GET /v1/params from either daemon reflects all of
it, to the number. Then as it runs: three real `autospec serve` processes on the tiny pair
reporting to the two daemons, HTTP clients sending completions."""
from __future__ import annotations

import threading
import urllib.parse

import pytest

from processes import batch, record, request, start_daemon, wait_for

from autospec.daemon.learner import SLOW_DISCOUNT
from autospec.store import open_store

STEPS = 12  # drafting steps per record (processes.record's default)
PARAMS = "/v1/params?model_pair=pair&hardware=cpu:test"


def evidence(steps: int) -> float:
    """Position 0's discounted observations after `steps` drafting steps (every drafted step
    observes position 0, so the order of the steps does not matter)."""
    return (1 - SLOW_DISCOUNT ** steps) / (1 - SLOW_DISCOUNT)


def test_two_daemons_on_one_postgresql_count_once_and_serve_all_traffic(tmp_path, postgres_url):
    daemons = [start_daemon(tmp_path, "--instance", f"d{i}", "--flush-interval", "0.2",
                            name=f"d{i}", url=postgres_url) for i in range(2)]
    try:
        batches: dict[str, tuple[int, dict]] = {}  # batch id -> (daemon that stored it, body)
        lock = threading.Lock()

        def client(c: int) -> None:  # client c reports to daemon c % 2, as a serve process would
            for i in range(4):
                body = batch(f"client{c}:{i}", [record(f"c{c}-{i}-{j}", "copy" if j else "prose")
                                                for j in range(3)])
                status, reply = request(daemons[c % 2].url, "POST", "/v1/telemetry", body)
                assert (status, reply["stored"], reply["duplicate"]) == (200, 3, False)
                with lock:
                    batches[body["batch_id"]] = (c % 2, body)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert len(batches) == 12
        # client 0's batches again, to the other daemon (a client that failed over): stored once
        for batch_id, (first, body) in sorted(batches.items()):
            if batch_id.startswith("client0:"):
                status, reply = request(daemons[1 - first].url, "POST", "/v1/telemetry", body)
                assert (status, reply["stored"], reply["duplicate"]) == (200, 0, True)
        with open_store(postgres_url) as store:
            assert store.count_requests() == 36
            assert store.count_requests(workload="copy") == 24

        # each daemon learnt only what it stored; what either serves is the fleet's sum
        copy_records = [sum(2 for d, _ in batches.values() if d == i) for i in range(2)]
        assert copy_records == [16, 8]
        expected = {"copy": sum(evidence(n * STEPS) for n in copy_records),
                    "*": sum(evidence(3 * n // 2 * STEPS) for n in copy_records)}

        def served(daemon) -> dict:
            acceptance = request(daemon.url, "GET", PARAMS)[1]["estimates"]["acceptance"]
            return {w: acceptance.get(w, {}).get("ngram", {}).get("observations", [0.0])[0]
                    for w in expected}

        for daemon in daemons:
            assert wait_for(lambda: all(abs(served(daemon)[w] - expected[w]) < 1e-3
                                        for w in expected), timeout=20), (served(daemon), expected)
            learnt = request(daemon.url, "GET", PARAMS)[1]["estimates"]
            assert learnt["acceptance"]["copy"]["ngram"]["rates"][:4] == [1.0, 1.0, 1.0, 0.0]
            assert learnt["verify_line"] is not None
    finally:
        for daemon in daemons:
            daemon.stop()


def _requests_stored(daemon) -> int:
    """autospec_requests_total summed over its labels: what this daemon itself stored."""
    metrics = request(daemon.url, "GET", "/metrics")[1]
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("autospec_requests_total{")))


def test_three_serve_processes_report_to_a_fleet_of_two_daemons(tmp_path, postgres_url, tiny_dir):
    """The fleet as it runs: three `autospec serve` processes (the tiny pair), two reporting to
    daemon 0 and one to daemon 1, both daemons on one PostgreSQL store, HTTP clients sending
    completions. Every request's telemetry is stored once; each daemon stored only its own
    servers' requests, yet GET /v1/params from either serves the same estimates: the fleet's."""
    from processes import start

    from autospec.engine.bandwidth import hardware_key
    daemons = [start_daemon(tmp_path, "--instance", f"d{i}", name=f"d{i}", url=postgres_url)
               for i in range(2)]
    serves = []
    try:
        for s, d in enumerate((0, 1, 0)):
            serves.append(start(["serve", "--port", "0", "--target", str(tiny_dir / "target"),
                                 "--draft", str(tiny_dir / "draft"), "--daemon", daemons[d].url,
                                 "--params-interval", "0.5"], tmp_path / f"serve{s}.log",
                                env={"OMP_NUM_THREADS": "1"}))
        prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
        ids: list[str] = []
        lock = threading.Lock()

        def client(serve) -> None:
            for i in range(4):
                status, body = request(serve.url, "POST", "/v1/completions",
                                       {"prompt": prompt, "max_tokens": 16, "temperature": 0,
                                        "autospec": {"workload": "copy" if i % 2 else "prose"}})
                assert status == 200, body
                with lock:
                    ids.append(body["id"])

        threads = [threading.Thread(target=client, args=(serve,)) for serve in serves]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert len(ids) == len(set(ids)) == 12
        with open_store(postgres_url) as store:
            assert wait_for(lambda: store.count_requests() == 12, timeout=30), store.count_requests()
        assert wait_for(lambda: [_requests_stored(d) for d in daemons] == [8, 4], timeout=20)
        pair = next(line.split('model_pair="', 1)[1].split('"', 1)[0]
                    for line in request(daemons[0].url, "GET", "/metrics")[1].splitlines()
                    if line.startswith("autospec_requests_total{"))
        # the servers' hardware key: this machine, at their one thread (OMP_NUM_THREADS=1)
        hardware = hardware_key().rsplit(":", 1)[0] + ":1threads"
        params = "/v1/params?" + urllib.parse.urlencode({"model_pair": pair, "hardware": hardware})

        def served(daemon) -> list[float]:
            acceptance = request(daemon.url, "GET", params)[1]["estimates"]["acceptance"]
            return [round(sum(e["observations"]), 6) for _, per in sorted(acceptance.items())
                    for _, e in sorted(per.items())]

        # both serve the same (the fleet's) estimates, once each has merged the other's share
        assert wait_for(lambda: served(daemons[0]) == served(daemons[1]) and served(daemons[0]),
                        timeout=30), (served(daemons[0]), served(daemons[1]))
    finally:
        for proc in serves + daemons:
            proc.stop()


def test_the_fleet_s_step_cost_adds_daemons_of_either_layout():
    """A daemon of an older version kept a batch cost of fewer features and no plain steps
    apart: the fleet's step cost still adds its statistics to a current daemon's."""
    from autospec.controller.cost import StepCost
    from autospec.daemon.learner import fleet_step_cost
    new = StepCost(16)
    for drafted in (0, 8, 0, 24):
        new.observe(4, 4 + drafted, 0.01 + 0.001 * drafted, width=1 + drafted // 4)
    old = {"xtx": [1.0] * 16, "xty": [0.5] * 4, "observed": 2.0}  # 4 features, one stratum
    fleet = StepCost(16).restore(fleet_step_cost([new.state(), old]))
    assert fleet.observed == pytest.approx(new.observed + 2.0)
    state, mine = fleet.state(), new.state()
    assert state["plain_xtx"] == mine["plain_xtx"]
    assert state["xtx"][0] == mine["xtx"][0] + 1.0 and state["xtx"][4] == mine["xtx"][4]
