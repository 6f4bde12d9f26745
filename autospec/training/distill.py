"""`autospec models build --preset smollm2-draft`: a small draft for SmolLM2, self-distilled.

The recipe (Medusa-2 / EAGLE's data recipe, on a CPU budget):
1. prompts: chat prompts made from the standard library's TRAINING split with the same makers
   as the shipped chat workload (`chat_prompts`), so the workload's held-out files never leak;
2. answers: the target answers them greedily (batched, left-padded) and keeps its top-k
   probabilities at every answer position — soft targets at no extra target cost;
3. the draft (`models/shared_draft.py`): a few of the target's own decoder layers (copied, then
   trained: a pruned target "healed" by distillation), the target's embedding borrowed at run
   time, and a head over the most frequent `vocab_subset` tokens of the target's answers
   (FR-Spec) initialised from the target's head rows. The first version — a 3-layer, width-256
   model with its own PCA-projected embedding and the full head — reached 0.36 top-1
   agreement and never paid on this CPU; starting from the target's layers starts closer;
4. training: CE on the target's greedy token plus CE to its renormalised top-k on answer
   positions, CE on a sample of prompt positions (the draft must also read the prompt it may
   have to copy). Only in-subset tokens count (the draft cannot propose the others), and the
   head is applied only at those positions.

Every stage is resumable: answers are written in shards, training checkpoints every 50 steps.
Everything intermediate lives in `paths.build_dir("smollm2-draft")`.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from autospec.models.shared_draft import own_state
from autospec.training.card import save_draft, write_card
from autospec.training.loop import train_steps
from autospec.training.target import load_target
from autospec.paths import SMOLLM2_SHIPPED_DIR, build_dir, smollm2_dir


@dataclass(frozen=True)
class DistillRecipe:
    prompts_per_category: int = 400
    prompt_seed: int = 1
    max_prompt_tokens: int = 768  # longer prompts are skipped (the answers must fit the budget)
    max_new_tokens: int = 128
    gen_batch: int = 16
    top_k: int = 8  # target probabilities kept per answer position
    # the draft: the target's decoder layers it starts from, and its head's vocabulary
    # first, middle, last: after 150 steps on 208 answers, held-out top-1 0.36 against 0.29 for
    # (0, 1, 29) and 0.30 for (0, 1, 2); lr 1e-3 beat 3e-4 (0.40 vs 0.35 after 300 steps)
    keep_layers: tuple[int, ...] = (0, 14, 29)
    vocab_subset: int = 8192
    # > 0: a trained early exit — the first `borrowed_layers` of keep_layers are the target's
    # own (frozen, not shipped); the rest, the norm and the head are the exit
    borrowed_layers: int = 0
    # training
    steps: int = 1200
    batch: int = 8
    lr: float = 1e-3
    warmup: int = 50
    soft_weight: float = 0.5  # answer positions: (1 - w) CE(greedy token) + w KL(top-k)
    # prompt positions per row that carry a term: distillation to the target's top-k there
    # where the prompt targets were computed (the answers stage does), else language modelling
    prompt_positions: int = 192
    prompt_weight: float = 0.5
    seed: int = 0


RECIPE = DistillRecipe()
# The trained exit for self-speculation: untrained, SmolLM2's exits agree
# with the full model on 0.03 (layer 4) to 0.33 (layer 24) of tokens; here the target's first
# 4 layers, then one trained layer (a copy of its last) with its own norm and subset head.
EXIT_RECIPE = DistillRecipe(keep_layers=(0, 1, 2, 3, 29), borrowed_layers=4)
RECIPES = {"smollm2-draft": (RECIPE, "draft"), "smollm2-exit": (EXIT_RECIPE, "exit")}


def work_dir() -> Path:
    return build_dir("smollm2-draft")


# -- 1. prompts -----------------------------------------------------------------------------
def training_prompts(tokenizer, recipe: DistillRecipe) -> list[list[int]]:
    """Rendered, tokenised chat prompts from the training split, shortest first."""
    from autospec.bench.chat_workloads import chat_prompts
    from autospec.models.corpus import default_corpus_dir, iter_sources, split
    train, _ = split(iter_sources(default_corpus_dir()))
    rows = chat_prompts(train, recipe.prompts_per_category, recipe.prompt_seed)
    encoded = []
    for row in rows:
        text = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True,
                                             tokenize=False)
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= recipe.max_prompt_tokens:
            encoded.append(ids)
    return sorted(encoded, key=len)  # batches of similar length: little padding


# -- 2. the target's answers ----------------------------------------------------------------
@torch.inference_mode()
def generate_answers(target, tokenizer, prompts: list[list[int]], recipe: DistillRecipe,
                     out: Path, quiet: bool = False) -> None:
    """Shard i = prompts[i*B:(i+1)*B] answered greedily; existing shards are skipped."""
    out.mkdir(parents=True, exist_ok=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else target.config.eos_token_id
    eos = target.config.eos_token_id
    n_shards = math.ceil(len(prompts) / recipe.gen_batch)
    bar = tqdm(total=n_shards, desc="target answers", disable=quiet, unit="shard", dynamic_ncols=True)
    for shard in range(n_shards):
        path = out / f"shard-{shard:05d}.pt"
        bar.update(1)
        if path.exists():
            continue
        batch = prompts[shard * recipe.gen_batch:(shard + 1) * recipe.gen_batch]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        result = target.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=recipe.max_new_tokens, pad_token_id=pad,
                                 return_dict_in_generate=True, output_logits=True)
        answers = result.sequences[:, width:]
        logits = torch.stack(result.logits, 1).float()  # (B, steps, V)
        top = torch.topk(torch.softmax(logits, -1), recipe.top_k, -1)
        rows = []
        for i, prompt in enumerate(batch):
            answer = answers[i].tolist()
            n = next((j + 1 for j, t in enumerate(answer) if t == eos), len(answer))
            rows.append({"prompt": prompt, "answer": answer[:n],
                         "top_ids": top.indices[i, :n].to(torch.int32),
                         "top_probs": top.values[i, :n].to(torch.float16)})
        tmp = path.with_suffix(".tmp")
        torch.save(rows, tmp)
        os.replace(tmp, path)
    bar.close()


@torch.inference_mode()
def generate_prompt_targets(target, answers: Path, out: Path, recipe: DistillRecipe,
                            quiet: bool = False, rows_per_forward: int = 4) -> None:
    """The target's top-k at every prompt position of every answered row, teacher-forced: one
    forward per few prompts (right-padded: causal attention keeps the padding out of the
    valid positions), several times cheaper per position than the answers' generation.
    Shard i beside answers' shard i; existing shards are skipped."""
    out.mkdir(parents=True, exist_ok=True)
    shards = sorted(answers.glob("shard-*.pt"))
    for shard in tqdm(shards, desc="prompt targets", disable=quiet, unit="shard", dynamic_ncols=True):
        path = out / shard.name
        if path.exists():
            continue
        rows, found = torch.load(shard), []
        for start in range(0, len(rows), rows_per_forward):
            group = [r["prompt"] for r in rows[start:start + rows_per_forward]]
            width = max(map(len, group))
            ids = torch.tensor([p + [0] * (width - len(p)) for p in group])
            logits = target(input_ids=ids).logits  # (B, width, V)
            for i, prompt in enumerate(group):
                top = torch.topk(torch.softmax(logits[i, :len(prompt) - 1].float(), -1),
                                 recipe.top_k, -1)  # position t: what follows token t
                found.append({"prompt_top_ids": top.indices.to(torch.int32),
                              "prompt_top_probs": top.values.to(torch.float16)})
        tmp = path.with_suffix(".tmp")
        torch.save(found, tmp)
        os.replace(tmp, path)


