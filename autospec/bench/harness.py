"""`autospec bench`: every method on every prompt, interleaved, measured in one run.

For each repeat, for each prompt, every method runs back to back (the order rotates from
prompt to prompt), so drift in machine speed hits all methods alike. Figures are ratios
within the run: tokens/s is the median over repeats of (tokens / wall seconds) per category.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from autospec.bench.methods import MethodAt, make_runner
from autospec.bench.prompts import Prompt, prompt_ids
from autospec.bench.runner import RunResult
from autospec.bench.roofline import peaks, roofline
from autospec.controller.formulas import speedup
from autospec.engine.loop import Engine
from autospec.method import Method, parse_method
from autospec.models.ties import verdict
from autospec.models.weights import format_of
from autospec.telemetry import acceptance_per_position

OVERALL = "overall"


@dataclass
class Cell:
    """What one method did on one category in one repeat."""
    tokens: int = 0
    wall_s: float = 0.0
    proposed: int = 0
    accepted: int = 0
    steps: int = 0
    controller_s: float = 0.0  # the controller's decide + update (our methods only)
    bytes_moved: int = 0  # weights + KV the steps read, by the telemetry (our methods only)

    def add(self, r: RunResult) -> None:
        self.tokens += len(r.token_ids)
        self.wall_s += r.wall_s
        self.proposed += r.proposed
        self.accepted += r.accepted
        self.steps += r.steps
        self.controller_s += sum(s.controller_seconds for s in r.step_records or ())
        self.bytes_moved += sum(s.bytes_moved for s in r.step_records or ())


@dataclass
class Measurements:
    # cells[MethodAt][category][repeat]
    cells: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(Cell))))
    outputs: dict = field(default_factory=lambda: defaultdict(dict))  # MethodAt -> prompt id -> ids
    identical: dict = field(default_factory=lambda: defaultdict(lambda: True))
    steps: dict = field(default_factory=lambda: defaultdict(list))  # MethodAt -> (category, StepRecord)

    def at(self, weights: str) -> Measurements:
        """The runs at one format only."""
        out = Measurements()
        for name in ("cells", "outputs", "steps"):
            getattr(out, name).update({run: v for run, v in getattr(self, name).items()
                                       if run.weights == weights})
        return out


def run_bench(engine: Engine | dict[str, Engine], prompts: list[Prompt],
              methods: list[Method | str], repeats: int = 1, max_new_tokens: int = 128,
              temperature: float = 0.0, seed: int = 0,
              progress: Callable[[str], None] | None = None) -> dict:
    """`engine`, or one engine per weight format ({format: Engine}, models/weights.py): with
    several, every method runs at every format, interleaved, keyed METHOD@FORMAT, each
    compared with plain at its own format; speedups are against plain at the first format,
    and the costs measured (v, c, alpha, roofline) are the first format's."""
    engines = engine if isinstance(engine, dict) else {"": engine}
    tags = {w: w if len(engines) > 1 else "" for w in engines}  # each format's MethodAt.weights
    first = next(iter(engines))
    engine = engines[first]
    methods = [m if isinstance(m, Method) else parse_method(m) for m in methods]
    plain, llamacpp_plain = parse_method("plain"), parse_method("llamacpp:plain")
    # every result is keyed by its MethodAt; each compared with the plain run beside it
    runners, plain_of, engine_of = {}, {}, {}
    for w, e in engines.items():
        for m in methods:
            if m.kind == "oracle" or (m.kind == "llamacpp" and w != first):
                continue  # oracles are picked afterwards; llama.cpp runs once
            run = MethodAt(m) if m.kind == "llamacpp" else MethodAt(m, tags[w])
            runners[run], engine_of[run] = make_runner(m, e), e
            plain_of[run] = MethodAt(llamacpp_plain) if m.kind == "llamacpp" else MethodAt(plain, tags[w])
    measured = list(runners)
    tok = engine.models.tokenizer
    encoded = {p.id: prompt_ids(engine, p) for p in prompts}
    limit = engine.models.max_positions
    for p in prompts:
        if len(encoded[p.id]) + (p.max_new_tokens or max_new_tokens) > limit:
            raise ValueError(f"prompt '{p.id}' has {len(encoded[p.id])} tokens; with "
                             f"{p.max_new_tokens or max_new_tokens} new tokens it exceeds the "
                             f"target's {limit} positions")
    machine = machine_info()  # before the runs: the peaks measured on a machine at rest
    # warm-up: first calls pay one-off costs (lazy init, allocator) that are not decoding
    for run in measured:
        runners[run](encoded[prompts[0].id], 8, temperature, seed, None)
    data = Measurements()
    total = repeats * len(prompts)
    for r in range(repeats):
        for run in measured:  # cross-request history (suffix) starts empty per method and repeat
            getattr(runners[run], "new_history", lambda tag: None)(f"{run.key} #{r}")
        for i, p in enumerate(prompts):
            limit = p.max_new_tokens or max_new_tokens
            order = measured[i % len(measured):] + measured[:i % len(measured)]
            for run in order:
                result = runners[run](encoded[p.id], limit, temperature, seed, p.category)
                data.cells[run][p.category][r].add(result)
                if r == 0:
                    data.outputs[run][p.id] = result.token_ids
                    if result.step_records:
                        data.steps[run].extend((p.category, s) for s in result.step_records)
            if progress:
                progress(f"repeat {r + 1}/{repeats}, prompt {r * len(prompts) + i + 1}/{total}: {p.id}")
    categories = sorted({p.category for p in prompts})
    base = data.at(tags[first])  # the first format's runs
    report = {"methods": {}, "measured": measure_costs(base, engine),
              "models": _models(engine), "machine": machine,
              "settings": {"repeats": repeats, "max_new_tokens": max_new_tokens,
                           "temperature": temperature, "seed": seed, "prompts": len(prompts),
                           "categories": categories}}
    if len(engines) > 1:
        report["settings"]["weights"] = list(engines)
        report["models"]["weights"] = {w: _models(e) for w, e in engines.items()}
    greedy = temperature == 0
    for run in measured:
        wanted_of = data.outputs.get(plain_of[run])
        same, parted = None, []
        if greedy and wanted_of is not None:
            outputs = [data.outputs[run][p.id] for p in prompts]
            wanted = [wanted_of[p.id] for p in prompts]
            if plain_of[run].method.kind == "llamacpp":  # another arithmetic: our margins say nothing
                same = outputs == wanted
            else:
                same, parted = verdict(engine_of[run].models.target, [encoded[p.id] for p in prompts],
                                       outputs, wanted)
        stats = report["methods"][run.key] = _stats_for(data.cells[run], categories, repeats, same)
        if parted:
            stats["divergences"] = [{**d, "prompt": prompts[d["prompt"]].id} for d in parted]
        if run.method.kind in ("adaptive", "ctl"):
            stats["choices"] = choice_shares(s for _, s in data.steps[run])
        learnt = getattr(getattr(runners[run], "controller", None), "reliability", None)
        if learnt is not None:  # each drafter's confidence calibration: predicted vs observed
            stats["reliability"] = learnt()
    plain_key = MethodAt(plain, tags[first]).key
    _add_speedups(report, categories, plain_key)
    statics = [run for run in measured if run.method.kind == "static"]
    for m in methods:
        if m.kind == "oracle":
            report["methods"][m.spec] = _oracle(report, data, statics, categories, repeats,
                                                per_category=m.baseline != "oracle")
    _add_speedups(report, categories, plain_key)
    # theory from the static runs only: in adaptive runs deep positions are drafted only when
    # acceptance runs hot, which would bias alpha upwards (acceptance is bursty)
    static = Measurements()
    static.steps.update({run: s for run, s in base.steps.items()
                         if run.method.kind in ("plain", "static")})
    static.cells.update({run: c for run, c in base.cells.items() if run.method.kind == "plain"})
    report["measured_static"] = measure_costs(static, engine)
    report["theoretical"] = theoretical_best(report["measured_static"])
    report["predicted_static"] = predicted_static(report, statics) if len(engines) == 1 else {}
    report["sample_outputs"] = {p.id: tok.decode(base.outputs[MethodAt(plain, tags[first])][p.id])
                                for p in prompts[:3]}
    report["roofline"] = roofline([s for steps in base.steps.values() for _, s in steps],
                                  engine.models.target, *peaks(engine.models.target))
    return report


