"""A fleet: two `autospec daemon` processes on one real PostgreSQL store (pgserver), three
clients posting telemetry. Every acknowledged batch is stored once fleet-wide, a batch re-sent
to the other daemon too, and GET /v1/params from either daemon reflects all of it.

The clients are plain HTTP posters of the telemetry `autospec serve` sends (processes.batch),
not serve processes: starting three engines would cost more than the whole test may take."""
from __future__ import annotations

import threading

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
