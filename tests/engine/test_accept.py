"""Step 3 as pure functions, on hand-written arrays."""
import numpy as np
import pytest
import torch
from scipy_free_stats import chi2_pvalue

from autospec.engine.accept import coupled_accept, greedy_accept, position_uniform


def one_hot_logits(tokens, vocab=6):
    logits = torch.zeros(len(tokens), vocab)
    for i, t in enumerate(tokens):
        logits[i, t] = 5.0
    return logits


def test_greedy_accepts_matching_prefix_then_target_token():
    logits = one_hot_logits([3, 1, 4, 2])  # target wants 3, 1, 4, then 2
    assert greedy_accept([3, 1, 5], logits) == (2, 4)  # third draft wrong: recovered = 4
    assert greedy_accept([3, 1, 4], logits) == (3, 2)  # all accepted: bonus = 2
    assert greedy_accept([0, 1, 4], logits) == (0, 3)
    assert greedy_accept([], logits[:1]) == (0, 3)  # k = 0 is plain decoding


def _output_histogram(draft_probs, target_probs, n, vocab, point_mass=False):
    """Histogram of the first emitted token over n single-position rounds, seeds 0..n-1."""
    gen = torch.Generator().manual_seed(0)
    counts = np.zeros(vocab)
    for seed in range(n):
        token = 2 if point_mass else int(torch.multinomial(draft_probs[0], 1, generator=gen))
        accepted, nxt = coupled_accept([token], target_probs, seed, 0)
        counts[token if accepted else nxt] += 1
    return counts


@pytest.mark.parametrize("point_mass", [False, True])
def test_coupled_sampling_output_is_target_distribution(point_mass):
    target = torch.tensor([[0.05, 0.40, 0.10, 0.30, 0.15], [0.2] * 5])
    draft = torch.tensor([[0.30, 0.10, 0.35, 0.05, 0.20]])
    n = 50_000
    counts = _output_histogram(draft, target, n, 5, point_mass)
    expected = target[0].numpy() * n
    tv = 0.5 * np.abs(counts / n - target[0].numpy()).sum()
    assert tv <= 0.01, tv
    assert chi2_pvalue(counts, expected) > 0.01


def test_a_seeds_tokens_do_not_depend_on_the_draft():
    """The output at each position is the target's sample there, whatever was drafted: the
    same tokens with no draft (plain), a right one, a wrong one, or a longer one."""
    target = torch.softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(1)), -1)
    for seed in range(200):
        plain = [coupled_accept([], target[i:i + 1], seed, i)[1] for i in range(4)]
        assert coupled_accept(plain[:3], target, seed, 0) == (3, plain[3])
        wrong = [(plain[0] + 1) % 50] + plain[1:3]
        assert coupled_accept(wrong, target, seed, 0) == (0, plain[0])
        assert coupled_accept(plain[:1] + [(plain[1] + 1) % 50], target[:3], seed, 0) == (1, plain[1])


def test_coupled_sampling_never_emits_a_zero_mass_token():
    target = torch.tensor([[0.5, 0.5, 0.0], [1 / 3] * 3])
    for seed in range(500):
        accepted, nxt = coupled_accept([2], target, seed, 0)  # the target gives token 2 no mass
        assert accepted == 0 and nxt in (0, 1)


def test_position_uniforms_are_uniform_and_independent_of_order():
    draws = np.array([position_uniform(seed, t) for seed in range(100) for t in range(100)])
    counts = np.histogram(draws, bins=10, range=(0, 1))[0]
    assert chi2_pvalue(counts, np.full(10, len(draws) / 10)) > 0.01
    assert position_uniform(7, 3) == position_uniform(7, 3) != position_uniform(8, 3)


def test_greedy_accept_rows_equals_greedy_accept_per_row():
    """The step's batched acceptance (ragged drafts, right-padded logits) decides exactly as the
    pure function row by row: the CPU path, and the kernel path (autospec.kernels.greedy_verify,
    on this CPU the kernel's torch reference; on CUDA the Triton kernel)."""
    from autospec.engine.accept import greedy_accept_rows, verify_rows
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        ks = torch.randint(0, 6, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen).tolist()
        logits = torch.randn(len(ks), max(ks) + 1, 37, generator=gen)
        drafts = []
        for i, k in enumerate(ks):
            target = logits[i, :k + 1].argmax(-1).tolist()
            # drafts that agree for a random prefix, then differ
            agree = int(torch.randint(0, k + 1, (1,), generator=gen))
            drafts.append(target[:agree] + [(t + 1) % 37 for t in target[agree:k]])
        want = [greedy_accept(d, logits[i, :len(d) + 1]) for i, d in enumerate(drafts)]
        assert greedy_accept_rows(drafts, logits) == want
        assert verify_rows(drafts, logits) == want
        if torch.cuda.is_available():
            assert greedy_accept_rows(drafts, logits.cuda()) == want
