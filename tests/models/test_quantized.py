"""autospec's int4 and int8 kernels (models/quantized.py, quantized.cpp): the weight's product
within bfloat16's rounding, as torch's kernels' are; a row's bits the same in any batch; bad
input refused with what is wrong; built once into the cache and loaded by a later process;
where they cannot be built, one warning and torch's kernels; and the compiled int4 forward,
which calls the int4 one from AOTInductor's library, gives the eager forward's logits.

The kernels are built into the user's cache as in use (~6-15 s once per machine and torch)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest
import torch

from autospec.models import compiled, quantized, weights
from autospec.models.forward import _PLANS, _plan
from autospec.models.ties import near_tie

pytestmark = pytest.mark.skipif(not quantized.available(),
                                reason=f"kernels not built here: {quantized._STATE.get('why')}")


def _blocks(n: int, k: int, seed: int = 0) -> weights.Int4Blocks:
    torch.manual_seed(seed)
    return weights.quantize(torch.randn(n, k) * 0.05)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 10, 11, 12, 16, 17, 40, 64, 70])
def test_the_product_is_the_blocks_within_bfloat16_rounding(rows):
    blocks = _blocks(96, 128)
    x = torch.randn(rows, 128).to(torch.bfloat16)
    got = quantized.mm(x, quantized.int4_forms(blocks))
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 96)
    # the kernel reads scales and zeros in bfloat16, as torch's packing holds them
    exact = weights.Int4Blocks(blocks.q, blocks.scale.to(torch.bfloat16).float(),
                               blocks.zero.to(torch.bfloat16).float())
    if rows >= quantized.AMX_WIDE_FROM and quantized._STATE["amx"]:
        # the wide AMX kernel dequantizes each block to bfloat16 first, as the oneDNN path's
        # weight is (products.py), and is that product within rounding
        values = exact.dequantize(torch.bfloat16)
        torch.testing.assert_close(got.float(), x.float() @ values.float().t(), atol=2e-3,
                                   rtol=8e-3)
        torch.testing.assert_close(got, x @ values.t(), atol=4e-3, rtol=1.6e-2)
        return
    want = x.float() @ exact.dequantize().t()
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=8e-3)
    torch_kernel = quantized.mm(x, blocks.packed())
    torch.testing.assert_close(got.float(), torch_kernel.float(), atol=2e-3, rtol=8e-3)


def _int8(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An 8-bit weight as models/weights.py makes the head's: values, a bfloat16 scale a row."""
    weight = torch.randn(n, k) * 0.05
    scale = weight.abs().amax(1) / 127
    values = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return values, scale.to(torch.bfloat16)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 17, 64, 70])
def test_the_8bit_product_is_the_weights_within_bfloat16_rounding(rows):
    values, scales = _int8(80, 96)
    x = torch.randn(rows, 96).to(torch.bfloat16)
    got = quantized.mm(x, quantized.int8_forms(values, scales))
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 80)
    want = x.float() @ (values.float() * scales.float()[:, None]).t()
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=8e-3)
    torch_kernel = quantized.mm(x, (values, scales))
    torch.testing.assert_close(got.float(), torch_kernel.float(), atol=2e-3, rtol=8e-3)
    assert quantized.shape(quantized.int8_forms(values, scales)) == (80, 96)
    assert quantized.shape((values, scales)) == (80, 96)


def test_a_rows_bits_are_the_same_in_any_batch():
    """On one path: the int4 kernel's 1-2 rows, 3-15 and 16-64 (on AMX, where the CPU has it,
    a tile product's sum in another order, and from 16 each block's values dequantized before
    it); the 8-bit kernel's 1-3 rows and 4-64 (on AMX)."""
    x = torch.randn(19, 96).to(torch.bfloat16)
    int4_forms = quantized.int4_forms(_blocks(64, 96, seed=1))
    int8_forms = quantized.int8_forms(*_int8(64, 96))
    amx, wide = quantized.AMX_FROM, quantized.AMX_WIDE_FROM
    for forms, counts, whole_rows in ((int4_forms, range(1, amx - 1), amx - 1),
                                      (int4_forms, (amx, wide - 3), wide - 1),
                                      (int4_forms, (wide, 16, 17), 19), (int8_forms, (1, 2), 3),
                                      (int8_forms, (4, 8, 9, 16), 19)):
        whole = quantized.mm(x[:whole_rows], forms)
        for rows in counts:
            assert torch.equal(quantized.mm(x[:rows], forms), whole[:rows])
    torch.testing.assert_close(quantized.mm(x[:1], int4_forms), quantized.mm(x, int4_forms)[:1],
                               atol=2e-3, rtol=8e-3)


def test_bad_input_is_refused_with_what_is_wrong():
    forms = quantized.int4_forms(_blocks(32, 64))
    with pytest.raises(RuntimeError, match="bfloat16"):
        torch.ops.autospec.int4_mm(torch.randn(2, 64), forms[0], 32)
    with pytest.raises(RuntimeError, match="is not one of"):
        torch.ops.autospec.int4_mm(torch.randn(2, 96).to(torch.bfloat16), forms[0], 32)
    (tiles8,) = quantized.int8_forms(*_int8(32, 64))
    with pytest.raises(RuntimeError, match="Char tiles"):
        torch.ops.autospec.int8_mm(torch.randn(2, 64).to(torch.bfloat16), forms[0], 32)
    with pytest.raises(RuntimeError, match="is not one of"):
        torch.ops.autospec.int8_mm(torch.randn(2, 96).to(torch.bfloat16), tiles8, 32)


