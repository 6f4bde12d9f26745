"""The report's numbers: pure functions over stored requests (no database, no matplotlib).

Pooled figures are ratios of sums, never means of per-request ratios, so a 10-token request
weighs a tenth of a 100-token one: acceptance rate = sum accepted / sum proposed, accepted
length = sum emitted / sum steps, tokens/s = sum output tokens / sum wall seconds, bandwidth =
sum bytes moved / sum (draft + verify) seconds, as telemetry.summarise defines them per request.

The plots over time draw the same pooled figures (`trends`): per workload, each request's own
figure (dots), the figure pooled over its workload's last N requests (a rolling ratio of sums,
not a rolling mean of per-request ratios), and the whole workload's figure, which is the summary
row's number. A mean of per-request ratios weighs a slow request like a fast one, and so reads
higher or lower than the summary's pooled figure (bandwidth.png once read 3-7 % of peak against
the summary's 1.6-2.9 %).

The workload rows, drafter shares and drafter speeds are of the controller's requests; baseline
traffic (requests whose method fixed the drafter and K, like the demo's plain half) is
reported apart, per method (`split_traffic`).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from autospec.method import is_adaptive
from autospec.store import AppliedPolicy, StepAggregate
from autospec.telemetry import UNLABELLED  # the workload of requests stored without one

PLAIN = "none"  # the drafter name of plain (non-speculative) steps, k = 0
ALL = "all"  # the row of the summary pooled over every workload


@dataclass(frozen=True)
class RequestPoint:
    """One stored request, as the report needs it (a RequestRow with its step aggregates)."""
    workload: str
    ingested_at: datetime
    model_pair: str
    hardware: str
    output_tokens: int
    steps: int
    proposed: int
    accepted: int
    acceptance_rate: float
    wall_seconds: float
    draft_seconds: float
    verify_seconds: float
    bytes_moved: int
    bandwidth_gbs: float
    aggregates: tuple[StepAggregate, ...]
    method: str | None = None  # as the request ran ("plain", "adaptive", ...); None: not said


@dataclass(frozen=True)
class GroupSummary:
    """One row of the summary: the requests of one workload, of all (ALL), or of one baseline
    method."""
    name: str
    requests: int
    output_tokens: int
    acceptance_rate: float | None  # None when nothing was drafted
    mean_accepted_length: float | None  # emitted tokens per step, bonus token included
    mean_k: float | None  # steps-weighted, plain steps counting k = 0
    drafter_shares: dict[str, float]  # {drafter: share of steps}, largest first
    tokens_per_s: float | None  # output tokens / wall seconds
    bandwidth_gbs: float | None  # bytes moved / (draft + verify) seconds


@dataclass(frozen=True)
class DrafterSpeed:
    """Tokens per second of step time (draft + verify) over one drafter's steps."""
    drafter: str
    steps: int
    emitted: int
    seconds: float
    tokens_per_s: float | None
    speedup: float | None  # tokens_per_s / plain's; None without plain steps


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def mean_k(aggregates: Iterable[StepAggregate]) -> float | None:
    """Steps-weighted mean k. Plain steps count as k = 0: choosing plain is the controller's
    K = 0 decision, so the mean is of K as chosen, not of K given that it drafted."""
    steps = weighted = 0
    for a in aggregates:
        steps += a.steps
        weighted += a.steps * a.k
    return _ratio(weighted, steps)


def utilisation(gbs: float | None, peak_gbs: float) -> float | None:
    """Bandwidth as a fraction of the peak: the summary's util column and bandwidth.png's y."""
    return None if gbs is None else gbs / peak_gbs


def rolling_ratio(parts: Sequence[tuple[float, float]], window: int) -> list[float | None]:
    """Trailing ratio of sums over the last `window` (numerator, denominator) pairs (fewer at
    the start): at each point, the pooled figure of those requests, as the summary pools a
    workload. None where the denominators sum to 0 (nothing drafted, no step time)."""
    if window < 1:
        raise ValueError(f"rolling window must be >= 1, got {window}")
    out: list[float | None] = []
    for i in range(len(parts)):
        kept = parts[max(0, i - window + 1): i + 1]
        out.append(_ratio(sum(n for n, _ in kept), sum(d for _, d in kept)))
    return out


