"""What a weight format costs in quality, against float32: `autospec models quality`.

Three figures per format (models/weights.py), each by our own forward (the one that decodes):
- greedy agreement: over chat and held-out prompts, the share whose first N generated tokens
  equal float32's, and where the others first part;
- held-out log-likelihood: the mean log-probability per token of the held-out workload's
  prompts (teacher-forced, one forward each), beside float32's;
- rounding spread: the largest difference of any logit between one forward over a whole text
  and the same text fed a token at a time — two orders of the same arithmetic. A speculative
  verify and plain decoding differ by exactly that, so an argmax may flip only where plain's
  top-2 margin is below twice this spread (models/ties.py).
"""
from __future__ import annotations

import statistics

import torch

from autospec.models.ties import text_logits, rounding_spread


def log_likelihood(model, texts: list[list[int]]) -> float:
    """Mean log-probability per predicted token over `texts` (token ids)."""
    total, count = 0.0, 0
    for ids in texts:
        logits = text_logits(model, ids, one_at_a_time=False)[:-1]
        picked = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])
        total += picked.sum().item()
        count += len(ids) - 1
    return total / max(1, count)


SPREAD_TEXTS = 4


def agreement(engine, reference: list[list[int]], prompts: list[list[int]], n: int) -> dict:
    """Greedy plain decoding of `prompts` by `engine` against `reference` outputs."""
    return agreement_of([engine.generate(ids, drafter=None, max_new_tokens=n).token_ids
                         for ids in prompts], reference)


def agreement_of(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    firsts = []
    for got, want in zip(outputs, reference):
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                     None if len(got) == len(want) else min(len(got), len(want)))
        firsts.append(first)
    parted = [f for f in firsts if f is not None]
    return {"prompts": len(outputs), "identical": len(outputs) - len(parted),
            "identical_share": (len(outputs) - len(parted)) / max(1, len(outputs)),
            "first_divergence_median": statistics.median(parted) if parted else None,
            "first_divergence_min": min(parted) if parted else None}


def measure(engines: dict, chat: list[list[int]], heldout: list[list[int]], n: int,
            progress=lambda m: None) -> dict:
    """Per format of `engines` ({format: Engine}; float32 first): agreement with float32 over
    chat + held-out prompts, held-out log-likelihood, rounding spread over the held-out texts."""
    prompts = chat + heldout
    base = engines["float32"]
    reference = [base.generate(ids, drafter=None, max_new_tokens=n).token_ids for ids in prompts]
    out = {}
    for name, engine in engines.items():
        progress(f"{name}: agreement, log-likelihood, rounding spread")
        model = engine.models.target
        out[name] = {"agreement": (agreement(engine, reference, prompts, n) if name != "float32"
                                   else agreement_of(reference, reference)),
                     "log_likelihood": log_likelihood(model, heldout),
                     # token at a time is a forward per token: SPREAD_TEXTS texts are enough
                     "rounding_spread": rounding_spread(model, heldout[:SPREAD_TEXTS])}
    return out


def format_quality(report: dict, n: int) -> str:
    lines = [f"| weights | first {n} tokens as float32's | first divergence (median, min) | "
             f"held-out log-likelihood / token | rounding spread (max logit) |",
             "|---|---|---|---|---|"]
    for name, q in report.items():
        a = q["agreement"]
        parted = ("" if a["first_divergence_median"] is None
                  else f"{a['first_divergence_median']:g}, {a['first_divergence_min']}")
        lines.append(f"| {name} | {a['identical']}/{a['prompts']} ({a['identical_share']:.0%}) | "
                     f"{parted} | {q['log_likelihood']:.4f} | {q['rounding_spread']:.2e} |")
    return "\n".join(lines)
