"""`autospec bench --engine vllm`: the bench's workload and statistics, decoded by vLLM.

Methods (autospec/method.py's grammar; each one vLLM engine, all started before the first
measurement, each in its own engine process; an idle one costs the running one nothing), and
the speculative_config each maps to:

    plain                  none
    vllm:ngram:K           vLLM's own n-gram proposer, fixed K (n from 1 to 4, as ours)
    vllm:eagle:K           the pair's feature head exported for vLLM (autospec models export)
    vllm:dynamic:TABLE     vLLM's batch size -> K table over its n-gram proposer (K of the
                           smallest size >= the batch, 0 above the largest)
    adaptive[:POLICY.yaml] autospec's proposer (autospec.vllm.Proposer; the policy file in
                           AUTOSPEC_POLICY)
    ours:METHOD            no vLLM engine: autospec's own engine running METHOD

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
from typing import Callable

from autospec.bench.arrivals import Schedule, arrival_jobs, arrivals_report, run_arrivals
from autospec.bench.harness import OVERALL, machine_info
from autospec.bench.prompts import Prompt, prompt_ids
from autospec.bench.load import method_stats, run_load
from autospec.bench.runlog import RunLog
from autospec.bench.runner import RunResult
from autospec.method import Method

KV_CACHE_BYTES = 512 << 20  # per engine: 16 rows of a few hundred tokens fit many times over


def speculative_config(method: Method, k_limit: int, eagle_dir: str | None = None,
                       max_rows: int = 256) -> dict | None:
    """vLLM's speculative_config for a method that runs inside vLLM (plain: None; adaptive:
    autospec's proposer, up to `k_limit` tokens a step; vllm:dynamic's table as inclusive
    batch-size ranges up to `max_rows`); ValueError for vllm:eagle:K without `eagle_dir`."""
    if method.kind == "plain":
        return None
    if method.kind == "adaptive":
        return {"method": "custom_class", "model": "autospec.vllm.Proposer",
                "num_speculative_tokens": k_limit}
    if method.kind != "vllm":
        raise ValueError(f"method '{method}' does not run inside vLLM")
    if method.table is not None:
        ranges, start = [], 1
        for size, k in method.table:
            ranges.append((start, size, k))
            start = size + 1
        if start <= max_rows:
            ranges.append((start, max_rows, 0))
        return _ngram(max(k for _, k in method.table), num_speculative_tokens_per_batch_size=ranges)
    if method.drafter == "ngram":
        return _ngram(method.k)
    if eagle_dir is None:
        raise ValueError(f"method '{method}': this pair has no feature head exported for vLLM")
    return {"method": "eagle", "model": eagle_dir, "num_speculative_tokens": method.k}


def _ngram(k: int, **more) -> dict:
    """vLLM's n-gram proposer, n from 1 to 4 (as ours)."""
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
            "prompt_lookup_max": 4, **more}


def start_engines(model: str, configs: dict[Method, dict | None], dtype: str, max_len: int,
                  rows: int, seed: int, progress=None, drafter_options: dict | None = None) -> dict:
    """{method: its vLLM engine} for each method and its speculative_config, each engine in
    its own process (the proposer's with `drafter_options`, as our engine's)."""
    import vllm
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # proposer_stats' RPC
    # each engine in a process of its own: two engines in one process fail in vLLM 0.32 (its
    # CPU platform re-registers its kernel overrides), and one idle engine must not slow another
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    options = json.dumps(drafter_options) if drafter_options else None
    engines = {}
    for m, config in configs.items():
        # the engine process reads them at start
        with _environ(AUTOSPEC_POLICY=m.policy_path, AUTOSPEC_DRAFTER_OPTIONS=options):
            engines[m] = vllm.LLM(model, dtype=dtype, enforce_eager=True, max_model_len=max_len,
                                  max_num_seqs=rows, kv_cache_memory_bytes=KV_CACHE_BYTES,
                                  speculative_config=config, seed=seed, disable_log_stats=False)
        if progress:
            progress(f"vLLM engine for {m} started")
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
          tag: str) -> RunLog:
    """`level` closed-loop clients over `jobs` ((prompt ids, max new tokens) each), each client
    sending its next job when its last ends: the tokens, TTFT and ITL of each request."""
    return _drive(llm, jobs, temperature, seed, tag,
                  lambda i, in_flight, elapsed: elapsed if in_flight < level else None)


