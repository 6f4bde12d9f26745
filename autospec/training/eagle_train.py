"""Training the feature head on the target's features (training/eagle.py makes them), the
held-out check through the real drafting code, and the shipped files with their card."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from autospec.drafters.base import DraftContext
from autospec.drafters.draft_model import DraftRow
from autospec.models.eagle_head import EagleHead, own_state, save_eagle_head
from autospec.models.sampling import SamplingParams
from autospec.training.loop import CHECKPOINT_EVERY, train_steps

CHAIN = 4  # draft positions the held-out check scores


def make_batch(rows: list[dict], recipe, rng: np.random.Generator) -> dict:
    """Right-padded pairs of each row's window (its last `context_pairs` prompt pairs and
    all its answer pairs): ids (B, T) = x_{t+1}, features (B, T, D) = f_t (noised), targets
    (B, T, D) = f_{t+1}, positions (B, T) = t + 1, and `scored` (B, T): the pairs the loss
    counts — every answer pair and `prompt_positions` sampled prompt pairs (the head must read
    the prompt; the answers are what it drafts), `answer` (B, T) the answer pairs."""
    windows = []
    for row in rows:
        n = len(row["features"]) - 1  # pairs t = 0 .. n-1 with a known f_{t+1}
        first_answer = max(0, len(row["prompt"]) - 2)  # pairs whose next token is answer
        start = max(0, first_answer - recipe.context_pairs)
        windows.append((start, first_answer, n))
    width = max(n - start for start, _, n in windows)
    dim = rows[0]["features"].shape[1]
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    positions = torch.ones(len(rows), width, dtype=torch.long)
    feats = torch.zeros(len(rows), width, dim)
    targets = torch.zeros(len(rows), width, dim)
    scored = torch.zeros(len(rows), width, dtype=torch.bool)
    answer = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (row, (start, first_answer, n)) in enumerate(zip(rows, windows)):
        seq = row["prompt"] + row["answer"]
        f = row["features"].float()
        m = n - start
        ids[i, :m] = torch.tensor(seq[start + 1:n + 1])
        positions[i, :m] = torch.arange(start + 1, n + 1)
        feats[i, :m] = f[start:n]
        targets[i, :m] = f[start + 1:n + 1]
        answer[i, first_answer - start:m] = True
        prompt_pairs = first_answer - start
        picks = rng.choice(prompt_pairs, min(prompt_pairs, recipe.prompt_positions), replace=False)
        scored[i, torch.from_numpy(np.asarray(picks, dtype=np.int64))] = True
        scored[i, first_answer - start:m] = True
    # noise on padding too: right-padded, causal and never scored, it reaches no loss
    scale = float(feats[answer].abs().mean())
    noise = (torch.rand(feats.shape, generator=torch.Generator().manual_seed(int(rng.integers(2**31))))
             * 2 - 1) * recipe.noise * scale
    return {"ids": ids, "positions": positions, "features": feats + noise,
            "targets": targets, "scored": scored, "answer": answer[scored]}


def head_loss(head: EagleHead, batch: dict, recipe) -> tuple[torch.Tensor, float]:
    """smooth-L1(f̂_{t+1}, f_{t+1}) + CE of the head's subset logits to the target's own
    subset distribution over f_{t+1} (EAGLE's classification term), on the scored pairs;
    returns (loss, top-1 agreement with the target on answer pairs)."""
    predicted = head(batch["ids"], batch["features"], batch["positions"])
    scored = batch["scored"]
    regression = F.smooth_l1_loss(predicted[scored], batch["targets"][scored])
    logits = head.lm_head.subset_logits(predicted[scored])
    with torch.no_grad():
        target_probs = torch.softmax(head.lm_head.subset_logits(batch["targets"][scored]), -1)
    ce = -(target_probs * F.log_softmax(logits, -1)).sum(-1).mean()
    with torch.no_grad():
        hits = (logits.argmax(-1) == target_probs.argmax(-1))[batch["answer"]]
        top1 = float(hits.float().mean()) if len(hits) else 0.0
    return recipe.feature_weight * regression + recipe.token_weight * ce, top1


def train_head(head: EagleHead, rows: list[dict], recipe, ckpt: Path, quiet: bool = False,
               heldout: list[dict] | None = None) -> dict:
    def step_loss(rng: np.random.Generator):
        picks = rng.choice(len(rows), recipe.batch, replace=False)
        # float32: this CPU has no bf16 matrix units (a bf16 matmul ran 5x slower)
        return head_loss(head, make_batch([rows[i] for i in picks], recipe, rng), recipe)
    evaluate = (lambda: {"heldout_alpha": heldout_alpha(head, heldout)}) if heldout else None
    return train_steps(head, recipe, ckpt, step_loss, desc="eagle head", metric="train_top1",
                       evaluate=evaluate, eval_every=4 * CHECKPOINT_EVERY, weight_decay=0.0,
                       quiet=quiet)


@torch.no_grad()
def heldout_alpha(head: EagleHead, rows: list[dict], every: int = 4) -> list[float]:
    """P(draft position j right | positions < j right), j = 1..CHAIN, over held-out answers,
    drafted by the real drafting code (BatchEagle) from the target's features, greedy."""
    from autospec.drafters.eagle import BatchEagle
    head.eval()
    tried, right = [0] * CHAIN, [0] * CHAIN
    for row in rows:
        seq = row["prompt"] + row["answer"]
        features = row["features"].float()
        drafting = BatchEagle(head, 1, len(seq) + CHAIN + 1)
        for end in range(len(row["prompt"]), len(seq) - 1, every):
            # context seq[:end]; the target's cache holds features of positions 0 .. end-2
            k = min(CHAIN, len(seq) - end)
            ctx = DraftContext(seq[:end], SamplingParams(), hidden=features[:end - 1])
            draft = drafting.propose([DraftRow(0, ctx, k)])[0][0].tokens
            for j, (got, want) in enumerate(zip(draft, seq[end:end + k])):
                tried[j] += 1
                if got != want:
                    break
                right[j] += 1
    return [round(r / t, 4) if t else 0.0 for r, t in zip(right, tried)]


def choose_subset(rows: list[dict], vocab_size: int, size: int, eos) -> torch.Tensor:
    from autospec.training.distill import choose_subset as by_frequency
    always = set(eos if isinstance(eos, list) else [eos]) - {None}
    return by_frequency(rows, vocab_size, size, always)


def train_and_ship(target, tokenizer, rows: dict[int, dict], split: tuple[list, list], recipe,
                   out_dir: Path, work: Path, quiet: bool = False, log=print) -> dict:
    """rows by index and the (held-out, training) indices (`eagle.split`): trains on the
    training rows made so far, judges on the held-out ones (never trained on: the card's
    figures), which must all be there."""
    held, trained = split
    missing = [i for i in held if i not in rows]
    if missing or len(rows) < 2 * recipe.batch + len(held):
        raise ValueError(f"{len(rows)} rows of target features in {work / 'features'}, "
                         f"{len(missing)} of the {len(held)} held-out ones missing: run the "
                         f"answers stage (it makes the held-out rows' shards first)")
    heldout = [rows[i] for i in held]
    train = [rows[i] for i in trained if i in rows]
    tokens = sum(len(r["features"]) for r in train)
    log(f"{len(train)} answered prompts to train on, {tokens:,} positions with features")
    token_ids = choose_subset(train, target.config.vocab_size, recipe.vocab_subset,
                              target.config.eos_token_id)
    torch.manual_seed(recipe.seed)
    head = EagleHead(target, token_ids)
    # phase 1 and phase 2 (the restart, from phase 1's head) checkpoint apart: phase 1's name
    # does not change with phase 2's settings
    first = {k: v for k, v in asdict(recipe).items() if not k.startswith("refine")}
    run = train_head(head, train, recipe, work / f"head-{_key(first)}-{len(train)}.pt", quiet,
                     heldout)
    refined = None
    if recipe.refine_steps:
        second = replace(recipe, steps=recipe.refine_steps, lr=recipe.refine_lr,
                         warmup=recipe.refine_warmup, seed=recipe.seed + 1)
        refined = train_head(head, train, second,
                             work / f"head-{_key(asdict(recipe))}-{len(train)}-refine.pt",
                             quiet, heldout)
    alpha = heldout_alpha(head, heldout, every=2)
    card = {"recipe": asdict(recipe), "training": run, "refine": refined,
            "prompts": len(train),
            "positions": tokens, "answer_tokens": sum(len(r["answer"]) for r in train),
            "heldout_alpha_per_position": alpha,
            "head_params": sum(t.numel() for k, t in own_state(head).items()
                               if not k.endswith("token_ids")),
            "target": "SmolLM2-135M-Instruct (fetched)"}
    save_eagle_head(head, out_dir)
    write_head_card(out_dir, card)
    log(f"feature head saved to {out_dir}: held-out alpha per position {alpha}")
    return card


def _key(fields: dict) -> str:
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]


