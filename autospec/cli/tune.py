"""`autospec tune`: search policies with Optuna on recorded traces (or live), export the best."""
from __future__ import annotations

import logging
from pathlib import Path

import click

from autospec.cli.options import draft_option, weights_option, target_option


@click.command()
@click.option("--study", "study_name", default=None, metavar="NAME",
              help="Study name; an existing study resumes where it stopped.")
@click.option("--show", "show_name", default=None, metavar="STUDY",
              help="List a study's trials (number, state, value, parameters) and exit.")
@click.option("--storage", default=None, metavar="URL",
              help="SQLAlchemy URL (postgresql+psycopg://... for many machines on one study). "
                   "Default: the autospec store's SQLite file.")
@click.option("--trials", "n_trials", default=100, show_default=True, type=int,
              help="Finished trials wanted in the study in total, over every worker and restart.")
@click.option("--timeout", default=None, type=click.FloatRange(min=0), metavar="SECONDS",
              help="Stop starting trials after this long (this worker).")
@click.option("--trace", "trace_paths", multiple=True, type=click.Path(path_type=Path),
              help="Repeatable: a trace from `autospec bench --record` (the default objective: "
                   "replayed tokens/s, deterministic).")
@click.option("--workload", "workload_path", default=None, type=click.Path(path_type=Path),
              help="Score live instead: a workload JSONL run on the engine (slow, noisy).")
@click.option("--space", "space_path", default=None, type=click.Path(path_type=Path),
              help="Search space YAML. Default: configs/search_spaces/default.yaml.")
@click.option("--export", "export_path", default=None, type=click.Path(path_type=Path),
              help="Write the best trial as a policy file (e.g. policies/NAME.yaml).")
@click.option("--grid", is_flag=True, help="Exhaustive grid over the space's discretised values.")
@click.option("--discrete", is_flag=True,
              help="Search only the grid's values (to compare with --grid on the same set).")
@click.option("--no-prune", is_flag=True, help="Score every trial to the end.")
@click.option("--seed", default=None, type=int, help="Sampler seed (default: random).")
@click.option("--heartbeat", default=10, show_default=True, type=click.IntRange(min=1),
              metavar="SECONDS", help="Trial heartbeat; a trial silent for 2 heartbeats is "
                                      "failed and re-queued.")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1),
              help="Live scoring only.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@target_option
@draft_option
@weights_option
def tune(study_name, show_name, storage, n_trials, timeout, trace_paths, workload_path,
         space_path, export_path, grid, discrete, no_prune, seed, heartbeat, max_new_tokens,
         quiet, target, draft, weights):
    """Search controller settings with Optuna; every trial is kept in the study's storage.

    \b
    autospec tune --study mixed --trace trace.json --trials 200 --export policies/mixed.yaml
    autospec tune --study mixed --trace trace.json --trials 300   # resumes: 100 more
    autospec tune --show mixed
    optuna-dashboard sqlite:///$AUTOSPEC_DATA/autospec.db         # the default storage

    The default storage is the autospec store's SQLite file (autospec.db in the data dir,
    $AUTOSPEC_DATA; autospec/paths.py names the fallbacks); Optuna's tables sit beside the
    store's autospec_ ones.
    """
    import optuna

    from autospec.tune import study as studies
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.ERROR)  # failed surplus trials: not news
    try:
        url = studies.storage_url(storage)
        if show_name:
            click.echo(_show(studies.load_study(show_name, studies.make_storage(url, heartbeat))))
            return
        if not study_name:
            raise ValueError("give --study NAME (or --show STUDY)")
        if n_trials < 1:
            raise ValueError(f"--trials must be at least 1, got {n_trials}")
        if trace_paths and workload_path:
            raise ValueError("give --trace or --workload, not both")
        _sweep(study_name, url, n_trials, timeout, trace_paths, workload_path, space_path,
               export_path, grid, discrete, no_prune, seed, heartbeat, max_new_tokens, quiet,
               (target, draft, weights))
    except ValueError as exc:  # SpaceError, PolicyError and bad traces are ValueErrors
        raise click.ClickException(str(exc).splitlines()[0]) from None
    except ImportError as exc:  # e.g. a postgresql:// URL without its driver installed
        raise click.ClickException(f"storage '{storage}': {exc}") from None


