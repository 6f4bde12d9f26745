"""`autospec models build`: train a model pair from the standard library's sources."""
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
