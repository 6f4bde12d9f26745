"""Figures for the model card: held-out loss, decode cost, agreement, loops and copying.

All on held-out files (corpus.is_heldout), greedy, batch 1.
"""
from __future__ import annotations

import ast
import difflib
import statistics
import textwrap
import time
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F

from autospec.models.kv import RowCache, cache_kwarg
from autospec.models.corpus import SourceFile

COPY_TOKENS = 48
LOOP_TOKENS = 64


@torch.no_grad()
def heldout_loss(model, tokens: np.ndarray, seq_len: int, windows: int = 32) -> float:
    """Mean next-token CE over `windows` evenly spaced windows of the held-out stream."""
    starts = np.linspace(0, len(tokens) - seq_len - 1, windows).astype(int)
    batch = torch.from_numpy(np.stack([tokens[s:s + seq_len] for s in starts]).astype(np.int64))
    losses = []
    for row in batch.split(8):
        logits = model(row, use_cache=False).logits.float()
        losses.append(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                      row[:, 1:].reshape(-1)).item())
    return float(np.mean(losses))


@torch.no_grad()
def decode_seconds_per_token(model, prompt_len: int = 128, steps: int = 48) -> float:
    """Steady-state seconds for one cached forward of one token (median), in a RowCache row
    as the engine decodes."""
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    limit = prompt_len + steps + 1
    cache, kwarg = RowCache(model, 1, limit), cache_kwarg(model)
    feed, times = ids, []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        logits = cache.forward(model, kwarg, [0], [feed], limit, last=1)
        cache.lengths[0] += len(feed)
        feed = [int(logits[0, -1].argmax())]
        times.append(time.perf_counter() - t0)
    times = times[1:]  # the prefill
    return statistics.median(times[steps // 4:])


@torch.no_grad()
def greedy_continue(model, tokenizer, prompt: str, n: int) -> list[int]:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=n, do_sample=False,
                         pad_token_id=tokenizer.eos_token_id)
    return out[0, ids.shape[1]:].tolist()


def functions_of(files: list[SourceFile], min_lines: int = 8, max_lines: int = 40) -> list[str]:
    """Source of top-level or method functions of a reasonable size, file order."""
    found = []
    for f in files:
        try:
            tree = ast.parse(f.text)
        except SyntaxError:
            continue
        lines = f.text.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                n = node.end_lineno - node.lineno + 1
                if min_lines <= n <= max_lines:
                    src = "\n".join(lines[node.lineno - 1:node.end_lineno])
                    found.append(textwrap.dedent(src))
    return found


def copy_prompts(files: list[SourceFile], count: int, head_lines: int = 3) -> list[tuple[str, str]]:
    """(prompt, expected): a function, a blank line, then its first `head_lines` lines again;
    expected is the rest of the function."""
    pairs = []
    for fn in functions_of(files)[::7]:
        lines = fn.splitlines()
        head = "\n".join(lines[:head_lines]) + "\n"
        pairs.append((fn + "\n\n\n" + head, "\n".join(lines[head_lines:])))
        if len(pairs) == count:
            break
    return pairs


def completion_prompts(files: list[SourceFile], count: int, lines: int = 24) -> list[str]:
    """The first `lines` lines of a function body's surroundings: open code completion."""
    prompts = []
    for f in files[::max(1, len(files) // (count * 2))]:
        text_lines = f.text.splitlines()
        if len(text_lines) < lines * 3:
            continue
        mid = len(text_lines) // 2
        prompts.append("\n".join(text_lines[mid - lines:mid]) + "\n")
        if len(prompts) == count:
            break
    return prompts


def copy_similarity(model, tokenizer, pairs: list[tuple[str, str]]) -> float:
    scores = []
    for prompt, expected in pairs:
        text = tokenizer.decode(greedy_continue(model, tokenizer, prompt, COPY_TOKENS))
        scores.append(difflib.SequenceMatcher(None, text, expected[:len(text)]).ratio())
    return float(np.mean(scores))


def loops(text: str) -> bool:
    """A line (non-blank) repeated more than twice."""
    counts = Counter(line.strip() for line in text.splitlines() if line.strip())
    return any(c > 2 for c in counts.values())


def loop_rate(model, tokenizer, prompts: list[str]) -> float:
    hits = [loops(tokenizer.decode(greedy_continue(model, tokenizer, p, LOOP_TOKENS)))
            for p in prompts]
    return float(np.mean(hits))


@torch.no_grad()
def greedy_agreement(target, draft, tokens: np.ndarray, seq_len: int = 256, windows: int = 8) -> float:
    """Share of held-out positions where draft argmax == target argmax (teacher forced)."""
    starts = np.linspace(0, len(tokens) - seq_len - 1, windows).astype(int)
    batch = torch.from_numpy(np.stack([tokens[s:s + seq_len] for s in starts]).astype(np.int64))
    t = target(batch, use_cache=False).logits.argmax(-1)
    d = draft(batch, use_cache=False).logits.argmax(-1)
    return float((t == d).float().mean())
