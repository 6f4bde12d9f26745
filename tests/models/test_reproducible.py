"""The tiny build's inputs are reproducible across machines; its weights are not.

What `autospec models build --preset tiny` trains on — the tokenizer and the batches — depends
only on the corpus (this Python's standard library) and the seed: a second build, in another
process with another hash seed and working directory, trains on the very same, and one
tokenizer thread gives the tokenizer that many do. No digest is pinned: the corpus differs
from one Python release to the next, patch releases too. The weights also depend on the CPU's
kernels: bf16 matmuls round differently under AVX2 and AVX-512, and 70 steps from the same
start give a different model (measured: an AVX2 build emits "eeee..." where the AVX-512 one
emits spaces). So no test relies on what the tiny models say; see test_lossless.py for
acceptance pinned by construction.
"""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from autospec.models.presets import get_preset
from autospec.models.train import sample_batch

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


def build_inputs(cache) -> dict:
    """Digests of what the tiny build under `cache` (its AUTOSPEC_CACHE) trained on: the corpus
    slice (its work dir is keyed by the files), the tokenizer, both token streams, the first
    batch."""
    work = next((cache / "build").glob("tiny-*"))
    streams = {name: hashlib.sha256(np.load(work / f"{name}_tokens.npy").tobytes()).hexdigest()[:16]
               for name in ("train", "heldout")}
    tokenizer = (cache / "tiny" / "target" / "tokenizer.json").read_text()
    return {"corpus": work.name, **streams, "batch0": first_batch_digest(work),
            "tokenizer": tokenizer_digest(tokenizer)}


@pytest.fixture(scope="module")
def digests(tiny_dir):
    return build_inputs(tiny_dir.parent)


def test_a_second_build_in_another_process_trains_on_the_same_inputs(digests, tmp_path):
    """What the pinned digests of one Python guarded, on any Python: the inputs are a function
    of the corpus and the seed, not of the process (hash seed, working directory)."""
    code = ("import sys; from pathlib import Path\n"
            "from autospec.models.build import build\n"
            "build('tiny', out_dir=Path(sys.argv[1]) / 'tiny', quiet=True, log=lambda m: None)\n")
    env = {**os.environ, "AUTOSPEC_CACHE": str(tmp_path), "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env, cwd=tmp_path)
    assert build_inputs(tmp_path) == digests


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