def by_workload(requests: Sequence[RequestPoint]) -> dict[str, list[RequestPoint]]:
    """Requests per workload, workloads sorted by name, requests in stored order."""
    groups: dict[str, list[RequestPoint]] = {}
    for r in requests:
        groups.setdefault(r.workload, []).append(r)
    return dict(sorted(groups.items()))


def drafter_steps(requests: Iterable[RequestPoint]) -> dict[str, int]:
    steps: dict[str, int] = {}
    for r in requests:
        for a in r.aggregates:
            steps[a.drafter] = steps.get(a.drafter, 0) + a.steps
    return steps


@dataclass(frozen=True)
class Traffic:
    """Stored requests split by who chose their drafter and K: the controller, or the method.

    A baseline request ran a method that fixes both (plain, static:DRAFTER:K) or a baseline
    controller (ctl:, hf:). Its steps are the client's choice, not the controller's: counted
    with the rest they read as if the controller had chosen them (the demo's plain half made
    the shares read "none 87 %"). A request stored without a method (telemetry from before
    schema 5, or a client that does not send it) counts as the controller's, as every request
    did before methods were recorded: nothing old moves out of the controller's rows."""
    requests: Sequence[RequestPoint]  # all of them, in stored order
    controller: list[RequestPoint]  # method adaptive or adaptive:POLICY, or None; stored order
    baseline: dict[str, list[RequestPoint]]  # {method: its requests}, methods by name

    @property
    def shown(self) -> Sequence[RequestPoint]:
        """What the controller's rows and plots show: its requests, or every request when none
        ran it (a store of baseline traffic only still reports its drafters)."""
        return self.controller or self.requests


def split_traffic(requests: Sequence[RequestPoint]) -> Traffic:
    controller: list[RequestPoint] = []
    baseline: dict[str, list[RequestPoint]] = {}
    for r in requests:
        if r.method is None or is_adaptive(r.method):
            controller.append(r)
        else:
            baseline.setdefault(r.method, []).append(r)
    return Traffic(requests, controller, dict(sorted(baseline.items())))


def summarise_workload(name: str, requests: Sequence[RequestPoint]) -> GroupSummary:
    """The summary row of a group of requests (one workload, ALL, or a baseline method)."""
    steps = drafter_steps(requests)
    total_steps = sum(steps.values())
    shares = {d: n / total_steps for d, n in sorted(steps.items(), key=lambda kv: (-kv[1], kv[0]))}
    output = sum(r.output_tokens for r in requests)
    step_seconds = sum(r.draft_seconds + r.verify_seconds for r in requests)
    moved = sum(r.bytes_moved for r in requests)
    return GroupSummary(
        name=name,
        requests=len(requests),
        output_tokens=output,
        acceptance_rate=_ratio(sum(r.accepted for r in requests), sum(r.proposed for r in requests)),
        mean_accepted_length=_ratio(output, sum(r.steps for r in requests)),
        mean_k=mean_k(a for r in requests for a in r.aggregates),
        drafter_shares=shares,
        tokens_per_s=_ratio(output, sum(r.wall_seconds for r in requests)),
        bandwidth_gbs=_ratio(moved / 1e9, step_seconds),
    )


# -- the figures over time, as the plots draw them -------------------------------------------
# Each is a ratio of sums; a request gives its (numerator, denominator), and pooled over a
# workload they give that workload's GroupSummary field (summarise_workload).
def acceptance_parts(r: RequestPoint) -> tuple[float, float]:
    """-> GroupSummary.acceptance_rate: accepted / proposed draft tokens."""
    return r.accepted, r.proposed


def k_parts(r: RequestPoint) -> tuple[float, float]:
    """-> GroupSummary.mean_k: sum of steps x K / steps, plain steps K = 0."""
    return sum(a.steps * a.k for a in r.aggregates), sum(a.steps for a in r.aggregates)


def bandwidth_parts(r: RequestPoint) -> tuple[float, float]:
    """-> GroupSummary.bandwidth_gbs: GB moved / step (draft + verify) seconds."""
    return r.bytes_moved / 1e9, r.draft_seconds + r.verify_seconds


@dataclass(frozen=True)
class Trend:
    """One workload's figure over the stored requests, as a plot over time draws it."""
    workload: str
    positions: list[int]  # x: each request's place among all the plotted ones (stored order)
    each: list[float | None]  # each request's own figure; None: nothing to divide
    rolling: list[float | None]  # pooled over the workload's last `window` requests so far
    whole: float | None  # pooled over all of the workload's requests: the summary's number