def test_rows_argmax_is_torchs_argmax_ties_nans_and_infinities_included():
    """Greedy accept's pick (engine/accept.py): the first maximal value's index, a NaN the
    largest (its first), rows of any length (a tail past 16), the same as torch's argmax."""
    torch.manual_seed(0)
    for trial in range(400):
        width = (49152, 37, 16, 100, 1)[trial % 5]
        x = torch.randint(-3, 4, (1 + trial % 7, width)).to(torch.bfloat16)  # ties everywhere
        if trial % 3 == 0:
            x[0, trial % width] = float("nan")
            x[-1, -1] = float("nan")
        if trial % 17 == 0:
            x[:] = -float("inf")
        if trial % 19 == 0:
            x = torch.zeros_like(x)
            x[:, ::2] = -0.0
        assert torch.equal(quantized.rows_argmax(x), x.argmax(-1)), trial
    with pytest.raises(RuntimeError, match="bfloat16"):
        torch.ops.autospec.rows_argmax(torch.randn(2, 8))


def test_pack_layout_and_shape():
    blocks = _blocks(48, 64)
    (tiles,) = quantized.int4_forms(blocks)
    assert tiles.dtype == torch.uint8 and tiles.shape == (3, 2 * quantized.BLOCK_BYTES)
    assert quantized.shape((tiles,)) == (48, 64) and quantized.shape(blocks.packed()) == (48, 64)
    # tile 0, block 0: output 0's inputs 0 and 16 share the first byte (low nibble first), its
    # 1 and 17 the second; output 1's 0 and 16 the third; chunk 1 holds inputs 2, 3 (18, 19)
    q = blocks.q
    assert tiles[0, 0].item() == int(q[0, 0]) | int(q[0, 16]) << 4
    assert tiles[0, 1].item() == int(q[0, 1]) | int(q[0, 17]) << 4
    assert tiles[0, 2].item() == int(q[1, 0]) | int(q[1, 16]) << 4
    assert tiles[0, 32 + 1].item() == int(q[0, 3]) | int(q[0, 19]) << 4


_PROBE = """
import logging, sys, torch
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from autospec.models import quantized, weights
blocks = weights.quantize(torch.randn(32, 64))
ok = quantized.available()
out = quantized.mm(torch.randn(3, 64).to(torch.bfloat16), quantized.int4_forms(blocks))
print(ok, len(quantized.int4_forms(blocks)), quantized.widest(4), tuple(out.shape))
"""


def _probe(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _PROBE], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)


def test_a_later_process_loads_the_kernel_without_building():
    done = _probe({})  # the suite's cache: this process has built it already
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "1", str(quantized.widest(4)), "(3,", "32)"]
    assert "building" not in done.stderr


def test_where_it_cannot_be_built_one_warning_and_torchs_kernel(tmp_path):
    done = _probe({"AUTOSPEC_CACHE": str(tmp_path), "CXX": str(tmp_path / "no-compiler")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "2", str(quantized.TORCH_WIDEST[4]), "(3,", "32)"]
    warned = [line for line in done.stderr.splitlines() if "kernels are off" in line]
    assert len(warned) == 1 and "torch's run instead" in warned[0]


def test_the_compiled_int4_forward_calls_the_kernel_and_gives_eagers_logits(monkeypatch):
    from autospec.models.pair import load_pair
    from test_compiled import PROMPT, _logits
    target = load_pair(weights="int4", with_draft=False).target
    monkeypatch.setenv("AUTOSPEC_COMPILE", "1")
    monkeypatch.setattr(compiled, "_FAILED", [])
    _PLANS.pop(target, None)
    ids = load_pair(with_draft=False).tokenizer.encode(PROMPT)
    feeds = [len(ids) - 22] + [3, 1, 5, 1] * 2 + [1] * 2  # verifies of 3 and 5, single steps
    graph = _plan(target).graph
    wide = compiled.widest(True)  # a verify at k_max (17 tokens) on AMX; 11 without
    assert graph is not None and graph.takes(wide) and not graph.takes(wide + 1)
    assert all(w.dtype == torch.uint8 for w in graph.weights[0][2:])  # the kernel's tiles
    got = _logits(target, ids, feeds)
    assert set(graph.runners) == {0, 1}  # both libraries ran
    # on AMX the layer attends by autospec::rows_attention (head dim 64, 17 x 1 queries a pass)
    assert graph.kernel(torch.bfloat16) == quantized.amx()
    for which in (0, 1):  # each calls the kernels' C entry points, not the dispatcher
        with zipfile.ZipFile(graph.package_path(which, torch.bfloat16)) as package:
            wrapper = [n for n in package.namelist() if n.endswith(".wrapper.cpp")]
            code = package.read(wrapper[0]).decode() if wrapper else ""
            # the wrapper declares every shim (`extern`), called or not: the calls are the rest
            calls = "\n".join(line for line in code.splitlines()
                              if not line.lstrip().startswith("extern "))
            assert "aoti_torch_cpu_int4_mm(" in calls
            assert ("aoti_torch_cpu_rows_attention(" in calls) == quantized.amx()
    _PLANS[target].graph = None
    eager = _logits(target, ids, feeds)
    # the same products (one kernel), the small ops in another order: within the rounding
    # spread of bfloat16 activations (models/ties.py: two orders of the same arithmetic)
    assert (got - eager).abs().max().item() <= near_tie(target, ids)
    assert (got.argmax(-1) == eager.argmax(-1)).float().mean().item() >= 0.95
