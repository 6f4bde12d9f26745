"""`autospec bench --engine vllm`: the bench's workload and statistics, decoded by vLLM.

Methods (each one vLLM engine, all started before the first measurement, each in its own
engine process; an idle one costs the running one nothing):

    plain                  no speculative config
    vllm:ngram:K           vLLM's own n-gram proposer, fixed K (n from 1 to 4, as ours)
    vllm:eagle:K           the pair's feature head exported for vLLM (autospec models export)
    vllm:dynamic:TABLE     vLLM's batch size -> K table over its n-gram proposer; TABLE as
                           ctl:batch-table's, SIZE=K/SIZE=K (K of the smallest size >= the
                           batch, 0 above the largest), e.g. 1=4/4=2/8=1
    adaptive               autospec's proposer (autospec.vllm.Proposer) on its defaults
    adaptive:POLICY.yaml   the same with a policy file (AUTOSPEC_POLICY)
    ours:METHOD            autospec's own engine running METHOD (ours:plain, ours:adaptive, ...)

At each concurrency N every vLLM method decodes the whole workload with N closed-loop clients
(N requests in flight, the next sent when one ends: `LLMEngine.add_request` and `step`), the
methods taking turns in an order that rotates from repeat to repeat; the repeat with the median
wall time is reported, in `autospec bench --concurrency`'s statistics (bench/load.py), with
identical_to_plain against vLLM's plain output at the same N (True, "near-tie" with each parting's
margin from vLLM's own log-probabilities, or False: models/ties.py logprob_verdict). The `ours:` methods run after, on
autospec's engine (bench/load.py's run_load), identical_to_plain against ours:plain. Batch 1 is
N = 1; the report's `methods` is N = 1's when it ran. With `--arrivals`, every method also
takes the schedule's open-loop load (bench/arrivals.py's statistics; vLLM queues what finds
its `--rows` taken, so its queue wait is inside TTFT and nothing is refused). The proposer's own seconds (look-ups,
decide, observe) over vLLM's step seconds are in `proposer_share` per adaptive method and N.
"""
from __future__ import annotations

import json
import os
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

from autospec.bench.arrivals import Schedule, Sent, arrival_jobs, arrivals_report, run_arrivals
from autospec.bench.harness import OVERALL, machine_info
from autospec.bench.prompts import Prompt, prompt_ids
from autospec.bench.load import LoadRun, method_stats, run_load
from autospec.bench.runner import RunResult
from autospec.method import Method, parse_method

KNOWN = ("plain, vllm:ngram:K, vllm:eagle:K, vllm:dynamic:TABLE, adaptive, adaptive:POLICY.yaml, "
         "ours:METHOD")
KV_CACHE_BYTES = 512 << 20  # per engine: 16 rows of a few hundred tokens fit many times over


@dataclass(frozen=True)
class VllmMethod:
    spec: str  # as written: the JSON's key
    speculative_config: dict | None = None  # None: plain, or one of ours
    policy: str | None = None  # adaptive:POLICY.yaml's file
    ours: Method | None = None  # ours:METHOD

    @property
    def adaptive(self) -> bool:
        return bool(self.speculative_config) and self.speculative_config["method"] == "custom_class"


def parse_vllm_method(text: str, k_limit: int, eagle_dir: str | None = None,
                      max_rows: int = 256) -> VllmMethod:
    """A VllmMethod; ValueError naming the entry and the accepted forms."""
    spec = text.strip()
    parts = spec.split(":")
    if spec == "plain":
        return VllmMethod(spec)
    if parts[0] == "ours" and len(parts) > 1:
        return VllmMethod(spec, ours=parse_method(spec[len("ours:"):]))
    if parts[0] == "adaptive":
        policy = spec[len("adaptive:"):] if len(parts) > 1 else None
        if policy:
            from autospec.policy import load_policy
            load_policy(policy)  # a PolicyError names the file and field, before any start
        return VllmMethod(spec, {"method": "custom_class", "model": "autospec.vllm.Proposer",
                                 "num_speculative_tokens": k_limit}, policy)
    if parts[0] == "vllm" and len(parts) == 3 and parts[1] in ("ngram", "eagle"):
        k = _k(parts[2], spec)
        if parts[1] == "ngram":
            return VllmMethod(spec, {"method": "ngram", "num_speculative_tokens": k,
                                     "prompt_lookup_min": 1, "prompt_lookup_max": 4})
        if eagle_dir is None:
            raise ValueError(f"method '{spec}': this pair has no feature head exported for vLLM")
        return VllmMethod(spec, {"method": "eagle", "model": eagle_dir, "num_speculative_tokens": k})
    if parts[0] == "vllm" and len(parts) == 3 and parts[1] == "dynamic":
        table = parse_method(f"ctl:batch-table:ngram:{parts[2]}").table
        k_max = max(k for _, k in table)
        ranges, start = [], 1
        for size, k in table:
            ranges.append((start, size, k))
            start = size + 1
        if start <= max_rows:
            ranges.append((start, max_rows, 0))
        return VllmMethod(spec, {"method": "ngram", "num_speculative_tokens": k_max,
                                 "prompt_lookup_min": 1, "prompt_lookup_max": 4,
                                 "num_speculative_tokens_per_batch_size": ranges})
    raise ValueError(f"unknown method '{spec}' for --engine vllm (known: {KNOWN})")


