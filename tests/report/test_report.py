"""`autospec report`: numbers by hand on a small store, valid PNGs, clear failures."""

import dataclasses

import pytest
from clirun import error_line, invoke

from autospec.report.stats import (PLAIN, drafter_speeds, mean_k, rolling_mean,
                                   summarise_workloads)
from autospec.store import StepAggregate, open_store
from autospec.telemetry import StepRecord, summarise

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("acceptance.png", "drafters.png", "speedup.png", "bandwidth.png")


def step(i, drafter, k=0, accepted=0, draft_s=0.0, verify_s=0.005):
    proposed = k  # every drafter proposes all k here
    return StepRecord("r", i, drafter, k, proposed, accepted, emitted=accepted + 1,
                      draft_seconds=draft_s, verify_seconds=verify_s, verify_tokens=proposed + 1,
                      context_tokens=10 + i, bytes_moved=1_000_000, bandwidth_gbs=0.0)


def ngram(i, accepted):
    return step(i, "ngram", 4, accepted, 0.002, 0.008)


def draft_model(i, accepted):
    return step(i, "draft-model", 2, accepted, 0.004, 0.006)


def plain(i):
    return step(i, PLAIN)


def records():
    """Three requests. By hand, per drafter over all of them:
    ngram: 3 steps, 5+3+1 = 9 emitted in 0.03 s = 300 tok/s, 1.5x plain
    draft-model: 3 steps, 2+3+3 = 8 in 0.03 s = 266.7 tok/s, 1.33x plain
    plain: 2 steps, 2 emitted in 0.01 s = 200 tok/s."""
    a = summarise("a", 8, [ngram(0, 4), ngram(1, 2), draft_model(2, 1), plain(3)],
                  wall_seconds=0.1, workload="code")  # 11 tokens, 7/10 accepted
    b = summarise("b", 8, [ngram(0, 0), plain(1)], wall_seconds=0.1, workload="code")  # 2, 0/4
    c = summarise("c", 8, [draft_model(0, 2), draft_model(1, 2)], wall_seconds=0.05,
                  workload="chat")  # 6 tokens, 4/4
    return [a, b, c]


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'autospec.db'}"


@pytest.fixture
def filled(url):
    a, b, c = records()
    with open_store(url) as store:
        store.ingest([a, b], "engine-1:1", "reference", "cpu")
        store.ingest([c], "engine-1:2", "reference", "cpu")
        store.record_policy("a" * 64, "policies/first.yaml", 1)
        store.record_policy("b" * 64, "policies/tuned.yaml", 1)
    return url


def run(*args, **env):
    return invoke(["report", *args], env=env)


# -- pure functions ---------------------------------------------------------------------------
def test_mean_k_weights_by_steps_and_counts_plain_as_zero():
    aggs = [StepAggregate("ngram", 4, 3, 12, 6, 9, 15, 0.0, 0.0),
            StepAggregate("ngram", 2, 1, 2, 1, 2, 3, 0.0, 0.0),
            StepAggregate(PLAIN, 0, 4, 0, 0, 4, 4, 0.0, 0.0)]
    assert mean_k(aggs) == pytest.approx((3 * 4 + 1 * 2) / 8)
    assert mean_k([]) is None


