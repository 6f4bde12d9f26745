"""The methods `autospec bench` can run, each a callable over token ids.

    plain                    our loop, k = 0
    static:DRAFTER:K         our loop, one drafter, fixed K
    hf:generate              transformers' own generate() on the same target
    hf:assisted[:K]          transformers' assisted generation with the same draft model
    hf:prompt-lookup[:K]     transformers' prompt lookup decoding
    hf:early-exit[:K]        transformers' self-speculative early exit (same exit layer)
    adaptive                 our online controller (controller/adaptive.py), learning across
                             the run's prompts as a serving process would
    adaptive:POLICY.yaml     the same, with a policy file's parameters (e.g. a tuned one)
    ctl:fixed[:DRAFTER:K]    baseline controllers (controller/baselines.py), default drafter
    ctl:hf-heuristic[:DRAFTER]   draft-model; fixed defaults to draft-model:4
    ctl:ema[:DRAFTER]
    oracle, oracle-per-category   picked afterwards from the static runs (harness.py)

The hf: peers run with a constant number of draft tokens (no confidence cut-off), so they
compare with static:*:K at the same K.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from autospec.controller.adaptive import DEFAULT_DRAFTERS
from autospec.controller.factory import make_controller
from autospec.drafters.base import known_drafters
from autospec.engine.loop import Engine

HF_DEFAULT_K = 4
DERIVED = ("oracle", "oracle-per-category")


@dataclass
class RunResult:
    token_ids: list[int]
    wall_s: float
    proposed: int = 0
    accepted: int = 0
    steps: int = 0
    step_records: list | None = None


Runner = Callable[[list[int], int, float, int, str], RunResult]


def parse_methods(spec: str) -> list[str]:
    """Validate a comma-separated method list; errors name the bad method and what is known."""
    methods = [m.strip() for m in spec.split(",") if m.strip()]
    if not methods:
        raise ValueError("no methods given")
    for m in methods:
        _validate(m)
    if "plain" not in methods:
        methods.insert(0, "plain")  # every speedup is measured against it, in the same run
    return list(dict.fromkeys(methods))


def _validate(method: str) -> None:
    parts = method.split(":")
    if method in ("plain", "hf:generate", "adaptive") or method in DERIVED:
        return
    if method.startswith("adaptive:"):
        from autospec.policy import PolicyError, load_policy
        try:
            load_policy(method[len("adaptive:"):])
        except PolicyError as exc:
            raise ValueError(f"method '{method}': {exc}") from None
        return
    if parts[0] == "ctl" and parts[1] in ("fixed", "hf-heuristic", "ema"):
        if len(parts) > 2 and parts[2] not in known_drafters():
            raise ValueError(f"unknown drafter '{parts[2]}' in method '{method}' "
                             f"(known: {', '.join(known_drafters())})")
        if parts[1] == "fixed" and len(parts) == 4:
            _k(parts[3], method)
            return
        if len(parts) <= 3:
            return
    if parts[0] == "static" and len(parts) == 3:
        if parts[1] not in known_drafters():
            raise ValueError(f"unknown drafter '{parts[1]}' in method '{method}' "
                             f"(known: {', '.join(known_drafters())})")
        _k(parts[2], method)
        return
    if parts[0] == "hf" and parts[1] in ("assisted", "prompt-lookup", "early-exit") and len(parts) <= 3:
        if len(parts) == 3:
            _k(parts[2], method)
        return
    raise ValueError(
        f"unknown method '{method}' (known: plain, static:DRAFTER:K, adaptive, "
        f"ctl:fixed[:DRAFTER:K], ctl:hf-heuristic[:DRAFTER], ctl:ema[:DRAFTER], hf:generate, "
        f"hf:assisted[:K], hf:prompt-lookup[:K], hf:early-exit[:K], oracle, oracle-per-category)")


def _k(text: str, method: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise ValueError(f"K must be an integer in method '{method}', got '{text}'") from None
    if k <= 0:
        raise ValueError(f"K must be >= 1 in method '{method}', got {k}")
    return k


def make_runner(method: str, engine: Engine) -> Runner:
    parts = method.split(":")
    if parts[0] != "hf":
        available = tuple(d for d in DEFAULT_DRAFTERS
                          if d != "draft-model" or engine.models.draft is not None)
        return _ours(engine, make_controller(method, available))
    k = int(parts[2]) if len(parts) == 3 else HF_DEFAULT_K
    models = engine.models
    extra: dict = {}
    if parts[1] == "assisted":
        if models.draft is None:
            raise ValueError("hf:assisted needs a draft model")
        extra = {"assistant_model": models.draft, "num_assistant_tokens": k,
                 "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
    elif parts[1] == "prompt-lookup":
        extra = {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": 4}
    elif parts[1] == "early-exit":
        extra = {"assistant_early_exit": models.default_exit_layer, "num_assistant_tokens": k,
                 "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
    return _hf(engine, extra)


def _ours(engine: Engine, controller) -> Runner:
    def run(ids, max_new_tokens, temperature, seed, workload):
        t0 = time.perf_counter()
        out = engine.generate(ids, controller=controller, max_new_tokens=max_new_tokens,
                              temperature=temperature, seed=seed, workload=workload)
        wall = time.perf_counter() - t0
        t = out.telemetry
        return RunResult(out.token_ids, wall, t.proposed, t.accepted, t.steps, t.step_records)
    return run


def _hf(engine: Engine, extra: dict) -> Runner:
    target, tokenizer = engine.models.target, engine.models.tokenizer

    @torch.inference_mode()
    def run(ids, max_new_tokens, temperature, seed, workload):
        torch.manual_seed(seed)
        input_ids = torch.tensor([ids])
        sampling = ({"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                    if temperature > 0 else {"do_sample": False})
        t0 = time.perf_counter()
        out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                              max_new_tokens=max_new_tokens, pad_token_id=tokenizer.eos_token_id,
                              eos_token_id=sorted(engine.eos_ids), **sampling, **extra)
        wall = time.perf_counter() - t0
        return RunResult(out[0, len(ids):].tolist(), wall)
    return run
