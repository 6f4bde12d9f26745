"""The shipped SmolLM2 draft or exit as files: weights without the borrowed tensors, the
target's tokenizer, and a card (card.json + README.md) with the figures measured here."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from autospec.training.target import load_target


def write_card(out_dir: Path, target=None) -> dict:
    """Measure the saved draft's decode cost against the target's (float32, as the engine
    runs them) and write card.json + README.md beside its weights."""
    from autospec.models.evaluate import decode_seconds_per_token
    from autospec.models.shared_draft import load_shared_draft
    card = json.loads((out_dir / "card.json").read_text())
    if target is None:
        target = load_target()[0]
    draft = load_shared_draft(out_dir, target, torch.float32)
    t_cost, d_cost = decode_seconds_per_token(target), decode_seconds_per_token(draft)
    card.update(target_ms_per_token=t_cost * 1e3, draft_ms_per_token=d_cost * 1e3,
                cost_ratio_c=d_cost / t_cost, threads=torch.get_num_threads())
    (out_dir / "card.json").write_text(json.dumps(card, indent=2, default=str) + "\n")
    r, run = card["recipe"], card["training"]
    curve = ", ".join(f"{h['step']}: {h['heldout_top1']:.2f}" for h in run["history"][::4])
    borrowed = r.get("borrowed_layers", 0)
    own = r["keep_layers"][borrowed:]
    what, preset = ("trained early exit", "smollm2-exit") if borrowed else ("draft", "smollm2-draft")
    prompt_term = ("the same loss against the target's top-k there (teacher-forced)"
                   if card.get("prompt_targets") else "CE on the prompt's own next token")
    layers = (f"the target's own first {borrowed} decoder layers (borrowed at run time,\n  frozen), "
              f"then {len(own)} trained decoder" if borrowed else f"{len(own)} decoder")
    plural = "s" if len(own) > 1 else ""
    (out_dir / "README.md").write_text(f"""# SmolLM2-135M-Instruct {what} (autospec)

Built by `autospec models build --preset {preset}` (after `autospec models fetch
smollm2`), self-distilled from the fetched target. Apache-2.0, like the target.

- model: Llama, {layers} layer{plural} at the target's width, initialised from the
  target's layer{plural} {', '.join(map(str, own))} and trained; the target's tokenizer, and its input
  embedding borrowed at run time (not shipped: `autospec/models/shared_draft.py`); a head over
  the {r['vocab_subset']:,} tokens the target emits most in its answers (FR-Spec), initialised
  from the target's head rows, covering {card['heldout_subset_coverage']:.1%} of held-out answer
  tokens; {card['draft_params'] / 1e6:.1f}M parameters of its own, bf16 on disk.
- data: the target's greedy answers ({r['max_new_tokens']} tokens at most, its top-{r['top_k']}
  probabilities kept) to {card['answers']} chat prompts made from the Python standard library's
  TRAINING split by the chat workload's makers ({card['answer_tokens']:,} answer tokens); the
  shipped `configs/workloads/chat.jsonl` is made from held-out files only.
- training: {run['steps']} steps of {r['batch']} rows, AdamW lr {r['lr']} (cosine), loss
  (1 - {r['soft_weight']}) CE(target's greedy token) + {r['soft_weight']} CE(target's top-k) on answer
  positions, + {r['prompt_weight']} x {prompt_term} on {r['prompt_positions']} prompt positions a row;
  {run['train_seconds']:.0f} s on {card.get('threads', 1)} CPU thread(s).

| figure | value |
|---|---|
| top-1 agreement with the target, teacher-forced, 32 held-out answers | {card['heldout_top1_agreement']:.3f} |
| ms per token, draft / target (float32, batch 1, this machine) | {card['draft_ms_per_token']:.1f} / {card['target_ms_per_token']:.1f} |
| cost ratio c | {card['cost_ratio_c']:.3f} |

Held-out agreement during training (step: top-1): {curve}.
Acceptance in the engine, per category: docs/benchmarks.md's SmolLM2 section (`autospec bench`).
""")
    return card


def save_draft(draft, tokenizer, out_dir: Path, card: dict) -> None:
    """bf16 safetensors (without the borrowed embedding) + the target's tokenizer + card,
    written atomically."""
    import shutil
    from autospec.models.shared_draft import save_shared_draft
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    save_shared_draft(draft, tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "card.json").write_text(json.dumps(card, indent=2, default=str) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
