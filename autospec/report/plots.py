"""The report's PNGs: thin matplotlib over stats.py's numbers.

Figures are built with matplotlib's object API on an Agg canvas, never through pyplot: no
display is needed and no global figure state is left behind (the daemon may call this too).
The report's plot_* return their Figure (report.render collects them, write_report saves
them), drawn from the same summary rows summary.txt prints; plot_load (bench) saves its own.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from autospec.report.stats import (ACCEPT_FMT, K_FMT, PLAIN, SHARE_FMT, SPEEDUP_FMT,
                                   TOKENS_PER_S_FMT, UTIL_FMT, DrafterSpeed, GroupSummary,
                                   RequestPoint, Trend, acceptance_parts, bandwidth_parts,
                                   by_workload, k_parts, number, trends, utilisation)

DPI = 120

# Each plotted series carries a gid, so what a figure shows can be read back from it (the
# tests compare it with summary.txt): "each:W", "rolling:W", "whole:W" per workload W over
# time; "share:D" per drafter D in drafters.png; "speed" in speedup.png.


def _figure(rows: int = 1, height: float = 4.0) -> tuple[Figure, list]:
    fig = Figure(figsize=(10, height * rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(rows, 1, i + 1) for i in range(rows)]


def _nan(values: Sequence[float | None]) -> list[float]:
    return [float("nan") if v is None else v for v in values]


def _key(requests: Sequence[RequestPoint], window: int) -> str:
    """The last line of a plot over time's title: what its marks are."""
    if window >= max(len(g) for g in by_workload(requests).values()):
        solid = "pooled over its workload's requests so far"  # ends on the dashed level
    elif window > 1:
        solid = f"pooled over its workload's last {window} requests"
    else:
        solid = "the same (a window of 1 request)"
    return (f"dots: one request; solid: {solid}; dashed: all of the workload's requests, "
            f"as in the legend and summary.txt")


def _over_time(ax, series: Sequence[Trend], label: Callable[[Trend], str], column: str) -> None:
    """Per workload: each request's figure as faint dots, the rolling pooled figure as a line,
    the whole workload's (the summary's number) dashed over its span and in the legend.
    x = position in stored (ingest) order over all requests, so workloads share one axis."""
    for t in series:
        line, = ax.plot(t.positions, _nan(t.rolling), "-", label=label(t),
                        gid=f"rolling:{t.workload}")
        color = line.get_color()
        ax.plot(t.positions, _nan(t.each), ".", color=color, alpha=0.35, gid=f"each:{t.workload}")
        if t.whole is not None:
            ax.plot([t.positions[0] - 0.4, t.positions[-1] + 0.4], [t.whole, t.whole], "--",
                    color=color, lw=1, alpha=0.7, gid=f"whole:{t.workload}")
    ax.legend(title=f"workload: {column}", fontsize="small", loc="upper left",
              bbox_to_anchor=(1.01, 1))
    ax.grid(alpha=0.3)


def plot_acceptance(requests: Sequence[RequestPoint], summaries: dict[str, GroupSummary],
                    window: int, who: str = "the controller's requests") -> Figure:
    """Acceptance rate (top) and mean K (bottom) per workload over the stored requests.
    summaries: summarise_workloads(requests), the summary's rows."""
    fig, (top, bottom) = _figure(rows=2, height=3.4)
    fig.suptitle(f"Acceptance rate and K by workload, over {who} in ingest order\n"
                 f"{_key(requests, window)}", fontsize="medium")
    _over_time(top, trends(requests, summaries, acceptance_parts, lambda s: s.acceptance_rate,
                           window),
               lambda t: f"{t.workload}: {number(t.whole, ACCEPT_FMT)}", "accept_rate")
    top.set_ylim(0, 1.02)
    top.set_title("acceptance rate = accepted / proposed draft tokens", fontsize="medium")
    top.set_ylabel("acceptance rate")
    _over_time(bottom, trends(requests, summaries, k_parts, lambda s: s.mean_k, window),
               lambda t: f"{t.workload}: {number(t.whole, K_FMT)}", "mean_K")
    bottom.set_ylim(bottom=0)
    bottom.set_title("mean K = draft tokens asked per step, steps-weighted (plain steps: K = 0)",
                     fontsize="medium")
    bottom.set_ylabel("mean K (tokens/step)")
    bottom.set_xlabel("request (ingest order, all workloads)")
    return fig