def load_answers(out: Path) -> list[dict]:
    """The answered rows; each with its prompt targets where they were computed."""
    rows = []
    for path in sorted(out.glob("shard-*.pt")):
        shard = torch.load(path)
        extra = out.parent / "prompt-targets" / path.name
        if extra.exists():
            shard = [{**row, **more} for row, more in zip(shard, torch.load(extra))]
        rows += shard
    return rows


# -- 3. the draft ---------------------------------------------------------------------------
def choose_subset(answers: list[dict], vocab_size: int, size: int,
                  always: set[int] = frozenset()) -> torch.Tensor:
    """The `size` ids the target emits most in its answers (ties: the prompts' counts, then
    the id), plus `always` (EOS); sorted."""
    counts = np.zeros(vocab_size, dtype=np.float64)
    for row in answers:
        np.add.at(counts, np.asarray(row["answer"], dtype=np.int64), 1.0)
        np.add.at(counts, np.asarray(row["prompt"], dtype=np.int64), 1e-3)
    for token in always:
        counts[token] = np.inf
    size = min(size, vocab_size)
    order = np.lexsort((np.arange(vocab_size), -counts))[:size]
    return torch.from_numpy(np.sort(order))


def make_draft(target, recipe: DistillRecipe, token_ids: torch.Tensor):
    from autospec.models.shared_draft import draft_from_target
    torch.manual_seed(recipe.seed)
    return draft_from_target(target, list(recipe.keep_layers), token_ids, recipe.borrowed_layers)


