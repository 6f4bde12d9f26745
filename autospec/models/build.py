"""`autospec models build`: corpus -> tokenizer -> target (early-exit loss) -> draft -> card.

Everything intermediate (tokenizer, token stream, checkpoints) lives in the cache, keyed by
the preset and the corpus, so an interrupted build resumes where it stopped. Only the final
pair is written to the output directory, in Hugging Face format (bf16 safetensors).
"""
from __future__ import annotations

import hashlib
import json
import platform
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer

from autospec.models import corpus as corpus_mod
from autospec.models import evaluate
from autospec.models.presets import Preset, get_preset
from autospec.models.tokenizer import train_tokenizer
from autospec.models.train import make_model, train
from autospec.paths import REFERENCE_DIR, build_dir, model_dir


def default_out_dir(preset: str) -> Path:
    return REFERENCE_DIR if preset == "reference" else model_dir(preset)


def work_dir_for(preset: Preset, files: list[corpus_mod.SourceFile]) -> Path:
    """Keyed by what the tokenizer and token streams depend on; each checkpoint is keyed by
    its own recipe (`stage_checkpoint`), so a preset that gains a stage reuses the others."""
    key = [preset.name, preset.vocab_size, preset.tokenizer_files, preset.max_corpus_files]
    digest = hashlib.sha1(json.dumps(key + [f.relpath for f in files]).encode()).hexdigest()[:12]
    return build_dir(f"{preset.name}-{digest}")


def stage_checkpoint(work: Path, role: str, preset: Preset, recipes: list) -> Path:
    """The checkpoint of the last of `recipes`, keyed by the model's shape, the seed and every
    recipe up to it (a stage continues from the ones before)."""
    shape = preset.target if role == "target" else preset.draft
    key = [asdict(shape), preset.seed, preset.max_positions] + [asdict(r) for r in recipes]
    if role == "draft" and len(recipes) > 1:  # distilled from the finished target: keyed by it
        key.append(stage_checkpoint(work, "target", preset,
                                    [preset.target_recipe, *preset.target_stages]).name)
    digest = hashlib.sha1(json.dumps(key, default=str).encode()).hexdigest()[:12]
    return work / f"{role}-{len(recipes) - 1}-{digest}.pt"


def train_stages(model, tokens, preset: Preset, role: str, seed: int, work: Path, quiet: bool,
                 teacher=None) -> list[dict]:
    """The role's main recipe, then each further stage in order; one summary per stage. The
    teacher is used by stages with `distill` > 0 only."""
    recipes = [preset.target_recipe, *preset.target_stages] if role == "target" else \
        [preset.draft_recipe, *preset.draft_stages]
    runs = []
    for i, recipe in enumerate(recipes):
        label = role if i == 0 else f"{role} stage {i}"
        runs.append(train(model, tokens, recipe, seed, stage_checkpoint(work, role, preset,
                                                                        recipes[:i + 1]),
                          label, quiet, teacher))
    return runs


def tokenize(tokenizer, files: list[corpus_mod.SourceFile], path: Path) -> np.ndarray:
    """One stream: each file's tokens followed by EOS. Cached as .npy."""
    if path.exists():
        return np.load(path)
    encoded = tokenizer.backend_tokenizer.encode_batch([f.text for f in files])
    eos = tokenizer.eos_token_id
    stream = np.fromiter((t for e in encoded for t in (*e.ids, eos)), dtype=np.int32)
    np.save(path, stream)
    return stream