def _k(text: str, spec: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"method '{spec}': K must be an integer >= 1")
    return int(text)


def parse_vllm_methods(text: str, k_limit: int, eagle_dir: str | None = None,
                       max_rows: int = 256) -> list[VllmMethod]:
    methods = [parse_vllm_method(t, k_limit, eagle_dir, max_rows) for t in text.split(",") if t.strip()]
    if not any(m.spec == "plain" for m in methods):
        methods.insert(0, VllmMethod("plain"))  # every identical_to_plain is against it
    return methods


def start_engines(model: str, methods: list[VllmMethod], dtype: str, max_len: int, rows: int,
                  seed: int, progress=None, drafter_options: dict | None = None) -> dict:
    """One vLLM engine per vLLM method, each in its own process (the proposer's with
    `drafter_options`, as our engine's)."""
    import vllm
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # proposer_stats' RPC
    # each engine in a process of its own: two engines in one process fail in vLLM 0.32 (its
    # CPU platform re-registers its kernel overrides), and one idle engine must not slow another
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    options = json.dumps(drafter_options) if drafter_options else None
    engines = {}
    for m in methods:
        if m.ours is not None:
            continue
        # the engine process reads them at start
        with _environ(AUTOSPEC_POLICY=m.policy, AUTOSPEC_DRAFTER_OPTIONS=options):
            engines[m.spec] = vllm.LLM(model, dtype=dtype, enforce_eager=True, max_model_len=max_len,
                                       max_num_seqs=rows, kv_cache_memory_bytes=KV_CACHE_BYTES,
                                       speculative_config=m.speculative_config, seed=seed,
                                       disable_log_stats=False)
        if progress:
            progress(f"vLLM engine for {m.spec} started")
    return engines


@contextmanager
def _environ(**values: str | None):
    """The environment with `values` set (None: unset), as it was after."""
    saved = {name: os.environ.get(name) for name in values}

    def put(pairs: dict) -> None:
        for name, value in pairs.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    put(values)
    try:
        yield
    finally:
        put(saved)


def proposer_stats(worker) -> tuple[float, float, int, int] | None:
    """(proposer seconds, step seconds, drafted, accepted) so far, run in vLLM's worker
    (collective_rpc)."""
    stats = getattr(worker.model_runner.drafter, "stats", None)
    return None if stats is None else (stats.proposer_seconds, stats.step_seconds,
                                       stats.drafted, stats.accepted)


def drive(llm, jobs: list[tuple[list[int], int]], level: int, temperature: float, seed: int,
          tag: str) -> LoadRun:
    """`level` closed-loop clients over `jobs` ((prompt ids, max new tokens) each), each client
    sending its next job when its last ends: the tokens, TTFT and ITL of each request."""
    sent, results = _drive(llm, jobs, temperature, seed, tag,
                           lambda i, in_flight, elapsed: elapsed if in_flight < level else None)
    ids = [f"{tag}-{i}" for i in range(len(jobs))]
    return LoadRun(results, ids, sent.wall_s, {ids[i]: s for i, s in sent.ttft_s.items()},
                   {ids[i]: s for i, s in sent.itl_s.items()})


def drive_open(llm, jobs, times: list[float], temperature: float, seed: int, tag: str) -> Sent:
    """Open loop: job i sent `times[i]` seconds after the start whatever the engine does; a
    request that finds every row taken waits in vLLM's own queue (its wait is inside TTFT)."""
    sent, results = _drive(llm, [(job.prompt, job.max_new_tokens) for job in jobs], temperature,
                           seed, tag, lambda i, in_flight, elapsed: times[i])
    sent.tokens = [r.token_ids for r in results]
    return sent


