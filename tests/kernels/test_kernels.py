"""The greedy verification kernel: Triton under the interpreter (CPU) and natively (CUDA)
against the torch reference, and the reference against the per-request function it batches.

triton 3.9 decides interpreted-or-compiled when a function is *decorated* by @triton.jit — and
that includes triton's own tl.zeros / tl.sum / tl.max / tl.cumsum, decorated when triton is first
imported. So TRITON_INTERPRET=1 must be set before triton is imported, which in a pytest session
(where other tests import it compiled) means another process: this file, run as a script, computes
every case in INTERPRETED once and saves inputs and outputs; the tests compare them to the
reference run here on the very same inputs.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import traceback

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import autospec.kernels as kernels
from autospec.engine.accept import greedy_accept
from autospec.kernels import dispatch
from autospec.kernels.verify import greedy_verify, greedy_verify_reference
from conftest import REPO_ROOT

VOCABS = [1000, 4097]          # odd sizes: the last tile is ragged
BLOCKS = [256, 2048]           # several tiles per row, and one tile wider than the vocabulary
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="native Triton needs a CUDA device (and no global TRITON_INTERPRET)")


def assert_same(got, want):
    for g, w in zip(got, want):
        assert g.dtype == torch.int64 and torch.equal(g.cpu(), w.cpu()), (g, w)


# -----------------------------------------------------------------------------
# inputs: ragged K (0, K_max, in between), planted prefixes, ties, NaN and -inf rows

def greedy_case(B=6, K=5, V=1000, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, K + 1, V, generator=gen)
    logits[1::2] = (logits[1::2] * 2).round()      # few distinct values: ties for the max
    if K >= 2:
        logits[0, 1, [7, 900 % V]] = float("nan")   # torch.argmax: the first NaN wins
        logits[0, 2] = float("-inf")                # all -inf: argmax is 0
    logits = logits.to(dtype)
    num_draft = torch.tensor([K, K, 0, 3, 1, 2][:B])
    target_tokens = logits.argmax(-1)
    draft = torch.randint(0, V, (B, K), generator=gen)
    for b in range(B):                              # plant a matching prefix of every length
        matched = b % (int(num_draft[b]) + 1)
        draft[b, :matched] = target_tokens[b, :matched]
        if matched < K:
            draft[b, matched] = (target_tokens[b, matched] + 1) % V
    draft[0, :3] = target_tokens[0, :3]             # through the NaN and the -inf rows
    return draft, num_draft, logits


# -----------------------------------------------------------------------------
# the kernel under the interpreter: name -> (inputs, tiling)

INTERPRETED = {
    **{f"greedy-V{V}-B{BV}": (lambda V=V: greedy_case(V=V), {"BLOCK_V": BV, "num_warps": 2})
       for V in VOCABS for BV in BLOCKS},
    "greedy-bf16": (lambda: greedy_case(dtype=torch.bfloat16), {}),
    "greedy-K0": (lambda: greedy_case(K=0, B=3, V=517), {"BLOCK_V": 256}),
}


def run_interpreted(path: str) -> None:
    """In a process started with TRITON_INTERPRET=1: every case's inputs and outputs -> path."""
    results = {}
    for name, (inputs, tiling) in INTERPRETED.items():
        args = inputs()
        try:
            results[name] = (args, kernels.greedy_verify_triton(*args, **tiling))
        except Exception:  # one broken case must not hide the others
            results[name] = (args, traceback.format_exc())
    torch.save(results, path)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    path = tmp_path_factory.mktemp("interpreted") / "results.pt"
    # as a script its own folder is on sys.path, not tests/ (conftest)
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT / "tests"),
                                               os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, __file__, str(path)], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": pythonpath},
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(path, weights_only=False)


@pytest.mark.parametrize("name", INTERPRETED)
def test_interpreted_kernel_matches_reference(interpreted, name):
    args, got = interpreted[name]
    assert not isinstance(got, str), got
    assert_same(got, greedy_verify_reference(*args))
    if name.endswith("K0"):
        assert got[0].tolist() == [0] * len(got[0])


# -----------------------------------------------------------------------------
# greedy verification

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_reference_is_greedy_accept_per_row(dtype):
    draft, num_draft, logits = greedy_case(V=1000, dtype=dtype)
    accepted, next_token = greedy_verify_reference(draft, num_draft, logits)
    for b, n in enumerate(num_draft.tolist()):
        want = greedy_accept(draft[b, :n].tolist(), logits[b, :n + 1])
        assert (int(accepted[b]), int(next_token[b])) == want, b
    assert accepted.tolist() == [3, 1, 0, 3, 0, 2]                # the planted prefixes


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 5), max_size=4), st.integers(0, 4)),
                min_size=1, max_size=4), st.integers(0, 2 ** 16))
