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
            "targets": targets, "scored": scored, "answer": answer[scored],
            "answer_pairs": answer}


def _pair_loss(head: EagleHead, predicted: torch.Tensor, targets: torch.Tensor, recipe
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """smooth-L1(f̂, f) + token_weight x CE of the head's subset logits to the target's own
    subset distribution over f (EAGLE's classification term), over (n, D) pairs; and the
    pairs' top-1 hits."""
    regression = F.smooth_l1_loss(predicted, targets)
    logits = head.lm_head.subset_logits(predicted)
    with torch.no_grad():
        target_probs = torch.softmax(head.lm_head.subset_logits(targets), -1)
    ce = -(target_probs * F.log_softmax(logits, -1)).sum(-1).mean()
    hits = (logits.argmax(-1) == target_probs.argmax(-1)).detach()
    return recipe.feature_weight * regression + recipe.token_weight * ce, hits


def head_loss(head: EagleHead, batch: dict, recipe, chain: int = 1) -> tuple[torch.Tensor, float]:
    """The loss on the scored pairs (`_pair_loss`) and top-1 agreement with the target on
    answer pairs. chain > 1 adds the training-time test (`chain_forward`): every answer pair
    also drafts positions 2..chain on the head's own predictions, position j's loss weighted
    chain_decay^(j-1)."""
    scored, answer = batch["scored"], batch["answer_pairs"]
    if chain == 1:  # phase 1: the head's own forward (transformers' layer)
        passes = [head(batch["ids"], batch["features"], batch["positions"])]
    else:
        slots = torch.zeros(len(answer), max(1, int(answer.sum(1).max())), dtype=torch.long)
        filled = torch.zeros(slots.shape, dtype=torch.bool)
        for i, row in enumerate(answer):
            where = row.nonzero().squeeze(1)
            slots[i, :len(where)], filled[i, :len(where)] = where, True
        passes = chain_forward(head, batch["ids"], batch["features"], batch["positions"],
                               slots, chain)
    loss, hits = _pair_loss(head, passes[0][scored], batch["targets"][scored], recipe)
    hits = hits[batch["answer"]]
    width = answer.shape[1]
    dim = batch["targets"].shape[-1]
    for j, predicted in enumerate(passes[1:], start=1):
        ahead = slots + j  # pass j at slot t predicts f_{t+1+j}: the pair j further on
        ok = filled & (ahead < width) & answer.gather(1, ahead.clamp(max=width - 1))
        if not ok.any():
            break
        wanted = batch["targets"].gather(1, ahead.clamp(max=width - 1)[..., None].expand(-1, -1, dim))
        extra, _ = _pair_loss(head, predicted[ok], wanted[ok], recipe)
        loss = loss + recipe.chain_decay ** j * extra
    return loss, float(hits.float().mean()) if len(hits) else 0.0


def chain_forward(head: EagleHead, ids: torch.Tensor, features: torch.Tensor,
                  positions: torch.Tensor, slots: torch.Tensor, chain: int) -> list[torch.Tensor]:
    """EAGLE-3's training-time test, as drafting runs it: pass 1 is the head over all pairs
    (B, T, D), causal; pass j > 1 runs only at `slots` (B, A) — pair t reads (its own pass j-1
    prediction, x_{t+j}) at position t + j and attends to pass 1's keys of pairs <= t (the
    target's true features, as the head's cache holds them when drafting from t) and to its
    own keys of passes 2..j (what drafting's cache holds of positions 2..j). Returns
    [pass 1 (B, T, D), pass 2 (B, A, D), ...]. The fed-back predictions are detached."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    layer, attn = head.layer, head.layer.self_attn

    def project(tokens, feats, pos):
        x = head.fc(torch.cat([head.embed(tokens).to(feats.dtype), feats], -1))
        cos, sin = head.rotary(x, pos)
        h = layer.input_layernorm(x)
        shape = (*x.shape[:2], -1, attn.head_dim)
        q, k, v = (proj(h).view(shape).transpose(1, 2)
                   for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        groups = q.shape[1] // k.shape[1]
        return x, q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)

    def finish(x, attended):
        x = x + attn.o_proj(attended.transpose(1, 2).flatten(2))
        return head.norm(x + layer.mlp(layer.post_attention_layernorm(x)))

    x, q, k0, v0 = project(ids, features, positions)
    first = finish(x, F.scaled_dot_product_attention(q, k0, v0, is_causal=True,
                                                     scale=attn.scaling))
    passes = [first]
    width = ids.shape[1]
    hidden = torch.arange(width)[None, None, :] > slots[:, :, None]  # (B, A, T)
    bias = torch.zeros(hidden.shape).masked_fill(hidden, float("-inf"))[:, None]
    own_k, own_v = [], []
    previous = first.gather(1, slots[..., None].expand(-1, -1, first.shape[-1]))
    for j in range(1, chain):
        tokens = ids.gather(1, (slots + j).clamp(max=width - 1))
        x, q, k, v = project(tokens, previous.detach(), positions.gather(1, slots) + j)
        own_k.append(k)
        own_v.append(v)
        scores = torch.cat([q @ k0.transpose(-1, -2) * attn.scaling + bias]
                           + [(q * key).sum(-1, keepdim=True) * attn.scaling for key in own_k], -1)
        weights = scores.softmax(-1)
        attended = weights[..., :width] @ v0
        for i, value in enumerate(own_v):
            attended = attended + weights[..., width + i, None] * value
        previous = finish(x, attended)
        passes.append(previous)
    return passes


def train_head(head: EagleHead, rows: list[dict], recipe, ckpt: Path, quiet: bool = False,
               heldout: list[dict] | None = None, chain: int = 1) -> dict:
    def step_loss(rng: np.random.Generator):
        picks = rng.choice(len(rows), recipe.batch, replace=False)
        # float32: this CPU has no bf16 matrix units (a bf16 matmul ran 5x slower)
        return head_loss(head, make_batch([rows[i] for i in picks], recipe, rng), recipe, chain)
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
    first = {k: v for k, v in asdict(recipe).items() if not k.startswith(("refine", "chain"))}
    run = train_head(head, train, recipe, work / f"head-{_key(first)}-{len(train)}.pt", quiet,
                     heldout)
    refined = None
    if recipe.refine_steps:
        second = replace(recipe, steps=recipe.refine_steps, lr=recipe.refine_lr,
                         warmup=recipe.refine_warmup, seed=recipe.seed + 1)
        refined = train_head(head, train, second,
                             work / f"head-{_key(asdict(recipe))}-{len(train)}-refine.pt",
                             quiet, heldout, chain=recipe.chain)
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
        f"Phase 2, from that head: EAGLE-3's training-time test, {refined['steps']} steps at "
        f"peak rate {r['refine_lr']} ({refined['train_seconds']:.0f} s) in which every answer "
        f"pair also drafts positions 2..{r['chain']} on the head's own predictions (loss "
        f"weight {r['chain_decay']}^(j-1)); held-out during it: "
        + "; ".join(f"step {h['step']}: {h['heldout_alpha']}" for h in refined["history"])
        + ".\n")
    (out_dir / "README.md").write_text(f"""# SmolLM2-135M-Instruct feature head (EAGLE)

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