def _drive(llm, jobs: list[tuple[list[int], int]], temperature: float, seed: int, tag: str,
           due: Callable[[int, int, float], float | None]) -> tuple[Sent, list[RunResult]]:
    """The add_request / step loop under drive and drive_open: jobs go in order, job i once
    `due(i, requests in flight, seconds since the start)` seconds after the start (None: not
    yet). Each request's TTFT and latency run from when it was due. (Sent by job index, its
    tokens left unset; each job's RunResult: tokens, latency, steps that emitted.)"""
    import vllm
    engine = llm.llm_engine
    run = Sent([None] * len(jobs), {}, {}, {}, [], [], 0.0)
    results: list[RunResult] = [None] * len(jobs)
    pending, active = deque(range(len(jobs))), {}  # request id -> (job, when due)
    seen, steps, last = [0] * len(jobs), [0] * len(jobs), [0.0] * len(jobs)
    # greedy: each token's top-2 log-probabilities too (the identity verdict's margins at a
    # parting, models/ties.py logprob_verdict)
    params = [vllm.SamplingParams(temperature=temperature, max_tokens=n,
                                  seed=seed if temperature else None,
                                  logprobs=None if temperature else 2) for _, n in jobs]
    t0 = time.perf_counter()
    while pending or active:
        while pending:
            elapsed = time.perf_counter() - t0
            at = due(pending[0], len(active), elapsed)
            if at is None or at > elapsed:
                break
            i = pending.popleft()
            engine.add_request(f"{tag}-{i}", {"prompt_token_ids": list(jobs[i][0])}, params[i])
            active[f"{tag}-{i}"] = (i, t0 + at)
        if not active:  # ahead of the schedule: nothing to step until the next is due
            time.sleep(max(0.0, t0 + at - time.perf_counter()))
            continue
        for out in engine.step():
            if out.request_id not in active:
                continue
            i, sent = active[out.request_id]
            now, tokens = time.perf_counter(), out.outputs[0].token_ids
            new = len(tokens) - seen[i]
            if new > 0:
                run.emitted_at.append((now - t0, new))
                if seen[i] == 0:
                    run.ttft_s[i] = now - sent
                else:
                    run.itl_s.setdefault(i, []).extend([(now - last[i]) / new] * new)
                last[i], seen[i] = now, len(tokens)
                steps[i] += 1
            if out.finished:
                results[i] = RunResult(list(tokens), now - sent, steps=steps[i],
                                       logprobs=_logprobs(out.outputs[0].logprobs))
                del active[out.request_id]
    run.wall_s = time.perf_counter() - t0
    return run, results


def _logprobs(positions) -> list[dict[int, float]] | None:
    """vLLM's per-position {token: Logprob} as {token: log-probability} (None: not asked)."""
    if positions is None:
        return None
    return [{int(token): float(entry.logprob) for token, entry in position.items()}
            for position in positions]