def choice_shares(steps) -> dict:
    """What a controller chose, as shares of its steps: {"drafters": {name: share}, "k":
    {K: share}} (the first repeat's steps)."""
    steps = list(steps)
    counts = {"drafters": Counter(s.drafter for s in steps), "k": Counter(str(s.k) for s in steps)}
    return {name: {key: round(c / len(steps), 4) for key, c in counted.most_common()}
            for name, counted in counts.items()} if steps else {}


def cell_stats(cells: list[Cell], same: bool | None) -> dict:
    """STATS (the keys below) over one method's cells, one per repeat: tokens/s is the
    median of the repeats' rates; bench under load (load.py) adds its own keys to these."""
    rates = [c.tokens / c.wall_s for c in cells if c.wall_s > 0]
    tokens = sum(c.tokens for c in cells)
    proposed = sum(c.proposed for c in cells)
    steps = sum(c.steps for c in cells)
    return {
        "tokens_per_s": statistics.median(rates) if rates else 0.0,
        "wall_s": statistics.median(c.wall_s for c in cells),
        "tokens": tokens // max(1, len(cells)),
        "acceptance_rate": sum(c.accepted for c in cells) / proposed if proposed else None,
        "mean_accepted_length": tokens / steps if steps else None,
        "identical_to_plain": same,
        "speedup_vs_plain": None,
        # decide + update as a share of wall time (0 for fixed policies and hf: peers)
        "controller_share": sum(c.controller_s for c in cells) / max(1e-12, sum(c.wall_s for c in cells)),
        # bytes read over the whole wall time (prefill, sampling and Python included): what
        # decoding achieved, not what the forwards alone did
        "bandwidth_gbs": sum(c.bytes_moved for c in cells) / max(1e-12, sum(c.wall_s for c in cells)) / 1e9,
    }