def trends(requests: Sequence[RequestPoint], summaries: dict[str, GroupSummary],
           parts: Callable[[RequestPoint], tuple[float, float]],
           whole: Callable[[GroupSummary], float | None], window: int,
           scale: float = 1.0) -> list[Trend]:
    """Per workload (by name): `parts` per request and rolling over `window`, each divided by
    `scale` (bandwidth: the peak, for utilisation), and `whole` of the workload's summary row
    (`summaries`: summarise_workloads of the same requests), so the plot's whole-workload
    level is the very number the summary prints."""
    position = {id(r): i for i, r in enumerate(requests)}

    def scaled(v: float | None) -> float | None:
        return None if v is None else v / scale

    out = []
    for workload, group in by_workload(requests).items():
        pairs = [parts(r) for r in group]
        out.append(Trend(workload, [position[id(r)] for r in group],
                         [scaled(_ratio(n, d)) for n, d in pairs],
                         [scaled(v) for v in rolling_ratio(pairs, window)],
                         whole(summaries[workload])))
    return out


def plot_window(requests: Sequence[RequestPoint], window: int) -> int:
    """The rolling window the plots over time use: `window`, but no more than the largest
    workload's count of requests (a window of 20 over 6 requests is a window of 6)."""
    groups = by_workload(requests)
    return max(1, min(window, max((len(g) for g in groups.values()), default=1)))


def summarise_workloads(requests: Sequence[RequestPoint]) -> dict[str, GroupSummary]:
    """{workload: summary} in name order, then "all" pooled over every request."""
    out = {w: summarise_workload(w, rs) for w, rs in by_workload(requests).items()}
    out[ALL] = summarise_workload(ALL, requests)
    return out


def drafter_speeds(requests: Iterable[RequestPoint]) -> list[DrafterSpeed]:
    """Per drafter: emitted tokens / (draft + verify seconds) over all its steps, and that
    relative to plain steps. Fastest first, plain last.

    Step time only: policy overhead and time between steps are not in it. And the controller
    chose where each drafter ran, so a drafter used only where it pays looks better than it
    would everywhere: this compares drafters as used, not on equal footing."""
    sums: dict[str, list] = {}
    for r in requests:
        for a in r.aggregates:
            acc = sums.setdefault(a.drafter, [0, 0, 0.0])
            acc[0] += a.steps
            acc[1] += a.emitted
            acc[2] += a.draft_seconds + a.verify_seconds
    plain = sums.get(PLAIN)
    plain_rate = _ratio(plain[1], plain[2]) if plain else None
    speeds = []
    for drafter, (steps, emitted, seconds) in sums.items():
        rate = _ratio(emitted, seconds)
        speedup = rate / plain_rate if rate is not None and plain_rate else None
        speeds.append(DrafterSpeed(drafter, steps, emitted, seconds, rate, speedup))
    return sorted(speeds, key=lambda s: (s.drafter == PLAIN, -(s.tokens_per_s or 0.0), s.drafter))


# -- the text summary -------------------------------------------------------------------------
def number(value: float | None, fmt: str) -> str:
    """A figure as the summary prints it ("-" for none); the plots label theirs the same way."""
    return "-" if value is None else format(value, fmt)


# The summary tables' columns: (header, width, format). Every header is one word, so a row
# splits on whitespace into exactly its columns, each under its header.
ACCEPT_FMT, K_FMT, UTIL_FMT, SHARE_FMT, SPEEDUP_FMT, TOKENS_PER_S_FMT = \
    ".3f", ".2f", ".1%", ".1%", ".2f", ".1f"
_COLUMNS = (("requests", 8, "d"), ("out_tokens", 10, "d"), ("accept_rate", 11, ACCEPT_FMT),
            ("tokens/step", 11, ".2f"), ("mean_K", 6, K_FMT), ("tokens/s", 9, TOKENS_PER_S_FMT),
            ("GB/s", 7, ".2f"), ("util", 6, UTIL_FMT))
COLUMN_KEY = [  # after the workload table; indented, so not read as a row
    "  accept_rate: accepted / proposed draft tokens; tokens/step: output tokens / steps (bonus",
    "  token included); mean_K: K per step, steps-weighted, plain steps K = 0; tokens/s: output",
    "  tokens / wall s; GB/s: bytes moved / step (draft + verify) s; util: GB/s / peak. Each is",
    "  pooled over the row's requests (a ratio of sums), as the plots' dashed lines and legends.",
]