def test_greedy_reference_property(rows, seed):
    K = 4
    logits = torch.randint(0, 3, (len(rows), K + 1, 6), generator=torch.Generator().manual_seed(seed))
    draft = torch.full((len(rows), K), 99)
    for b, (tokens, _) in enumerate(rows):
        draft[b, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    num_draft = torch.tensor([len(tokens) for tokens, _ in rows])
    accepted, next_token = greedy_verify_reference(draft, num_draft, logits.float())
    for b, (tokens, _) in enumerate(rows):
        want = greedy_accept(tokens, logits[b, :len(tokens) + 1].float())
        assert (int(accepted[b]), int(next_token[b])) == want


# -----------------------------------------------------------------------------
# dispatch

def test_dispatch_picks_reference_on_cpu_and_honours_the_override(monkeypatch):
    cpu = torch.zeros(1)
    monkeypatch.delenv("AUTOSPEC_KERNELS", raising=False)
    assert dispatch.choose_backend(cpu) == "reference"
    monkeypatch.setenv("AUTOSPEC_KERNELS", "triton")
    assert dispatch.choose_backend(cpu) == "triton"
    monkeypatch.setenv("AUTOSPEC_KERNELS", "cuda")
    with pytest.raises(ValueError, match="known: auto, reference, triton"):
        dispatch.choose_backend(cpu)


def test_wrappers_on_cpu_run_the_reference(monkeypatch):
    monkeypatch.setenv("AUTOSPEC_KERNELS", "reference")
    case = greedy_case()
    assert_same(greedy_verify(*case, BLOCK_V=512), greedy_verify_reference(*case))


def test_tiling_is_validated():
    with pytest.raises(ValueError, match="BLOCK_V=300 must be a positive power of two"):
        kernels.greedy_verify_triton(*greedy_case(), BLOCK_V=300)
    draft, num_draft, logits = greedy_case()
    with pytest.raises(ValueError, match="float64 .supported: float32, bfloat16, float16"):
        kernels.greedy_verify_triton(draft, num_draft, logits.double())
    with pytest.raises(ValueError, match=r"target_logits must be \(B, K_max\+1, V\)"):
        greedy_verify_reference(draft, num_draft, logits[:, :2])
    with pytest.raises(ValueError, match="unknown tiling knob 'BLOCK_Q'"):
        dispatch.resolve_tiling("op", {"BLOCK_V": 256}, {"BLOCK_Q": 1})


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="kernels imported interpreted")
def test_compiled_kernel_on_cpu_tensors_says_what_to_do():
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.greedy_verify_triton(*greedy_case())


# -----------------------------------------------------------------------------
# compiled: for an H100/H200-class target without a GPU, then natively where there is one

def test_kernel_compiles_for_sm90_without_a_gpu():
    """The interpreter accepts code the compiler rejects: compile the kernel to PTX offline.
    Bit-exactness also needs IEEE arithmetic: no fused multiply-add."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from autospec.kernels import verify as verify_module

    def ptx(fn, types, constexprs):
        signature = {name: types.get(name, "i32") for name in fn.arg_names}
        signature.update({name: "constexpr" for name in constexprs})
        options = {"num_warps": 4, "num_stages": 2, "enable_fp_fusion": False}  # as launched
        return triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                              options=options).asm["ptx"]

    ptrs = lambda names, t="*i64": {n: t for n in names}  # noqa: E731
    greedy = ptx(verify_module._greedy_verify_kernel,
                 {**ptrs(["draft_ptr", "num_draft_ptr", "accepted_ptr", "next_ptr"]), "logits_ptr": "*bf16"},
                 {"BLOCK_V": 1024})
    assert not re.search(r"^\s*(@\S+\s+)?fma\.", greedy, re.M)


@needs_cuda
@pytest.mark.parametrize("V", VOCABS)
@pytest.mark.parametrize("BLOCK_V", BLOCKS)
def test_gpu_kernel_matches_reference(V, BLOCK_V):
    case = greedy_case(V=V)
    assert_same(greedy_verify(*[x.cuda() for x in case], BLOCK_V=BLOCK_V),
                greedy_verify_reference(*case))


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("run with TRITON_INTERPRET=1: the interpreter must be on before triton is imported")
    run_interpreted(sys.argv[1])
