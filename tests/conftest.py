"""Shared fixtures: a freshly trained `tiny` pair (seconds), and a minuscule random model.

Losslessness holds for any weights, so these tests need no good model. The tiny pair's weights
differ from machine to machine (CPU kernels round bf16 training differently, see
tests/models/test_reproducible.py): no test may rely on what it says. Tests that need acceptance
pin it by construction (a draft equal to the target, the synthetic drafter, a counting target:
counting_llama); tests that need real behaviour (copying) use the shipped reference pair.

tests/ mirrors the package's folders (tests/engine, tests/store, ...). pytest's default import
mode puts this file's folder on sys.path, so a test in any of them imports the helpers here
(`from conftest import REPO_ROOT`) and the modules beside it (clirun, processes, ...) by name.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# the suite's many small models would each compile their one-row forward (models/compiled.py):
# eager here, and in every process a test starts; tests/models/test_compiled.py turns it on
os.environ.setdefault("AUTOSPEC_COMPILE", "0")

from autospec.engine.loop import Engine  # noqa: E402
from autospec.controller.interface import StaticController
from autospec.models.pair import ModelPair, load_pair
# greedy speculative output may part from plain's only at one of plain's near-ties, by the
# model's format (autospec/models/ties.py: why, and the measured values)
from autospec.models.ties import NEAR_TIE, first_difference, near_tie  # noqa: F401

# The models here are small: one thread is faster than two, and leaves a core to the other
# process of a 2-core machine.
torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parent.parent  # configs/, policies/, README.md, docs/
TEST_DATA = REPO_ROOT / "tests" / "data"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """Build the tiny preset once per test session into a private cache."""
    root = tmp_path_factory.mktemp("autospec-cache")
    old = os.environ.get("AUTOSPEC_CACHE")
    os.environ["AUTOSPEC_CACHE"] = str(root)
    try:
        from autospec.models.build import build
        build("tiny", out_dir=root / "tiny", quiet=True, log=lambda m: None)
    finally:
        # training takes every core; the suite's small models run faster on one (a test
        # after the build ran 7x slower with two threads on a loaded 2-core machine)
        torch.set_num_threads(1)
        if old is None:
            os.environ.pop("AUTOSPEC_CACHE", None)
        else:
            os.environ["AUTOSPEC_CACHE"] = old
    return root / "tiny"


@pytest.fixture(scope="session")
def tiny_pair(tiny_dir) -> ModelPair:
    return load_pair(str(tiny_dir / "target"), str(tiny_dir / "draft"))


@pytest.fixture(scope="session")
def tiny_engine(tiny_pair) -> Engine:
    return Engine(tiny_pair)


@pytest.fixture(scope="session")
def reference_pair() -> ModelPair:
    """The shipped reference pair (target + draft model), float32: real copying behaviour."""
    return load_pair()


class IdTokenizer:
    """Token ids are the text: for models with a handful of tokens and no tokenizer files."""
    eos_token_id = None

    def encode(self, ids):
        return list(ids)

    def decode(self, ids, **_):
        return " ".join(map(str, ids))


def random_llama(vocab: int, seed: int, scale: float = 1.0, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=128, eos_token_id=None, bos_token_id=None,
                      pad_token_id=None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)  # sharper or flatter next-token distributions
    return model


def counting_llama(vocab: int = 12):
    """A Llama whose greedy next token is (current token + 1) % vocab, by construction: the
    decoder layers add nothing to the residual (zeroed output projections), the embeddings are
    one-hot, and the head's row j reads token j - 1. Top-2 logit margin sqrt(hidden) = 4."""
    from transformers import LlamaConfig, LlamaForCausalLM
    hidden = 16
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=32,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=False,
                      eos_token_id=None, bos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(vocab, hidden))
        model.lm_head.weight.copy_(torch.eye(vocab, hidden).roll(1, dims=0))
    return model


KS = [1, 2, 4, 8]  # the draft lengths the lossless tests sweep


def top2_margins(pair, prompt_ids, output):
    """Plain's top-1 minus top-2 logit at each output position (one uncached forward)."""
    from autospec.models.ties import top2_margins as margins
    return margins(pair.target, prompt_ids, output)