# -- 4. training ----------------------------------------------------------------------------
def make_batch(rows: list[dict], recipe: DistillRecipe, rng: np.random.Generator) -> dict:
    """Right-padded (B, T) ids, and for each loss term ("answer", "prompt") the rows and
    positions it scores, the token each position should predict and, where known, the
    target's top-k there (soft ids and probabilities; None: a plain language-model term)."""
    seqs = [r["prompt"] + r["answer"] for r in rows]
    width = max(map(len, seqs))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    soft_prompts = all("prompt_top_ids" in r for r in rows)
    terms = {name: {"rows": [], "pos": [], "next": [], "soft_ids": [], "soft_probs": []}
             for name in ("answer", "prompt")}

    def add(name, i, pos, next_ids, soft_ids=None, soft_probs=None):
        t = terms[name]
        t["rows"] += [i] * len(pos)
        t["pos"] += list(pos)
        t["next"] += list(next_ids)
        if soft_ids is not None:
            t["soft_ids"].append(soft_ids.long())
            t["soft_probs"].append(soft_probs.float())

    for i, (row, seq) in enumerate(zip(rows, seqs)):
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
        p, n = len(row["prompt"]), len(row["answer"])
        # the logits at position t predict token t + 1: answer token j sits at p + j
        add("answer", i, range(p - 1, p - 1 + n), row["answer"], row["top_ids"], row["top_probs"])
        picks = np.sort(rng.choice(p - 1, min(p - 1, recipe.prompt_positions), replace=False))
        if soft_prompts:  # what the target would say there (its argmax), not the text's token
            top = row["prompt_top_ids"][picks]
            add("prompt", i, picks.tolist(), top[:, 0].tolist(), top, row["prompt_top_probs"][picks])
        else:
            add("prompt", i, picks.tolist(), [seq[t + 1] for t in picks])
    batch = {"ids": ids, "mask": mask}
    for name, t in terms.items():
        batch[name] = {"rows": torch.tensor(t["rows"], dtype=torch.long),
                       "pos": torch.tensor(t["pos"], dtype=torch.long),
                       "next": torch.tensor(t["next"], dtype=torch.long),
                       "soft_ids": torch.cat(t["soft_ids"]) if t["soft_ids"] else None,
                       "soft_probs": torch.cat(t["soft_probs"]) if t["soft_probs"] else None}
    return batch


