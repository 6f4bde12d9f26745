"""`autospec models build --preset smollm2-eagle`: a feature-level draft head for SmolLM2.

EAGLE (Li et al. 2024) drafts from the target's own features: the head reads the target's
last hidden state at position t and the embedding of token t+1, predicts the hidden state at
t+1, and scores it through the target's head (`models/eagle_head.py`). The recipe, on a CPU
budget:
1. data: the target answers training-split chat prompts greedily (the same prompts as the
   draft's, `distill.training_prompts`) and keeps, for every position of prompt + answer, its
   last hidden state (after the final norm: what its head reads) — taken from the generation
   itself (`output_hidden_states`), so the features cost no forward beyond the answers'.
   Shards of 16 prompts in a seeded order (not shortest first), so a build that stops early
   trains on a sample of every length; existing shards are skipped (resumable).
2. training: at every pair (f_t, x_{t+1}) the head predicts f_{t+1}; loss = smooth-L1 to the
   true feature + CE of its logits to the target's greedy token (the argmax of the target's
   head over f_{t+1}, i.e. x_{t+2} on answer positions), both in the head's vocabulary subset
   (FR-Spec: the most frequent 8192 answer tokens). Input features get uniform noise
   (EAGLE's ±0.1 of their scale), so drafting on its own predicted features (positions 2..K)
   is not out of distribution. Checkpoints every 50 steps.
3. phase 2, from phase 1's head: EAGLE-3's training-time test (`eagle_train.chain_forward`:
   each answer pair also drafts positions 2..chain on the head's own predictions, as drafting
   runs them), at a lower rate.
The 32 held-out rows (`split`) are fixed by the prompt count and their shards are made first,
so a build stopped early is judged on the same rows as a whole one.
Everything intermediate lives in `paths.build_dir("smollm2-eagle")`.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from autospec.paths import SMOLLM2_SHIPPED_DIR, build_dir


@dataclass(frozen=True)
class EagleRecipe:
    # data: more prompts than the draft's 400 a category (data is EAGLE's lever); shards are
    # in a seeded order, so however many exist are a sample of all lengths
    prompts_per_category: int = 800
    prompt_seed: int = 1
    max_prompt_tokens: int = 768
    max_new_tokens: int = 128
    gen_batch: int = 16
    order_seed: int = 7
    # the head
    vocab_subset: int = 8192
    # training: each row's window is its last `context_pairs` prompt pairs and its answer;
    # the loss scores every answer pair and `prompt_positions` sampled prompt pairs (a step of
    # batch 8 then costs ~1.2 s on this CPU's 2 cores, float32). 1,600 steps of 8 are ~4
    # passes over ~3,150 answered prompts: 800 steps over 624 prompts (10 passes) reached
    # top-1 0.72 on training rows but 0.48 held out
    context_pairs: int = 192
    prompt_positions: int = 48
    steps: int = 1600
    batch: int = 8
    lr: float = 1e-3
    warmup: int = 50
    feature_weight: float = 1.0  # smooth-L1 on the predicted feature (EAGLE: 1.0 with 0.1 CE)
    token_weight: float = 0.5
    noise: float = 0.1  # uniform noise on input features, times their mean |value|
    # phase 2, from phase 1's head: EAGLE-3's training-time test — every answer pair also
    # drafts positions 2..chain on the head's own (detached) predictions, position j's loss
    # weighted chain_decay^(j-1) — at a lower rate (its own warm-up and cosine). From the
    # shipped phase-1 head, 150 steps of it lifted held-out positions 2-4 by 0.04-0.09 and
    # kept position 1; as many steps without it did not
    refine_steps: int = 300
    refine_lr: float = 3e-4
    refine_warmup: int = 20
    chain: int = 3
    chain_decay: float = 0.8
    seed: int = 0


RECIPE = EagleRecipe()


def work_dir() -> Path:
    return build_dir("smollm2-eagle")


# -- 1. data --------------------------------------------------------------------------------
HELDOUT_ROWS = 32


def shard_order(n_prompts: int, recipe: EagleRecipe) -> list[list[int]]:
    """Prompt indices (of the shortest-first list) per shard: groups of similar length, the
    groups in a seeded order."""
    groups = [list(range(i, min(i + recipe.gen_batch, n_prompts)))
              for i in range(0, n_prompts, recipe.gen_batch)]
    random.Random(recipe.order_seed).shuffle(groups)
    return groups


def split(n_prompts: int, recipe: EagleRecipe) -> tuple[list[int], list[int]]:
    """(held-out, training) row indices — a row's index is its place in the rows of all the
    shards in order — fixed by the number of prompts alone, so a build that stopped early
    holds out the same rows as a complete one."""
    order = np.random.default_rng(recipe.seed).permutation(n_prompts).tolist()
    return order[:HELDOUT_ROWS], order[HELDOUT_ROWS:]


@torch.inference_mode()
def generate_features(target, tokenizer, prompts: list[list[int]], recipe: EagleRecipe,
                      out: Path, quiet: bool = False, limit: int | None = None) -> None:
    """Shard i: its prompts answered greedily, with the target's last hidden state at every
    position of prompt + answer but the last (bf16). Existing shards are skipped."""
    out.mkdir(parents=True, exist_ok=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else target.config.eos_token_id
    eos = target.config.eos_token_id
    shards = shard_order(len(prompts), recipe)
    # the held-out rows' shards first: a build stopped early can still be judged
    owner = [k for k, picks in enumerate(shards) for _ in picks]
    first = sorted({owner[i] for i in split(len(prompts), recipe)[0]})
    todo = (first + [k for k in range(len(shards)) if k not in set(first)])[:limit]
    for shard in tqdm(todo, desc="target features", disable=quiet, unit="shard",
                      dynamic_ncols=True):
        picks = shards[shard]
        path = out / f"shard-{shard:05d}.pt"
        if path.exists():
            continue
        batch = [prompts[i] for i in picks]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        result = target.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=recipe.max_new_tokens, pad_token_id=pad,
                                 return_dict_in_generate=True, output_hidden_states=True)
        answers = result.sequences[:, width:]
        # step 0: the prompt's features (B, width, D); step s > 0: answer token s-1's (B, 1, D)
        prompt_features = result.hidden_states[0][-1]
        answer_features = torch.cat([h[-1] for h in result.hidden_states[1:]], 1) \
            if len(result.hidden_states) > 1 else prompt_features[:, :0]
        rows = []
        for i, prompt in enumerate(batch):
            answer = answers[i].tolist()
            n = next((j + 1 for j, t in enumerate(answer) if t == eos), len(answer))
            features = torch.cat([prompt_features[i, width - len(prompt):],
                                  answer_features[i, :n - 1]])  # positions 0 .. P+n-2
            rows.append({"prompt": prompt, "answer": answer[:n],
                         "features": features.to(torch.bfloat16)})
        tmp = path.with_suffix(".tmp")
        torch.save(rows, tmp)
        os.replace(tmp, path)


def load_rows(out: Path, n_prompts: int, recipe: EagleRecipe) -> dict[int, dict]:
    """The rows of the shards made so far, by index (`split`)."""
    shards = shard_order(n_prompts, recipe)
    starts = np.cumsum([0] + [len(picks) for picks in shards])
    rows = {}
    for path in sorted(out.glob("shard-*.pt")):
        shard = int(path.stem.split("-")[1])
        rows.update((int(starts[shard]) + i, row) for i, row in enumerate(torch.load(path)))
    return rows


def build(out_dir: Path | None = None, quiet: bool = False, log=print, stage: str = "all",
          threads: int | None = None, recipe: EagleRecipe = RECIPE) -> dict:
    """stage: "answers" (the target's answers and features only), "train", "all"."""
    from autospec.training.distill import DistillRecipe, training_prompts
    from autospec.training.target import load_target
    torch.set_num_threads(threads or os.cpu_count() or 1)
    work = work_dir()
    work.mkdir(parents=True, exist_ok=True)
    target, tokenizer = load_target()
    prompts = training_prompts(tokenizer, DistillRecipe(
        prompts_per_category=recipe.prompts_per_category, prompt_seed=recipe.prompt_seed,
        max_prompt_tokens=recipe.max_prompt_tokens))
    if stage in ("answers", "all"):
        log(f"{len(prompts)} training prompts (<= {recipe.max_prompt_tokens} tokens)")
        generate_features(target, tokenizer, prompts, recipe, work / "features", quiet)
        if stage == "answers":
            return {}
    from autospec.training.eagle_train import train_and_ship
    return train_and_ship(target, tokenizer, load_rows(work / "features", len(prompts), recipe),
                          split(len(prompts), recipe), recipe,
                          Path(out_dir) if out_dir else SMOLLM2_SHIPPED_DIR / "eagle", work,
                          quiet, log)