def divergences(pair, prompts, batched, plain):
    """(prompt index, first differing position, plain's margin there) for every output that
    differs from plain's."""
    found = []
    for i, (got, want) in enumerate(zip(batched, plain)):
        if got != want:
            pos = first_difference(got, want)
            ids = pair.tokenizer.encode(prompts[i]) if isinstance(prompts[i], str) else prompts[i]
            margin = top2_margins(pair, ids, want)[pos] if pos < len(want) else float("inf")
            print(f"prompt {i}: batched output diverges from plain at token {pos}, plain's top-2 "
                  f"margin there {margin:.2e}")
            found.append((i, pos, margin))
    return found


def assert_lossless(pair, prompt, plain_ids, spec_ids):
    """spec_ids equal plain_ids, or diverge first at one of plain's near-ties."""
    ids = pair.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    for _, _, margin in divergences(pair, [prompt], [spec_ids], [plain_ids]):
        limit = near_tie(pair.target, ids + list(plain_ids))
        assert margin < limit, f"diverged from plain at a top-2 margin of {margin:.2e} (limit {limit:.2e})"


def assert_refused_only_at_near_ties(pair, prompt, generation):
    """For drafts of the target's own argmax (a draft equal to the target, synthetic at alpha
    1): every one is accepted, but where the draft's forward and the verify's round a near-tie
    apart. A refused draft sat at output token (the step's first) + accepted."""
    ids = pair.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    margins, start = None, 0
    for step in generation.telemetry.step_records:
        if step.accepted < step.proposed:
            margins = margins or top2_margins(pair, ids, generation.token_ids)
            at = start + step.accepted
            print(f"a draft of the target's argmax refused at token {at}, top-2 margin "
                  f"{margins[at]:.2e}")
            assert margins[at] < near_tie(pair.target, ids + generation.token_ids), (
                f"refused at a top-2 margin of {margins[at]:.2e}")
        start += step.emitted


def assert_lossless_text(pair, prompt, plain_text, text, max_new_tokens):
    """For an output seen only as text (through a server, a CLI): `text` equals plain
    decoding's `plain_text`, or parts from it at one of plain's near-ties. Text does not say at
    which token the two parted, so any of plain's tokens up to the first differing character
    may be the near-tie (plain's tokens from a decode here, margins as in divergences)."""
    if text == plain_text:
        return
    ids = pair.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    plain = Engine(pair).generate(ids, controller=StaticController(None, 0),
                                  max_new_tokens=max_new_tokens).token_ids
    cut = next((i for i, (a, b) in enumerate(zip(text, plain_text)) if a != b),
               min(len(text), len(plain_text)))
    decode = lambda t: pair.tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    last = next((t for t in range(len(plain)) if len(decode(plain[:t + 1])) > cut), len(plain) - 1)
    margin = min(top2_margins(pair, ids, plain)[:last + 1], default=float("inf"))
    print(f"text parts from plain's at character {cut} (plain's token {last}); plain's least "
          f"top-2 margin up to there {margin:.2e}")
    assert margin < near_tie(pair.target, ids + plain), (f"parted from plain's text at character {cut}, no near-tie "
                               f"before it (least top-2 margin {margin:.2e}): {text!r} vs "
                               f"{plain_text!r}")


def plain_and_speculative(engine, prompt, drafter, k, n=24):
    """Plain greedy output and `drafter`'s at K = k, for the same prompt: they must be equal."""
    plain = engine.generate(prompt, controller=StaticController(None, 0), max_new_tokens=n)
    spec = engine.generate(prompt, controller=StaticController(drafter, k), max_new_tokens=n)
    return plain, spec


@pytest.fixture
def postgres_url(tmp_path):
    """A real PostgreSQL server (pgserver: one in a wheel) for this test, as a SQLAlchemy URL
    on the psycopg 3 driver; the test is skipped where either is missing or it cannot start."""
    pgserver = pytest.importorskip("pgserver", reason="pip install pgserver: a PostgreSQL server "
                                                      "in a wheel (part of the [test] extra)")
    pytest.importorskip("psycopg", reason="pip install 'psycopg[binary]' (part of the [test] extra)")
    try:
        server = pgserver.get_server(tmp_path / "pg", cleanup_mode="stop")
    except Exception as exc:  # noqa: BLE001 (its own error types vary by version)
        pytest.skip(f"pgserver could not start PostgreSQL here: {exc}")
    try:
        # postgresql://postgres:@/postgres?host=SOCKET_DIR -> SQLAlchemy's psycopg 3 dialect
        yield server.get_uri().replace("postgresql://", "postgresql+psycopg://", 1)
    finally:
        server.cleanup()
