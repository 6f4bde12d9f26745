"""The Optuna study: storage, the sweep loop, provenance, and what `--show` prints.

Plain Optuna RDB storage (optuna-dashboard reads it): by default the store's own SQLite file
(`autospec.paths.store_url()`; Optuna's tables sit beside the `autospec_` ones), any
SQLAlchemy URL otherwise — PostgreSQL for many machines on one study.

Counting. `--trials N` is N finished trials (complete or pruned) in the study, whoever ran them
and however often the sweep was restarted. Each worker loops: stop when N have finished;
otherwise run one trial when fewer than N are finished, running or queued, else wait for
the running ones. A worker killed mid-trial leaves a RUNNING trial whose heartbeat stops; after
the grace period any worker marks it failed, and RetryHeartbeatStaleTrialCallback queues a
copy (same parameters, WAITING) that the next free worker runs. So a trial is neither lost nor
counted twice. Two workers that pass the check at the same instant could both start the N-th
trial: each trial checks its rank among the live trials when it starts, and one ranked N or
later fails at once, unscored (user attr `surplus`), and is not counted.
"""
from __future__ import annotations

import datetime as dt
import inspect
import statistics
import subprocess
import time
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
LIVE = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)


class RunningMedianPruner(optuna.pruners.BasePruner):
    """Prune a trial whose running objective at step s is below the median of the complete
    trials' running objective at step s.

    Optuna's MedianPruner compares a trial's *best* value over its steps so far; a running
    tokens/s over the requests replayed so far is not a learning curve — it rises or falls
    with the order of the requests (a trace sorted by category starts with copy-heavy, the
    fastest), so its best is its first chunk and MedianPruner would never prune."""

    def __init__(self, n_startup_trials: int = 8, n_warmup_steps: int = 2):
        self.n_startup_trials = n_startup_trials
        self.n_warmup_steps = n_warmup_steps

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.n_warmup_steps:
            return False
        others = [t.intermediate_values[step] for t in
                  study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                  if step in t.intermediate_values]
        if len(others) < self.n_startup_trials:
            return False
        return trial.intermediate_values[step] < statistics.median(others)


class Surplus(Exception):
    """A trial started after another worker had already started the N-th."""


def storage_url(url: str | None) -> str:
    """The URL to use: the store's SQLite file by default. A bare postgresql:// URL means
    SQLAlchemy's psycopg2 driver; where only psycopg 3 is installed, use that one."""
    if url:
        if url.startswith("postgresql://"):
            import importlib.util
            if importlib.util.find_spec("psycopg2") is None and importlib.util.find_spec("psycopg"):
                return "postgresql+psycopg://" + url[len("postgresql://"):]
        return url
    from autospec.paths import data_dir, store_url
    data_dir().mkdir(parents=True, exist_ok=True)
    return store_url()


def make_storage(url: str, heartbeat: int = 10) -> optuna.storages.RDBStorage:
    """RDB storage with a heartbeat: a trial whose worker died is failed after 2 heartbeats
    without news and re-queued once (RetryHeartbeatStaleTrialCallback)."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    engine_kwargs = {}
    if url.startswith("sqlite"):
        # wait for another writer's lock (a daemon, a second tuner) instead of failing at once
        engine_kwargs = {"connect_args": {"timeout": 60}}
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    params = inspect.signature(optuna.storages.RDBStorage).parameters
    if retry is not None and "heartbeat_stale_trial_callback" in params:
        callback = {"heartbeat_stale_trial_callback": retry(max_retry=3)}
    else:  # Optuna < 4.9
        callback = {"failed_trial_callback": optuna.storages.RetryFailedTrialCallback(max_retry=3)}
    storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs,
                                         heartbeat_interval=heartbeat,
                                         grace_period=2 * heartbeat, **callback)
    if url.startswith("sqlite"):
        _sqlite_wal(storage.engine)
    return storage


def _sqlite_wal(engine) -> None:
    """WAL, as the store uses on the same file: readers (a dashboard, --show) never block the
    tuner, and synchronous=NORMAL makes a commit an append, not an fsync (a trial commits a
    dozen times); it survives kill -9 and loses at most the last commits on power loss."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    engine.dispose()  # connections made while Optuna created its tables lack the pragmas


