"""`autospec models build` and the shipped reference pair."""
import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from autospec.paths import REFERENCE_DIR


def test_tiny_build_loads_with_transformers(tiny_dir):
    for role in ("target", "draft"):
        model = AutoModelForCausalLM.from_pretrained(tiny_dir / role)
        tok = AutoTokenizer.from_pretrained(tiny_dir / role)
        assert next(model.parameters()).dtype == torch.bfloat16
        assert tok.decode(tok.encode("def f(x):\n    return x\n")) == "def f(x):\n    return x\n"
    card = json.loads((tiny_dir / "card.json").read_text())
    for key in ("target_heldout_loss", "draft_heldout_loss", "cost_ratio_c",
                "draft_greedy_agreement", "target_loop_rate", "target_copy_similarity"):
        assert key in card
    assert (tiny_dir / "README.md").read_text().startswith("# autospec reference pair (tiny)")


def test_build_resumes_from_checkpoint(tiny_dir, tmp_path, monkeypatch):
    """A second build with the same cache trains no step: it resumes from complete checkpoints."""
    from autospec.models import build as build_mod
    from autospec.models import train as train_mod

    def no_training(*args):
        raise AssertionError("a step was trained although the checkpoint was complete")
    monkeypatch.setattr(train_mod, "sample_batch", no_training)
    monkeypatch.setenv("AUTOSPEC_CACHE", str(tiny_dir.parent))
    card = build_mod.build("tiny", out_dir=tmp_path / "again", quiet=True, log=lambda m: None)
    first = json.loads((tiny_dir / "card.json").read_text())
    assert card["target_heldout_loss"] == pytest.approx(first["target_heldout_loss"], abs=1e-3)


def test_unknown_preset():
    from autospec.models.presets import get_preset
    with pytest.raises(ValueError, match="unknown preset 'huge' \\(known: reference, tiny\\)"):
        get_preset("huge")


@pytest.mark.skipif(not (REFERENCE_DIR / "card.json").exists(), reason="reference pair not built")
def test_shipped_reference_pair_meets_its_card():
    card = json.loads((REFERENCE_DIR / "card.json").read_text())
    assert card["target_heldout_loss"] < card["draft_heldout_loss"] - 0.2
    assert card["cost_ratio_c"] <= 0.3
    size = sum(f.stat().st_size for f in REFERENCE_DIR.rglob("*.safetensors"))
    assert size <= 40e6
    model = AutoModelForCausalLM.from_pretrained(REFERENCE_DIR / "target")
    assert model.config.autospec_exit_layer >= 1


def test_kernels_and_store_are_not_top_level(tmp_path):
    code = ("import autospec.kernels, autospec.store\n"
            "import importlib.util as u\n"
            "assert u.find_spec('kernels') is None or 'site-packages' in u.find_spec('kernels').origin\n"
            "assert u.find_spec('store') is None\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
