"""`autospec report`: numbers by hand on a small store, valid PNGs, clear failures."""

import dataclasses
import re

import pytest
from clirun import error_line, invoke

from autospec.report.stats import (PLAIN, drafter_speeds, mean_k, rolling_ratio,
                                   summarise_workloads)
from autospec.store import StepAggregate, open_store
from autospec.telemetry import StepRecord, summarise

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("acceptance.png", "drafters.png", "speedup.png", "bandwidth.png")
COLUMNS = ["requests", "out_tokens", "accept_rate", "tokens/step", "mean_K", "tokens/s", "GB/s",
           "util"]


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


def test_rolling_ratio_is_a_trailing_ratio_of_sums():
    # not a mean of ratios: (7 + 0) / (10 + 4) = 0.5, where the mean of 0.7 and 0 is 0.35
    assert rolling_ratio([(7, 10), (0, 4), (4, 4)], 2) == [0.7, 0.5, 0.5]
    assert rolling_ratio([(0, 0), (2, 4), (0, 0)], 3) == [None, 0.5, 0.5]  # nothing to divide
    assert rolling_ratio([(1, 2), (3, 4)], 20) == [0.5, 4 / 6]  # fewer at the start
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        rolling_ratio([(1, 1)], 0)


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


def header_line(lines: list[str]) -> str:
    return next(ln for ln in lines if ln.startswith("workload "))


def row_line(lines: list[str], name: str) -> str:
    return next(ln for ln in lines if ln.split()[:1] == [name])


def assert_the_rows_of_records(lines: list[str]) -> None:
    """The summary's workload rows, drafter shares and speeds of records(), by hand."""
    row = table_rows(lines)
    assert row["workload"][1:] == COLUMNS  # one word per column
    assert row["code"][1:] == ["2", "13", "0.500", "2.17", "2.33", "65.0", "0.12", "10.0%"]
    assert row["chat"][1:] == ["1", "6", "1.000", "3.00", "2.00", "120.0", "0.10", "8.3%"]
    assert row["all"][1:4] == ["3", "19", "0.611"]
    ends = [m.end() for m in re.finditer(r"\S+", header_line(lines))][1:]
    for name in ("code", "chat", "all"):  # each figure right-aligned under its header
        assert [m.end() for m in re.finditer(r"\S+", row_line(lines, name))][1:] == ends
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


# -- the plots agree with the summary ---------------------------------------------------------
def summary_figures(text: str) -> tuple[dict, dict, dict]:
    """What summary.txt prints, as printed: ({row: {column: figure}} of the workload table,
    {row: {drafter: share}}, {drafter: (steps, tok/s, speedup)})."""
    lines = text.splitlines()
    at = lines.index(header_line(lines))
    table = {}
    for ln in lines[at + 1:]:
        if not ln[:1].strip():
            break
        name, *figures = ln.split()
        table[name] = dict(zip(COLUMNS, figures))
    at = lines.index("drafter shares of steps:")
    shares = {}
    for ln in lines[at + 1:]:
        if not ln.startswith("  "):
            break
        name, listed = ln.split(None, 1)
        shares[name] = dict(pair.split() for pair in listed.split(", "))
    at = next(i for i, ln in enumerate(lines) if ln.startswith("tokens/s of step time"))
    speeds = {}
    for ln in lines[at + 1:]:
        if not ln.startswith("  "):
            break
        drafter, steps, _, tokens_per_s, _, speedup = ln.split()
        speeds[drafter] = (steps, tokens_per_s, speedup)
    return table, shares, speeds


def plotted(ax) -> dict[str, list[float]]:
    """{gid: y values} of an axes' lines, as drawn."""
    return {line.get_gid(): [float(y) for y in line.get_ydata()] for line in ax.get_lines()}


def legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def rendered(url, window=20):
    from autospec.report import PLOTS, render
    with open_store(url) as store:
        report = render(store, peak_gbs=1.2, window=window)
    assert tuple(report.figures) == PLOTS
    return report


