"""`autospec bench --engine vllm`: its methods parsed, and one short real run on the reference
pair, closed and open loop (a process of its own, as a user runs it: vLLM starts one engine
process per method)."""
import json
import os
import subprocess
import sys

import pytest
from clirun import error_line, invoke
from conftest import REPO_ROOT

from autospec.method import parse_method, parse_methods
from autospec.vllm.bench import speculative_config, start_engines

POLICY = REPO_ROOT / "policies" / "mixed.yaml"
SHAPE = ("tokens_per_s", "throughput_tokens_per_s", "identical_to_plain", "speedup_vs_plain",
         "itl_p50_ms", "ttft_p50_ms", "mean_accepted_length")


def config(text, k_limit=8, **kwargs):
    return speculative_config(parse_method(text), k_limit, **kwargs)


def test_methods_map_to_vllms_configs():
    assert config("plain") is None
    assert config("vllm:ngram:3") == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
        "prompt_lookup_max": 4}
    assert config("adaptive", 6) == {"method": "custom_class", "model": "autospec.vllm.Proposer",
                                     "num_speculative_tokens": 6}
    assert config("vllm:eagle:2", eagle_dir="/head") == {"method": "eagle", "model": "/head",
                                                         "num_speculative_tokens": 2}
    # K of the smallest size >= the batch, 0 above the largest: as inclusive ranges to 16 rows
    dynamic = config("vllm:dynamic:1=4/4=2/8=1", max_rows=16)
    assert dynamic["num_speculative_tokens_per_batch_size"] == [(1, 1, 4), (2, 4, 2), (5, 8, 1),
                                                                 (9, 16, 0)]
    assert dynamic["num_speculative_tokens"] == 4
    assert [m.spec for m in parse_methods("adaptive", "vllm")] == ["plain", "adaptive"]


@pytest.mark.parametrize("text, message", [
    ("vllm:ngram:0", "K must be >= 1 in method 'vllm:ngram:0', got 0"),
    ("vllm:medusa:2", "unknown method 'vllm:medusa:2' (known: plain, "),
    ("adaptive:/nonexistent.yaml", "nonexistent.yaml"),
    ("static:ngram:4", "method 'static:ngram:4' runs on autospec's engine, not inside vLLM: give "
                       "'ours:static:ngram:4'"),
    ("ours:vllm:ngram:2", "'vllm:ngram:2' runs inside vLLM only"),
])
def test_bad_methods_are_refused_naming_them(text, message):
    with pytest.raises(ValueError) as err:
        parse_methods(text, "vllm")
    assert message in str(err.value)


@pytest.mark.parametrize("engine, methods, message", [
    ("vllm", "plain,static:ngram:4", "method 'static:ngram:4' runs on autospec's engine, not "
                                     "inside vLLM"),
    ("autospec", "plain,vllm:ngram:2", "method 'vllm:ngram:2' runs inside vLLM only"),
    ("autospec", "ours:plain", "method 'ours:plain' runs beside vLLM only"),
])
def test_each_engine_refuses_the_others_methods_before_loading_anything(engine, methods, message):
    result = invoke(["bench", "--engine", engine, "--methods", methods])
    assert message in error_line(result)


def test_eagle_without_an_exported_head_is_refused():
    with pytest.raises(ValueError, match="no feature head exported for vLLM"):
        config("vllm:eagle:2")


def test_each_engine_starts_with_its_policy_and_the_drafter_options(monkeypatch):
    """What an engine process reads at start (the proposer: AUTOSPEC_POLICY and
    AUTOSPEC_DRAFTER_OPTIONS); the bench's own environment as it was after."""
    vllm = pytest.importorskip("vllm", reason="vLLM's CPU build (pip install -e '.[vllm]')")
    names = ("AUTOSPEC_POLICY", "AUTOSPEC_DRAFTER_OPTIONS")
    monkeypatch.setattr(vllm, "LLM", lambda *args, **kwargs: {n: os.environ.get(n) for n in names})
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_ALLOW_INSECURE_SERIALIZATION"):
        monkeypatch.setenv(name, "1")  # start_engines sets them: restored after the test
    monkeypatch.setenv("AUTOSPEC_POLICY", "outer.yaml")
    monkeypatch.delenv("AUTOSPEC_DRAFTER_OPTIONS", raising=False)
    plain, adaptive = parse_methods(f"adaptive:{POLICY}", "vllm")
    engines = start_engines("model", {plain: None, adaptive: {"method": "custom_class"}},
                            "float32", 64, 4, 0, drafter_options={"ngram": {"n_min": 2}})
    options = '{"ngram": {"n_min": 2}}'
    assert engines == {plain: {"AUTOSPEC_POLICY": None, "AUTOSPEC_DRAFTER_OPTIONS": options},
                       adaptive: {"AUTOSPEC_POLICY": str(POLICY),
                                  "AUTOSPEC_DRAFTER_OPTIONS": options}}
    assert os.environ["AUTOSPEC_POLICY"] == "outer.yaml"
    assert "AUTOSPEC_DRAFTER_OPTIONS" not in os.environ


def test_a_short_run_writes_the_bench_json_with_every_output_identical_to_vllms_plain(tmp_path):
    pytest.importorskip("vllm", reason="vLLM's CPU build (pip install -e '.[vllm]')")
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "autospec", "bench", "--engine", "vllm",
                          "--limit", "1", "--max-new-tokens", "24", "--concurrency", "1,4",
                          "--arrivals", "8:1,2:1", "--rows", "4",
                          "--drafter-option", "ngram.n_max=4",  # reaches the proposer: checked there
                          "--methods", "plain,vllm:ngram:2,vllm:dynamic:1=2/2=1,adaptive,ours:plain",
                          "--json", out], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["engine"] == "vllm" and set(report["by_concurrency"]) == {"1", "4"}
    assert report["methods"] == report["by_concurrency"]["1"]["methods"]
    for level in ("1", "4"):
        methods = report["by_concurrency"][level]["methods"]
        assert set(methods) == {"plain", "vllm:ngram:2", "vllm:dynamic:1=2/2=1", "adaptive",
                                "ours:plain"}
        for spec, stats in methods.items():
            assert all(key in stats["overall"] for key in SHAPE), spec
            assert stats["overall"]["identical_to_plain"] is True, (level, spec)
        assert set(report["proposer_share"]["adaptive"]) == {"1", "4"}
    assert "| 4 | adaptive |" in run.stdout
    arrivals = report["arrivals"]  # open loop: every method, every request, the same outputs
    assert set(arrivals["methods"]) == set(methods)
    for spec, stats in arrivals["methods"].items():
        assert stats["overall"]["completed"] == arrivals["requests"], spec
        assert stats["overall"]["identical_to_plain"] is True, spec
