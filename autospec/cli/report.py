"""`autospec report`: PNG plots and a text summary of what the store holds."""
from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option("--db", "db_url", default=None, envvar="AUTOSPEC_DB", metavar="URL",
              help="Store URL (SQLAlchemy), env AUTOSPEC_DB. Default: autospec.db in the data dir.")
@click.option("--out", "out_dir", default="autospec-report", show_default=True,
              type=click.Path(path_type=Path, file_okay=False), help="Directory for the PNGs and summary.txt.")
@click.option("--peak-gbs", type=float, default=None, metavar="GB/S",
              help="Peak memory bandwidth for utilisation. Default: measured on this machine.")
@click.option("--window", type=click.IntRange(min=1), default=20, show_default=True,
              help="Requests pooled in each rolling line of the plots over time (capped at a "
                   "workload's request count).")
@click.option("--bench", "bench_paths", multiple=True, metavar="JSON",
              type=click.Path(path_type=Path, dir_okay=False),
              help="Instead of the store: the one-setting table of these `autospec bench "
                   "--json` reports (repeatable): every fixed method's throughput as a "
                   "fraction of the best fixed method in each (pair, workload, concurrency), "
                   "and adaptive's.")
@click.option("--by-category", is_flag=True,
              help="With --bench: a cell per category too (pair, workload, category, concurrency).")
def report(db_url: str | None, out_dir: Path, peak_gbs: float | None, window: int,
           bench_paths: tuple[Path, ...], by_category: bool) -> None:
    """Write acceptance.png, drafters.png, speedup.png, bandwidth.png and summary.txt to
    --out, and print the summary. Exit 1 when the store holds no requests.

    The workload rows, drafter shares and plots are of the controller's requests; requests
    that ran a fixed method (plain, static:DRAFTER:K, a ctl: baseline) are reported apart,
    per method. With --bench: the one-setting table of bench reports, nothing else."""
    if bench_paths:
        from autospec.bench.one_setting import one_setting_table
        try:
            click.echo(one_setting_table(list(bench_paths), by_category), nl=False)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        return
    from autospec.report import PLOTS, open_existing, write_report
    from autospec.store import StoreError
    if peak_gbs is not None and not peak_gbs > 0:
        raise click.BadParameter(f"must be > 0 GB/s, got {peak_gbs}", param_hint="--peak-gbs")
    try:
        with open_existing(db_url) as store:
            text = write_report(store, out_dir, peak_gbs=peak_gbs, window=window)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(text, nl=False)
    click.echo(f"\nwrote {', '.join(PLOTS)}, summary.txt to {out_dir}/")
