"""`autospec bench --engine vllm`: the CLI's side of autospec/vllm/bench.py (cli/bench.py
parses the methods, autospec/method.py's grammar, for --engine vllm)."""
from __future__ import annotations

from pathlib import Path

import click

DEFAULT_VLLM_METHODS = "plain,vllm:ngram:2,vllm:ngram:4,vllm:ngram:8,adaptive"


def bench_vllm(engine, prompts, methods: list, k_limit: int,
               levels: list[int], repeats: int, max_new_tokens: int, temperature: float,
               seed: int, dtype: str, pair, target, prompts_path, schedule, rows: int,
               record_path, plot_path, json_path) -> None:
    if record_path:
        raise click.UsageError("--record is not measured with --engine vllm (autospec's engine only)")
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise click.ClickException("--engine vllm needs vLLM: pip install -e '.[vllm]' && "
                                   "pip uninstall -y torchvision torchaudio torchcodec") from None
    from autospec.bench.load import format_load_table
    from autospec.models.pairs import DEFAULT_PAIR, named_pair
    from autospec.vllm.bench import run_vllm_bench
    model = str(named_pair(pair or DEFAULT_PAIR).locate()[0]) if target is None else str(target)
    eagle_dir = _exported_head(pair or DEFAULT_PAIR, model) if target is None else None
    try:
        report = run_vllm_bench(engine, model, prompts, methods, levels, repeats,
                                max_new_tokens, temperature, seed, dtype,
                                progress=lambda m: click.echo(m, err=True),
                                schedule=schedule, rows=rows, k_limit=k_limit,
                                eagle_dir=eagle_dir and str(eagle_dir))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    report["settings"].update(pair=engine.models.key, workload=Path(
        prompts_path or named_pair(pair or DEFAULT_PAIR).workload("bench")).stem)
    click.echo(format_load_table(report["by_concurrency"]))
    if "arrivals" in report:
        from autospec.bench.arrivals import format_arrivals_table
        click.echo("\n" + format_arrivals_table(report["arrivals"]))
    for spec, shares in report["proposer_share"].items():
        click.echo(f"\n{spec}: the proposer's seconds over vLLM's step seconds: "
                   + ", ".join(f"N = {n} {share:.1%}" for n, share in shares.items()))
    from autospec.cli.options import write_report
    write_report(report, plot_path, json_path)


def _exported_head(pair: str, target: str) -> Path | None:
    """The pair's feature head as vLLM loads it (exported once, under the cache), checked
    against the target vLLM runs; None for a pair without a head."""
    from autospec.models.pairs import named_pair
    from autospec.paths import model_dir
    from autospec.vllm.export import ExportError, check_vllm_eagle, export_vllm_eagle
    if named_pair(pair).eagle_dir() is None:
        return None
    out = model_dir(f"{pair}-vllm-eagle")
    try:
        if not (out / "config.json").is_file():
            export_vllm_eagle(pair, out)
        check_vllm_eagle(out, target)
    except ExportError as exc:
        raise click.ClickException(str(exc)) from None
    return out
