"""Training loop for the reference pair: resumable, seeded, with a LayerSkip-style exit loss.

The target is trained with auxiliary losses at a few intermediate layers, each decoded through
the *shared* final norm and head (LayerSkip, Elhoushi et al. 2024), so the early-exit drafter
(the first L layers + norm + head) proposes sensible tokens without any extra parameters.

A share of the training sequences rewards in-context copying: the second part of the
sequence repeats a span of the first. Induction heads form faster on such data (Olsson et al.
2022), and copying is what makes prompt lookup pay off on real LLMs.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

from autospec.models.presets import ModelShape, TrainRecipe

CHECKPOINT_EVERY = 100  # steps


def make_model(shape: ModelShape, vocab_size: int, max_positions: int, eos_id: int,
               seed: int, **extra) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        **extra,
    )
    return LlamaForCausalLM(config)


def sample_batch(tokens: np.ndarray, recipe: TrainRecipe, rng: np.random.Generator,
                 vocab_size: int | None = None) -> torch.Tensor:
    """(batch, seq_len) int64. A `copy_share` of code rows: first h tokens of a chunk, then a
    copy of one of its spans, so that the copied part is predictable only by looking back.
    With a `random_share` (needs vocab_size), that share of rows (binomial per batch) are
    instead a run of random tokens repeated to the end, after a little code (`random_rows`)."""
    n_random = int(rng.binomial(recipe.batch, recipe.random_share)) if recipe.random_share else 0
    seq_len = recipe.seq_len
    rows = []
    for _ in range(recipe.batch):
        start = int(rng.integers(0, len(tokens) - seq_len - 1))
        chunk = tokens[start:start + seq_len]
        if rng.random() < recipe.copy_share:
            h = int(rng.integers(seq_len // 2, 3 * seq_len // 4 + 1))
            m = seq_len - h  # copy length, <= h
            a = int(rng.integers(0, h - m + 1))
            chunk = np.concatenate([chunk[:h], chunk[a:a + m]])
        rows.append(chunk)
    rows = rows[:recipe.batch - n_random] + random_rows(tokens, n_random, seq_len, vocab_size, rng)
    return torch.from_numpy(np.stack(rows).astype(np.int64))


def random_rows(tokens: np.ndarray, count: int, seq_len: int, vocab_size: int | None,
                rng: np.random.Generator) -> list[np.ndarray]:
    """Rows of up to 64 code tokens, then one run of 12..159 uniform random token ids (3 and
    up: above the special tokens) repeated until the row is full."""
    if count and not vocab_size:
        raise ValueError("random rows need the vocabulary size")
    rows = []
    for _ in range(count):
        run = rng.integers(3, vocab_size, int(rng.integers(12, 160)))
        lead = int(rng.integers(0, 64))
        start = int(rng.integers(0, len(tokens) - lead - 1))
        repeats = [run] * (seq_len // len(run) + 2)
        rows.append(np.concatenate([tokens[start:start + lead], *repeats])[:seq_len])
    return rows


def exit_logits(model: LlamaForCausalLM, hidden: torch.Tensor) -> torch.Tensor:
    """Decode an intermediate hidden state through the shared final norm and head."""
    return model.lm_head(model.model.norm(hidden))


def training_loss(model: LlamaForCausalLM, batch: torch.Tensor, recipe: TrainRecipe,
                  teacher: LlamaForCausalLM | None = None) -> tuple[torch.Tensor, float]:
    """Next-token CE at the last layer plus weighted CE at each auxiliary exit; with a teacher
    and `recipe.distill` = w, the last layer's term is (1 - w) CE + w KL(teacher || model)."""
    want_hidden = bool(recipe.exit_layers)
    out = model(batch, output_hidden_states=want_hidden, use_cache=False)
    labels = batch[:, 1:].reshape(-1)
    vocab = out.logits.shape[-1]
    logits = out.logits[:, :-1].reshape(-1, vocab).float()
    final = F.cross_entropy(logits, labels)
    loss = final
    if teacher is not None and recipe.distill:
        with torch.no_grad():
            teacher_logits = teacher(batch, use_cache=False).logits[:, :-1].reshape(-1, vocab).float()
        kl = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(teacher_logits, -1),
                      log_target=True, reduction="batchmean")
        loss = (1 - recipe.distill) * final + recipe.distill * kl
    for layer in recipe.exit_layers:
        # hidden_states[l] is the output of the first l decoder layers (index 0 = embeddings)
        logits = exit_logits(model, out.hidden_states[layer])
        loss = loss + recipe.exit_weight * F.cross_entropy(
            logits[:, :-1].reshape(-1, vocab).float(), labels)
    return loss, float(final.detach())


def lr_at(step: int, recipe: TrainRecipe) -> float:
    """Linear warm-up, then cosine decay to 10 % over schedule_steps (default: steps), or
    constant."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    if recipe.schedule == "constant":
        return recipe.lr
    total = recipe.schedule_steps or recipe.steps
    progress = (step - recipe.warmup) / max(1, total - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model: LlamaForCausalLM, tokens: np.ndarray, recipe: TrainRecipe, seed: int,
          ckpt_path: Path, label: str, quiet: bool = False,
          teacher: LlamaForCausalLM | None = None) -> dict:
    """Train in place; resume from ckpt_path when it exists. Returns a small summary."""
    torch.set_num_threads(os.cpu_count() or 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    step = 0
    elapsed = 0.0
    if ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, elapsed = state["step"], state["elapsed"]
    model.train()
    bar = tqdm(total=recipe.steps, initial=step, desc=label, disable=quiet, unit="step",
               dynamic_ncols=True, mininterval=5)
    loss_ema = None
    started = time.perf_counter() - elapsed
    while step < recipe.steps:
        # Seed per step, so a resumed run sees exactly the batches an uninterrupted one would.
        rng = np.random.default_rng([seed if recipe.data_seed is None else recipe.data_seed, step])
        batch = sample_batch(tokens, recipe, rng, model.config.vocab_size)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, recipe)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, final = training_loss(model, batch, recipe, teacher)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        loss_ema = final if loss_ema is None else 0.95 * loss_ema + 0.05 * final
        seconds = time.perf_counter() - started
        bar.set_postfix(loss=f"{loss_ema:.3f}", tok_s=f"{step * batch.numel() / seconds:.0f}",
                        refresh=False)
        bar.update(1)
        if step % CHECKPOINT_EVERY == 0 or step == recipe.steps:
            save_checkpoint(ckpt_path, model, optimizer, step, seconds)
    bar.close()
    model.eval()
    return {"steps": step, "train_seconds": round(time.perf_counter() - started, 1),
            "train_tokens": step * recipe.batch * recipe.seq_len, "final_train_loss": loss_ema}


def save_checkpoint(path: Path, model, optimizer, step: int, elapsed: float, **extra) -> None:
    """Atomic: a kill mid-write leaves the previous checkpoint intact. `extra` entries (e.g.
    the distilled draft's agreement history) are saved beside the state."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "step": step, "elapsed": elapsed, **extra}, tmp)
    os.replace(tmp, path)
