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


def sample_batch(tokens: np.ndarray, recipe: TrainRecipe, rng: np.random.Generator) -> torch.Tensor:
    """(batch, seq_len) int64. A `copy_share` of rows: first h tokens of a chunk, then a copy of
    one of its spans, so that the copied part is predictable only by looking back."""
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
    return torch.from_numpy(np.stack(rows).astype(np.int64))


def exit_logits(model: LlamaForCausalLM, hidden: torch.Tensor) -> torch.Tensor:
    """Decode an intermediate hidden state through the shared final norm and head."""
    return model.lm_head(model.model.norm(hidden))


def training_loss(model: LlamaForCausalLM, batch: torch.Tensor, recipe: TrainRecipe) -> tuple[torch.Tensor, float]:
    """Next-token CE at the last layer plus weighted CE at each auxiliary exit."""
    want_hidden = bool(recipe.exit_layers)
    out = model(batch, output_hidden_states=want_hidden, use_cache=False)
    labels = batch[:, 1:].reshape(-1)
    vocab = out.logits.shape[-1]
    final = F.cross_entropy(out.logits[:, :-1].reshape(-1, vocab).float(), labels)
    loss = final
    for layer in recipe.exit_layers:
        # hidden_states[l] is the output of the first l decoder layers (index 0 = embeddings)
        logits = exit_logits(model, out.hidden_states[layer])
        loss = loss + recipe.exit_weight * F.cross_entropy(
            logits[:, :-1].reshape(-1, vocab).float(), labels)
    return loss, float(final.detach())


def lr_at(step: int, recipe: TrainRecipe) -> float:
    """Linear warm-up, then cosine decay to 10 %."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model: LlamaForCausalLM, tokens: np.ndarray, recipe: TrainRecipe, seed: int,
          ckpt_path: Path, label: str, quiet: bool = False) -> dict:
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
        rng = np.random.default_rng([seed, step])
        batch = sample_batch(tokens, recipe, rng)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, recipe)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, final = training_loss(model, batch, recipe)
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


def save_checkpoint(path: Path, model, optimizer, step: int, elapsed: float) -> None:
    """Atomic: a kill mid-write leaves the previous checkpoint intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "step": step, "elapsed": elapsed}, tmp)
    os.replace(tmp, path)
