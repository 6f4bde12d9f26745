"""Where greedy speculative output may part from plain decoding's: only at a near-tie.

A verify scores K + 1 tokens in one forward, plain decoding one token a forward; a batch pads
and packs rows. The same function, computed in another order, rounds differently in the last
bits, so on trained weights an argmax may flip where plain's top two logits are closer than
that rounding. `near_tie(model, ids)` is how close, by the model's format
(models/weights.py):
- float32: NEAR_TIE; the rounding spread measured there is ~1e-5 on the reference pair,
  3e-4 on SmolLM2 (`autospec models quality`);
- bfloat16 activations (`bfloat16`, `int4`): the logits are bfloat16 and the spread is far wider
  (reference pair 0.1, SmolLM2 1-1.9: bfloat16 rounding through 30 layers), so the limit is
  measured on the very text in question: twice its rounding spread (`rounding_spread`: the
  largest logit difference between one forward over the text and the text fed a token at a
  time, two orders of the same arithmetic).

`verdict` is what `autospec bench` reports as identical_to_plain: True, "near-tie" (every
divergence at one of plain's near-ties, each listed with its margin and limit), or False.
"""
from __future__ import annotations

import torch

from autospec.models.weights import format_of

NEAR_TIE = 1e-3


def near_tie(model, ids: list[int]) -> float:
    """The top-2 margin below which an argmax may flip on `ids` (a prompt and plain's output)."""
    if format_of(model) == "float32":
        return NEAR_TIE
    key = (id(model), tuple(ids))  # a bench asks once per method of the same plain output
    if key not in _LIMITS:
        _LIMITS[key] = 2 * rounding_spread(model, [ids])
    return _LIMITS[key]


_LIMITS: dict[tuple, float] = {}


def text_logits(model, ids: list[int], one_at_a_time: bool) -> torch.Tensor:
    """(T, V) float32 logits of `ids` by the decode-time forward over a fresh RowCache."""
    from autospec.models.kv import RowCache, cache_kwarg
    cache = RowCache(model, 1, len(ids) + 1)
    slot = cache.claim()
    kwarg = cache_kwarg(model)
    feeds = [[t] for t in ids] if one_at_a_time else [ids]
    out = []
    with torch.inference_mode():
        for feed in feeds:
            out.append(cache.forward(model, kwarg, [slot], [feed], len(ids) + 1)[0].float().clone())
            cache.lengths[slot] += len(feed)
    return torch.cat(out)


def rounding_spread(model, texts: list[list[int]]) -> float:
    """The largest |logit| difference between a text's one forward and its token-at-a-time
    forwards, over `texts` (token ids)."""
    return max((text_logits(model, ids, False) - text_logits(model, ids, True)).abs().max().item()
               for ids in texts)


@torch.no_grad()
def top2_margins(model, prompt_ids: list[int], output: list[int]) -> list[float]:
    """Plain's top-1 minus top-2 logit at each output position (one uncached forward)."""
    logits = model(torch.tensor([prompt_ids + output])).logits[0, len(prompt_ids) - 1:-1]
    top = logits.float().topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def first_difference(got: list[int], want: list[int]) -> int:
    return next((t for t, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def verdict(model, prompts: list[list[int]], outputs: list[list[int]],
            plain: list[list[int]]) -> tuple[bool | str, list[dict]]:
    """(True | "near-tie" | False, the divergences: prompt index, position, plain's margin)."""
    found = []
    for i, (got, want) in enumerate(zip(outputs, plain)):
        if got != want:
            at = first_difference(got, want)
            margin = (top2_margins(model, prompts[i], want)[at] if at < len(want)
                      else float("inf"))
            found.append({"prompt": i, "position": at, "margin": margin,
                          "limit": near_tie(model, prompts[i] + want)})
    if not found:
        return True, []
    return ("near-tie" if all(d["margin"] < d["limit"] for d in found) else False), found


def logprob_verdict(outputs: list[list[int]], plain: list[list[int]],
                    output_logprobs: list[list[dict[int, float]]],
                    plain_logprobs: list[list[dict[int, float]]]) -> tuple[bool | str, list[dict]]:
    """`verdict` for an engine whose target we cannot run (vLLM), from the log-probabilities
    both runs reported (each position's top two and the chosen token's): a divergence's
    margin is plain's top-1 minus top-2 log-probability there (a difference of log-softmaxes
    is one of logits), and the limit twice the rounding spread measured on these very texts —
    the largest difference between the two runs' log-probability of the same token, every
    token both report there (the chosen one and the runners-up), wherever their outputs still
    agree (two orders of the same arithmetic, as `rounding_spread`'s), at least NEAR_TIE. The
    runners-up count because a likely token's log-probability hides its logit's movement (the
    normalizer moves with it) where a runner-up's moves by the two logits' difference, as a
    margin does: SmolLM2 in bfloat16 under vLLM at 16 clients, the chosen tokens' alone gave a
    limit of 0.24 where partings sat at margins of 0-0.25 (one at 0.25: False); with the
    runners-up, 1.0."""
    spread, found = 0.0, []
    for i, (got, want) in enumerate(zip(outputs, plain)):
        at = first_difference(got, want)
        for t in range(min(at, len(output_logprobs[i]), len(plain_logprobs[i]))):
            mine, theirs = output_logprobs[i][t], plain_logprobs[i][t]
            for token, value in mine.items():
                other = theirs.get(token)
                if other is not None:
                    spread = max(spread, abs(value - other))
        if got != want:
            top = sorted(plain_logprobs[i][at].values(), reverse=True) if at < len(
                plain_logprobs[i]) else []
            margin = top[0] - top[1] if len(top) > 1 else float("inf")
            found.append({"prompt": i, "position": at, "margin": margin})
    limit = max(2 * spread, NEAR_TIE)
    for d in found:
        d["limit"] = limit
    if not found:
        return True, []
    return ("near-tie" if all(d["margin"] < limit for d in found) else False), found
