"""`autospec tune`: spaces, the policy a trial describes, export, resuming after kill -9,
many workers on one PostgreSQL study, and bad input.

tests/data/trace-mixed-small.json is cut from a trace of configs/workloads/mixed.jsonl on the
reference pair (`autospec bench --record`): 2 requests per category, first 96 output tokens.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from clirun import error_line, invoke

from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.bench.trace import Trace
from autospec.bench.recorded import replay
from autospec.policy import load_policy
from autospec.tune.controller import build_controller, parameters_for
from autospec.tune.space import SpaceError, load_space, shipped_space
from autospec.tune.study import make_storage
from conftest import REPO_ROOT, TEST_DATA

TRACE = TEST_DATA / "trace-mixed-small.json"
SMALL = str(shipped_space("small"))


def tune_cmd(*args) -> list[str]:
    return [sys.executable, "-c", "from autospec.cli import main; main()", "tune", *args]


# `autospec tune` that, at trial AUTOSPEC_TEST_HOLD_TRIAL, stops after the trial's first chunk
# has been scored and reported (its parameters drawn, an intermediate value stored: the
# trial is mid-way), writes the file AUTOSPEC_TEST_HOLD_FILE and waits there to be killed
HELD_TUNE = """
import os, pathlib, time
import autospec.tune.objective as objective_module
hold_at, marker = int(os.environ["AUTOSPEC_TEST_HOLD_TRIAL"]), os.environ["AUTOSPEC_TEST_HOLD_FILE"]
make = objective_module.trial_function

def trial_function(space, source, n_trials, provenance, discrete=False):
    objective, run = make(space, source, n_trials, provenance, discrete), source.run

    def held(params):
        yield next(iter(run(params)))
        pathlib.Path(marker).write_text("reported")
        time.sleep(3600)

    def held_objective(trial):
        source.run = held if trial.number == hold_at else run
        return objective(trial)
    return held_objective

objective_module.trial_function = trial_function
from autospec.cli import main; main()
"""


def finished_numbers(url: str, study: str) -> list[int]:
    trials = optuna.load_study(study_name=study, storage=url).get_trials(deepcopy=False)
    return [t.number for t in trials if t.state in (optuna.trial.TrialState.COMPLETE,
                                                    optuna.trial.TrialState.PRUNED)]


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "AUTOSPEC_DATA": str(tmp_path / "data")}


# -- spaces ----------------------------------------------------------------------------------
def test_shipped_spaces_load_and_discretise():
    space = load_space(shipped_space("default"))
    names = {p.name for p in space.params}
    assert {"drafters", "k_min", "k_max", "controller.prior_strength", "controller.confidence",
            "priors.ngram"} <= names
    assert 100 <= space.grid_size() <= 1000
    assert max(space.clamp_k(8).grid()["k_max"]) <= 8
    small = load_space(SMALL)
    assert [p.name for p in small.params if p.fixed] == ["drafters"]


@pytest.mark.parametrize("text, message", [
    ("schema_version: 1\ncontroller: {prior_strenght: {low: 0.9, high: 0.99}}\n",
     "controller.prior_strenght: unknown field (did you mean 'prior_strength'?"),
    ("schema_version: 1\ncontroller: {prior_strength: {low: 0.99, high: 0.9}}\n",
     "controller.prior_strength: low 0.99 is above high 0.9"),
    ("schema_version: 1\nk_max: {low: 1, high: 99}\n",
     "k_max.high: 99 is outside what a policy accepts (an integer in [1, 64])"),
    ("schema_version: 1\ndrafters: {choices: [[ngram, ngarm]]}\n",
     "drafters.choices[0][1]: unknown drafter 'ngarm' (known: "),
    ("schema_version: 2\nk_max: 4\n", "schema_version: expected 1 (the version this autospec reads), got 2"),
])
def test_bad_space_names_file_and_field(tmp_path, text, message):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError) as err:
        load_space(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_a_tunable_knob_reaches_policy_files_and_search_spaces(tmp_path):
    """One field in ControllerSettings is the whole declaration: the per-token pricing switch
    (`confidence`) became tunable by its Knob alone, and both formats accept it."""
    from autospec.policy import parse_policy
    from autospec.tune.space import searchable
    assert "controller.confidence" in searchable()
    policy = parse_policy("schema_version: 1\ncontroller: {confidence: false}\n")
    assert policy.to_settings().confidence is False
    assert "confidence: false" in policy.to_yaml()
    path = tmp_path / "space.yaml"
    path.write_text("schema_version: 1\ncontroller: {confidence: {choices: [true, false]}}\n")
    (param,) = load_space(path).params
    assert (param.name, param.kind, param.choices) == ("controller.confidence", "bool", (True, False))
    assert parameters_for({"controller.confidence": False}).confidence is False
    path.write_text("schema_version: 1\ncontroller: {confidence: {choices: [1]}}\n")
    with pytest.raises(SpaceError, match=r"controller.confidence.choices\[0\]: expected true or false"):
        load_space(path)


# -- the controller a trial describes --------------------------------------------------------
def test_default_parameters_replay_like_the_adaptive_controller():
    trace = Trace.load(TRACE)
    ours = replay(trace, build_controller(ControllerSettings(k_max=8)))
    theirs = replay(trace, AdaptiveController(ControllerSettings(k_max=8)))
    assert [s.k for r in ours for s in r.step_records] == [s.k for r in theirs for s in r.step_records]


def test_k_min_and_priors_change_decisions():
    trace = Trace.load(TRACE)

    def ks(values):
        params = parameters_for({"k_max": 8, "drafters": ("ngram",), **values})
        records = replay(trace, build_controller(params))
        return [[(s.k, sum(x.emitted for x in r.step_records[:i]), r.output_tokens)
                 for i, s in enumerate(r.step_records)] for r in records]

    floor = ks({"k_min": 3})
    for request in floor:
        for k, t, n in request:
            # below k_min only where the request's end caps K (replay: k <= n - t - 1)
            assert k == 0 or k >= 3 or k == n - t - 1
    assert floor != ks({})
    assert ks({"priors.ngram": 0.95}) != ks({})
    crossed = parameters_for({"k_min": 6, "k_max": 4})
    assert (crossed.k_min, crossed.k_max) == (4, 4)


def test_pruner_compares_running_values_step_by_step():
    """A running tokens/s falls as slower requests come in; a trial must be compared with the
    others at the same step, not by its best (first) value as Optuna's MedianPruner does."""
    from autospec.tune.study import RunningMedianPruner
    study = optuna.create_study(direction="maximize")
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    for i in range(8):
        study.add_trial(optuna.trial.create_trial(
            params={"x": 0.5}, distributions=dist, value=290.0 + i,
            intermediate_values={0: 400.0, 1: 350.0, 2: 300.0, 3: 290.0 + i}))
    trial = study.ask(dist)
    for step, value in enumerate([500.0, 400.0, 320.0]):
        trial.report(value, step)
    frozen = study.get_trials(deepcopy=False)[-1]
    assert not RunningMedianPruner(8, 2).prune(study, frozen)
    trial.report(250.0, 3)
    frozen = study.get_trials(deepcopy=False)[-1]
    assert RunningMedianPruner(8, 2).prune(study, frozen)
    assert not optuna.pruners.MedianPruner(8, 2).prune(study, frozen)  # why ours exists


