"""What a bench runner is: a function from (prompt ids, max new tokens, temperature, seed,
workload) to a `RunResult`, one per method (bench/methods.py makes ours and the hf: peers',
bench/llamacpp.py llama.cpp's, vllm/bench.py vLLM's)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass
class RunResult:
    token_ids: list[int]
    wall_s: float
    proposed: int = 0
    accepted: int = 0
    steps: int = 0
    step_records: list | None = None
    # per output position, {token: log-probability} of the run's own distribution there (its
    # top two and the token it chose), where the runner reports them (vLLM's logprobs): what
    # a verdict reads a divergence's margin from where our target cannot be asked
    logprobs: list[dict[int, float]] | None = None


Runner = Callable[[list[int], int, float, int, str], RunResult]
