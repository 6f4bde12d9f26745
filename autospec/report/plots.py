"""The report's PNGs: thin matplotlib over stats.py's numbers.

Figures are built with matplotlib's object API on an Agg canvas, never through pyplot: no
display is needed and no global figure state is left behind (the daemon may call this too).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from autospec.report.stats import (PLAIN, DrafterSpeed, GroupSummary, RequestPoint,
                                   by_workload, mean_k, rolling_mean)

DPI = 120


def _figure(rows: int = 1, height: float = 4.0) -> tuple[Figure, list]:
    fig = Figure(figsize=(8, height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(rows, 1, i + 1) for i in range(rows)]


def _over_time(ax, requests: Sequence[RequestPoint], value, window: int, ylabel: str) -> None:
    """Per workload: the per-request values as faint dots, their rolling mean as a line.
    x = position in stored (ingest) order over all requests, so workloads share one axis."""
    position = {id(r): i for i, r in enumerate(requests)}
    for workload, group in by_workload(requests).items():
        xs = [position[id(r)] for r in group]
        ys = [value(r) for r in group]
        dots = ax.plot(xs, [float("nan") if y is None else y for y in ys], ".", alpha=0.25)
        smooth = rolling_mean(ys, window)
        ax.plot(xs, [float("nan") if y is None else y for y in smooth], "-",
                color=dots[0].get_color(), label=workload)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def plot_acceptance(requests: Sequence[RequestPoint], path: Path, window: int) -> None:
    fig, (top, bottom) = _figure(rows=2, height=3.2)
    _over_time(top, requests, lambda r: r.acceptance_rate if r.proposed else None, window,
               "acceptance rate")
    top.set_ylim(0, 1.02)
    top.set_title(f"Acceptance and K per request (lines: rolling mean of {window})")
    top.legend(title="workload", fontsize="small")
    _over_time(bottom, requests, lambda r: mean_k(r.aggregates), window, "mean K (plain = 0)")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("request (ingest order)")
    fig.savefig(path, dpi=DPI)


def plot_drafters(summaries: dict[str, GroupSummary], path: Path) -> None:
    fig, (ax,) = _figure()
    names = list(summaries)
    drafters = sorted({d for s in summaries.values() for d in s.drafter_shares},
                      key=lambda d: (d == PLAIN, d))  # plain on top of the stack
    bottoms = [0.0] * len(names)
    for drafter in drafters:
        shares = [summaries[w].drafter_shares.get(drafter, 0.0) for w in names]
        ax.bar(names, shares, bottom=bottoms, label=drafter,
               color="0.75" if drafter == PLAIN else None)
        bottoms = [b + s for b, s in zip(bottoms, shares)]
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of steps")
    ax.set_title("Drafter shares by workload")
    ax.legend(title="drafter", fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.savefig(path, dpi=DPI)


def plot_speedup(speeds: Sequence[DrafterSpeed], path: Path) -> None:
    """Speedup over plain steps when plain steps were recorded, else absolute tokens/s."""
    relative = any(s.drafter == PLAIN for s in speeds)
    fig, (ax,) = _figure()
    shown = [s for s in speeds if (s.speedup if relative else s.tokens_per_s) is not None]
    values = [s.speedup if relative else s.tokens_per_s for s in shown]
    bars = ax.bar([s.drafter for s in shown], values,
                  color=["0.75" if s.drafter == PLAIN else "C0" for s in shown])
    ax.bar_label(bars, labels=[f"{v:.2f}x" if relative else f"{v:.0f}" for v in values])
    ax.margins(y=0.12)  # room for the labels above the tallest bar
    if relative:
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("tokens/s relative to plain steps")
        ax.set_title("Speedup by drafter (step time: draft + verify)")
    else:
        ax.set_ylabel("tokens/s")
        ax.set_title("Tokens/s by drafter (no plain steps recorded: absolute)")
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=DPI)


def plot_bandwidth(requests: Sequence[RequestPoint], peak_gbs: float, path: Path,
                   window: int) -> None:
    fig, (ax,) = _figure()
    _over_time(ax, requests, lambda r: r.bandwidth_gbs / peak_gbs, window, "bandwidth / peak")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("request (ingest order)")
    ax.set_title(f"Bandwidth utilisation (peak {peak_gbs:.1f} GB/s; "
                 f"lines: rolling mean of {window})")
    ax.legend(title="workload", fontsize="small")
    fig.savefig(path, dpi=DPI)


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