def test_every_plot_reads_back_as_the_summarys_numbers(filled):
    """Each plot's data, read off its matplotlib Figure, is the figure summary.txt prints, to
    the printed digits. records() is built so that a mean of per-request figures differs from
    the pooled one the summary prints (code's acceptance: mean of 0.7 and 0 is 0.35, pooled
    0.5; its utilisation: mean 10.3 %, pooled 10.0 %): the plots must pool too."""
    report = rendered(filled)
    table, shares, speeds = summary_figures(report.text)
    workloads = ("chat", "code")

    top, bottom = report.figures["acceptance.png"].axes
    (bandwidth,) = report.figures["bandwidth.png"].axes
    for ax, column, fmt in ((top, "accept_rate", ".3f"), (bottom, "mean_K", ".2f"),
                            (bandwidth, "util", ".1%")):
        lines = plotted(ax)
        assert sorted(lines) == sorted(f"{kind}:{w}" for kind in ("each", "rolling", "whole")
                                       for w in workloads)
        for w in workloads:
            printed = table[w][column]
            assert {format(y, fmt) for y in lines[f"whole:{w}"]} == {printed}, (column, w)
            # the window (20, capped at 2) covers each workload: its line ends on that figure
            assert format(lines[f"rolling:{w}"][-1], fmt) == printed, (column, w)
            assert any(text.startswith(f"{w}: {printed}") for text in legend(ax)), legend(ax)
    assert plotted(top)["each:code"] == pytest.approx([0.7, 0.0])
    assert plotted(top)["rolling:code"] == pytest.approx([0.7, 0.5])  # pooled, not 0.35
    # a: 4 MB in 0.035 s of steps, b: 2 MB in 0.015 s; peak 1.2 GB/s
    assert plotted(bandwidth)["each:code"] == pytest.approx([4e6 / 0.035 / 1.2e9,
                                                             2e6 / 0.015 / 1.2e9])
    assert plotted(bandwidth)["rolling:code"][-1] == pytest.approx(6e6 / 0.05 / 1.2e9)
    assert f"code: {table['code']['util']} ({table['code']['GB/s']} GB/s)" in legend(bandwidth)

    (ax,) = report.figures["drafters.png"].axes
    names = [t.get_text() for t in ax.get_xticklabels()]
    assert names == list(shares) == ["chat", "code", "all"]
    for bars in ax.containers:
        drafter = bars.get_label()
        for name, bar in zip(names, bars):
            printed = shares[name].get(drafter)
            assert (format(bar.get_height(), ".1%") if printed else bar.get_height()) \
                == (printed or 0.0), (name, drafter)
    assert sorted(b.get_label() for b in ax.containers) == sorted({d for row in shares.values()
                                                                   for d in row})

    (ax,) = report.figures["speedup.png"].axes
    (bars,) = ax.containers
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == [f"{d}\n{steps} steps" for d, (steps, _, _) in speeds.items()]
    assert [format(b.get_height(), ".2f") + "x" for b in bars] \
        == [speedup for _, _, speedup in speeds.values()]
    assert [t.get_text() for t in ax.texts] == [speedup for _, _, speedup in speeds.values()]


def test_plot_titles_say_what_is_plotted(filled):
    report = rendered(filled)  # --window 20 over workloads of 2 and 1 requests
    acceptance = report.figures["acceptance.png"]
    title = acceptance.get_suptitle()
    assert "over the controller's requests in ingest order" in title
    assert "solid: pooled over its workload's requests so far" in title
    assert "20" not in title  # no window wider than the data
    top, bottom = acceptance.axes
    assert top.get_title() == "acceptance rate = accepted / proposed draft tokens"
    assert bottom.get_title().startswith("mean K = draft tokens asked per step, steps-weighted")
    title = report.figures["bandwidth.png"].get_suptitle()
    assert "GB moved / step (draft + verify) seconds, as % of peak 1.2 GB/s" in title
    assert report.figures["bandwidth.png"].axes[0].get_ylabel() == "% of peak 1.2 GB/s"
    assert "share of decoding steps by drafter, per workload" in \
        report.figures["drafters.png"].axes[0].get_title().lower()
    assert report.figures["speedup.png"].axes[0].get_title().startswith(
        "Speedup by drafter: tokens/s of step time (draft + verify) relative to plain steps")

    narrow = rendered(filled, window=1)  # narrower than the data: the line is the dots
    assert "(a window of 1 request)" in narrow.figures["acceptance.png"].get_suptitle()
    lines = plotted(narrow.figures["acceptance.png"].axes[0])
    assert lines["rolling:code"] == lines["each:code"] == pytest.approx([0.7, 0.0])


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
    assert row["method"][1:] == COLUMNS
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