def build(preset_name: str = "reference", corpus_dir: Path | None = None,
          out_dir: Path | None = None, quiet: bool = False, log=print) -> dict:
    preset = get_preset(preset_name)
    corpus_dir = Path(corpus_dir) if corpus_dir else corpus_mod.default_corpus_dir()
    out_dir = Path(out_dir) if out_dir else default_out_dir(preset.name)
    files = corpus_mod.iter_sources(corpus_dir)
    if preset.max_corpus_files:
        files = files[::max(1, len(files) // preset.max_corpus_files)]
    train_files, heldout_files = corpus_mod.split(files)
    if not heldout_files:  # tiny slices can miss the 1-in-10 split
        train_files, heldout_files = files[1:], files[:1]
    work = work_dir_for(preset, files)
    work.mkdir(parents=True, exist_ok=True)
    log(f"corpus: {len(train_files)} training files, {len(heldout_files)} held out, from {corpus_dir}")
    log(f"work dir (checkpoints, resumable): {work}")

    tok_dir = work / "tokenizer"
    if (tok_dir / "tokenizer.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    else:
        texts = [f.text for f in train_files[:preset.tokenizer_files]]
        tokenizer = train_tokenizer(texts, preset.vocab_size, tok_dir)
    train_tokens = tokenize(tokenizer, train_files, work / "train_tokens.npy")
    heldout_tokens = tokenize(tokenizer, heldout_files, work / "heldout_tokens.npy")
    log(f"tokens: {len(train_tokens):,} train, {len(heldout_tokens):,} held out "
        f"(vocab {len(tokenizer)})")

    eos = tokenizer.eos_token_id
    target = make_model(preset.target, len(tokenizer), preset.max_positions, eos, preset.seed,
                        autospec_exit_layer=preset.exit_layer)
    target_run = train_stages(target, train_tokens, preset, "target", preset.seed, work, quiet)
    draft = make_model(preset.draft, len(tokenizer), preset.max_positions, eos, preset.seed + 1)
    draft_run = train_stages(draft, train_tokens, preset, "draft", preset.seed + 1, work, quiet,
                             teacher=target)

    card = measure(preset, target, draft, tokenizer, heldout_tokens, heldout_files)
    card["training"] = {"target": target_run, "draft": draft_run}
    card["corpus"] = {"dir": str(corpus_dir), "python": platform.python_version(),
                      "train_files": len(train_files), "heldout_files": len(heldout_files),
                      "train_tokens": int(len(train_tokens)),
                      "heldout_tokens": int(len(heldout_tokens)),
                      "heldout_rule": "sha1(relative path) % 10 == 0"}
    card["preset"] = asdict(preset)
    if preset.chat_template:
        tokenizer.chat_template = preset.chat_template
    save_pair(out_dir, target, draft, tokenizer, card)
    log(summary(card))
    return card


def measure(preset: Preset, target, draft, tokenizer, heldout_tokens, heldout_files) -> dict:
    seq_len = min(256, preset.target_recipe.seq_len)
    # Cost and behaviour are measured in the dtype that ships (bf16), as users will run it.
    target, draft = target.to(torch.bfloat16), draft.to(torch.bfloat16)
    t_cost = evaluate.decode_seconds_per_token(target)
    d_cost = evaluate.decode_seconds_per_token(draft)
    n = 8 if preset.name != "tiny" else 2
    return {
        "target_params": sum(p.numel() for p in target.parameters()),
        "draft_params": sum(p.numel() for p in draft.parameters()),
        "target_heldout_loss": evaluate.heldout_loss(target, heldout_tokens, seq_len),
        "draft_heldout_loss": evaluate.heldout_loss(draft, heldout_tokens, seq_len),
        "target_ms_per_token": t_cost * 1e3,
        "draft_ms_per_token": d_cost * 1e3,
        "cost_ratio_c": d_cost / t_cost,
        "draft_greedy_agreement": evaluate.greedy_agreement(target, draft, heldout_tokens, seq_len),
        "target_loop_rate": evaluate.loop_rate(
            target, tokenizer, evaluate.completion_prompts(heldout_files, n)),
        "target_copy_similarity": evaluate.copy_similarity(
            target, tokenizer, evaluate.copy_prompts(heldout_files, n)),
        "exit_layer": preset.exit_layer,
        "torch": torch.__version__,
        "machine": platform.machine(),
    }


def save_pair(out_dir: Path, target, draft, tokenizer, card: dict) -> None:
    """Write target/ and draft/ (each loadable with from_pretrained) and the card, atomically."""
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    for role, model in (("target", target), ("draft", draft)):
        model.to(torch.bfloat16).save_pretrained(tmp / role, safe_serialization=True)
        tokenizer.save_pretrained(tmp / role)
    (tmp / "card.json").write_text(json.dumps(card, indent=2, default=str) + "\n")
    (tmp / "README.md").write_text(model_card(card))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


def summary(card: dict) -> str:
    return (
        f"target: {card['target_params'] / 1e6:.2f}M params, held-out loss "
        f"{card['target_heldout_loss']:.3f}, {card['target_ms_per_token']:.2f} ms/token\n"
        f"draft:  {card['draft_params'] / 1e6:.2f}M params, held-out loss "
        f"{card['draft_heldout_loss']:.3f}, {card['draft_ms_per_token']:.2f} ms/token\n"
        f"c = {card['cost_ratio_c']:.3f}   draft greedy agreement "
        f"{card['draft_greedy_agreement']:.3f}   target loop rate {card['target_loop_rate']:.2f}"
        f"   copy similarity {card['target_copy_similarity']:.3f}")


def model_card(card: dict) -> str:
    p = card["preset"]
    return f"""# autospec reference pair ({p['name']})

Built by `autospec models build --preset {p['name']}` (seed {p['seed']}), from the Python
{card['corpus']['python']} standard library's own source files. Files with
{card['corpus']['heldout_rule']} are held out ({card['corpus']['heldout_files']} files,
{card['corpus']['heldout_tokens']:,} tokens); training used {card['corpus']['train_files']} files,
{card['corpus']['train_tokens']:,} tokens.

- tokenizer: byte-level BPE, vocab {p['vocab_size']}, `<|endoftext|>` = BOS/EOS/pad
- target (`target/`): Llama, {p['target']['layers']} layers, d={p['target']['hidden']},
  {p['target']['heads']} heads, FFN {p['target']['ffn']}, tied head. Trained with a
  LayerSkip-style exit loss at layers {p['target_recipe']['exit_layers']} (weight
  {p['target_recipe']['exit_weight']}) through the shared norm and head; the early-exit drafter
  uses layer {card['exit_layer']} (`autospec_exit_layer` in config.json).
- draft (`draft/`): Llama, {p['draft']['layers']} layers, d={p['draft']['hidden']}.
- recipe: AdamW (0.9, 0.95), wd 0.1, linear warm-up, bf16 autocast, grad clip 1; stages in
  order, each continuing from the one before with a fresh optimizer. "copy": share of code rows
  that repeat a span of themselves; "random": share of rows that repeat a run of random
  tokens (only an induction head lowers their loss); the draft's later stages are distilled
  from the finished target ("distill": weight of the KL term).

{_stages(p)}

## Figures (this machine, {card['machine']}, torch {card['torch']}, bf16, batch 1)

| | params | held-out loss | ms / token |
|---|---|---|---|
| target | {card['target_params'] / 1e6:.2f}M | {card['target_heldout_loss']:.3f} | {card['target_ms_per_token']:.2f} |
| draft | {card['draft_params'] / 1e6:.2f}M | {card['draft_heldout_loss']:.3f} | {card['draft_ms_per_token']:.2f} |

- draft/target cost ratio c = {card['cost_ratio_c']:.3f}
- draft greedy agreement with the target (teacher-forced, held-out): {card['draft_greedy_agreement']:.3f}
- target greedy-loop rate (64-token continuations of held-out code where a line repeats more
  than twice): {card['target_loop_rate']:.2f}
- target copy similarity (a function, then its first 3 lines again; difflib ratio of the
  48-token greedy continuation against the rest of the function): {card['target_copy_similarity']:.3f}
- training: target {_seconds(card, 'target')} s, draft {_seconds(card, 'draft')} s of CPU
  wall time (shipped pair: see the notes)

{_notes(p)}Full figures: `card.json`.
{_copying()}{_reproducibility()}"""


def _notes(preset: dict) -> str:
    notes = preset.get("notes") or {}
    return "".join(f"Note ({key}): {text}\n\n" for key, text in notes.items())


def _stages(preset: dict) -> str:
    rows = ["| model | stage | steps | batch x tokens | lr, schedule | copy | random | exits | distill |",
            "|---|---|---|---|---|---|---|---|---|"]
    for role in ("target", "draft"):
        for i, r in enumerate([preset[f"{role}_recipe"], *preset.get(f"{role}_stages", ())]):
            schedule = r.get("schedule", "cosine")
            if schedule == "cosine" and r.get("schedule_steps"):
                schedule += f" over {r['schedule_steps']}"
            rows.append(f"| {role} | {i} | {r['steps']} | {r['batch']} x {r['seq_len']} | "
                        f"{r['lr']}, {schedule} | {r['copy_share']} | {r.get('random_share', 0)} | "
                        f"{list(r['exit_layers']) or '-'} | {r.get('distill', 0) or '-'} |")
    return "\n".join(rows)


def _seconds(card: dict, role: str) -> float:
    runs = card["training"][role]
    runs = runs if isinstance(runs, list) else [runs]
    return round(sum(r["train_seconds"] for r in runs), 1)


def _reproducibility() -> str:
    """Why weights differ across machines while the inputs do not."""
    path = Path(__file__).with_name("reproducibility.md")
    return "\n" + path.read_text() if path.exists() else ""


def _copying() -> str:
    """The table of copy-curriculum variants (kept in the package, carried into each card)."""
    path = Path(__file__).with_name("copying.md")
    return "\n" + path.read_text() if path.exists() else ""