def drive_open(llm, jobs, times: list[float], temperature: float, seed: int, tag: str) -> RunLog:
    """Open loop: job i sent `times[i]` seconds after the start whatever the engine does; a
    request that finds every row taken waits in vLLM's own queue (its wait is inside TTFT)."""
    return _drive(llm, [(job.prompt, job.max_new_tokens) for job in jobs], temperature, seed,
                  tag, lambda i, in_flight, elapsed: times[i])


def _drive(llm, jobs: list[tuple[list[int], int]], temperature: float, seed: int, tag: str,
           due: Callable[[int, int, float], float | None]) -> RunLog:
    """The add_request / step loop under drive and drive_open: jobs go in order, job i once
    `due(i, requests in flight, seconds since the start)` seconds after the start (None: not
    yet). Each request's TTFT and latency run from when it was due. (The run's log by job
    index: each job's RunResult, tokens, latency, steps that emitted, log-probabilities.)"""
    import vllm
    engine = llm.llm_engine
    log = RunLog([None] * len(jobs), start=time.perf_counter())
    pending, active = deque(range(len(jobs))), {}  # request id -> (job, when due)
    seen, steps = [0] * len(jobs), [0] * len(jobs)
    # greedy: each token's top-2 log-probabilities too (the identity verdict's margins at a
    # parting, models/ties.py logprob_verdict)
    params = [vllm.SamplingParams(temperature=temperature, max_tokens=n,
                                  seed=seed if temperature else None,
                                  logprobs=None if temperature else 2) for _, n in jobs]
    t0 = log.start
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
                log.emit(i, new, sent, now)
                seen[i] = len(tokens)
                steps[i] += 1
            if out.finished:
                log.results[i] = RunResult(list(tokens), now - sent, steps=steps[i],
                                           logprobs=_logprobs(out.outputs[0].logprobs))
                del active[out.request_id]
    log.wall_s = time.perf_counter() - t0
    return log


def _logprobs(positions) -> list[dict[int, float]] | None:
    """vLLM's per-position {token: Logprob} as {token: log-probability} (None: not asked)."""
    if positions is None:
        return None
    return [{int(token): float(entry.logprob) for token, entry in position.items()}
            for position in positions]


