"""The tiny build's inputs are reproducible across machines; its weights are not (issue 11).

What `autospec models build --preset tiny` trains on — the tokenizer and the batches — depends
only on the corpus (this Python's standard library) and the seed, so it is pinned here by digest
for the Python the CI machine runs. The weights also depend on the CPU's kernels: bf16 matmuls
round differently under AVX2 and AVX-512, and 70 steps from the same start give a different
model (measured: an AVX2 build emits "eeee..." where the AVX-512 one emits spaces). So no test
relies on what the tiny models say; see test_lossless.py for acceptance pinned by construction.
"""
import hashlib
import json
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

from autospec.models.presets import get_preset
from autospec.models.train import sample_batch

# Python version -> digests of the tiny build's tokenizer (vocab + merges) and first batch.
PINNED = {"3.11.7": {"tokenizer": "2c47d26c3b6c52cc", "batch0": "a3c02f8d716b4d40"}}


def tokenizer_digest(tokenizer_json: str) -> str:
    model = json.loads(tokenizer_json)["model"]
    return hashlib.sha256(json.dumps([model["vocab"], model["merges"]], sort_keys=True)
                          .encode()).hexdigest()[:16]


def first_batch_digest(work_dir) -> str:
    preset = get_preset("tiny")
    stream = np.load(work_dir / "train_tokens.npy")
    batch = sample_batch(stream, preset.target_recipe, np.random.default_rng([preset.seed, 0]),
                         preset.vocab_size)
    return hashlib.sha256(batch.numpy().tobytes()).hexdigest()[:16]


@pytest.fixture(scope="module")
def digests(tiny_dir):
    work = next((tiny_dir.parent / "build").glob("tiny-*"))
    return {"tokenizer": tokenizer_digest((tiny_dir / "target" / "tokenizer.json").read_text()),
            "batch0": first_batch_digest(work), "work": work}


def test_tiny_build_inputs_match_the_pinned_digests(digests):
    pinned = PINNED.get(platform.python_version())
    if pinned is None:
        pytest.skip(f"no digest pinned for Python {platform.python_version()} "
                    f"(its standard library is another corpus)")
    assert {k: digests[k] for k in pinned} == pinned


def test_tokenizer_training_does_not_depend_on_threads(digests, tmp_path):
    """The BPE trainer runs in parallel by default; one thread must give the same merges."""
    code = (
        "import sys; from pathlib import Path\n"
        "from autospec.models import corpus\n"
        "from autospec.models.presets import get_preset\n"
        "from autospec.models.tokenizer import train_tokenizer\n"
        "p = get_preset('tiny'); files = corpus.iter_sources(corpus.default_corpus_dir())\n"
        "files = files[::max(1, len(files) // p.max_corpus_files)]\n"
        "train, held = corpus.split(files)\n"
        "train = train if held else files[1:]\n"
        "train_tokenizer([f.text for f in train[:p.tokenizer_files]], p.vocab_size, Path(sys.argv[1]))\n")
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env)
    assert tokenizer_digest((tmp_path / "tokenizer.json").read_text()) == digests["tokenizer"]