def write_head_card(out_dir: Path, card: dict) -> None:
    (out_dir / "card.json").write_text(json.dumps(card, indent=2, default=str) + "\n")
    r, run, refined = card["recipe"], card["training"], card.get("refine")
    curve = "; ".join(f"step {h['step']}: {h['heldout_alpha']}" for h in run["history"])
    second = "" if not refined else (
        f"Phase 2, from that head: {refined['steps']} steps at peak rate {r['refine_lr']} "
        f"({refined['train_seconds']:.0f} s); held-out during it: "
        + "; ".join(f"step {h['step']}: {h['heldout_alpha']}" for h in refined["history"])
        + ".\n")
    (out_dir / "README.md").write_text(f"""# SmolLM2-135M-Instruct feature head (EAGLE-1)

Drafts from the target's own last hidden state (`drafter eagle`): one decoder layer at the
target's width over (feature, next token) pairs predicts the next feature, scored by the
target's head rows over the {r['vocab_subset']} most frequent answer tokens. The embedding,
rotary embedding and head rows are the target's, taken at load, not shipped;
{card['head_params']:,} own parameters (bf16).

Made by `autospec models build --preset smollm2-eagle` (autospec/training/eagle.py): the
target's greedy answers to {card['prompts']} training-split chat prompts
({card['answer_tokens']:,} answer tokens, {card['positions']:,} positions with features),
{run['steps']} steps of batch {r['batch']} ({run['train_seconds']:.0f} s on this CPU), loss =
smooth-L1 on the predicted feature + {r['token_weight']} x CE to the target's distribution,
input features noised by ±{r['noise']} of their scale.

Held-out (32 answered prompts never trained on), drafted by the real drafting code from the
target's features, greedy: P(position j right | earlier ones right), j = 1..4:
{card['heldout_alpha_per_position']}

During training (phase 1): {curve}
{second}{card.get("note", "")}""")
