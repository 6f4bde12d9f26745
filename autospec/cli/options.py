"""Options shared by several commands, defined once."""
from __future__ import annotations

import json
from pathlib import Path

import click

from autospec.models import AUTO, FORMATS
from autospec.models.pairs import PAIRS

# chunked prefill's tokens a step (bench, serve): a 64-token prefill forward costs about one
# decode step of 16 rows on both shipped pairs here (reference 9.5 ms against 8.7; SmolLM2 89
# against 70), so a step waits about one step more at most; smaller chunks pay the forward's
# fixed cost more often (16 tokens: 6.1 ms reference, 54 ms SmolLM2)
PREFILL_CHUNK = 64


def _check_pair(ctx, param, name):
    if name is not None and name not in PAIRS:
        raise click.BadParameter(f"unknown pair '{name}' (known: {', '.join(sorted(PAIRS))})")
    return name


def _pair_option(what: str):
    names = "; ".join(f"{p.name}: {p.summary}" for p in PAIRS.values())
    return click.option("--pair", default=None, metavar="NAME", callback=_check_pair,
                        help=f"A model pair by name ({names}). {what}")


pair_option = _pair_option("Default: reference. Not with --target/--draft.")
trace_pair_option = _pair_option("Refuse a trace recorded on another pair.")
target_option = click.option("--target", default=None, metavar="PATH",
                             help="Target model (HF dir or id). Default: the shipped reference target.")
draft_option = click.option("--draft", default=None, metavar="PATH",
                            help="Draft model. Default: the reference draft when --target is unset.")
def _drafter_options(ctx, param, values) -> dict[str, dict]:
    """--drafter-option DRAFTER.NAME=VALUE entries -> {drafter: {name: value}}, each value
    read as a YAML scalar and checked where the drafter declares its options (suffix); an
    unknown drafter or option, or a bad value, is click's error naming the entry."""
    import inspect

    import yaml

    from autospec.drafters.base import drafter_class
    options: dict[str, dict] = {}
    for entry in values:
        name, eq, raw = entry.partition("=")
        drafter, dot, key = name.partition(".")
        if not (eq and dot and drafter and key):
            raise click.BadParameter(f"'{entry}': expected DRAFTER.NAME=VALUE, "
                                     f"e.g. suffix.min_confidence=0")
        try:
            cls = drafter_class(drafter)
        except ValueError as exc:
            raise click.BadParameter(f"'{entry}': {exc}") from None
        accepted = [n for n in inspect.signature(cls.__init__).parameters
                    if n not in ("self", "models", "options")]
        checker = getattr(cls, "options_class", None)
        if checker is None and key not in accepted:
            raise click.BadParameter(f"'{entry}': drafter '{drafter}' has no option '{key}' "
                                     f"(accepted: {', '.join(accepted) or 'none'})")
        options.setdefault(drafter, {})[key] = yaml.safe_load(raw)
    for drafter, given in options.items():
        checker = getattr(drafter_class(drafter), "options_class", None)
        if checker is not None:
            try:
                checker.check(given, where=f"--drafter-option {drafter}")
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
    return options


drafter_options_option = click.option(
    "--drafter-option", "drafter_options", multiple=True, callback=_drafter_options,
    metavar="DRAFTER.NAME=VALUE",
    help="A drafter's option for every method of the run, e.g. suffix.min_confidence=0 or "
         "ngram.n_max=3 (repeatable).")
prefill_chunk_option = click.option(
    "--prefill-chunk", default=PREFILL_CHUNK, show_default=True, type=click.IntRange(min=0),
    metavar="TOKENS",
    help="Prefill a joining prompt this many tokens a step while the other rows decode "
         "(chunked prefill: no step waits for a whole long prompt); 0: whole, at once.")
weights_option = click.option(
    "--weights", default=AUTO, show_default=True, type=click.Choice([AUTO, *FORMATS]),
    help="Weight format of the target and every drafter: auto (the target's own: a GGUF "
         "pair's 4-bit blocks, SmolLM2's, else float32); float32; bfloat16; int4 (4-bit blocks "
         "of 32, bfloat16 activations). Speculative output is plain decoding's at the same "
         "format. docs/weights.md.")


def parse_formats(ctx, param, value: str) -> list[str]:
    """--weights on bench and `models quality`: one format or a comma-separated list."""
    chosen = [w.strip() for w in value.split(",") if w.strip()]
    bad = [w for w in chosen if w not in (AUTO, *FORMATS)]
    if bad or not chosen:
        raise click.BadParameter(f"unknown weight format '{(bad or [value])[0]}' (accepted: "
                                 f"{AUTO}, {', '.join(FORMATS)}, or a comma-separated list)")
    return list(dict.fromkeys(chosen))


def load_engines(target, draft, weights: list[str], pair=None,
                 drafter_options: dict | None = None) -> dict:
    """{format: Engine}, one per format of `weights`, keyed by the format each runs at (auto:
    the target's own), in the order given."""
    from autospec.models.weights import format_of
    engines: dict = {}
    for w in weights:
        loaded = load_engine(target, draft, w, pair, drafter_options)
        engines.setdefault(format_of(loaded.models.target), loaded)
    return engines


def check_pair_args(pair, target, draft) -> None:
    """--pair names both models: with --target or --draft it is a usage error."""
    if pair is not None and (target is not None or draft is not None):
        given = "--target" if target is not None else "--draft"
        raise click.UsageError(f"--pair {pair} names both models: give --pair or "
                               f"--target/--draft, not {given} with it")


def load_engine(target, draft, weights, pair=None, drafter_options: dict | None = None):
    """Engine or a ClickException naming what is wrong (no traceback for bad input)."""
    from autospec.engine.loop import Engine
    from autospec.engine.request import freeze_heap
    from autospec.models import ModelLoadError
    from autospec.models.pair import load_named_pair, load_pair
    check_pair_args(pair, target, draft)
    try:
        models = load_named_pair(pair, weights) if pair else load_pair(target, draft, weights)
    except ModelLoadError as exc:
        raise click.ClickException(str(exc)) from None
    engine = Engine(models, drafter_options)
    freeze_heap()  # the models live as long as the command: out of the collector's walks
    return engine


def write_report(report: dict, plot_path: Path | None, json_path: Path | None) -> None:
    """bench's plot under load (--plot) and its JSON (--json), where asked for."""
    if plot_path:
        from autospec.report.plots import plot_load  # matplotlib only when asked for
        plot_path.parent.mkdir(parents=True, exist_ok=True)
        plot_load(report["by_concurrency"], plot_path)
        click.echo(f"wrote {plot_path}", err=True)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        click.echo(f"wrote {json_path}", err=True)