def run_vllm_bench(engine, model: str, prompts: list[Prompt], methods: list[Method],
                   levels: list[int], repeats: int = 1, max_new_tokens: int = 128,
                   temperature: float = 0.0, seed: int = 0, dtype: str = "float32",
                   progress: Callable[[str], None] | None = None,
                   schedule: Schedule | None = None, rows: int = 16, k_limit: int = 8,
                   eagle_dir: str | None = None) -> dict:
    """The report (module docstring). `engine`: autospec's engine on the same pair (its
    tokenizer renders the prompts; it runs the ours: methods); `methods` as
    parse_methods(..., "vllm") gives them, plain among them; `k_limit` and `eagle_dir` as
    speculative_config takes them."""
    encoded = [prompt_ids(engine, p) for p in prompts]
    limits = [p.max_new_tokens or max_new_tokens for p in prompts]
    jobs = list(zip(encoded, limits))
    max_len = min(engine.models.max_positions, max(len(ids) + n for ids, n in jobs) + 16)
    categories = sorted({p.category for p in prompts})
    theirs = [m for m in methods if m.kind != "ours"]
    ours = {m.inner.spec: m for m in methods if m.kind == "ours"}  # run_load keys by the inner
    # every config before any engine starts: a bad method costs no start
    configs = {m: speculative_config(m, k_limit, eagle_dir, max(levels)) for m in theirs}
    plain_method = next(m for m in theirs if m.kind == "plain")
    width = max(levels + ([rows] if schedule else []))
    engines = start_engines(model, configs, dtype, max_len, width, seed, progress,
                            engine.drafter_options)
    warm = [(ids, 8) for ids, _ in jobs[:width]]
    for m, llm in engines.items():  # warm-up: lazy init, the first forwards at every width
        drive(llm, warm, width, temperature, seed, f"warm-{m}")
    by_level: dict[str, dict] = {}
    overhead: dict[Method, dict[str, float]] = {}
    adaptive = [m for m in theirs if m.kind == "adaptive"]  # autospec's proposer reports its stats
    for level in levels:
        runs: dict[Method, list[RunLog]] = {m: [] for m in theirs}
        drafted: dict[Method, list[tuple[int, int]]] = {m: [] for m in theirs}
        before = {m: _proposer(engines[m]) for m in adaptive}
        for r in range(repeats):
            for m in theirs[r % len(theirs):] + theirs[:r % len(theirs)]:
                start = _proposer(engines[m]) if m in adaptive else None
                runs[m].append(drive(engines[m], jobs, level, temperature, seed,
                                     f"{m}-{level}-{r}"))
                end = _proposer(engines[m]) if m in adaptive else None
                drafted[m].append((end[2] - start[2], end[3] - start[3]) if start else (0, 0))
                if progress:
                    progress(f"vllm, concurrency {level}, repeat {r + 1}/{repeats}: {m} "
                             f"{runs[m][-1].wall_s:.1f} s")
        for m, start in before.items():
            end = _proposer(engines[m])
            if start and end and end[1] > start[1]:
                overhead.setdefault(m, {})[str(level)] = (end[0] - start[0]) / (end[1] - start[1])
        picked = {m: sorted(range(len(rs)), key=lambda r: rs[r].wall_s)[len(rs) // 2]
                  for m, rs in runs.items()}
        plain = runs[plain_method][picked[plain_method]]
        by_level[str(level)] = {"methods": {}}
        for m, r in picked.items():
            stats = method_stats(runs[m][r], prompts, categories, plain, temperature == 0)
            # the proposer's counts, over the run as a whole (vLLM's own proposers report none
            # here: its Prometheus counters are one per process, not per engine)
            proposed, accepted = drafted[m][r]
            stats[OVERALL]["acceptance_rate"] = accepted / proposed if proposed else None
            by_level[str(level)]["methods"][m.spec] = stats
    arrivals = None
    if schedule is not None:
        sends = schedule.send_times(seed)
        if not sends:
            raise ValueError(f"--arrivals {schedule.text}: the schedule sends no request")
        open_jobs = arrival_jobs(engine, prompts, len(sends), max_new_tokens, temperature, seed)
        sent: dict[str, RunLog] = {}
        for m in theirs:
            sent[m.spec] = drive_open(engines[m], open_jobs, [t for t, _ in sends],
                                      temperature, seed, f"open-{m}")
            if progress:
                progress(f"vllm, arrivals {schedule.text}: {m} {sent[m.spec].wall_s:.1f} s")
        arrivals = arrivals_report(sent, schedule, sends, rows, len(open_jobs), temperature == 0)
    for llm in engines.values():  # before ours run: their processes bind threads to the cores
        llm.llm_engine.engine_core.shutdown()
    inner = [m.inner for m in ours.values()]
    if ours and schedule is not None:
        mine = run_arrivals(engine, prompts, inner, schedule, rows, max_new_tokens, temperature,
                            seed, progress)
        arrivals["methods"].update({ours[spec].spec: stats for spec, stats in mine["methods"].items()})
    if ours:
        mine = run_load(engine, prompts, inner, levels, max_new_tokens, temperature, seed,
                        repeats, progress)
        for level, entry in mine.items():
            for spec, stats in entry["methods"].items():
                by_level[level]["methods"][ours[spec].spec] = stats
    for entry in by_level.values():  # every method against vLLM's plain at the same N
        base = entry["methods"][plain_method.spec][OVERALL]["throughput_tokens_per_s"]
        for stats in entry["methods"].values():
            stats[OVERALL]["speedup_vs_vllm_plain"] = stats[OVERALL]["throughput_tokens_per_s"] / base
    report = {"engine": "vllm", "by_concurrency": by_level,
              "proposer_share": {m.spec: shares for m, shares in overhead.items()},
              "machine": machine_info(),
              "models": {"target": model, "dtype": dtype},
              "settings": {"repeats": repeats, "max_new_tokens": max_new_tokens,
                           "temperature": temperature, "seed": seed, "prompts": len(prompts),
                           "categories": categories, "concurrency": levels,
                           "vllm_methods": {m.spec: configs[m] for m in theirs}}}
    if "1" in by_level:
        report["methods"] = by_level["1"]["methods"]
    if arrivals is not None:
        report["arrivals"] = arrivals
    return report


def _proposer(llm) -> tuple[float, float] | None:
    return llm.collective_rpc(proposer_stats)[0]