# -- sweeps ----------------------------------------------------------------------------------
def test_export_validates_differs_from_default_and_changes_replay(tmp_path, env, monkeypatch):
    monkeypatch.setenv("AUTOSPEC_DATA", env["AUTOSPEC_DATA"])
    out = tmp_path / "policies" / "tuned.yaml"
    result = invoke(["tune", "--study", "exp", "--trace", str(TRACE), "--space", SMALL,
                     "--trials", "12", "--seed", "3", "--quiet", "--export", str(out)])
    assert result.exit_code == 0, result.output
    assert "| trial | state | tok/s |" in result.output
    policy = load_policy(out)
    default = load_policy(REPO_ROOT / "policies" / "default.yaml")
    assert policy.parameters != default.parameters
    prov = policy.provenance
    assert prov.study == "exp" and prov.model_pair == "reference" and prov.git_sha and prov.hardware
    # the keys serve reports telemetry under, so the policy joins the traffic it explains
    from autospec.engine.bandwidth import hardware_key
    assert prov.hardware == hardware_key() and prov.model_pair == Trace.load(TRACE).pair
    trace = Trace.load(TRACE)
    tuned = replay(trace, build_controller(policy.parameters))
    base = replay(trace, AdaptiveController(default.to_settings()))
    rate = sum(r.output_tokens for r in tuned) / sum(r.wall_seconds for r in tuned)
    assert rate == pytest.approx(prov.objective_value, abs=1e-3)
    assert [s.k for r in tuned for s in r.step_records] != [s.k for r in base for s in r.step_records]
    # provenance on every trial, and --show lists them
    from autospec.store import default_url
    trials = optuna.load_study(study_name="exp", storage=default_url()).trials
    for trial in trials:
        assert {"git_sha", "policy_hash", "model_pair", "hardware", "workload_hash"} <= set(trial.user_attrs)
    shown = invoke(["tune", "--show", "exp"])
    assert shown.exit_code == 0
    assert shown.output.count("| complete |") + shown.output.count("| pruned |") == 12