def plot_drafters(summaries: dict[str, GroupSummary], who: str = "the controller's requests"
                  ) -> Figure:
    """Stacked share of steps per drafter, one bar per summary row (workloads, then all)."""
    fig, (ax,) = _figure()
    names = list(summaries)
    drafters = sorted({d for s in summaries.values() for d in s.drafter_shares},
                      key=lambda d: (d == PLAIN, d))  # plain on top of the stack
    bottoms = [0.0] * len(names)
    for drafter in drafters:
        shares = [summaries[w].drafter_shares.get(drafter, 0.0) for w in names]
        bars = ax.bar(names, shares, bottom=bottoms, label=drafter, gid=f"share:{drafter}",
                      color="0.75" if drafter == PLAIN else None)
        ax.bar_label(bars, labels=[format(v, SHARE_FMT) if v >= 0.04 else "" for v in shares],
                     label_type="center", fontsize="small")
        bottoms = [b + s for b, s in zip(bottoms, shares)]
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of steps (%)")
    ax.set_title(f"Share of decoding steps by drafter, per workload, over {who}\n"
                 "(summary.txt: drafter shares of steps)", fontsize="medium")
    ax.legend(title="drafter", fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def plot_speedup(speeds: Sequence[DrafterSpeed], who: str = "the controller's requests"
                 ) -> Figure:
    """Speedup over plain steps when plain steps were recorded, else absolute tokens/s."""
    relative = any(s.drafter == PLAIN for s in speeds)
    fig, (ax,) = _figure()
    shown = [s for s in speeds if (s.speedup if relative else s.tokens_per_s) is not None]
    values = [s.speedup if relative else s.tokens_per_s for s in shown]
    bars = ax.bar([f"{s.drafter}\n{s.steps} steps" for s in shown], values, gid="speed",
                  color=["0.75" if s.drafter == PLAIN else "C0" for s in shown])
    ax.bar_label(bars, labels=[f"{v:{SPEEDUP_FMT}}x" if relative else f"{v:{TOKENS_PER_S_FMT}}"
                               for v in values])
    ax.margins(y=0.12)  # room for the labels above the tallest bar
    step_time = "tokens/s of step time (draft + verify)"
    if relative:
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("speedup (x plain steps' tokens/s)")
        ax.set_title(f"Speedup by drafter: {step_time} relative to plain steps, over {who}\n"
                     "(summary.txt: tokens/s of step time by drafter)", fontsize="medium")
    else:
        ax.set_ylabel("tokens/s of step time")
        ax.set_title(f"Tokens/s by drafter: {step_time}, over {who}; no plain steps recorded, "
                     "so absolute\n(summary.txt: tokens/s of step time by drafter)",
                     fontsize="medium")
    ax.grid(axis="y", alpha=0.3)
    return fig


def plot_bandwidth(requests: Sequence[RequestPoint], summaries: dict[str, GroupSummary],
                   peak_gbs: float, window: int, who: str = "the controller's requests") -> Figure:
    """Bandwidth utilisation (GB/s over peak_gbs) per workload over the stored requests."""
    fig, (ax,) = _figure(height=4.5)

    def label(t: Trend) -> str:
        return (f"{t.workload}: {number(t.whole, UTIL_FMT)} "
                f"({number(summaries[t.workload].bandwidth_gbs, '.2f')} GB/s)")

    _over_time(ax, trends(requests, summaries, bandwidth_parts,
                          lambda s: utilisation(s.bandwidth_gbs, peak_gbs), window, peak_gbs),
               label, "util (GB/s)")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"% of peak {peak_gbs:.1f} GB/s")
    ax.set_xlabel("request (ingest order, all workloads)")
    fig.suptitle(f"Bandwidth utilisation by workload, over {who} in ingest order\n"
                 f"GB moved / step (draft + verify) seconds, as % of peak {peak_gbs:.1f} GB/s\n"
                 f"{_key(requests, window)}", fontsize="medium")
    return fig


def plot_load(by_concurrency: dict, path: Path) -> None:
    """`autospec bench --concurrency ... --plot PATH`: throughput (top) and ITL p50, with p99
    dashed in the same colour (bottom), against concurrency, one line per method. by_concurrency
    is the bench JSON's {"N": {"methods": {METHOD: {"overall": STATS, ...}}}}. A method with no
    ITL (hf:generate: a static batch, no stream) has no line in the bottom panel."""
    levels = sorted(by_concurrency, key=int)
    methods = list(dict.fromkeys(m for n in levels for m in by_concurrency[n]["methods"]))

    def series(method: str, key: str) -> list[float]:
        stats = [by_concurrency[n]["methods"].get(method) for n in levels]
        return [float("nan") if s is None or s["overall"].get(key) is None else s["overall"][key]
                for s in stats]

    fig, (top, bottom) = _figure(rows=2, height=3.2)
    xs = [int(n) for n in levels]
    no_itl = []
    for i, method in enumerate(methods):
        color = "0.5" if method == "plain" else f"C{i}"
        top.plot(xs, series(method, "throughput_tokens_per_s"), "o-", color=color, label=method)
        p50 = series(method, "itl_p50_ms")
        if any(v == v for v in p50):  # not all NaN
            bottom.plot(xs, p50, "o-", color=color, label=f"{method} p50")
            bottom.plot(xs, series(method, "itl_p99_ms"), "o--", color=color, alpha=0.7,
                        label=f"{method} p99")
        else:
            no_itl.append(method)
    top.set_title("Under load: N closed-loop clients")
    top.set_ylabel("throughput (tokens/s)")
    top.legend(title="method", fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    bottom.set_title("Inter-token latency: p50 solid, p99 dashed"
                     + (f" (none measured: {', '.join(no_itl)})" if no_itl else ""))
    bottom.set_ylabel("inter-token latency (ms)")
    bottom.set_xlabel("concurrency (clients)")
    bottom.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    for ax in (top, bottom):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=DPI)
