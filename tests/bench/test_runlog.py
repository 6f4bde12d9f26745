"""The one run log and its statistics (bench/runlog.py) that the closed loop, the open loop and
vLLM's runs share."""
import pytest

from autospec.bench.runlog import RunLog, latency_stats, log_run
from autospec.bench.runner import RunResult
from autospec.controller.interface import StaticController
from autospec.engine.loop import Engine
from autospec.engine.request import Job
from autospec.models.sampling import SamplingParams


def test_emissions_give_ttft_from_the_send_and_per_token_intervals():
    log = RunLog([None, None], start=100.0)
    log.emit(0, 1, sent=99.0, now=100.5, queue_s=0.25)  # first tokens: TTFT 1.5 s, no interval
    log.emit(0, 4, sent=99.0, now=101.3)  # 4 tokens 0.8 s later: 4 intervals of 0.2 s
    log.emit(1, 2, sent=100.0, now=100.1)
    log.results = [RunResult([1] * 5, 2.3), None]  # job 1 never finished
    log.wall_s = 2.0
    stats = latency_stats(log, [0, 1], queue=True)
    assert stats["ttft_p50_ms"] == pytest.approx(1500.0)  # job 1 not counted: it did not finish
    assert stats["itl_p50_ms"] == pytest.approx(200.0) and stats["itl_p99_ms"] == pytest.approx(200.0)
    assert stats["queue_p50_ms"] == pytest.approx(250.0)
    assert stats["throughput_tokens_per_s"] == pytest.approx(5 / 2.0)
    assert log.emitted_at == [(pytest.approx(0.5), 1), (pytest.approx(1.3), 4), (pytest.approx(0.1), 2)]
    # a window counts every token emitted in it, over its length
    assert latency_stats(log, [0], (0.0, 1.0))["throughput_tokens_per_s"] == pytest.approx(3.0)
    assert "queue_p50_ms" not in latency_stats(log, [0])


def test_a_logged_run_knows_each_request_by_its_job(tiny_pair):
    engine = Engine(tiny_pair, max_batch=2)
    jobs = [Job([5, 6, 7], n, SamplingParams(), 0, None, "the caller's id") for n in (3, 6, 4)]
    log = log_run(engine, jobs, StaticController("ngram", 2))
    assert [len(r.token_ids) for r in log.results] == [3, 6, 4]
    assert sorted(log.ttft_s) == [0, 1, 2] and log.wall_s > 0
    assert sum(n for _, n in log.emitted_at) == 13
    stats = latency_stats(log, range(3))
    assert stats["throughput_tokens_per_s"] == pytest.approx(13 / log.wall_s)