def test_sweep_killed_mid_way_resumes_without_loss_or_duplicates(tmp_path, env):
    """kill -9 lands mid-trial by construction, not by timing: the first sweep holds trial 8
    once its first chunk is reported (HELD_TUNE) and is killed there; the test waits, with a
    bounded deadline, for that event, not for a fixed time."""
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    args = ["--study", "k9", "--storage", url, "--trace", str(TRACE), "--space", SMALL,
            "--trials", "40", "--heartbeat", "1", "--quiet", "--no-prune"]
    marker = tmp_path / "held"
    held_env = {**env, "AUTOSPEC_TEST_HOLD_TRIAL": "8", "AUTOSPEC_TEST_HOLD_FILE": str(marker)}
    log = tmp_path / "held.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", HELD_TUNE, "tune", *args], env=held_env,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), f"trial 8 never reported its first chunk:\n{log.read_text()}"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    study = optuna.load_study(study_name="k9", storage=url)
    held = study.trials[8]
    assert held.state == optuna.trial.TrialState.RUNNING and list(held.intermediate_values) == [0]
    before = finished_numbers(url, "k9")
    assert before == list(range(8))
    done = subprocess.run(tune_cmd(*args), env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    numbers = finished_numbers(url, "k9")
    assert len(numbers) == 40 and len(set(numbers)) == 40
    assert set(before) <= set(numbers)
    study = optuna.load_study(study_name="k9", storage=url)
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert [t.number for t in failed] == [8]
    retries = [t for t in study.trials if t.system_attrs.get("failed_trial") == 8]
    # the killed trial had drawn all its parameters: its one retry runs them again, and finishes
    assert len(retries) == 1 and retries[0].params == held.params and retries[0].number in numbers


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_a_stale_running_trial_is_failed_and_rerun(tmp_path, env):
    """What kill -9 mid-trial leaves behind, made on purpose: a RUNNING trial whose heartbeat
    stopped. The next sweep fails it after the grace period and runs its parameters again."""
    url = f"sqlite:///{tmp_path / 'stale.db'}"
    storage = make_storage(url, heartbeat=1)
    study = optuna.create_study(study_name="st", storage=storage, direction="maximize")
    trial = study.ask({"k_max": optuna.distributions.IntDistribution(1, 8)})
    storage.record_heartbeat(trial._trial_id)
    result = subprocess.run(tune_cmd("--study", "st", "--storage", url, "--trace", str(TRACE),
                                     "--space", SMALL, "--trials", "6", "--heartbeat", "1",
                                     "--quiet"), env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    trials = optuna.load_study(study_name="st", storage=url).trials
    assert trials[0].state == optuna.trial.TrialState.FAIL
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == 0]
    assert len(retry) == 1 and retry[0].state == optuna.trial.TrialState.COMPLETE
    assert len(finished_numbers(url, "st")) == 6


def test_two_workers_on_postgresql_share_one_study(tmp_path, env, postgres_url):
    url = postgres_url
    args = tune_cmd("--study", "pg", "--storage", url, "--trace", str(TRACE), "--space",
                    SMALL, "--trials", "30", "--heartbeat", "2", "--quiet")
    optuna.create_study(study_name="pg", storage=url, direction="maximize")  # no create race
    workers = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=180) for w in workers]
    for w, (_, err) in zip(workers, outputs):
        assert w.returncode == 0, err
    ran = [int(err.split("this worker ran ")[1].split()[0]) for _, err in outputs]
    numbers = finished_numbers(url, "pg")
    assert len(numbers) == 30 and len(set(numbers)) == 30
    assert all(n > 0 for n in ran), ran  # both took part
    assert sum(ran) >= 30


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--study", "s", "--trace", "nope.json"], "trace 'nope.json' not found"),
    (["--study", "s", "--trace", str(TRACE), "--trials", "0"], "--trials must be at least 1, got 0"),
    (["--study", "s"], "give --trace PATH"),
    (["--show", "nosuch"], "unknown study 'nosuch'"),
    (["--study", "s", "--trace", str(TRACE), "--space", "SPACE"], "controller.discont: unknown field"),
])
def test_bad_input_is_one_clear_line(tmp_path, monkeypatch, args, message):
    monkeypatch.setenv("AUTOSPEC_DATA", str(tmp_path / "data"))
    space = tmp_path / "space.yaml"
    space.write_text("schema_version: 1\ncontroller: {discont: {low: 0.9, high: 0.99}}\n")
    args = [str(space) if a == "SPACE" else a for a in args]
    result = invoke(["tune", *args])
    assert message in error_line(result)
