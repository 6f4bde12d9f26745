"""`autospec demo`: daemon + serve + the mixed workload, on the shipped reference pair (or
another, --pair)."""
from __future__ import annotations

from pathlib import Path

import click

from autospec.cli.options import (check_pair_args, draft_option, pair_option, target_option,
                                  weights_option)


@click.command()
@click.option("--prompts", "prompts_path", type=click.Path(path_type=Path), default=None,
              help="Workload JSONL. Default: the pair's demo workload (reference: the "
                   "shipped mixed workload; smollm2: the chat workload).")
@click.option("--limit", default=None, type=click.IntRange(min=1),
              help="Use only the first N prompts of the workload.")
@click.option("--max-new-tokens", "--max-tokens", "max_tokens", default=128, show_default=True,
              type=click.IntRange(min=1),
              help="Tokens per request (--max-tokens: the old spelling, kept).")
@click.option("--db", default=None, metavar="URL",
              help="The daemon's store (env AUTOSPEC_DB). Default: SQLite under the data dir.")
@pair_option
@target_option
@draft_option
@weights_option
def demo(prompts_path, limit, max_tokens, db, pair, target, draft, weights):
    """Start a daemon and a server, drive a workload through them, show what was chosen."""
    import os

    from tqdm import tqdm

    from autospec.bench.prompts import load_prompts
    from autospec.demo import DemoError, format_summary, run_demo
    from autospec.models.pairs import DEFAULT_PAIR, named_pair

    check_pair_args(pair, target, draft)
    try:
        spec = named_pair(pair or DEFAULT_PAIR)
        prompts = load_prompts(prompts_path or spec.workload("demo"))
        if pair:
            spec.locate()  # a pair not fetched yet: say so here, not in serve's log
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    prompts = prompts[:limit] if limit else prompts
    bar = tqdm(total=len(prompts), desc="prompts (plain + adaptive each)", unit="prompt",
               dynamic_ncols=True)

    def progress(done: int, total: int, speedup: float) -> None:
        bar.set_postfix(speedup=f"{speedup:.2f}x")
        bar.update(done - bar.n)

    try:
        outcome = run_demo(prompts, max_tokens, db or os.environ.get("AUTOSPEC_DB"), target,
                           draft, echo=lambda m: bar.write(m), progress=progress, pair=pair,
                           weights=weights)
    except KeyboardInterrupt:
        bar.close()
        click.echo("interrupted: daemon and server stopped", err=True)
        raise SystemExit(130) from None
    except (DemoError, OSError) as exc:
        bar.close()
        raise click.ClickException(str(exc)) from None
    bar.close()
    click.echo(format_summary(outcome))
    click.echo("what the daemon learnt is in the store: `autospec report` plots it")