def run_vllm_bench(engine, model: str, prompts: list[Prompt], methods: list[VllmMethod],
                   levels: list[int], repeats: int = 1, max_new_tokens: int = 128,
                   temperature: float = 0.0, seed: int = 0, dtype: str = "float32",
                   progress: Callable[[str], None] | None = None,
                   schedule: Schedule | None = None, rows: int = 16) -> dict:
    """The report (module docstring). `engine`: autospec's engine on the same pair (its
    tokenizer renders the prompts; it runs the ours: methods)."""
    encoded = [prompt_ids(engine, p) for p in prompts]
    limits = [p.max_new_tokens or max_new_tokens for p in prompts]
    jobs = list(zip(encoded, limits))
    max_len = min(engine.models.max_positions, max(len(ids) + n for ids, n in jobs) + 16)
    categories = sorted({p.category for p in prompts})
    theirs = [m for m in methods if m.ours is None]
    ours = [m for m in methods if m.ours is not None]
    width = max(levels + ([rows] if schedule else []))
    engines = start_engines(model, theirs, dtype, max_len, width, seed, progress,
                            engine.drafter_options)
    warm = [(ids, 8) for ids, _ in jobs[:width]]
    for spec, llm in engines.items():  # warm-up: lazy init, the first forwards at every width
        drive(llm, warm, width, temperature, seed, f"warm-{spec}")
    by_level: dict[str, dict] = {}
    overhead: dict[str, dict[str, float]] = {}
    for level in levels:
        runs: dict[str, list[LoadRun]] = {m.spec: [] for m in theirs}
        drafted: dict[str, list[tuple[int, int]]] = {m.spec: [] for m in theirs}
        before = {m.spec: _proposer(engines[m.spec]) for m in theirs if m.adaptive}
        for r in range(repeats):
            for m in theirs[r % len(theirs):] + theirs[:r % len(theirs)]:
                start = _proposer(engines[m.spec]) if m.adaptive else None
                runs[m.spec].append(drive(engines[m.spec], jobs, level, temperature, seed,
                                          f"{m.spec}-{level}-{r}"))
                end = _proposer(engines[m.spec]) if m.adaptive else None
                drafted[m.spec].append((end[2] - start[2], end[3] - start[3]) if start else (0, 0))
                if progress:
                    progress(f"vllm, concurrency {level}, repeat {r + 1}/{repeats}: {m.spec} "
                             f"{runs[m.spec][-1].wall_s:.1f} s")
        for spec, start in before.items():
            end = _proposer(engines[spec])
            if start and end and end[1] > start[1]:
                overhead.setdefault(spec, {})[str(level)] = (end[0] - start[0]) / (end[1] - start[1])
        picked = {spec: sorted(range(len(rs)), key=lambda r: rs[r].wall_s)[len(rs) // 2]
                  for spec, rs in runs.items()}
        plain = runs["plain"][picked["plain"]]
        by_level[str(level)] = {"methods": {}}
        for spec, r in picked.items():
            stats = method_stats(runs[spec][r], prompts, categories, plain, temperature == 0)
            # the proposer's counts, over the run as a whole (vLLM's own proposers report none
            # here: its Prometheus counters are one per process, not per engine)
            proposed, accepted = drafted[spec][r]
            stats[OVERALL]["acceptance_rate"] = accepted / proposed if proposed else None
            by_level[str(level)]["methods"][spec] = stats
    arrivals = None
    if schedule is not None:
        sends = schedule.send_times(seed)
        if not sends:
            raise ValueError(f"--arrivals {schedule.text}: the schedule sends no request")
        open_jobs = arrival_jobs(engine, prompts, len(sends), max_new_tokens, temperature, seed)
        sent: dict[str, Sent] = {}
        for m in theirs:
            sent[m.spec] = drive_open(engines[m.spec], open_jobs, [t for t, _ in sends],
                                      temperature, seed, f"open-{m.spec}")
            if progress:
                progress(f"vllm, arrivals {schedule.text}: {m.spec} {sent[m.spec].wall_s:.1f} s")
        arrivals = arrivals_report(sent, schedule, sends, rows, len(open_jobs), temperature == 0)
    for llm in engines.values():  # before ours run: their processes bind threads to the cores
        llm.llm_engine.engine_core.shutdown()
    if ours and schedule is not None:
        mine = run_arrivals(engine, prompts, [m.ours for m in ours], schedule, rows,
                            max_new_tokens, temperature, seed, progress)
        arrivals["methods"].update({f"ours:{spec}": stats for spec, stats in mine["methods"].items()})
    if ours:
        mine = run_load(engine, prompts, [m.ours for m in ours], levels, max_new_tokens,
                        temperature, seed, repeats, progress)
        for level, entry in mine.items():
            for spec, stats in entry["methods"].items():
                by_level[level]["methods"][f"ours:{spec}"] = stats
    for entry in by_level.values():  # every method against vLLM's plain at the same N
        base = entry["methods"]["plain"][OVERALL]["throughput_tokens_per_s"]
        for stats in entry["methods"].values():
            stats[OVERALL]["speedup_vs_vllm_plain"] = stats[OVERALL]["throughput_tokens_per_s"] / base
    report = {"engine": "vllm", "by_concurrency": by_level, "proposer_share": overhead,
              "machine": machine_info(),
              "models": {"target": model, "dtype": dtype},
              "settings": {"repeats": repeats, "max_new_tokens": max_new_tokens,
                           "temperature": temperature, "seed": seed, "prompts": len(prompts),
                           "categories": categories, "concurrency": levels,
                           "vllm_methods": {m.spec: m.speculative_config for m in theirs}}}
    if "1" in by_level:
        report["methods"] = by_level["1"]["methods"]
    if arrivals is not None:
        report["arrivals"] = arrivals
    return report


def _proposer(llm) -> tuple[float, float] | None:
    return llm.collective_rpc(proposer_stats)[0]

