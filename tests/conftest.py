"""Shared fixtures: a freshly trained `tiny` pair (seconds), and a minuscule random model.

Losslessness holds for any weights, so these tests need no good model. The tiny pair's weights
differ from machine to machine (CPU kernels round bf16 training differently, see
tests/test_reproducible.py): no test may rely on what it says. Tests that need acceptance pin
it by construction (a draft equal to the target, the synthetic drafter, a counting target);
tests that need real behaviour (copying) use the shipped reference pair.
"""
from __future__ import annotations

import os

import pytest
import torch

from autospec.engine.loop import Engine
from autospec.models.pair import ModelPair, load_pair

# The models here are small: one thread is faster than two, and leaves a core to the other
# process of a 2-core machine.
torch.set_num_threads(1)


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