def distill_loss(draft, batch: dict, recipe: DistillRecipe) -> tuple[torch.Tensor, float]:
    """The draft's loss on one batch; returns (loss, answer CE) — CE on the greedy token is
    what acceptance tracks. Scored in the head's subset: positions whose next token lies
    outside it are left out (no draft can propose that token)."""
    from autospec.models.shared_draft import subset_lookup
    hidden = draft.model(input_ids=batch["ids"], attention_mask=batch["mask"]).last_hidden_state
    head = draft.lm_head
    lookup = subset_lookup(head.token_ids, head.vocab_size)  # (V,) -> subset index or -1

    def term(t: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, CE on the token to predict) over the positions whose token is in the subset:
        (1 - w) CE + w CE to the renormalised top-k (= KL + const) where soft targets exist."""
        target = lookup[t["next"]]
        keep = target >= 0
        if not keep.any():
            zero = hidden.sum() * 0.0
            return zero, zero
        logits = head.subset_logits(hidden[t["rows"][keep], t["pos"][keep]]).float()
        ce = F.cross_entropy(logits, target[keep])
        if t["soft_ids"] is None:
            return ce, ce
        soft_ids = lookup[t["soft_ids"][keep]]  # (n, k), -1 outside the subset
        probs = t["soft_probs"][keep] * (soft_ids >= 0)
        probs = probs / probs.sum(1, keepdim=True)  # the argmax token is in: the sum is > 0
        log_probs = F.log_softmax(logits, -1).gather(1, soft_ids.clamp(min=0))
        soft = -(probs * log_probs).sum(1).mean()
        return (1 - recipe.soft_weight) * ce + recipe.soft_weight * soft, ce

    loss, answer_ce = term(batch["answer"])
    if recipe.prompt_weight and len(batch["prompt"]["pos"]):
        loss = loss + recipe.prompt_weight * term(batch["prompt"])[0]
    return loss, float(answer_ce.detach())


def train_draft(draft, answers: list[dict], recipe: DistillRecipe, ckpt: Path,
                quiet: bool = False, heldout: list[dict] | None = None) -> dict:
    def step_loss(rng: np.random.Generator):
        picks = rng.choice(len(answers), recipe.batch, replace=False)
        batch = make_batch([answers[i] for i in picks], recipe, rng)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return distill_loss(draft, batch, recipe)
    evaluate = (lambda: {"heldout_top1": top1_agreement(draft, heldout)}) if heldout else None
    return train_steps(draft, recipe, ckpt, step_loss, desc="draft", metric="answer_ce",
                       evaluate=evaluate, quiet=quiet)


@torch.inference_mode()
def top1_agreement(draft, rows: list[dict]) -> float:
    """Teacher-forced: how often the draft's argmax is the target's greedy answer token
    (≈ acceptance at draft position 1)."""
    draft.eval()
    hits = total = 0
    for row in rows:
        seq = torch.tensor([row["prompt"] + row["answer"]])
        logits = draft(seq).logits[0]
        p, n = len(row["prompt"]), len(row["answer"])
        predicted = logits[p - 1:p - 1 + n].argmax(-1)
        hits += int((predicted == torch.tensor(row["answer"])).sum())
        total += n
    return hits / max(1, total)


# -- the build ------------------------------------------------------------------------------
def build(out_dir: Path | None = None, preset: str = "smollm2-draft", quiet: bool = False,
          log=print, stage: str = "all",
          threads: int | None = None) -> dict:
    """preset: "smollm2-draft" or "smollm2-exit" (both learn from the same answers);
    stage: "answers" (only the target's answers), "train" (with what answers exist), "all"."""
    recipe, shipped_as = RECIPES[preset]
    out_dir = Path(out_dir) if out_dir else SMOLLM2_SHIPPED_DIR / shipped_as
    work = work_dir()
    work.mkdir(parents=True, exist_ok=True)
    # Beside other work, 1 thread: 2 OpenMP threads on 2 busy cores wait on each other (a
    # shard of answers took 10x longer that way than on one thread).
    torch.set_num_threads(threads or os.cpu_count() or 1)
    target, tokenizer = load_target()
    if stage in ("answers", "all"):
        prompts = training_prompts(tokenizer, recipe)
        log(f"{len(prompts)} training prompts (<= {recipe.max_prompt_tokens} tokens)")
        generate_answers(target, tokenizer, prompts, recipe, work / "answers", quiet)
        generate_prompt_targets(target, work / "answers", work / "prompt-targets", recipe, quiet)
        if stage == "answers":
            return {}
    answers = load_answers(work / "answers")
    if len(answers) < 2 * recipe.batch:
        raise ValueError(f"only {len(answers)} target answers in {work / 'answers'}: "
                         f"run the answers stage first")
    rng = np.random.default_rng(recipe.seed)
    order = rng.permutation(len(answers))
    heldout = [answers[i] for i in order[:32]]  # never trained on: the card's agreement
    train = [answers[i] for i in order[32:]]
    log(f"{len(train)} answers to train on, {sum(len(a['answer']) for a in train):,} answer tokens")
    eos = target.config.eos_token_id
    always = set(eos if isinstance(eos, list) else [eos]) - {None}
    token_ids = choose_subset(train, target.config.vocab_size, recipe.vocab_subset, always)
    covered = subset_coverage(token_ids, heldout)
    log(f"head over {len(token_ids)} tokens: {covered:.1%} of held-out answer tokens")
    draft = make_draft(target, recipe, token_ids)
    key = json.dumps(asdict(recipe), sort_keys=True)
    ckpt = work / f"draft-{hashlib.sha1(key.encode()).hexdigest()[:10]}-{len(train)}.pt"
    run = train_draft(draft, train, recipe, ckpt, quiet, heldout)
    card = {"recipe": asdict(recipe), "training": run, "answers": len(train),
            "answer_tokens": sum(len(a["answer"]) for a in train),
            "heldout_top1_agreement": top1_agreement(draft, heldout),
            "heldout_subset_coverage": covered,
            "prompt_targets": all("prompt_top_ids" in a for a in train),
            "draft_params": sum(t.numel() for t in own_state(draft).values()),
            "target": str(smollm2_dir() / "target")}
    save_draft(draft, tokenizer, out_dir, card)
    card = write_card(out_dir, target)
    log(f"draft saved to {out_dir}: held-out top-1 agreement "
        f"{card['heldout_top1_agreement']:.3f}, c = {card['cost_ratio_c']:.3f}")
    return card


def subset_coverage(token_ids: torch.Tensor, rows: list[dict]) -> float:
    """Share of these answers' tokens the head can propose at all."""
    inside = set(token_ids.tolist())
    tokens = [t for row in rows for t in row["answer"]]
    return sum(t in inside for t in tokens) / max(1, len(tokens))
