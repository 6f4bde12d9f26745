"""`autospec models build` and the shipped reference pair."""
import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from autospec.models.pair import load_pair
from autospec.paths import REFERENCE_DIR
from conftest import REPO_ROOT


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


def test_the_kernels_folder_does_not_shadow_the_kernels_distribution_from_the_root():
    # transformers >= 5.25 depends on Hugging Face's `kernels` and imports it by that name;
    # from the repository root (python -m, pytest) the root is on sys.path, where the folder
    # kernels/ answers to the same name
    # (installed: the folder hands `import kernels` on to it; not installed, as with the
    # transformers vLLM pins: an empty namespace, which transformers reads as not installed)
    code = ("import importlib.metadata as m\n"
            "try:\n    m.distribution('kernels'); installed = True\n"
            "except m.PackageNotFoundError:\n    installed = False\n"
            "import kernels, autospec.kernels\n"
            "if installed:\n    assert 'site-packages' in kernels.__file__, kernels.__file__\n"
            "else:\n    assert kernels.__file__ is None and not list(kernels.__path__)\n"
            "assert autospec.kernels.greedy_verify\n"
            "import transformers.modeling_utils, transformers.integrations.hub_kernels\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)


def test_random_rows_repeat_a_run_after_some_code():
    import numpy as np
    from autospec.models.presets import TrainRecipe
    from autospec.models.train import sample_batch
    tokens = np.arange(5000, 6000, dtype=np.int32)  # "code", told apart from random ids < 4096
    recipe = TrainRecipe(steps=1, batch=16, seq_len=512, lr=1e-3, warmup=1, copy_share=0.0,
                         random_share=1.0)
    batch = sample_batch(tokens, recipe, np.random.default_rng(0), vocab_size=4096).numpy()
    assert batch.shape == (16, 512)
    for row in batch:
        lead = int((row >= 5000).sum())
        assert lead < 64 and (row[:lead] >= 5000).all()
        run = row[lead:]
        assert 3 <= run.min() and run.max() < 4096
        assert any((run[p:] == run[:-p]).all() for p in range(12, 160))
    with pytest.raises(ValueError, match="vocabulary size"):
        sample_batch(tokens, recipe, np.random.default_rng(0))


def test_learning_rate_schedules():
    from autospec.models.presets import TrainRecipe
    from autospec.models.train import lr_at
    constant = TrainRecipe(steps=100, batch=1, seq_len=8, lr=1e-3, warmup=10, copy_share=0,
                           schedule="constant")
    assert lr_at(4, constant) == pytest.approx(5e-4) and lr_at(99, constant) == 1e-3
    cut = TrainRecipe(steps=50, batch=1, seq_len=8, lr=1e-3, warmup=0, copy_share=0,
                      schedule_steps=100)
    assert lr_at(50, cut) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * 2 * 0.5))  # half-way


def test_a_new_stage_keeps_the_earlier_checkpoints(tmp_path):
    from dataclasses import replace
    from autospec.models.build import stage_checkpoint
    from autospec.models.presets import get_preset
    tiny = get_preset("tiny")
    longer = replace(tiny, target_stages=tiny.target_stages * 2)
    recipes = [tiny.target_recipe, *tiny.target_stages]
    more = [longer.target_recipe, *longer.target_stages]
    for i in range(len(recipes)):
        assert stage_checkpoint(tmp_path, "target", tiny, recipes[:i + 1]) == \
            stage_checkpoint(tmp_path, "target", longer, more[:i + 1])
    assert stage_checkpoint(tmp_path, "target", longer, more) not in \
        {stage_checkpoint(tmp_path, "target", tiny, recipes[:i + 1]) for i in range(len(recipes))}
    # the draft's first stage does not depend on the target; its distilled stages do
    assert stage_checkpoint(tmp_path, "draft", tiny, [tiny.draft_recipe]) == \
        stage_checkpoint(tmp_path, "draft", longer, [longer.draft_recipe])
    drafts = [tiny.draft_recipe, *tiny.draft_stages]
    assert stage_checkpoint(tmp_path, "draft", tiny, drafts) != \
        stage_checkpoint(tmp_path, "draft", longer, drafts)


def test_distillation_term_is_the_kl_to_the_teacher():
    from dataclasses import replace

    import numpy as np
    from autospec.models.presets import TrainRecipe, get_preset
    from autospec.models.train import make_model, training_loss
    tiny = get_preset("tiny")
    model = make_model(tiny.draft, 64, 128, 0, seed=0)
    other = make_model(tiny.draft, 64, 128, 0, seed=1)
    batch = torch.from_numpy(np.random.default_rng(0).integers(0, 64, (2, 16)))
    recipe = TrainRecipe(steps=1, batch=2, seq_len=16, lr=1e-3, warmup=1, copy_share=0.0,
                         distill=1.0)
    with torch.no_grad():
        same, _ = training_loss(model, batch, recipe, teacher=model)
        differs, _ = training_loss(model, batch, recipe, teacher=other)
        ce, final = training_loss(model, batch, replace(recipe, distill=0.0), teacher=other)
    assert float(same) == pytest.approx(0.0, abs=1e-5)
    assert float(differs) > 1e-4
    assert float(ce) == pytest.approx(final)  # no distill weight: plain CE, teacher unused


def test_loading_the_reference_pair_draws_no_progress_bar(capfd):
    """transformers 5's "Loading weights" bar would precede every `autospec generate`."""
    from transformers.utils import logging as hf_logging
    load_pair()
    err = capfd.readouterr().err
    assert "Loading" not in err and "it/s]" not in err, err
    assert hf_logging.is_progress_bar_enabled()  # the switch is put back for everyone else
