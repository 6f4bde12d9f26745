"""Options shared by several commands, defined once."""
from __future__ import annotations

import click

target_option = click.option("--target", default=None, metavar="PATH",
                             help="Target model (HF dir or id). Default: the shipped reference target.")
draft_option = click.option("--draft", default=None, metavar="PATH",
                            help="Draft model. Default: the reference draft when --target is unset.")
dtype_option = click.option("--dtype", default="float32", show_default=True,
                            type=click.Choice(["float32", "bfloat16", "float16"]),
                            help="Compute dtype (float32 keeps greedy output token-identical).")


def load_engine(target, draft, dtype):
    """Engine or a ClickException naming what is wrong (no traceback for bad input)."""
    from autospec.engine.loop import Engine
    from autospec.models.pair import ModelLoadError, load_pair
    try:
        return Engine(load_pair(target, draft, dtype))
    except ModelLoadError as exc:
        raise click.ClickException(str(exc)) from None
