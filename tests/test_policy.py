"""Policy files: validation errors name file, field and what is accepted; the CLI."""
import dataclasses

import pytest
from clirun import error_line, invoke

from autospec.controller.adaptive import ControllerSettings
from autospec.policy import PolicyError, diff_policies, load_policy, parse_policy
from conftest import REPO_ROOT

DEFAULT = REPO_ROOT / "policies" / "default.yaml"

TUNED = """\
schema_version: 1
drafters: [ngram, draft-model]
k_max: 6
controller: {prior_strength: 2.0, confidence: false}
priors: {ngram: {acceptance_mean: 0.7}}
workloads:
  copy-heavy:
    k_max: 12
    controller: {cost_stale_steps: 8}
    priors: {ngram: {acceptance_mean: 0.9}}
  completion:
    drafters: [draft-model]
provenance: {study: ref-cpu-mixed, trial: 41, objective_value: 57.25, git_sha: 7d38e04,
             hardware: cpu-2core, date: 2026-11-30}
"""


def write(tmp_path, text, name="x.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def run(*args):
    return invoke(["policy", *args])


def test_default_policy_is_the_code_defaults():
    policy = load_policy(DEFAULT)
    assert policy.to_settings() == ControllerSettings(
        prior_means={"draft-model": 0.5, "eagle": 0.5, "early-exit": 0.5, "ngram": 0.5})  # = the code's 0.5
    assert policy.resolve().k_min == 1
    assert dict(policy.resolve().prior_means) == {"draft-model": 0.5, "eagle": 0.5,
                                                  "early-exit": 0.5, "ngram": 0.5}
    assert parse_policy("schema_version: 1").policy_hash == policy.policy_hash  # nothing but defaults


def test_a_retired_field_is_read_warned_about_and_ignored():
    """A policy kept in version control that still sets a knob since removed keeps loading."""
    import logging
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    log = logging.getLogger("autospec.policy")  # its own handler and level: other tests'
    level = log.level                            # logging set-up (no propagation to root)
    log.addHandler(handler)                      # cannot hide it
    log.setLevel(logging.WARNING)
    try:
        policy = parse_policy("schema_version: 1\ncontroller: {hysteresis: 0.2, thompson: false, "
                              "prior_strength: 2.0}")
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert policy.to_settings().prior_strength == 2.0
    for name in ("hysteresis", "thompson"):
        assert any(f"controller.{name}: removed" in m and "ignored" in m for m in seen), seen
    assert policy.policy_hash == parse_policy(
        "schema_version: 1\ncontroller: {prior_strength: 2.0}").policy_hash


def test_workload_overrides_merge_field_by_field(tmp_path):
    policy = load_policy(write(tmp_path, TUNED))
    copy = policy.to_settings("copy-heavy")
    assert (copy.k_max, copy.cost_stale_steps, copy.prior_strength, copy.confidence) == (
        12, 8, 2.0, False)
    assert policy.resolve("copy-heavy").prior_means["ngram"] == 0.9
    assert policy.resolve("copy-heavy").prior_means["draft-model"] == 0.5  # base's default kept
    assert policy.to_settings("completion").drafters == ("draft-model",)
    # a workload the file does not list, and no workload, get the base parameters
    assert policy.to_settings("unlisted") == policy.to_settings(None)
    assert policy.provenance.trial == 41 and policy.provenance.date == "2026-11-30"
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.parameters.k_max = 3
    with pytest.raises(TypeError):
        policy.parameters.prior_means["ngram"] = 0.1


def test_hash_ignores_form_and_provenance_but_not_values():
    policy = parse_policy(TUNED)
    reformatted = "# a comment\n" + TUNED.replace("provenance: {study: ref-cpu-mixed,",
                                                   "provenance: {study: other,")
    assert parse_policy(reformatted).policy_hash == policy.policy_hash
    assert parse_policy(TUNED.replace("k_max: 6", "k_max: 7")).policy_hash != policy.policy_hash
    assert parse_policy(policy.to_yaml()) == policy  # the written form reads back the same
    assert len(policy.policy_hash) == 64


@pytest.mark.parametrize("text, error", [
    ("schema_version: 1\ncontroller: {prior_strength: fast}",
     "controller.prior_strength: expected a number > 0, got 'fast'"),
    ("schema_version: 1\ncontroller: {step_cap: 20}",
     "controller.step_cap: expected a number in [0, 16], got 20"),
    ("schema_version: 1\ncontroller: {prior_strenght: 0.9}",
     "controller.prior_strenght: unknown field (did you mean 'prior_strength'? accepted: "
     "confidence, cost_stale_steps, prior_strength, step_cap)"),
    ("schema_version: 1\nworkloads: {copy-heavy: {k_max: 100}}",
     "workloads.copy-heavy.k_max: expected an integer in [1, 64], got 100"),
    ("schema_version: 1\nk_max: 4\nworkloads: {copy-heavy: {k_min: 6}}",
     "workloads.copy-heavy.k_min: k_min 6 is above k_max 4; expected k_min <= k_max"),
    ("schema_version: 1\ndrafters: [ngram, ngarm]",
     "drafters[1]: unknown drafter 'ngarm' (known: draft-model, eagle, early-exit, ngram, suffix, synthetic"),
    ("schema_version: 1\npriors: {ngram: {acceptance_mean: 1.0}}",
     "priors.ngram.acceptance_mean: expected a number in (0, 1), got 1.0"),
    ("schema_version: 1\ncontroller: {confidence: 'yes'}",
     "controller.confidence: expected true or false, got 'yes'"),
    ("schema_version: 1\ncontroller: {prior_strength: 1e-3}",
     "expected a number > 0, got '1e-3' (YAML reads 1e-3 as text: write e.g. 1.0e-3"),
    ("schema_version: 1\ncontroller: {prior_strength: 0}",
     "controller.prior_strength: expected a number > 0, got 0"),
    ("schema_version: 1\nprovenance: {trial: -1}",
     "provenance.trial: expected an integer >= 0, got -1"),
    ("schema_version: 1\nprovenance: {date: last tuesday}", "provenance.date: expected an ISO 8601 date"),
    ("schema_version: 1\nk_max: 8\nk_max: 4", "not valid YAML: line 3, column 1: key 'k_max' given twice"),
    ("schema_version: 1\nkmax: 4", "kmax: unknown field (did you mean 'k_max'?"),
    ("schema_version: 1\nworkloads: {w: {provenance: {}}}", "workloads.w.provenance: unknown field"),
    ("schema_version: 2\nnew_field: 1", "schema_version: expected 1 (the version this autospec reads), got 2"),
    ("k_max: 4", "schema_version: missing; expected 1"),
    ("", "top level: empty file; expected at least 'schema_version: 1'"),
    ("schema_version: [1", "not valid YAML: line 1, column 19"),
])
def test_invalid_files_name_file_field_and_accepted_values(tmp_path, text, error):
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert str(err.value).startswith(f"{path}: ")
    assert error in str(err.value)


def test_cli_validate_one_line_per_file(tmp_path):
    good = write(tmp_path, TUNED, "good.yaml")
    bad = write(tmp_path, "schema_version: 1\ncontroller: {prior_strength: fast}", "bad.yaml")
    result = run("validate", DEFAULT, good)
    assert result.exit_code == 0
    assert result.output.splitlines()[0].startswith(f"{DEFAULT}: ok (")
    result = run("validate", good, bad, tmp_path / "missing.yaml")
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert len(lines) == 3 and lines[0].startswith(f"{good}: ok")
    assert lines[1] == f"{bad}: controller.prior_strength: expected a number > 0, got 'fast'"
    assert lines[2].startswith(f"{tmp_path / 'missing.yaml'}: cannot read")


def test_cli_show_resolves_workloads(tmp_path):
    result = run("show", write(tmp_path, TUNED))
    assert result.exit_code == 0, result.output
    assert f"policy_hash: {parse_policy(TUNED).policy_hash}" in result.output
    assert "copy-heavy:\n    drafters: [ngram, draft-model]\n    k_min: 1\n    k_max: 12" in result.output
    result = run("show", write(tmp_path, "schema_version: 3", "new.yaml"))
    assert "schema_version: expected 1 (the version this autospec reads), got 3" in error_line(result)


def test_cli_diff_one_changed_field_per_line(tmp_path):
    result = run("diff", DEFAULT, write(tmp_path, TUNED))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == diff_policies(load_policy(DEFAULT), parse_policy(TUNED))
    assert result.output.splitlines()[:5] == [
        'drafters: ["ngram", "eagle", "draft-model", "early-exit"] -> ["ngram", "draft-model"]',
        "k_max: 16 -> 6",
        "controller.prior_strength: 4.0 -> 2.0",
        "controller.confidence: true -> false",
        "priors.eagle.acceptance_mean: 0.5 -> (unset)",
    ]
    assert "workloads.copy-heavy.k_max: (unset) -> 12" in result.output
    assert "provenance.trial: (unset) -> 41" in result.output
    assert run("diff", DEFAULT, DEFAULT).output == ""


def test_provenance_values_yaml_would_misread():
    policy = parse_policy("schema_version: 1\n"
                          "provenance: {date: '2026-11-30T08:00:00+00:00', git_sha: '0123456'}")
    assert policy.provenance.date == "2026-11-30T08:00:00+00:00"
    assert parse_policy(policy.to_yaml()) == policy
    with pytest.raises(PolicyError, match=r"provenance.git_sha: expected a non-empty string \(in quotes"):
        parse_policy("schema_version: 1\nprovenance: {git_sha: 1234567}")


def test_the_knobs_table_in_the_docs_is_rendered_from_controller_settings():
    from autospec.policy import knobs_table
    page = (REPO_ROOT / "docs" / "controller.md").read_text()
    assert f"<!-- knobs table: begin -->\n{knobs_table()}\n<!-- knobs table: end -->" in page


def test_parameters_round_trip_through_their_dict_form(tmp_path):
    from autospec.policy import parameters_from_dict, parameters_to_dict
    policy = load_policy(write(tmp_path, TUNED))
    for settings in (policy.parameters, *policy.workloads.values()):
        assert parameters_from_dict(parameters_to_dict(settings)) == settings


def test_an_exception_in_a_command_fails_the_cli_helper(monkeypatch):
    """What `"Traceback" not in result.output` never caught: CliRunner keeps the exception."""
    import autospec.policy
    monkeypatch.setattr(autospec.policy, "load_policy", lambda path: 1 / 0)
    with pytest.raises(pytest.fail.Exception, match="ZeroDivisionError"):
        run("validate", DEFAULT)