def test_rolling_mean_is_trailing_and_skips_missing():
    assert rolling_mean([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    assert rolling_mean([None, 2, None, 4], 3) == [None, 2, 2, 3]
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        rolling_mean([1], 0)


def test_numbers_by_hand(filled):
    from autospec.report import load
    with open_store(filled) as store:
        requests, policies = load(store)
    assert [r.workload for r in requests] == ["code", "code", "chat"]  # ingest order
    s = summarise_workloads(requests)
    assert list(s) == ["chat", "code", "all"]
    code, chat, everything = s["code"], s["chat"], s["all"]
    assert (code.requests, code.output_tokens) == (2, 13)
    assert code.acceptance_rate == pytest.approx(7 / 14)
    assert code.mean_accepted_length == pytest.approx(13 / 6)
    assert code.mean_k == pytest.approx((4 + 4 + 2 + 0 + 4 + 0) / 6)
    assert code.drafter_shares == pytest.approx({"ngram": 3 / 6, PLAIN: 2 / 6, "draft-model": 1 / 6})
    assert list(code.drafter_shares) == ["ngram", PLAIN, "draft-model"]  # largest first
    assert code.tokens_per_s == pytest.approx(13 / 0.2)
    assert code.bandwidth_gbs == pytest.approx(6e6 / 0.05 / 1e9)
    assert chat.acceptance_rate == 1.0 and chat.drafter_shares == {"draft-model": 1.0}
    assert chat.tokens_per_s == pytest.approx(120.0)
    assert everything.acceptance_rate == pytest.approx(11 / 18)
    assert everything.bandwidth_gbs == pytest.approx(8e6 / 0.07 / 1e9)
    speeds = {d.drafter: d for d in drafter_speeds(requests)}
    assert [d.drafter for d in drafter_speeds(requests)] == ["ngram", "draft-model", PLAIN]
    assert speeds["ngram"].tokens_per_s == pytest.approx(300.0)
    assert speeds["ngram"].speedup == pytest.approx(1.5)
    assert speeds["draft-model"].speedup == pytest.approx(8 / 0.03 / 200)
    assert speeds[PLAIN].speedup == pytest.approx(1.0)
    assert [p.path for p in policies] == ["policies/first.yaml", "policies/tuned.yaml"]


# -- the command ------------------------------------------------------------------------------
def table_rows(lines: list[str]) -> dict[str, list[str]]:
    """{first word: words} of the summary's unindented lines (table rows and headers)."""
    return {ln.split()[0]: ln.split() for ln in lines if ln[:1].strip()}


def assert_the_rows_of_records(lines: list[str]) -> None:
    """The summary's workload rows, drafter shares and speeds of records(), by hand."""
    row = table_rows(lines)
    # workload requests output accept len/step meanK tok/s GB/s util
    assert row["code"][1:] == ["2", "13", "0.500", "2.17", "2.33", "65.0", "0.12", "10.0%"]
    assert row["chat"][1:] == ["1", "6", "1.000", "3.00", "2.00", "120.0", "0.10", "8.3%"]
    assert row["all"][1:4] == ["3", "19", "0.611"]
    assert "  code             ngram 50.0%, none 33.3%, draft-model 16.7%" in lines
    assert "  ngram                   3 steps     300.0 tok/s 1.50x" in lines
    assert "  none                    2 steps     200.0 tok/s 1.00x" in lines


def test_report_writes_plots_and_summary(filled, tmp_path):
    out = tmp_path / "report"
    result = run("--db", filled, "--out", str(out), "--peak-gbs", "1.2")
    assert result.exit_code == 0, result.output
    for name in PLOTS:
        raw = (out / name).read_bytes()
        assert raw.startswith(PNG_MAGIC), name
        assert len(raw) > 10_000, name  # axes, lines and text, not a blank canvas
    summary = (out / "summary.txt").read_text()
    assert summary in result.output
    lines = summary.splitlines()
    assert "requests 3, output tokens 19" in lines[1]
    assert "peak bandwidth 1.2 GB/s (from --peak-gbs)" in summary
    assert_the_rows_of_records(lines)
    assert "policies applied: 2; in force: bbbbbbbbbbbb policies/tuned.yaml" in summary


def baseline_records():
    """Two baseline requests: plain (10 plain steps: 10 tokens in 0.05 s = 200 tok/s) and
    static:ngram:4 (2 steps of 4 accepted: 10 tokens in 0.1 s = 100 tok/s)."""
    p = summarise("p", 8, [plain(i) for i in range(10)], wall_seconds=0.05, workload="code",
                  method="plain")
    s = summarise("s", 8, [ngram(0, 4), ngram(1, 4)], wall_seconds=0.1, workload="chat",
                  method="static:ngram:4")
    return [p, s]


def test_baseline_requests_are_reported_apart_from_the_controllers(url, tmp_path):
    """The controller's requests (adaptive, adaptive:POLICY, and one stored without a method)
    give the same rows, shares and speeds as in test_report_writes_plots_and_summary; the
    baseline ones (their 10 plain steps would read "none 66.7 %" for code) are their own
    section."""
    a, b, c = records()
    a = dataclasses.replace(a, method="adaptive")
    c = dataclasses.replace(c, method="adaptive:policies/tuned.yaml")  # b: method None
    with open_store(url) as store:
        store.ingest([a, *baseline_records(), b, c], "engine-1:1", "reference", "cpu")
    out = tmp_path / "report"
    result = run("--db", url, "--out", str(out), "--peak-gbs", "1.2")
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code == 0, result.output
    lines = (out / "summary.txt").read_text().splitlines()
    assert "requests 5, output tokens 39" in lines[1]  # everything stored
    assert "the controller's requests: 3 (method adaptive, or not recorded); baseline " \
           "requests apart, below" in lines
    assert_the_rows_of_records(lines)
    row = table_rows(lines)
    at = lines.index("baseline requests: 2 (plain 1, static:ngram:4 1), tokens/s 133.3")
    assert lines[at + 1] == "their method fixed the drafter and K: not in the controller's rows above"
    assert row["method"][1:] == ["requests", "output", "accept", "len/step", "mean", "K",
                                 "tok/s", "GB/s", "util"]
    assert row["plain"][1:7] == ["1", "10", "-", "1.00", "0.00", "200.0"]
    assert row["static:ngram:4"][1:7] == ["1", "10", "1.000", "5.00", "4.00", "100.0"]


def test_a_store_of_baseline_requests_only_still_reports_its_drafters(url):
    from autospec.report import load
    from autospec.report.stats import split_traffic, summary_text
    with open_store(url) as store:
        store.ingest(baseline_records(), "b", "reference", "cpu")
        requests, policies = load(store)
    traffic = split_traffic(requests)
    assert traffic.controller == [] and list(traffic.baseline) == ["plain", "static:ngram:4"]
    assert traffic.shown == requests
    text = summary_text(requests, policies, 1.0, "given", url)
    assert "no request ran the adaptive controller: the rows below pool the 2 baseline " \
           "requests" in text
    assert "  all              none 83.3%, ngram 16.7%" in text
    assert "baseline requests: 2 (plain 1, static:ngram:4 1), tokens/s 133.3\n" \
           "their method fixed the drafter and K\n" in text


def test_report_without_plain_steps_plots_absolute_tokens_per_s(url, tmp_path):
    only_drafted = summarise("x", 8, [ngram(0, 4), draft_model(1, 0)], wall_seconds=0.1)
    with open_store(url) as store:
        store.ingest([only_drafted], "b", "reference", "cpu")
    out = tmp_path / "report"
    result = run("--out", str(out), "--peak-gbs", "10", AUTOSPEC_DB=url)  # the env var works too
    assert result.exit_code == 0, result.output
    assert "no plain steps recorded" in result.output
    assert "unlabelled" in result.output  # a request stored without a workload
    assert "policies applied: none recorded" in result.output
    assert (out / "speedup.png").read_bytes().startswith(PNG_MAGIC)


def test_empty_store_is_one_line_and_exit_1(url, tmp_path):
    open_store(url).close()
    out = tmp_path / "report"
    result = run("--db", url, "--out", str(out), "--peak-gbs", "10")
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0
    assert "holds no requests yet: nothing to report" in result.output
    assert not out.exists()  # no empty plots


@pytest.mark.parametrize("db, message", [
    ("sqlite:///{tmp}/missing.db", "no such file"),
    ("notadialect://x", "not a usable SQLAlchemy URL"),
    ("sqlite:////nonexistent-dir/autospec.db", "no such file"),
])
def test_bad_store_url_is_one_line(tmp_path, db, message):
    db = db.format(tmp=tmp_path)
    result = run("--db", db, "--out", str(tmp_path / "report"))
    assert result.exit_code == 1
    assert result.output.startswith("Error: store ") and result.output.strip().count("\n") == 0
    assert message in error_line(result) and db.split("///")[-1] in error_line(result)
    assert not (tmp_path / "missing.db").exists()  # a typo leaves no new store behind


def test_bad_peak_is_refused(filled, tmp_path):
    result = run("--db", filled, "--out", str(tmp_path / "r"), "--peak-gbs", "0")
    assert result.exit_code == 2
    assert "must be > 0 GB/s, got 0.0" in error_line(result)
