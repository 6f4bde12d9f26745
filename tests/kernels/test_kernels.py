"""Kernels: Triton under the interpreter (CPU) and natively (CUDA) against the torch references,
and the references against the per-request functions they batch.

triton 3.9 decides interpreted-or-compiled when a function is *decorated* by @triton.jit — and
that includes triton's own tl.zeros / tl.sum / tl.max / tl.cumsum, decorated when triton is first
imported. So TRITON_INTERPRET=1 must be set before triton is imported, which in a pytest session
(where other tests import it compiled) means another process: this file, run as a script, computes
every case in INTERPRETED once and saves inputs and outputs; the tests compare them to the
references run here on the very same inputs.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import traceback

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy_free_stats import chi2_pvalue

import autospec.kernels as kernels
from autospec.drafters.ngram import ngram_match
from autospec.engine.accept import greedy_accept, rejection_accept
from autospec.kernels import dispatch
from autospec.kernels.ngram import ngram_match_batch, ngram_match_batch_reference
from autospec.kernels.verify import (greedy_verify, greedy_verify_reference, rejection_verify,
                                     rejection_verify_reference)
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


def rejection_case(B=6, K=4, V=1000, point_mass=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, K + 1, V, generator=gen) * 3
    logits[:, :, V // 2:][logits[:, :, V // 2:] < 0] = float("-inf")   # top-p style zeros
    target_probs = torch.softmax(logits, -1)
    noise = torch.randn(B, K + 1, V, generator=gen)
    draft_probs = torch.softmax(torch.where(logits.isinf(), -2.0, logits) + noise, -1)[:, :K]
    draft = torch.multinomial(draft_probs.reshape(-1, V), 1, generator=gen).view(B, K)
    draft[5] = target_probs[5, :K].argmax(-1)          # with uniforms 0 below: all accepted
    if point_mass:
        draft_probs = None
        draft[::2] = target_probs[::2, :K].argmax(-1)   # a copying drafter is often right
    else:
        # rejected where draft > target everywhere: no residual mass left, fall back to target
        draft_probs[3, 0] = target_probs[3, 0] * 1.25
        draft[3, 0] = int(target_probs[3, 0].argmax())
    num_draft = torch.tensor([K, 0, 2, K, 1, 3][:B])
    uniforms = torch.rand(B, K, generator=gen)
    uniforms[3, 0] = 0.95
    uniforms[5] = 0.0
    recover_uniforms = torch.rand(B, generator=gen)
    recover_uniforms[4] = 1 - 2 ** -24                  # the largest float32 below 1
    return draft, num_draft, draft_probs, target_probs, uniforms, recover_uniforms


def ngram_case(seed=0, B=8, L=200):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 3, (B, L), generator=gen)           # tiny alphabet: long matches
    tokens[1] = torch.randint(0, 1000, (L,), generator=gen)       # big one: few or no matches
    tokens[6] = torch.randint(0, 1000, (L,), generator=gen)
    tokens[6, 60:120] = tokens[6, :60]                            # a long copy, then padding
    lengths = torch.tensor([L, 0, 1, 2, 57, 133, 120, L - 1])
    return tokens, lengths


def rejection_case_without_drafts(point_mass, V=777):
    """K_max = 0 for the whole batch: only bonus tokens."""
    _, _, draft_probs, target_probs, _, recover_uniforms = rejection_case(V=V)
    return (torch.empty(6, 0, dtype=torch.long), torch.zeros(6, dtype=torch.long),
            None if point_mass else draft_probs[:, :0], target_probs[:, :1], torch.empty(6, 0),
            recover_uniforms)


# -----------------------------------------------------------------------------
# the kernels under the interpreter: name -> (kernel, inputs, tiling); references in REFERENCES

INTERPRETED = {
    **{f"greedy-V{V}-B{BV}": ("greedy_verify_triton", lambda V=V: greedy_case(V=V),
                              {"BLOCK_V": BV, "num_warps": 2}) for V in VOCABS for BV in BLOCKS},
    "greedy-bf16": ("greedy_verify_triton", lambda: greedy_case(dtype=torch.bfloat16), {}),
    "greedy-K0": ("greedy_verify_triton", lambda: greedy_case(K=0, B=3, V=517), {"BLOCK_V": 256}),
    **{f"rejection-{kind}-V{V}-B{BV}": (
        "rejection_verify_triton", lambda V=V, pm=pm: rejection_case(V=V, point_mass=pm), {"BLOCK_V": BV})
       for V in VOCABS for BV in BLOCKS for kind, pm in (("draft", False), ("pointmass", True))},
    **{f"rejection-{kind}-K0": ("rejection_verify_triton", lambda pm=pm: rejection_case_without_drafts(pm),
                                {"BLOCK_V": 256}) for kind, pm in (("draft", False), ("pointmass", True))},
    **{f"ngram-{n_min}-{n_max}-{k}-L{BL}": (
        "ngram_match_batch_triton", lambda a=(n_min, n_max, k): (*ngram_case(), *a), {"BLOCK_L": BL})
       for n_min, n_max, k in [(1, 4, 5), (2, 3, 1), (3, 6, 8)] for BL in (32, 128)},
}
REFERENCES = {"greedy_verify_triton": greedy_verify_reference,
              "rejection_verify_triton": rejection_verify_reference,
              "ngram_match_batch_triton": ngram_match_batch_reference}


def run_interpreted(path: str) -> None:
    """In a process started with TRITON_INTERPRET=1: every case's inputs and outputs -> path."""
    results = {}
    for name, (kernel, inputs, tiling) in INTERPRETED.items():
        args = inputs()
        try:
            results[name] = (args, getattr(kernels, kernel)(*args, **tiling))
        except Exception:  # one broken case must not hide the others
            results[name] = (args, traceback.format_exc())
    torch.save(results, path)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    path = tmp_path_factory.mktemp("interpreted") / "results.pt"
    # as a script its own folder is on sys.path, not tests/ (conftest, scipy_free_stats)
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT / "tests"),
                                               os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, __file__, str(path)], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": pythonpath},
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(path, weights_only=False)


