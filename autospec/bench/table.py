"""`autospec bench`'s report as text: the per-category table, what each controller chose,
the controller's share of wall time, plain decoding's bandwidth against the machine's peak,
and the formula's S(K*) against what the methods achieved."""
from __future__ import annotations

import statistics

from autospec.bench.harness import OVERALL
from autospec.bench.methods import DERIVED
from autospec.bench.roofline import format_roofline
from autospec.confidence import gap_line, merged_table


def format_table(report: dict) -> str:
    """Markdown: tokens/s and speedup per category and overall, identical_to_plain."""
    cats = report["settings"]["categories"]
    head = "| method | " + " | ".join(f"{c} tok/s (x plain)" for c in cats) + \
           " | overall tok/s (x plain) | accept | identical |"
    lines = [head, "|" + "---|" * (len(cats) + 4)]
    for name, stats in report["methods"].items():
        cells = [_fmt(stats["by_category"][c]) for c in cats] + [_fmt(stats[OVERALL])]
        acc = stats[OVERALL].get("acceptance_rate")
        same = stats[OVERALL].get("identical_to_plain")
        picked = stats.get("picked")
        label = f"{name} ({picked})" if isinstance(picked, str) else name
        lines.append(f"| {label} | " + " | ".join(cells) +
                     f" | {'' if acc is None else f'{acc:.2f}'} | {'' if same is None else same} |")
    for name, stats in report["methods"].items():
        choices = stats.get("choices")
        if choices:
            top = {what: ", ".join(f"{key} {v:.0%}" for key, v in list(shares.items())[:5])
                   for what, shares in choices.items()}
            lines += ["", f"{name} chose drafters {top['drafters']}; K {top['k']}"]
    peak = report["machine"].get("peak_bandwidth_gbs")
    for name, plain in report["methods"].items():  # plain, or plain@FORMAT for each format
        if name.split("@")[0] == "plain" and plain[OVERALL].get("bandwidth_gbs") and peak:
            gbs = plain[OVERALL]["bandwidth_gbs"]
            lines += ["", f"{name} read {gbs:.1f} GB/s of weights + KV (as stored) = "
                          f"{gbs / peak:.0%} of this machine's measured copy peak "
                          f"({peak:.1f} GB/s{_peak_note(report)})"]
    line = format_roofline(report.get("roofline") or [], ", one row")
    if line:
        peak_flops = report["machine"].get("peak_matmul_gflops")
        lines += ["", line + f"; copy peak {peak:.1f} GB/s, matmul peak {peak_flops:.0f} GFLOP/s"]
    shares = [f"{name} {stats[OVERALL]['controller_share']:.1%}" for name, stats in report["methods"].items()
              if stats[OVERALL].get("controller_share", 0) > 0.001]
    if shares:
        lines += ["", "controller decide + update, share of wall time: " + ", ".join(shares)]
    for name, stats in report["methods"].items():  # each drafter's, its workloads' bins added up
        learnt = stats.get("reliability") or {}
        drafters = sorted({d for per in learnt.values() for d in per})
        if drafters:
            lines += ["", f"{name} calibration: " + "; ".join(
                f"{d} {gap_line(merged_table([per[d] for per in learnt.values() if d in per]))}"
                for d in drafters)]
    theory = report.get("theoretical") or {}
    if theory:
        lines += ["", "theoretical S(K*) from this run's alpha, c, v(K): " + ", ".join(
            f"{c} {t['speedup']:.2f}x ({t['drafter']}:{t['k']})" for c, t in sorted(theory.items()))]
        predicted = report.get("predicted_static") or {}
        if predicted:
            ratios = [cell["measured"] / cell["predicted"] for per_cat in predicted.values()
                      for cell in per_cat.values() if cell["predicted"] > 0]
            lines.append(f"static methods, measured / predicted by the same formula: "
                         f"{min(ratios):.2f}..{max(ratios):.2f} (median "
                         f"{statistics.median(ratios):.2f}; per-step overhead charged: "
                         f"{report['measured_static'].get('overhead', 0):.3f} plain steps)")
        for name, stats in report["methods"].items():
            if name.startswith("adaptive") or name in DERIVED:
                lines.append(f"{name} achieved / theoretical: " + ", ".join(
                    f"{c} {stats['by_category'][c]['speedup_vs_plain'] / t['speedup']:.2f}"
                    for c, t in sorted(theory.items()) if c in stats["by_category"]))
    return "\n".join(lines)


def _fmt(s: dict) -> str:
    sp = s.get("speedup_vs_plain")
    return f"{s['tokens_per_s']:.1f} ({sp:.2f}x)" if sp else f"{s['tokens_per_s']:.1f}"


def _peak_note(report: dict) -> str:
    """When the copy peak in use was measured, and what this run measured beside it."""
    peak = report["machine"].get("peak_bandwidth") or {}
    if "this_run" not in peak:
        return ""
    when = f"measured {peak['measured_at']}" if peak.get("measured_at") else "cached"
    return (f", the highest {when}; this run {peak['this_run']:.1f}, spread of the last "
            f"{len(peak['recent'])} {peak['spread']:.0%}")

