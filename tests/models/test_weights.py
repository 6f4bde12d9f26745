"""models/weights.py: a pair at float32, bfloat16 or int4 — its blocks as a GGUF stores them,
its products by the int4 kernel, speculative output identical to plain at the same format,
and bad formats refused or warned about with the reason."""
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from autospec.cli import main
from autospec.engine.loop import Engine
from autospec.engine.jobs import Job
from autospec.models import quantized, weights
from autospec.models.gguf import read_gguf_blocks
from autospec.models.products import Product
from autospec.models import ModelLoadError
from autospec.models.pair import load_pair, weight_bytes
from autospec.models.sampling import SamplingParams
from autospec.models.ties import near_tie
from conftest import KS, NEAR_TIE, REPO_ROOT, assert_lossless, divergences, plain_and_speculative

WORKLOAD = REPO_ROOT / "configs" / "workloads" / "reference.jsonl"


@pytest.fixture(scope="module", params=["bfloat16", "int4"])
def engine(request):
    return Engine(load_pair(weights=request.param))


def _prompts(n):
    rows = [json.loads(line) for line in WORKLOAD.read_text().splitlines()]
    return [r["prompt"] for r in rows[::max(1, len(rows) // n)][:n]]


# --- the blocks -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_gguf_blocks_are_the_values_gguf_dequantizes(tmp_path, kind):
    """Blocks read from a GGUF de-quantize to exactly what the gguf library de-quantizes; Q and
    K rows come back in transformers' order; a layer tensor of another type is named and left
    out (int4 quantizes it at load)."""
    import gguf
    from gguf.quants import dequantize, quantize
    rng = np.random.default_rng(0)
    heads, head_dim, hidden = 2, 16, 64
    kind_type = gguf.GGMLQuantizationType[kind]
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    originals = {}
    for name, rows in (("attn_q", heads * head_dim), ("ffn_up", 96)):
        values = rng.standard_normal((rows, hidden)).astype(np.float32)
        packed = quantize(values, kind_type)
        originals[name] = dequantize(packed, kind_type)
        w.add_tensor(f"blk.0.{name}.weight", packed, raw_dtype=kind_type)
    eight = quantize(rng.standard_normal((32, hidden)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.ffn_down.weight", eight, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    warned = []
    blocks = read_gguf_blocks(tmp_path / "m.gguf", heads, heads, warn=warned.append)
    assert sorted(blocks) == ["model.layers.0.mlp.up_proj", "model.layers.0.self_attn.q_proj"]
    assert len(warned) == 1 and "ffn_down" in warned[0] and "Q8_0" in warned[0]
    up = blocks["model.layers.0.mlp.up_proj"].dequantize().numpy()
    np.testing.assert_allclose(up, originals["ffn_up"], rtol=0, atol=1e-6)
    q = originals["attn_q"].reshape(heads, head_dim // 2, 2, hidden).swapaxes(1, 2).reshape(-1, hidden)
    np.testing.assert_allclose(blocks["model.layers.0.self_attn.q_proj"].dequantize().numpy(), q,
                               rtol=0, atol=1e-6)
    weights.save_blocks(blocks, tmp_path / "b.safetensors")
    again = weights.load_blocks(tmp_path / "b.safetensors")
    assert all(torch.equal(again[k].q, blocks[k].q) for k in blocks)


def test_int4_products_are_the_blocks_values_and_rows_do_not_interact():
    """Up to quantized.widest(4) rows by the int4 kernel, a row's output the same bits at any row
    count; from there by oneDNN over the blocks' values in bfloat16: both the blocks' function."""
    widest = quantized.widest(4)
    torch.manual_seed(0)
    gate, up = torch.nn.Linear(64, 96, bias=False), torch.nn.Linear(64, 48, bias=False)
    model = torch.nn.Sequential(gate, up)
    weights.apply(model, "int4")
    blocks = [weights.blocks_of(m).dequantize() for m in (gate, up)]
    x = torch.randn(widest + 3, 64).to(torch.bfloat16)
    with torch.inference_mode():
        for rows in (widest, widest + 3):
            out = Product(gate, up)(x[:rows])
            want = torch.cat([x[:rows].float() @ b.t() for b in blocks], -1)
            torch.testing.assert_close(out.float(), want, atol=0.05, rtol=0.01)
        few = Product(gate, up)(x[:widest])
        # a row is a row of several on one path (test_quantized): on AMX 3-15 rows and 16-widest
        wide = quantized.AMX_WIDE_FROM if quantized._STATE["amx"] else widest
        for first, last in ((quantized.AMX_FROM, min(wide, widest) - 1), (wide, widest)):
            whole = Product(gate, up)(x[:last])
            for rows in range(first, last):
                assert torch.equal(Product(gate, up)(x[:rows]), whole[:rows])
        # up to widest it is the int4 kernel over the stacked blocks, not a bfloat16 product
        stacked = quantized.int4_forms(
            weights.stack_blocks([weights.blocks_of(m) for m in (gate, up)]))
        assert torch.equal(few, quantized.mm(x[:widest], stacked))


def test_int4_bytes_are_what_the_blocks_store_and_the_roofline_counts_them():
    """Each quantized weight: half a byte a value plus two bfloat16 numbers a block of 32,
    against bfloat16's 2 bytes; the head a byte a value plus a bfloat16 scale a row (untied
    from the embedding, which a step reads a row of: not counted); the norms stay bfloat16."""
    bf16, i4 = load_pair(weights="bfloat16", with_draft=False), load_pair(weights="int4", with_draft=False)
    assert weights.format_of(i4.target) == "int4"
    quantized = sum(m.weight.numel() for m in i4.target.modules() if weights.blocks_of(m) is not None)
    assert quantized > 0.5 * sum(p.numel() for p in i4.target.parameters())
    values, scales = weights.int8_of(i4.target.lm_head)
    assert values.dtype == torch.int8 and scales.shape == (values.shape[0],)
    assert i4.target.lm_head.weight.data_ptr() != i4.target.model.embed_tokens.weight.data_ptr()
    head = values.numel()
    assert weight_bytes(bf16.target) - weight_bytes(i4.target) == (
        quantized * (2 - 0.5 - 4 / 32) + head * (2 - 1) - 2 * scales.numel())


def test_the_8_bit_head_runs_the_8_bit_kernel_for_a_few_rows_its_values_for_more():
    i4 = load_pair(weights="int4", with_draft=False).target
    head = i4.lm_head
    values, scales = weights.int8_of(head)
    widest = quantized.widest(8)
    x = torch.randn(widest + 2, head.in_features).to(torch.bfloat16)
    from autospec.models.forward import step_products
    (_, product, _), = [p for p in step_products(i4) if p[0] == "head"]
    forms = quantized.int8_forms(values, scales)
    assert torch.equal(product(x[:widest]), quantized.mm(x[:widest], forms))
    # more rows: oneDNN over the values in bfloat16, the same function
    assert (product(x).float() - torch.nn.functional.linear(x, head.weight).float()).abs().max() < 0.1


def test_a_subset_head_at_int4_is_the_targets_8_bit_rows_and_runs_the_8_bit_kernel():
    """A feature head's (or shared draft's) rows of the target's head: at int4 their 8-bit
    values and scales are the target head's own rows (each row quantized alone), and its
    scores run the 8-bit kernel."""
    from autospec.models.eagle_head import EagleHead
    from autospec.models.forward import head_scores
    pair = load_pair(weights="float32", with_draft=False)
    ids = torch.arange(0, pair.target.config.vocab_size, 3)[:64]
    head = EagleHead(pair.target, ids).eval()
    weights.apply(pair.target, "int4")
    weights.apply(head, "int4")
    values, scales = weights.int8_of(head.lm_head)
    target_values, target_scales = weights.int8_of(pair.target.lm_head)
    assert torch.equal(values, target_values[ids]) and torch.equal(scales, target_scales[ids])
    x = torch.randn(3, head.config.hidden_size).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(head_scores(head, x),
                           quantized.mm(x, quantized.int8_forms(values, scales)))


# --- lossless at each format ------------------------------------------------------------------

@pytest.mark.parametrize("drafter", ["ngram", "draft-model", "early-exit"])
def test_greedy_speculative_is_plain_at_the_same_format(engine, drafter):
    for prompt in _prompts(2):
        for k in KS:
            plain, spec = plain_and_speculative(engine, prompt, drafter, k, n=32)
            assert_lossless(engine.models, prompt, plain.token_ids, spec.token_ids)


def test_a_mixed_batch_is_plain_at_the_same_format(engine):
    prompts = _prompts(4)
    ids = [engine.encode(p) for p in prompts]
    plain = [engine.generate(i, drafter=None, max_new_tokens=24).token_ids for i in ids]
    batch = Engine(engine.models, max_batch=4)
    jobs = [Job(i, 24, SamplingParams(0.0), 0) for i in ids]
    from autospec.controller.factory import make_controller
    from autospec.method import parse_method
    out = batch.run(jobs, make_controller(parse_method("adaptive")))
    for i, _, margin in divergences(engine.models, ids, [g.token_ids for g in out], plain):
        assert margin < near_tie(engine.models.target, ids[i] + plain[i])


# --- quality and bad input --------------------------------------------------------------------

def test_quality_measures_each_format_against_float32(tmp_path):
    out = tmp_path / "q.json"
    result = CliRunner().invoke(main, ["models", "quality", "--limit", "1", "--max-new-tokens", "16",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert list(report) == ["float32", "bfloat16", "int4"]
    assert report["float32"]["agreement"]["identical_share"] == 1.0
    # float32's near-tie holds the spread it stands for; bfloat16's is measured text by text
    assert report["float32"]["rounding_spread"] < NEAR_TIE / 2
    assert min(report[w]["rounding_spread"] for w in ("bfloat16", "int4")) > NEAR_TIE
    assert abs(report["int4"]["log_likelihood"] - report["float32"]["log_likelihood"]) < 0.2


def test_an_unknown_format_names_the_accepted_ones():
    with pytest.raises(ModelLoadError, match="unknown weight format 'int8' .accepted: auto, float32, "
                                             "bfloat16, int4"):
        load_pair(weights="int8")
    result = CliRunner().invoke(main, ["bench", "--weights", "float32,int8"])
    assert result.exit_code == 2 and "accepted: auto, float32, bfloat16, int4" in result.output
    result = CliRunner().invoke(main, ["generate", "x", "--weights", "fp8"])
    assert result.exit_code == 2 and "'fp8' is not one of 'auto', 'float32'" in result.output


def test_auto_is_the_targets_own_format(tmp_path):
    from autospec.models import weights as w
    assert w.resolve("auto", tmp_path) == "float32"  # a checkpoint as stored
    (tmp_path / "autospec").mkdir()
    (tmp_path / "autospec" / "int4-blocks.safetensors").write_bytes(b"")
    assert w.resolve("auto", tmp_path) == "int4"  # a GGUF's blocks kept beside it at fetch
    assert w.resolve("bfloat16", tmp_path) == "bfloat16"


def test_a_cpu_without_bfloat16_products_is_warned_about(monkeypatch):
    monkeypatch.setattr(weights, "cpu_flags", lambda: {"avx2", "fma"})
    line = weights.warn_if_slow("int4")
    assert "neither avx512_bf16 nor AMX" in line and "--weights float32" in line
    monkeypatch.setattr(weights, "cpu_flags", lambda: {"avx512_bf16"})
    assert weights.warn_if_slow("bfloat16") is None


def test_int4_without_the_kernel_is_refused_with_what_to_run(monkeypatch):
    monkeypatch.setattr(weights, "_KERNEL_CHECKED", [])

    def missing(self):
        raise RuntimeError("no int4 kernel for this CPU")
    monkeypatch.setattr(weights.Int4Blocks, "packed", missing)
    with pytest.raises(ModelLoadError, match="run --weights bfloat16 instead"):
        load_pair(weights="int4", with_draft=False)


def test_bench_runs_every_method_at_every_format_keyed_method_at_format(tmp_path):
    out = tmp_path / "b.json"
    result = CliRunner().invoke(main, ["bench", "--weights", "float32,int4", "--methods",
                                       "plain,static:ngram:4", "--limit", "1",
                                       "--max-new-tokens", "16", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert list(report["methods"]) == ["plain@float32", "static:ngram:4@float32", "plain@int4",
                                       "static:ngram:4@int4"]
    methods = report["methods"]
    assert methods["plain@float32"]["overall"]["speedup_vs_plain"] == 1.0
    assert methods["static:ngram:4@int4"]["overall"]["identical_to_plain"] is not None
    assert report["models"]["weights"]["int4"]["weights"] == "int4"
    assert "plain@int4 read" in result.output  # its bandwidth, counting the bytes it stores


class _TieModel(torch.nn.Module):
    """Logits known by construction: after any token, tokens 1 and 2 tie at the top (margin
    0) when the token is even, token 3 leads by 5 when it is odd."""

    def forward(self, ids):
        logits = torch.zeros(*ids.shape, 8)
        even = (ids % 2 == 0)
        logits[..., 1] = torch.where(even, 5.0, 0.0)
        logits[..., 2] = torch.where(even, 5.0, 0.0)
        logits[..., 3] = torch.where(even, 0.0, 5.0)
        return type("Out", (), {"logits": logits})()


def test_the_bench_verdict_allows_a_divergence_only_at_a_near_tie():
    from autospec.models.ties import verdict
    model, prompt = _TieModel(), [[4]]
    assert verdict(model, prompt, [[1, 3]], [[1, 3]]) == (True, [])
    same, parted = verdict(model, prompt, [[2, 2]], [[1, 3]])  # after 4 (even): a tie
    assert same == "near-tie" and parted == [{"prompt": 0, "position": 0, "margin": 0.0,
                                              "limit": NEAR_TIE}]
    same, parted = verdict(model, prompt, [[1, 2]], [[1, 3]])  # after 1 (odd): margin 5
    assert same is False and parted[0]["margin"] == 5.0