@pytest.mark.parametrize("name", INTERPRETED)
def test_interpreted_kernel_matches_reference(interpreted, name):
    kernel, _, _ = INTERPRETED[name]
    args, got = interpreted[name]
    assert not isinstance(got, str), got
    want = REFERENCES[kernel](*args)
    assert_same(got, want)
    if name.startswith("rejection-draft-V"):  # the planted full-mass rejection took the fallback
        assert int(want[0][3]) == 0
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
# rejection sampling

@pytest.mark.parametrize("point_mass", [False, True])
def test_rejection_reference_accepts_like_rejection_accept(point_mass):
    """Same uniforms -> the same accepted count as the per-request function; the emitted token
    has mass in the distribution it was drawn from."""
    draft, num_draft, draft_probs, target_probs, _, recover = rejection_case(point_mass=point_mass)
    B, K = draft.shape
    uniforms = torch.zeros(B, K)
    expected = []
    for b, n in enumerate(num_draft.tolist()):
        uniforms[b, :n] = torch.rand(n, generator=torch.Generator().manual_seed(b))
        row_draft = None if point_mass else draft_probs[b, :n]
        gen = torch.Generator().manual_seed(b)                   # rejection_accept draws these first
        expected.append(rejection_accept(draft[b, :n].tolist(), row_draft, target_probs[b, :n + 1], gen)[0])
    accepted, next_token = rejection_verify_reference(draft, num_draft, draft_probs, target_probs,
                                                      uniforms, recover)
    assert accepted.tolist() == expected
    for b, (a, token) in enumerate(zip(accepted.tolist(), next_token.tolist())):
        target = target_probs[b, a]
        if a < num_draft[b] and point_mass:
            assert token != draft[b, a] and target[token] > 0
        elif a < num_draft[b] and (target - draft_probs[b, a]).clamp_min(0).sum() > 1e-6:
            assert target[token] > draft_probs[b, a, token]
        else:
            assert target[token] > 0


@pytest.mark.parametrize("point_mass", [False, True])
def test_rejection_reference_output_is_target_distribution(point_mass):
    """The first emitted token, over many one-token rounds, follows target_probs[0] exactly."""
    n = 40_000
    gen = torch.Generator().manual_seed(1)
    target = torch.tensor([[0.05, 0.40, 0.10, 0.30, 0.15], [0.2] * 5])
    draft = torch.tensor([[0.30, 0.10, 0.35, 0.05, 0.20]])
    tokens = (torch.full((n, 1), 2) if point_mass
              else torch.multinomial(draft.expand(n, 5), 1, replacement=True, generator=gen))
    accepted, next_token = rejection_verify_reference(
        tokens, torch.ones(n, dtype=torch.long), None if point_mass else draft.expand(n, 1, 5),
        target.expand(n, 2, 5), torch.rand(n, 1, generator=gen), torch.rand(n, generator=gen))
    first = torch.where(accepted == 1, tokens[:, 0], next_token)
    counts = np.bincount(first.numpy(), minlength=5)
    assert 0.5 * np.abs(counts / n - target[0].numpy()).sum() <= 0.01
    assert chi2_pvalue(counts, target[0].numpy() * n) > 0.01


# -----------------------------------------------------------------------------
# batched n-gram match

@pytest.mark.parametrize("n_min,n_max,k", [(1, 4, 5), (2, 3, 1), (3, 6, 8), (1, 1, 3)])
def test_ngram_reference_is_ngram_match_per_row(n_min, n_max, k):
    tokens, lengths = ngram_case()
    proposals, num = ngram_match_batch_reference(tokens, lengths, n_min, n_max, k)
    for b, length in enumerate(lengths.tolist()):
        want = ngram_match(tokens[b, :length].numpy(), n_min, n_max, k)
        assert proposals[b, :num[b]].tolist() == want, b
        assert (proposals[b, num[b]:] == -1).all()
    assert num[6] == k and proposals[6].tolist() == tokens[6, :k].tolist()  # the planted copy