def _merge(cells: list[Cell]) -> Cell:
    out = Cell()
    for c in cells:
        out.tokens += c.tokens
        out.wall_s += c.wall_s
        out.proposed += c.proposed
        out.accepted += c.accepted
        out.steps += c.steps
        out.controller_s += c.controller_s
        out.bytes_moved += c.bytes_moved
    return out


def _stats_for(by_category: dict, categories: list[str], repeats: int, same) -> dict:
    per_cat = {c: cell_stats([by_category[c][r] for r in range(repeats)], same) for c in categories}
    overall = [_merge([by_category[c][r] for c in categories]) for r in range(repeats)]
    return {OVERALL: cell_stats(overall, same), "by_category": per_cat}


def _add_speedups(report: dict, categories: list[str], plain_key: str = "plain") -> None:
    plain = report["methods"][plain_key]
    for stats in report["methods"].values():
        stats[OVERALL]["speedup_vs_plain"] = _ratio(stats[OVERALL], plain[OVERALL])
        for c in categories:
            stats["by_category"][c]["speedup_vs_plain"] = _ratio(
                stats["by_category"][c], plain["by_category"][c])


def _ratio(a: dict, b: dict) -> float | None:
    return a["tokens_per_s"] / b["tokens_per_s"] if b["tokens_per_s"] else None