def _header(first: str, width: int) -> str:
    return f"{first:<{width}}" + "".join(f"  {h:>{w}}" for h, w, _ in _COLUMNS)


def _row(s: GroupSummary, peak_gbs: float, width: int) -> str:
    """One line of a summary table: the group's name in `width` characters, then _COLUMNS."""
    values = (s.requests, s.output_tokens, s.acceptance_rate, s.mean_accepted_length, s.mean_k,
              s.tokens_per_s, s.bandwidth_gbs, utilisation(s.bandwidth_gbs, peak_gbs))
    return f"{s.name:<{width}}" + "".join(f"  {number(v, f):>{w}}"
                                          for v, (_, w, f) in zip(values, _COLUMNS))


def summary_text(requests: Sequence[RequestPoint], policies: Sequence[AppliedPolicy],
                 peak_gbs: float, peak_source: str, store_url: str) -> str:
    """The report as text: totals, one line per workload, drafter shares, drafter speeds (the
    controller's requests), baseline requests per method, policies. `requests` in stored order
    (non-empty)."""
    traffic = split_traffic(requests)
    summaries = summarise_workloads(traffic.shown)
    first, last = requests[0].ingested_at, requests[-1].ingested_at
    pairs = sorted({r.model_pair for r in requests})
    hardware = sorted({r.hardware for r in requests})
    lines = [
        f"autospec report: {store_url}",
        f"requests {len(requests)}, output tokens {sum(r.output_tokens for r in requests)}, "
        f"ingested {first:%Y-%m-%d %H:%M} .. {last:%Y-%m-%d %H:%M} UTC",
        f"model pair {', '.join(pairs)}; hardware {', '.join(hardware)}",
        f"peak bandwidth {peak_gbs:.1f} GB/s ({peak_source})",
        "",
    ]
    if traffic.baseline and traffic.controller:
        lines.append(f"the controller's requests: {len(traffic.controller)} (method adaptive, or "
                     f"not recorded); baseline requests apart, below")
    elif traffic.baseline:
        lines.append(f"no request ran the adaptive controller: the rows below pool the "
                     f"{len(requests)} baseline requests")
    width = max(16, *map(len, summaries))
    lines.append(_header("workload", width))
    lines += [_row(s, peak_gbs, width) for s in summaries.values()]
    lines += COLUMN_KEY
    lines += ["", "drafter shares of steps:"]
    for s in summaries.values():
        shares = ", ".join(f"{d} {share:{SHARE_FMT}}" for d, share in s.drafter_shares.items())
        lines.append(f"  {s.name:<16} {shares or '-'}")
    speeds = drafter_speeds(traffic.shown)
    has_plain = any(s.drafter == PLAIN for s in speeds)
    lines += ["", "tokens/s of step time (draft + verify) by drafter"
              + (", relative to plain steps:" if has_plain else ":")]
    for s in speeds:
        lines.append(f"  {s.drafter:<16} {s.steps:>8} steps "
                     f"{number(s.tokens_per_s, TOKENS_PER_S_FMT):>9} tok/s"
                     + (f" {number(s.speedup, SPEEDUP_FMT)}x" if has_plain else ""))
    if not has_plain:
        lines.append("  no plain steps recorded: no speedup vs plain; speedup.png shows absolute tokens/s")
    lines.append("")
    if traffic.baseline:
        rows = {m: summarise_workload(m, rs) for m, rs in traffic.baseline.items()}
        everything = summarise_workload(ALL, [r for rs in traffic.baseline.values() for r in rs])
        counts = ", ".join(f"{m} {s.requests}" for m, s in rows.items())
        width = max(16, *map(len, rows))
        lines += [f"baseline requests: {everything.requests} ({counts}), tokens/s "
                  f"{number(everything.tokens_per_s, TOKENS_PER_S_FMT)}",
                  "their method fixed the drafter and K"
                  + (": not in the controller's rows above" if traffic.controller else ""),
                  _header("method", width)]
        lines += [_row(s, peak_gbs, width) for s in rows.values()]
        lines.append("")
    if policies:
        now = policies[-1]
        lines.append(f"policies applied: {len(policies)}; in force: {now.policy_hash[:12]} "
                     f"{now.path} (since {now.applied_at:%Y-%m-%d %H:%M} UTC)")
    else:
        lines.append("policies applied: none recorded")
    return "\n".join(lines) + "\n"
