"""The best trial as a policy file: the trial's fields over the policy defaults, provenance
filled in, checked by the same validator `autospec policy validate` runs before it is written."""
from __future__ import annotations

from pathlib import Path

import optuna

from autospec.controller.adaptive import ControllerSettings
from autospec.policy import Provenance, load_policy, parse_policy
from autospec.tune.controller import parameters_for, policy_for
from autospec.tune.space import decode_value
from autospec.tune.study import best_trials, now


def trial_values(trial: optuna.trial.FrozenTrial) -> dict:
    """The trial's policy fields, decoded (lists travel as 'a,b' strings in Optuna)."""
    values = dict(trial.user_attrs.get("fixed", {}))
    for name, value in trial.params.items():
        values[name] = decode_value(name, value)
    return values


def policy_text(study: optuna.Study, trial: optuna.trial.FrozenTrial,
                base: ControllerSettings = ControllerSettings()) -> str:
    attrs = trial.user_attrs
    provenance = Provenance(study=study.study_name, trial=trial.number,
                            objective_value=round(float(trial.value), 3),
                            git_sha=attrs.get("git_sha"), hardware=attrs.get("hardware"),
                            model_pair=attrs.get("model_pair"), date=now())
    policy = policy_for(parameters_for(trial_values(trial), base), provenance)
    header = [f"# Exported by `autospec tune --study {study.study_name} --export`: trial "
              f"{trial.number} of {len(study.trials)},",
              f"# {attrs.get('objective', 'replay')} tokens/s {trial.value:.1f} "
              f"(policy hash {policy.policy_hash[:12]}).",
              f"# Scored on: {', '.join(attrs.get('workloads', [])) or 'unknown'} "
              f"(sha256 {attrs.get('workload_hash', '?')})."]
    text = "\n".join(header) + "\n" + policy.to_yaml()
    parse_policy(text, "<export>")  # what validate will say, before anything is written
    return text


def export_best(study: optuna.Study, path: str | Path) -> optuna.trial.FrozenTrial:
    """Write the best complete trial to `path`; ValueError when the study has none."""
    best = best_trials(study, 1)
    if not best:
        raise ValueError(f"study '{study.study_name}' has no complete trial to export")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(policy_text(study, best[0]))
    load_policy(path)
    return best[0]
