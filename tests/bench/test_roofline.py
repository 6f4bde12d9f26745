"""The roofline (bench/roofline.py): a forward's bytes and FLOPs from the model's shapes, its
bound from the two peaks, and the report's grouping of measured steps by shape."""
import pytest

from autospec.bench.roofline import (format_step_profile, forward_bound, roofline,
                                     step_profile)
from autospec.models.kv import kv_bytes_per_token
from autospec.models.pair import weight_bytes
from autospec.telemetry import StepRecord
from conftest import random_llama


def test_a_forward_s_bytes_flops_and_bound():
    model = random_llama(32, seed=0, layers=2)
    cfg = model.config
    weights, kv = weight_bytes(model), kv_bytes_per_token(model)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    bound = forward_bound(model, rows=4, tokens=3, context=100, copy_gbs=10.0, matmul_gflops=100.0)
    assert bound["bytes"] == weights + 4 * 103 * kv  # every weight once, each row's K and V
    assert bound["flops"] == (2 * (weights // 4) * 12  # float32: 2 FLOPs a weight a token
                              + 4 * 2 * cfg.num_attention_heads * head_dim * 12 * 103)
    assert bound["bound_s"] == pytest.approx(max(bound["bytes"] / 10e9, bound["flops"] / 100e9))
    assert bound["limit"] == "memory"
    # with memory to spare, the arithmetic bounds it
    fast = forward_bound(model, 4, 3, 100, copy_gbs=1e9, matmul_gflops=1.0)
    assert fast["limit"] == "compute" and fast["bound_s"] == pytest.approx(fast["flops"] / 1e9)


def test_steps_are_grouped_by_shape_with_their_median():
    model = random_llama(32, seed=0, layers=2)
    def step(rows, width, seconds, context=50):
        return StepRecord("r", 0, "ngram", width - 1, width - 1, 0, 1, 0.0, seconds, width,
                          context, 0, 0.0, batch_size=rows, batch_tokens=rows * width,
                          batch_width=width)
    steps = [step(1, 1, s) for s in (0.010, 0.030, 0.020)] + [step(4, 5, 0.050)]
    rows = roofline(steps, model, 10.0, 100.0)
    assert [(r["rows"], r["width"], r["steps"]) for r in rows] == [(1, 1, 3), (4, 5, 1)]
    plain = rows[0]
    assert plain["measured_s"] == 0.020 and plain["context"] == 50
    assert plain["of_bound"] == pytest.approx(
        forward_bound(model, 1, 1, 50, 10.0, 100.0)["bound_s"] / 0.020)


def test_the_step_profile_splits_a_one_token_forward(tiny_engine):
    ids = tiny_engine.encode("def add(a, b):\n    return a + b\n")
    free = list(tiny_engine.cache.free)
    profile = step_profile(tiny_engine, ids, copy_gbs=10.0)
    assert tiny_engine.cache.free == free  # its row given back
    assert profile["context"] == len(ids) - 1 and not profile["compiled"]  # eager under pytest
    parts = profile["layers_s"] + profile["head_s"] + profile["attention_s"] + profile["rest_s"]
    assert parts == pytest.approx(profile["forward_s"])
    assert profile["layers_s"] > 0 and profile["head_s"] > 0 and profile["attention_s"] > 0
    assert profile["weights_s"] == pytest.approx(profile["weight_bytes"] / 10e9)
    assert profile["verify_3"] > 0 and profile["verify_5"] > 0
    lines = format_step_profile(profile, " of tiny").splitlines()
    assert lines[0].startswith("one-token forward of tiny (float32, eager, ")
    assert "products" in lines[1] and "attention" in lines[1] and "the rest" in lines[1]
    assert "at the copy peak (10.0 GB/s)" in lines[2]


def test_bench_profile_prints_and_keeps_the_step_profile(tiny_dir, tmp_path):
    import json
    from clirun import invoke
    out = tmp_path / "bench.json"
    result = invoke(["bench", "--limit", "1", "--max-new-tokens", "4", "--methods", "plain",
                     "--profile", "--json", out, "--target", tiny_dir / "target"])
    assert result.exit_code == 0, result.output
    assert "one-token forward of " in result.output and "weight reads: " in result.output
    profile = json.loads(out.read_text())["step_profile"]["float32"]
    assert profile["forward_s"] > 0 and profile["format"] == "float32"
