"""What a trial is worth: tokens per second of the controller its values describe.

Two sources, one shape — an iterator of running (tokens, seconds) after each chunk of
requests, so the study can report the running objective and prune a poor trial early:
- ReplayObjective: recorded traces (bench.trace), simulated seconds from the recorded
  costs. Deterministic and fast (a fraction of a second per trial): the default.
- LiveObjective: a real engine over a workload's prompts, wall-clock seconds. Noisy and
  minutes per trial; for checking a replay-tuned policy on the machine itself.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from autospec.bench.trace import Trace
from autospec.bench.recorded import replay
from autospec.controller.adaptive import ControllerSettings
from autospec.drafters.base import available_drafters
from autospec.tune.controller import build_controller


def file_hash(path: str | Path) -> str:
    """sha256 of a file's bytes, first 16 hex digits (what a trial's provenance names)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def load_traces(paths: list[str | Path]) -> list[tuple[str, Trace]]:
    """[(path, Trace)]; ValueError naming the file when one is missing or malformed."""
    out = []
    for path in paths:
        if not Path(path).is_file():
            raise ValueError(f"trace '{path}' not found (record one with `autospec bench "
                             f"--record PATH`)")
        out.append((str(path), Trace.load(path)))
    if not out:
        raise ValueError("no trace given")
    return out


@dataclass
class ReplayObjective:
    traces: list[tuple[str, Trace]]
    chunk: int = 4  # requests between intermediate reports
    kind: str = field(default="replay", init=False)

    def __post_init__(self):
        self.available = tuple(sorted({d for _, t in self.traces for d in t.draft_seconds_per_token}))
        self.k_limit = min(t.k_max for _, t in self.traces)
        self.hashes = {p: file_hash(p) for p, _ in self.traces}
        self.model_pair = ",".join(sorted({t.pair or "unknown" for _, t in self.traces}))

    @property
    def workload_hash(self) -> str:
        return hashlib.sha256(",".join(sorted(self.hashes.values())).encode()).hexdigest()[:16]

    def run(self, params: ControllerSettings) -> Iterator[tuple[int, float]]:
        """Running (tokens, seconds) after each chunk of requests, over every trace in turn.
        One controller for all of them, as one engine would serve them."""
        ctl = build_controller(params)
        tokens, seconds = 0, 0.0
        for _, trace in self.traces:
            requests = trace.requests
            for i in range(0, len(requests), self.chunk):
                for r in replay(trace, ctl, requests[i:i + self.chunk]):
                    tokens += r.output_tokens
                    seconds += r.wall_seconds
                yield tokens, seconds


@dataclass
class LiveObjective:
    engine: object  # engine.loop.Engine
    prompts: list  # bench.prompts.Prompt
    workload_path: str
    max_new_tokens: int = 128
    chunk: int = 4
    kind: str = field(default="live", init=False)

    def __post_init__(self):
        from autospec.bench.prompts import prompt_ids
        m = self.engine.models
        self.ids = [prompt_ids(self.engine, p) for p in self.prompts]  # chat rows rendered
        self.available = available_drafters(m)
        self.k_limit = 64
        self.hashes = {self.workload_path: file_hash(self.workload_path)}
        self.model_pair = m.key
        self.workload_hash = self.hashes[self.workload_path]
        # warm-up, as bench does: first calls pay one-off costs (lazy init, allocator, each
        # drafter's set-up) that are not decoding and would be charged to the first trial
        for drafter in (None, *self.available):
            self.engine.generate(self.ids[0], drafter=drafter, k=2 if drafter else 0,
                                 max_new_tokens=8)

    def run(self, params: ControllerSettings) -> Iterator[tuple[int, float]]:
        ctl = build_controller(params)
        tokens, seconds = 0, 0.0
        for i in range(0, len(self.prompts), self.chunk):
            for p, ids in zip(self.prompts[i:i + self.chunk], self.ids[i:i + self.chunk]):
                t0 = time.perf_counter()
                out = self.engine.generate(ids, controller=ctl, workload=p.category,
                                           max_new_tokens=p.max_new_tokens or self.max_new_tokens)
                seconds += time.perf_counter() - t0
                tokens += len(out.token_ids)
            yield tokens, seconds


# -- one trial -------------------------------------------------------------------------------
def trial_function(space, source, n_trials: int, provenance: dict, discrete: bool = False):
    """The Optuna objective: suggest, score chunk by chunk (reporting, pruning), return tok/s."""
    import optuna

    from autospec.tune.controller import parameters_for, policy_for
    from autospec.tune.study import check_rank

    def objective(trial: optuna.Trial) -> float:
        check_rank(trial, n_trials)
        values = space.suggest(trial, discrete)
        params = parameters_for(values)
        trial.set_user_attr("fixed", {p.name: values[p.name] for p in space.params if p.fixed})
        for key, value in {**provenance, "policy_hash": policy_for(params).policy_hash[:16]}.items():
            trial.set_user_attr(key, value)
        t0 = time.perf_counter()
        rate = 0.0
        for step, (tokens, seconds) in enumerate(source.run(params)):
            rate = tokens / seconds if seconds > 0 else 0.0
            trial.report(rate, step)
            if trial.should_prune():
                trial.set_user_attr("eval_seconds", round(time.perf_counter() - t0, 4))
                raise optuna.TrialPruned(f"{rate:.1f} tok/s after {step + 1} chunks")
        trial.set_user_attr("eval_seconds", round(time.perf_counter() - t0, 4))
        return rate

    return objective