def test_ngram_by_hand():
    # tail "1 2": its most recent earlier occurrence (ends at 6) is followed by 9, then the tail
    tokens = torch.tensor([[5, 1, 2, 3, 7, 1, 2, 9, 1, 2, 0, 0], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]])
    proposals, num = ngram_match_batch_reference(tokens, torch.tensor([10, 3]), 1, 3, 4)
    assert proposals.tolist() == [[9, 1, 2, -1], [4, -1, -1, -1]] and num.tolist() == [3, 1]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=4),
       st.integers(1, 3), st.integers(0, 3), st.integers(0, 6))
def test_ngram_reference_property(rows, n_min, extra, k):
    L = max(map(len, rows))
    tokens = torch.full((len(rows), L), 3)                       # padding that would match
    for b, row in enumerate(rows):
        tokens[b, :len(row)] = torch.tensor(row, dtype=torch.long)
    proposals, num = ngram_match_batch_reference(tokens, torch.tensor(list(map(len, rows))),
                                                 n_min, n_min + extra, k)
    for b, row in enumerate(rows):
        assert proposals[b, :num[b]].tolist() == ngram_match(np.array(row, dtype=np.int64),
                                                              n_min, n_min + extra, k)


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
    case = rejection_case()
    assert_same(rejection_verify(*case), rejection_verify_reference(*case))
    tokens, lengths = ngram_case()
    assert_same(ngram_match_batch(tokens, lengths, 1, 3, 4),
                ngram_match_batch_reference(tokens, lengths, 1, 3, 4))


def test_tiling_is_validated_and_declared():
    assert set(kernels.TILING_SPACES) == {"greedy_verify", "rejection_verify", "ngram_match_batch"}
    with pytest.raises(ValueError, match="BLOCK_V=300 must be a positive power of two"):
        kernels.greedy_verify_triton(*greedy_case(), BLOCK_V=300)
    draft, num_draft, logits = greedy_case()
    with pytest.raises(ValueError, match="float64 .supported: float32, bfloat16, float16"):
        kernels.greedy_verify_triton(draft, num_draft, logits.double())
    case = list(rejection_case())
    case[4] = case[4][:, :2]
    with pytest.raises(ValueError, match=r"uniforms must be \(6, 4\)"):
        rejection_verify_reference(*case)
    with pytest.raises(ValueError, match="unknown tiling knob 'BLOCK_Q'"):
        dispatch.resolve_tiling("op", {"BLOCK_V": [256]}, {"BLOCK_V": 256}, {"BLOCK_Q": 1})


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="kernels imported interpreted")
def test_compiled_kernel_on_cpu_tensors_says_what_to_do():
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.greedy_verify_triton(*greedy_case())


# -----------------------------------------------------------------------------
# compiled: for an H100/H200-class target without a GPU, then natively where there is one

def test_kernels_compile_for_sm90_without_a_gpu():
    """The interpreter accepts code the compiler rejects: compile each kernel to PTX offline.
    Bit-exactness also needs IEEE arithmetic: no fused multiply-add, no approximate division."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from autospec.kernels import ngram as ngram_module
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
    for has_draft in (True, False):
        rejection = ptx(verify_module._rejection_verify_kernel,
                        {**ptrs(["draft_ptr", "num_draft_ptr", "accepted_ptr", "next_ptr"]),
                         **ptrs(["draft_probs_ptr", "target_probs_ptr", "uniforms_ptr", "recover_ptr"],
                                "*fp32")},
                        {"HAS_DRAFT_PROBS": has_draft, "BLOCK_K": 8, "BLOCK_V": 1024})
        assert not re.search(r"^\s*(@\S+\s+)?(fma\.|div\.[a-z.]*f32)", rejection, re.M)
        assert re.search(r"^\s*mul\.rn\.f64", rejection, re.M)  # .rn: ptxas may not contract it
    ptx(ngram_module._ngram_match_kernel, ptrs(["tokens_ptr", "lengths_ptr", "proposals_ptr", "num_ptr"]),
        {"N_MAX": 4, "BLOCK_L": 256, "BLOCK_K": 8})
    assert not re.search(r"^\s*(@\S+\s+)?fma\.", greedy, re.M)



@needs_cuda
@pytest.mark.parametrize("V", VOCABS)
@pytest.mark.parametrize("BLOCK_V", BLOCKS)
def test_gpu_kernels_match_reference(V, BLOCK_V):
    cuda = lambda xs: [None if x is None else x.cuda() for x in xs]  # noqa: E731
    case = greedy_case(V=V)
    assert_same(greedy_verify(*cuda(case), BLOCK_V=BLOCK_V), greedy_verify_reference(*case))
    for point_mass in (False, True):
        case = rejection_case(V=V, point_mass=point_mass)
        assert_same(rejection_verify(*cuda(case), BLOCK_V=BLOCK_V), rejection_verify_reference(*case))
    tokens, lengths = ngram_case()
    assert_same(ngram_match_batch(tokens.cuda(), lengths.cuda(), 2, 4, 5),
                ngram_match_batch_reference(tokens, lengths, 2, 4, 5))


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("run with TRITON_INTERPRET=1: the interpreter must be on before triton is imported")
    run_interpreted(sys.argv[1])
