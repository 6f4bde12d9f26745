"""`autospec bench --arrivals`: open-loop load whose rate follows a schedule."""
import json

import pytest
from clirun import error_line, invoke

from autospec.bench.arrivals import parse_schedule
from autospec.engine.loop import Engine
from autospec.engine.request import Job
from conftest import NEAR_TIE, divergences

STATS = {"throughput_tokens_per_s", "completed", "refused", "ttft_p50_ms", "ttft_p99_ms",
         "itl_p50_ms", "itl_p99_ms", "queue_p50_ms", "queue_p99_ms", "identical_to_plain"}


def test_the_schedule_sends_poisson_requests_phase_by_phase():
    schedule = parse_schedule("2:30,20:10,2:30")
    sends = schedule.send_times(seed=0)
    assert sends == schedule.send_times(seed=0)  # the seed fixes them
    times = [t for t, _ in sends]
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 70
    counts = [sum(1 for _, p in sends if p == k) for k in range(3)]
    assert 30 <= counts[0] <= 95 and 140 <= counts[1] <= 260 and 30 <= counts[2] <= 95
    assert all(30 <= t < 40 for t, p in sends if p == 1)


def test_a_trace_file_gives_the_send_times(tmp_path):
    path = tmp_path / "sends.txt"
    path.write_text("0\n0.5\n0.5\n2.25\n")
    assert parse_schedule(f"@{path}").send_times(seed=7) == [(0.0, 0), (0.5, 0), (0.5, 0), (2.25, 0)]


@pytest.mark.parametrize("text, says", [
    ("2:60,x", "entry 'x' has no colon"), ("0:60", "entry '0:60': rate and duration must be positive"),
    ("2:-1", "entry '2:-1': rate and duration must be positive"),
    ("a:b", "entry 'a:b': RATE and SECONDS must be numbers"),
    ("@/no/such/file", "cannot read the trace file '/no/such/file'")])
def test_a_bad_schedule_names_the_entry(text, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        parse_schedule(text)
    line = error_line(invoke(["bench", "--arrivals", text, "--methods", "plain"]))
    assert "--arrivals" in line and says in line


def test_an_open_loop_queues_requests_and_refuses_one_that_cannot_fit(tiny_pair):
    """Sent at fixed times, whatever the engine does: with one row the second request queues;
    one too long for a row is refused, counted, and the run goes on."""
    engine = Engine(tiny_pair, max_batch=1, max_len=64)
    jobs = [Job([1, 2, 3], 8), Job([4, 5, 6], 8), Job(list(range(1, 60)), 8), Job([7, 8], 8)]
    refused = []
    out = engine.run(jobs, arrivals=[0.0, 0.0, 0.01, 0.02],
                     on_refused=lambda i, why: refused.append((i, why)))
    assert [g is None for g in out] == [False, False, True, False]
    assert refused[0][0] == 2 and "a row holds 64 positions" in refused[0][1]
    plain = [engine.generate(j.prompt, drafter=None, max_new_tokens=8).token_ids
             for j in (jobs[0], jobs[1], jobs[3])]
    for _, _, margin in divergences(tiny_pair, [jobs[i].prompt for i in (0, 1, 3)],
                                    [out[i].token_ids for i in (0, 1, 3)], plain):
        assert margin < NEAR_TIE  # trained weights: the near-tie rule
    assert engine.cache.free == [0]  # every row given back


def test_bench_arrivals_reports_each_phase(tmp_path):
    out = tmp_path / "bench.json"
    result = invoke(["bench", "--limit", "1", "--max-new-tokens", "6", "--methods",
                     "plain,static:ngram:2,adaptive", "--arrivals", "4:1,12:0.5", "--rows", "2",
                     "--json", out])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())["arrivals"]
    assert report["schedule"] == "4:1,12:0.5" and report["rows"] == 2
    for name, entry in report["methods"].items():
        assert set(entry["by_phase"]) == {"0", "1"}
        for stats in [entry["overall"], *entry["by_phase"].values()]:
            assert set(stats) >= STATS
        assert entry["overall"]["completed"] == report["requests"]
        assert entry["overall"]["refused"] == 0
        assert entry["overall"]["identical_to_plain"] is True, name
    assert "| adaptive | 1 |" in result.output