def _oracle(report: dict, data: Measurements, statics: list[MethodAt], categories: list[str],
            repeats: int, per_category: bool) -> dict:
    """The best of the `statics` in hindsight: one for all prompts, or one per category."""
    if not statics:
        raise ValueError("oracle needs at least one static:DRAFTER:K method in the run")
    methods = report["methods"]
    if not per_category:
        best = max(statics, key=lambda run: methods[run.key][OVERALL]["tokens_per_s"])
        return {**json.loads(json.dumps(methods[best.key])), "picked": best.key}
    picks = {c: max(statics, key=lambda run: methods[run.key]["by_category"][c]["tokens_per_s"])
             for c in categories}
    overall = [_merge([data.cells[picks[c]][c][r] for c in categories]) for r in range(repeats)]
    verdicts = [methods[picks[c].key][OVERALL]["identical_to_plain"] for c in categories]
    same = (False if False in verdicts else "near-tie" if "near-tie" in verdicts
            else None if None in verdicts else True)
    picked = {c: run.key for c, run in picks.items()}
    return {OVERALL: {**cell_stats(overall, same), "picked": picked},
            "by_category": {c: {**methods[picked[c]]["by_category"][c], "picked": picked[c]}
                            for c in categories},
            "picked": picked}


def measure_costs(data: Measurements, engine: Engine) -> dict:
    """alpha per drafter and position, c per drafter, v(K), from our own runs' step records;
    and what the formula needs to charge what every method pays:
    - alpha_per_slot: P(position j accepted | the step asked for more than j tokens), over
      every drafting step — a look-up with no match, or a shorter proposal than K, counts as
      not accepted there (`alpha`, P(accepted | proposed), leaves such steps out);
    - overhead: seconds per step outside the draft and the target's forward (the engine's own
      work: look-ups, acceptance, cache roll-back, telemetry), in plain steps, from plain."""
    plain_steps = [s for run, steps in data.steps.items() if run.method.kind == "plain"
                   for _, s in steps]
    t1 = statistics.median(s.verify_seconds for s in plain_steps) if plain_steps else None
    verify_by_tokens: dict[int, list[float]] = defaultdict(list)
    draft_per_token: dict[str, list[float]] = defaultdict(list)
    drafted: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    asked: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for method, steps in data.steps.items():
        for category, s in steps:
            verify_by_tokens[s.verify_tokens].append(s.verify_seconds)
            if s.proposed:
                draft_per_token[s.drafter].append(s.draft_seconds / s.proposed)
                drafted[s.drafter][category].append(s)
            if s.k and s.drafter != "none":
                asked[s.drafter][category].append(s)
    out = {"target_step_seconds": t1, "v": {}, "c": {}, "alpha": {}, "alpha_per_slot": {},
           "overhead": 0.0}
    if t1:
        out["v"] = {str(n - 1): statistics.median(v) / t1 for n, v in sorted(verify_by_tokens.items())}
        out["c"] = {d: statistics.median(v) / t1 for d, v in sorted(draft_per_token.items())}
        plain = [cell for run, by_category in data.cells.items() if run.method.kind == "plain"
                 for per_repeat in by_category.values() for cell in per_repeat.values()]
        steps, wall = sum(c.steps for c in plain), sum(c.wall_s for c in plain)
        if steps:
            inside = sum(s.verify_seconds + s.draft_seconds for s in plain_steps) / len(plain_steps)
            out["overhead"] = max(0.0, wall / steps - inside) / t1
    for drafter, per_category in drafted.items():
        out["alpha"][drafter] = {category: [round(a, 4) for a in acceptance_per_position(steps)]
                                 for category, steps in per_category.items()}
    for drafter, per_category in asked.items():
        out["alpha_per_slot"][drafter] = {category: [round(a, 4) for a in acceptance_per_position(steps, per_slot=True)]
                                          for category, steps in per_category.items()}
    return out