def study_names(storage) -> list[str]:
    return [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]


def load_study(name: str, storage, sampler=None, pruner=None) -> optuna.Study:
    """An existing study; ValueError naming the known ones when there is none by that name."""
    if name not in study_names(storage):
        known = ", ".join(study_names(storage)) or "none"
        raise ValueError(f"unknown study '{name}' in {redact(storage.url)} (known: {known})")
    return optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)


def open_study(name: str, storage, sampler, pruner, attrs: dict) -> optuna.Study:
    """Create the study or resume it (load_if_exists). `attrs` describe what it optimises; a
    resumed study must describe the same, or its trials would not be comparable."""
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner,
                                direction="maximize", load_if_exists=True)
    old = study.user_attrs
    for key, value in attrs.items():
        if key in old and old[key] != value:
            raise ValueError(f"study '{name}' was created with {key}={old[key]!r}, this run has "
                             f"{value!r}; use another --study name")
        if key not in old:
            study.set_user_attr(key, value)
    return study


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    from sqlalchemy.engine import make_url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 (a malformed URL: SQLAlchemy says so later)
        return url.split("@")[-1]


def counts(study: optuna.Study) -> tuple[int, int]:
    """(finished, live) trial counts."""
    trials = study.get_trials(deepcopy=False, states=LIVE)
    return sum(t.state in FINISHED for t in trials), len(trials)


def check_rank(trial: optuna.Trial, n_trials: int) -> None:
    """Raise Surplus when N live trials were numbered before this one."""
    before = [t for t in trial.study.get_trials(deepcopy=False, states=LIVE)
              if t.number < trial.number]
    if len(before) >= n_trials:
        trial.set_user_attr("surplus", True)
        raise Surplus(f"trial {trial.number}: {n_trials} trials already started")


def sweep(study: optuna.Study, objective, n_trials: int, timeout: float | None = None,
          progress=None, poll_s: float = 1.0, stall_s: float = 600.0) -> int:
    """Run trials until N have finished in the study (or `timeout` seconds pass); returns how
    many this worker ran. `progress(finished)` is called after each change. Waiting on other
    workers' trials gives up after `stall_s` seconds without one finishing (a trial whose
    worker died before its first heartbeat never turns stale)."""
    start = time.monotonic()
    ran = 0
    last = (-1, start)  # (finished, when that count was first seen)
    while True:
        finished, live = counts(study)
        if finished != last[0]:
            last = (finished, time.monotonic())
        if progress:
            progress(finished)
        if finished >= n_trials:
            return ran
        if timeout is not None and time.monotonic() - start >= timeout:
            return ran
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if live >= n_trials and not waiting:
            # the rest are running elsewhere, or their worker died: wait for the heartbeat
            if time.monotonic() - last[1] > stall_s:
                return ran
            optuna.storages.fail_stale_trials(study)
            time.sleep(poll_s)
            continue
        study.optimize(objective, n_trials=1, catch=(Surplus,), gc_after_trial=False)
        ran += 1


# -- provenance ------------------------------------------------------------------------------
def git_sha() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10)
        sha = out.stdout.strip()
        if out.returncode == 0 and sha:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   cwd=root, capture_output=True, text=True, timeout=10).stdout
            return sha + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


# -- reading a study -------------------------------------------------------------------------
def best_trials(study: optuna.Study, n: int = 5) -> list:
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    return sorted(done, key=lambda t: -t.value)[:n]


def format_trials(trials, params: list[str] | None = None) -> str:
    """A markdown table: number, state, value, then one column per parameter."""
    names = params or sorted({k for t in trials for k in t.params})
    lines = ["| trial | state | tok/s | " + " | ".join(names) + " |",
             "|" + "---|" * (len(names) + 3)]
    for t in trials:
        value = f"{t.value:.1f}" if t.value is not None else ""
        cells = [_cell(t.params.get(n, "")) for n in names]
        lines.append(f"| {t.number} | {t.state.name.lower()} | {value} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