def _sweep(study_name, url, n_trials, timeout, trace_paths, workload_path, space_path,
           export_path, grid, discrete, no_prune, seed, heartbeat, max_new_tokens, quiet, model):
    import optuna
    from tqdm import tqdm

    from autospec.engine.bandwidth import hardware_key
    from autospec.tune import study as studies
    from autospec.tune.export import export_best
    from autospec.tune.objective import trial_function
    from autospec.tune.space import load_space, shipped_space

    space_path = space_path or shipped_space("default")
    space = load_space(space_path)
    source = _source(trace_paths, workload_path, max_new_tokens, model)
    space = space.clamp_k(source.k_limit)
    if grid:
        n_trials = min(n_trials, space.grid_size())
        sampler = optuna.samplers.GridSampler(space.grid(), seed=seed)
    else:
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    pruner = (optuna.pruners.NopPruner() if no_prune or grid else
              studies.RunningMedianPruner(n_startup_trials=8, n_warmup_steps=2))
    attrs = {"objective": source.kind, "workloads": sorted(source.hashes),
             "workload_hash": source.workload_hash, "model_pair": source.model_pair,
             "space": Path(space_path).name, "sampler": "grid" if grid else
             ("tpe-discrete" if discrete else "tpe")}
    study = studies.open_study(study_name, studies.make_storage(url, heartbeat), sampler, pruner,
                               {k: v for k, v in attrs.items() if k != "workloads"})
    provenance = {**attrs, "git_sha": studies.git_sha(), "hardware": hardware_key()}
    objective = trial_function(space, source, n_trials, provenance, discrete or grid)
    click.echo(f"study '{study_name}' in {studies.redact(url)}: {source.kind} on "
               f"{', '.join(sorted(source.hashes))}; {len(space.searched())} fields searched "
               f"from {space_path}", err=True)
    bar = None if quiet else tqdm(total=n_trials, desc=study_name, unit="trial")

    def progress(finished):
        if bar is not None:
            bar.n = min(finished, n_trials)
            best = studies.best_trials(study, 1)
            if best:
                bar.set_postfix_str(f"best {best[0].value:.1f} tok/s (#{best[0].number})",
                                    refresh=False)
            bar.refresh()

    try:
        ran = studies.sweep(study, objective, n_trials, timeout, progress,
                            stall_s=max(60.0, 30.0 * heartbeat))
    finally:
        if bar is not None:
            bar.close()
    finished, _ = studies.counts(study)
    click.echo(f"this worker ran {ran} trials; the study has {finished} finished", err=True)
    best = studies.best_trials(study, 5)
    if best:
        click.echo(studies.format_trials(best))
    if export_path:
        trial = export_best(study, export_path)
        click.echo(f"wrote {export_path} (trial {trial.number}, {trial.value:.1f} tok/s)", err=True)


def _source(trace_paths, workload_path, max_new_tokens, model):
    from autospec.tune.objective import LiveObjective, ReplayObjective, load_traces
    if workload_path:
        from autospec.bench.prompts import load_prompts
        from autospec.cli.options import load_engine
        prompts = load_prompts(workload_path)
        return LiveObjective(load_engine(*model), prompts, str(workload_path), max_new_tokens)
    if not trace_paths:
        raise ValueError("give --trace PATH (record one with `autospec bench --record PATH`) "
                         "or --workload PATH")
    return ReplayObjective(load_traces(list(trace_paths)))


def _show(study) -> str:
    from autospec.tune.study import format_trials
    trials = study.get_trials(deepcopy=False)
    attrs = ", ".join(f"{k}={v}" for k, v in sorted(study.user_attrs.items()))
    return f"study '{study.study_name}': {len(trials)} trials; {attrs}\n" + format_trials(trials)