def theoretical_best(measured: dict) -> dict:
    """S(K*) per category from the run's own measurements: max over drafters and K of
    `charged_speedup`. The speedup a perfect static choice would get if acceptance did not
    depend on K."""
    best: dict[str, dict] = {}
    for drafter, per_cat in _alphas(measured).items():
        for category in per_cat:
            rates = charged_speedup(measured, drafter, category)
            if rates is None:
                continue
            k = int(np.argmax(rates[1:])) + 1
            if rates[k] > best.get(category, {}).get("speedup", 0.0):
                best[category] = {"drafter": drafter, "k": k, "speedup": float(rates[k])}
    return best


def _alphas(measured: dict) -> dict:
    return measured.get("alpha_per_slot") or measured.get("alpha") or {}


def charged_speedup(measured: dict, drafter: str, category: str) -> np.ndarray | None:
    """S(K), K = 0..: controller.formulas.speedup over the measured c and v(K), charging what
    every method pays: the per-step overhead o (in plain steps: a plain step costs 1 + o, a
    drafting one c K + v(K) + o) and, through alpha_per_slot, drafts shorter than K.
    The measured alpha is cumulative over positions; formulas take it conditional on the
    earlier positions, hence the ratios. None where the run measured no cost for `drafter`."""
    v, c = measured.get("v") or {}, measured.get("c") or {}
    kept = (_alphas(measured).get(drafter) or {}).get(category)
    if drafter not in c or not kept:
        return None
    # v(K) where measured, linear in between (static runs measure a few K only); v(0) = 1
    sizes = sorted(int(k) for k in v if int(k) > 0)
    if not sizes:
        return None
    verify = np.interp(np.arange(sizes[-1] + 1), [0, *sizes], [1.0, *(v[str(k)] for k in sizes)])
    kept = np.asarray(kept[:len(verify) - 1], float)
    if not len(kept):
        return None
    earlier = np.concatenate([[1.0], kept[:-1]])
    conditional = np.divide(kept, earlier, out=np.zeros_like(kept), where=earlier > 0)
    o = measured.get("overhead", 0.0)
    charged = (verify[:len(kept) + 1] + o) / (1 + o)
    return speedup(conditional, c[drafter] / (1 + o), charged)


def predicted_static(report: dict, statics: list[MethodAt]) -> dict:
    """Each static method's speedup per category as the charged formula predicts it, beside
    the measured one: how far the formula is from what runs (docs/benchmarks.md: achieved / theoretical)."""
    measured = report.get("measured_static") or report["measured"]
    out = {}
    for run in statics:
        drafter, k = run.method.drafter, run.method.k
        for category, cell in report["methods"][run.key]["by_category"].items():
            rates = charged_speedup(measured, drafter, category)
            if rates is not None and k < len(rates) and cell.get("speedup_vs_plain"):
                out.setdefault(run.key, {})[category] = {
                    "predicted": round(float(rates[k]), 3),
                    "measured": round(cell["speedup_vs_plain"], 3)}
    return out


def _models(engine: Engine) -> dict:
    m = engine.models
    return {"target": m.target_name, "draft": m.draft_name,
            "target_params": sum(p.numel() for p in m.target.parameters()),
            "draft_params": own_params(m.draft, m.target) if m.draft else None,
            "dtype": str(next(m.target.parameters()).dtype).replace("torch.", ""),
            "weights": format_of(m.target),
            "exit_layer": m.default_exit_layer}


def own_params(model, target) -> int:
    """Parameters of `model` that are not the target's (a shared draft borrows some)."""
    shared = {id(p) for p in target.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in shared)


def machine_info() -> dict:
    """The host (the roofline uses the target's device), its peaks measured again now: the
    highest ever measured is the one used, and `peak_bandwidth` says when it was measured,
    what this run measured and the recent measurements' spread (engine/bandwidth.py)."""
    from autospec.engine.bandwidth import peak_bandwidth, peak_matmul_gflops
    copy = peak_bandwidth("cpu", remeasure=True)
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "cuda": torch.cuda.is_available(),
            "peak_bandwidth_gbs": copy["gbs"], "peak_bandwidth": copy,
            "peak_matmul_gflops": peak_matmul_gflops("cpu", remeasure=True)}
