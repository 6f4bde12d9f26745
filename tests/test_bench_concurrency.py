"""`autospec bench --concurrency`: each method under N closed-loop clients, on the reference pair."""
import json

import pytest
from clirun import error_line, invoke

LOAD_KEYS = {"throughput_tokens_per_s", "itl_p50_ms", "itl_p99_ms", "ttft_p50_ms", "ttft_p99_ms",
             "tokens_per_s", "speedup_vs_plain", "identical_to_plain", "acceptance_rate",
             "mean_accepted_length", "tokens", "wall_s"}


def test_bench_under_load_writes_by_concurrency(tmp_path):
    out = tmp_path / "bench.json"
    result = invoke(["bench", "--limit", "2", "--max-new-tokens", "8", "--concurrency", "1,2",
                     "--methods", "plain,static:ngram:2,ctl:batch-table,hf:generate",
                     "--json", out])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert set(report) >= {"methods", "measured", "models", "machine", "by_concurrency"}
    assert set(report["by_concurrency"]) == {"1", "2"}
    for level in report["by_concurrency"].values():
        # hf: peers run only one request at a time: left out under load, and named
        assert set(level["methods"]) == {"plain", "static:ngram:2", "ctl:batch-table"}
        for name, stats in level["methods"].items():
            assert set(stats["by_category"]) == {"completion", "copy-heavy", "prose"}
            for s in [stats["overall"], *stats["by_category"].values()]:
                assert set(s) >= LOAD_KEYS, name
                assert s["throughput_tokens_per_s"] > 0 and s["ttft_p50_ms"] > 0
            assert stats["overall"]["identical_to_plain"] is True, name
            assert stats["overall"]["tokens"] == 6 * 8
        assert level["methods"]["plain"]["overall"]["speedup_vs_plain"] == pytest.approx(1.0)
    assert report["settings"]["not_under_load"] == ["hf:generate"]
    assert "| 2 | ctl:batch-table |" in result.output


@pytest.mark.parametrize("levels, bad", [("1,0", "'0'"), ("4,-2", "'-2'"), ("1,x", "'x'"),
                                         ("2.5", "'2.5'"), ("1,,4", "''")])
def test_bad_concurrency_names_the_entry(levels, bad):
    result = invoke(["bench", "--concurrency", levels, "--methods", "plain"])
    line = error_line(result)
    assert "--concurrency" in line and f"concurrency entry {bad} is not a positive integer" in line
