"""`autospec report --bench A.json B.json`: the one-setting table over bench reports."""
import json

from autospec.bench.one_setting import is_fixed, one_setting_table
from tests.clirun import error_line, invoke


def _report(pair, workload, batch1, by_level):
    return {"settings": {"pair": pair, "workload": workload},
            "methods": {spec: {"overall": {"tokens_per_s": v}} for spec, v in batch1.items()},
            "by_concurrency": {level: {"methods": {spec: {"overall": {"throughput_tokens_per_s": v}}
                                                   for spec, v in values.items()}}
                               for level, values in by_level.items()}}


def test_the_best_single_fixed_setting_against_adaptive(tmp_path):
    """ngram:8 is best at batch 1 and loses at 16 rows, ngram:2 the other way round: the best
    single fixed setting's worst cell is 0.75; adaptive's 0.96."""
    a = tmp_path / "a.json"
    a.write_text(json.dumps(_report("smollm2", "chat",
                                    {"plain": 10, "static:ngram:2": 15, "static:ngram:8": 20,
                                     "adaptive": 21, "hf:generate": 30},
                                    {"16": {"plain": 100, "static:ngram:2": 125,
                                            "static:ngram:8": 90, "adaptive": 120}})))
    result = invoke(["report", "--bench", a])
    assert result.exit_code == 0, result.output
    rows = {line.split(" | ")[0].strip("| "): line for line in result.output.splitlines()}
    assert "smollm2 · chat · N=1 | smollm2 · chat · N=16" in result.output
    assert rows["static:ngram:2"].endswith("| 0.75 | 1.00 | 0.75 |")
    assert rows["static:ngram:8"].endswith("| 1.00 | 0.72 | 0.72 |")
    assert rows["adaptive"].endswith("| 1.05 | 0.96 | 0.96 |")
    assert "hf:generate" not in rows  # a peer, not a setting of ours; nor the best of a cell
    assert "best single fixed setting: static:ngram:2, worst cell 0.75" in result.output
    assert "adaptive: worst cell 0.96" in result.output


def test_a_file_that_is_not_a_bench_report_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"methods": 3}')
    assert "bad.json: not an `autospec bench --json` report" in error_line(
        invoke(["report", "--bench", bad]))


def test_a_vllm_report_by_category_counts_vllms_settings_as_fixed_and_not_ours(tmp_path):
    """--engine vllm's methods: vllm:* are fixed settings, ours:* another engine (left out);
    --by-category: a cell per category, by its requests' own speed (tokens_per_s)."""
    def stats(copy, chat):
        return {"overall": {"throughput_tokens_per_s": copy + chat},
                "by_category": {"copy": {"tokens_per_s": copy}, "chat": {"tokens_per_s": chat}}}
    report = {"settings": {"pair": "reference", "workload": "mix", "categories": ["chat", "copy"]},
              "by_concurrency": {"1": {"methods": {
                  "plain": stats(10, 10), "vllm:ngram:8": stats(40, 10), "vllm:ngram:2": stats(20, 12),
                  "adaptive": stats(38, 12), "ours:adaptive": stats(90, 90)}}}}
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(report))
    result = invoke(["report", "--bench", path, "--by-category"])
    assert result.exit_code == 0, result.output
    rows = {line.split(" | ")[0].strip("| "): line for line in result.output.splitlines()}
    assert "reference · mix · chat · N=1 | reference · mix · copy · N=1" in result.output
    assert rows["vllm:ngram:8"].endswith("| 0.83 | 1.00 | 0.83 |")
    assert rows["adaptive"].endswith("| 1.00 | 0.95 | 0.95 |")
    assert "ours:adaptive" not in rows
    assert "best single fixed setting: vllm:ngram:8, worst cell 0.83" in result.output


def report(speeds: dict[str, float], workload: str) -> dict:
    return {"settings": {"pair": "reference", "workload": workload},
            "methods": {spec: {"overall": {"tokens_per_s": v}} for spec, v in speeds.items()}}


def test_fixed_settings_are_known_by_kind_at_any_format(tmp_path):
    assert all(map(is_fixed, ("plain", "plain@int4", "static:ngram:4@int4", "ctl:ema",
                              "vllm:ngram:2")))
    assert not any(map(is_fixed, ("adaptive", "adaptive@int4", "hf:generate", "ours:plain",
                                  "oracle")))
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(report({"plain@int4": 10, "static:ngram:2@int4": 20,
                                    "adaptive@int4": 18}, "chat")))
    b.write_text(json.dumps(report({"plain@int4": 10, "static:ngram:2@int4": 8,
                                    "adaptive@int4": 12}, "prose")))
    table = one_setting_table([a, b])
    # each fixed setting's worst cell: plain 0.50 (chat), n-gram 0.80 (prose); adaptive's 0.90
    assert "| plain@int4 | 0.50 | 1.00 | 0.50 |" in table
    assert "best single fixed setting: static:ngram:2@int4, worst cell 0.80" in table
    assert "adaptive@int4: worst cell 0.90" in table
