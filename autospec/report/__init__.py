"""autospec.report: PNG plots and a text summary of what a store holds.

    from autospec.report import open_existing, write_report
    with open_existing("sqlite:////abs/autospec.db") as store:
        text = write_report(store, Path("autospec-report"), peak_gbs=50.0)

stats.py computes every number (pure, testable without matplotlib); plots.py draws them, from
the same summary rows summary.txt prints (render() gives both, before anything is written).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import selectinload

from autospec.report.stats import (UNLABELLED, RequestPoint, drafter_speeds, plot_window,
                                   split_traffic, summarise_workloads, summary_text)
from autospec.store import AppliedPolicy, StepAggregate, Store, StoreError, default_url, open_store
from autospec.store.queries import applied_policies
from autospec.store.schema import RequestRow

PLOTS = ("acceptance.png", "drafters.png", "speedup.png", "bandwidth.png")


class EmptyStoreError(StoreError):
    """The store holds no requests: nothing to report."""


@dataclass(frozen=True)
class Peak:
    gbs: float
    source: str  # how it was found, for the summary


def open_existing(url: str | None = None) -> Store:
    """open_store, except that a SQLite file that does not exist is an error rather than a
    new empty store: a mistyped --db should not leave a stray database behind."""
    target = url or default_url()
    try:
        parsed = make_url(target)
    except ArgumentError:
        parsed = None  # open_store words the error
    if parsed is not None and parsed.get_backend_name() == "sqlite" and parsed.database \
            and parsed.database != ":memory:" and not parsed.database.startswith("file:") \
            and not Path(parsed.database).exists():
        raise StoreError(f"store {target}: no such file {parsed.database!r}; expected an "
                         f"existing store (--db or AUTOSPEC_DB), e.g. sqlite:////abs/path/autospec.db")
    return open_store(url)


def _utc(moment: datetime) -> datetime:
    # SQLite keeps no zone: what went in as UTC comes back naive
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


def load(store: Store) -> tuple[list[RequestPoint], list[AppliedPolicy]]:
    """Every stored request in ingest order, with its step aggregates, and every applied
    policy oldest first. One read transaction."""
    query = (select(RequestRow).options(selectinload(RequestRow.step_aggregates))
             .order_by(RequestRow.ingested_at, RequestRow.id))
    with store.session_scope(write=False) as session:
        requests = [
            RequestPoint(
                workload=row.workload or UNLABELLED, ingested_at=_utc(row.ingested_at),
                model_pair=row.model_pair, hardware=row.hardware,
                output_tokens=row.output_tokens, steps=row.steps, proposed=row.proposed,
                accepted=row.accepted, acceptance_rate=row.acceptance_rate,
                wall_seconds=row.wall_seconds, draft_seconds=row.draft_seconds,
                verify_seconds=row.verify_seconds, bytes_moved=row.bytes_moved,
                bandwidth_gbs=row.bandwidth_gbs, method=row.method,
                aggregates=tuple(StepAggregate(a.drafter, a.k, a.steps, a.proposed, a.accepted,
                                               a.emitted, a.verify_tokens, a.draft_seconds,
                                               a.verify_seconds)
                                 for a in sorted(row.step_aggregates, key=lambda a: (a.drafter, a.k))))
            for row in session.scalars(query)]
        policies = applied_policies(session)
    return requests, policies


def peak_bandwidth(hardware: set[str], given: float | None = None) -> Peak:
    """The peak GB/s utilisation is measured against: `given`, else this machine's (the
    store's rows may come from elsewhere: the summary says which was used)."""
    if given is not None:
        if not given > 0:
            raise ValueError(f"peak bandwidth must be > 0 GB/s, got {given!r}")
        return Peak(given, "from --peak-gbs")
    from autospec.engine.bandwidth import peak_bandwidth_gbs
    device = "cuda" if hardware and all(h.startswith("cuda") for h in hardware) else "cpu"
    return Peak(peak_bandwidth_gbs(device), f"{device} peak of this machine; --peak-gbs to override")


@dataclass(frozen=True)
class Rendered:
    """The report before it is written: summary.txt's text and {PLOTS name: Figure}."""
    text: str
    figures: dict


def render(store: Store, peak_gbs: float | None = None, window: int = 20) -> Rendered:
    """The summary and the four PLOTS, drawn from the same rows the summary's numbers are
    (stats.summarise_workloads, stats.drafter_speeds of the controller's requests: baseline
    traffic apart, stats.Traffic). Raises EmptyStoreError when the store holds no requests."""
    if window < 1:
        raise ValueError(f"rolling window must be >= 1, got {window}")
    requests, policies = load(store)
    if not requests:
        raise EmptyStoreError(f"store {store.url} holds no requests yet: nothing to report "
                              f"(requests are stored by the daemon or `store.ingest`)")
    peak = peak_bandwidth({r.hardware for r in requests}, peak_gbs)
    traffic = split_traffic(requests)
    shown = traffic.shown
    who = "the controller's requests" if traffic.controller else "the baseline requests"
    summaries = summarise_workloads(shown)  # summary_text's workload rows, from the same rows
    window = plot_window(shown, window)
    from autospec.report import plots  # matplotlib only once there is something to draw
    figures = {
        "acceptance.png": plots.plot_acceptance(shown, summaries, window, who),
        "drafters.png": plots.plot_drafters(summaries, who),
        "speedup.png": plots.plot_speedup(drafter_speeds(shown), who),
        "bandwidth.png": plots.plot_bandwidth(shown, summaries, peak.gbs, window, who),
    }
    assert tuple(figures) == PLOTS
    text = summary_text(requests, policies, peak.gbs, peak.source, store.url)
    return Rendered(text + calibration_text(store, requests), figures)


def calibration_text(store: Store, requests: list[RequestPoint]) -> str:
    """The daemons' confidence calibrations of the pairs and hardware the requests ran on,
    each daemon's added (as a fleet merges them): predicted against observed acceptance per
    confidence bin (autospec/confidence.py). Empty where none was learnt."""
    from autospec.confidence import Calibration, reliability_lines
    tables: dict[str, dict[str, list[dict]]] = {}
    for pair, hardware in sorted({(r.model_pair, r.hardware) for r in requests}):
        merged: dict[tuple[str, str], Calibration] = {}
        for per_workload in store.fleet(pair, hardware)[0].values():
            for workload, per_drafter in per_workload.items():
                for drafter, estimate in per_drafter.items():
                    if estimate.calibration:
                        merged.setdefault((workload, drafter), Calibration()).merge(
                            Calibration.from_state(estimate.calibration))
        for (workload, drafter), calibration in sorted(merged.items()):
            if calibration.tokens():
                tables.setdefault(f"{pair} on {hardware}: {workload}", {})[drafter] = \
                    calibration.reliability()
    if not tables:
        return ""
    return "\n".join(["", "confidence calibration (each drafted token's confidence -> "
                           "P(accepted); predicted before the token was learnt from):"]
                     + reliability_lines(tables)) + "\n"


def write_report(store: Store, out_dir: Path, peak_gbs: float | None = None,
                 window: int = 20) -> str:
    """Write summary.txt and the four PLOTS into out_dir (created); returns the summary.
    Raises EmptyStoreError before writing anything when the store holds no requests."""
    report = render(store, peak_gbs, window)
    from autospec.report.plots import DPI
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, figure in report.figures.items():
        figure.savefig(out_dir / name, dpi=DPI)
    (out_dir / "summary.txt").write_text(report.text)
    return report.text
