"""The training loop the distilled draft, the trained exit and the feature head share:
AdamW, linear warm-up then cosine to a tenth, gradient clipping at 1, a checkpoint every
CHECKPOINT_EVERY steps (atomic; a killed build resumes from it and sees the same batches: each
step's randomness is seeded by (seed, step)), and a held-out evaluation at checkpoints."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from autospec.models.train import save_checkpoint

CHECKPOINT_EVERY = 50


def train_steps(model, recipe, ckpt: Path, step_loss: Callable[[np.random.Generator], tuple],
                *, desc: str, metric: str, evaluate: Callable[[], dict] | None = None,
                eval_every: int = CHECKPOINT_EVERY, weight_decay: float = 0.1,
                quiet: bool = False) -> dict:
    """Train `model`'s parameters that require grad for recipe.steps (from its checkpoint, if
    any). step_loss(rng) -> (loss, `metric`'s value on the batch); evaluate() -> a dict
    added to the history every `eval_every` steps and at the end."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=recipe.lr, betas=(0.9, 0.95),
                                  weight_decay=weight_decay)
    step, elapsed, history = 0, 0.0, []
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, elapsed, history = state["step"], state["elapsed"], state.get("history", [])
    model.train()
    bar = tqdm(total=recipe.steps, initial=step, desc=desc, disable=quiet, unit="step",
               dynamic_ncols=True, mininterval=5)
    started = time.perf_counter() - elapsed
    ema = None
    while step < recipe.steps:
        rng = np.random.default_rng([recipe.seed, step])  # per step: resumes see the same batches
        lr = recipe.lr * min(1.0, (step + 1) / recipe.warmup)
        lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / recipe.steps)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss, value = step_loss(rng)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        ema = value if ema is None else 0.95 * ema + 0.05 * value
        bar.set_postfix({metric: f"{ema:.3f}"}, refresh=False)
        bar.update(1)
        if step % CHECKPOINT_EVERY == 0 or step == recipe.steps:
            if evaluate is not None and (step % eval_every == 0 or step == recipe.steps):
                history.append({"step": step, **evaluate()})
                model.train()
            save_checkpoint(ckpt, model, optimizer, step, time.perf_counter() - started,
                            history=history)
    bar.close()
    model.eval()
    return {"steps": step, "train_seconds": round(time.perf_counter() - started, 1),
            f"final_{metric}": ema, "history": history}
