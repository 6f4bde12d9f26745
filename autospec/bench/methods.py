"""The runners `autospec bench` measures, one per method (autospec.method parses them):
our engine loop with a controller (plain, static, adaptive, ctl:) or transformers' own
generation on the same models (hf:). oracle and oracle-per-category run nothing: harness.py
picks them afterwards from the static runs. A `MethodAt` is a method at one weight format:
harness.py keys every runner and result by one.

The hf: peers run with a constant number of draft tokens (no confidence cut-off), so they
compare with static:*:K at the same K.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from autospec.bench.llamacpp import llamacpp_runner
from autospec.bench.runner import RunResult, Runner
from autospec.controller.factory import make_controller
from autospec.engine.loop import Engine
from autospec.method import ORACLES, Method, parse_methods  # noqa: F401 (re-exported)

DERIVED = ORACLES  # picked afterwards, not run


@dataclass(frozen=True)
class MethodAt:
    """A method at one weight format: what bench runs, and keys every result by."""
    method: Method
    weights: str = ""  # the format, when several run (models/weights.py); "" for the one
    #                    format, and for llama.cpp, which runs its own whatever --weights

    @property
    def key(self) -> str:
        """The report's key: METHOD, or METHOD@FORMAT when several formats run."""
        return f"{self.method.spec}@{self.weights}" if self.weights else self.method.spec


def make_runner(method: Method, engine: Engine) -> Runner:
    if method.is_controller:
        return _ours(engine, make_controller(method))
    if method.kind == "llamacpp":
        return llamacpp_runner(method, engine)
    models = engine.models
    k = method.k
    extra: dict = {}
    if method.baseline == "assisted":
        if models.draft is None:
            raise ValueError("hf:assisted needs a draft model")
        extra = {"assistant_model": models.draft, "num_assistant_tokens": k,
                 "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
    elif method.baseline == "prompt-lookup":
        extra = {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": 4}
    elif method.baseline == "early-exit":
        extra = {"assistant_early_exit": models.default_exit_layer, "num_assistant_tokens": k,
                 "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
    return _hf(engine, extra)


def _ours(engine: Engine, controller) -> Runner:
    engines = [engine]

    def run(ids, max_new_tokens, temperature, seed, workload):
        t0 = time.perf_counter()
        out = engines[0].generate(ids, controller=controller, max_new_tokens=max_new_tokens,
                                  temperature=temperature, seed=seed, workload=workload)
        wall = time.perf_counter() - t0
        t = out.telemetry
        return RunResult(out.token_ids, wall, t.proposed, t.accepted, t.steps, t.step_records)

    def new_history(tag: str) -> None:
        engines[0] = Engine(engine.models, fresh_history(engine.drafter_options, tag))

    run.new_history = new_history
    run.controller = controller  # what it learnt (the bench JSON's reliability table)
    return run


def fresh_history(drafter_options: dict, tag: str) -> dict:
    """Drafter options with a fresh cross-request history (the suffix drafter's shared index)
    under `tag`: each method and repeat learns only from its own earlier requests — sharing one
    would hand a method the very answers another already produced for the same prompts."""
    options = dict(drafter_options)
    options["suffix"] = {**options.get("suffix", {}), "tenant": f"bench {tag}"}
    return options


def _hf(engine: Engine, extra: dict) -> Runner:
    def run(ids, max_new_tokens, temperature, seed, workload):
        input_ids = torch.tensor([ids])
        t0 = time.perf_counter()
        out = hf_generate(engine, input_ids, torch.ones_like(input_ids), max_new_tokens,
                          temperature, seed, **extra)
        wall = time.perf_counter() - t0
        return RunResult(out[0, len(ids):].tolist(), wall)
    return run


@torch.inference_mode()
def hf_generate(engine: Engine, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                max_new_tokens: int, temperature: float, seed: int, **extra) -> torch.Tensor:
    """transformers' own `generate()` on the target as a user would call it: greedy, or plain
    sampling (no top-k/top-p) at `temperature` from `seed`; our EOS ids stop it.
    input_ids, attention_mask: [B, T] (left-padded when B > 1); returns [B, T + new]."""
    torch.manual_seed(seed)
    sampling = ({"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                if temperature > 0 else {"do_sample": False})
    return engine.models.target.generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
        pad_token_id=engine.models.tokenizer.eos_token_id, eos_token_id=sorted(engine.eos_ids),
        **sampling, **extra)
