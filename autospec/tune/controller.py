"""From a trial's values to the controller a policy file describes.

A trial is a dict of policy field paths -> values (space.SearchSpace.suggest). It becomes
the `ControllerSettings` a policy file resolves to (what export writes) and the controller
serve would build from it.
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping

from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.policy import (SCHEMA_VERSION, Policy, Provenance, merged_priors, policy_knobs,
                             policy_path)


def parameters_for(values: Mapping[str, Any],
                   base: ControllerSettings = ControllerSettings()) -> ControllerSettings:
    """`base` with the trial's fields set; k_min is capped at k_max (independent ranges in
    the space may cross; the policy file may not)."""
    fields = {name: values[policy_path(name, knob)] for name, knob in policy_knobs().items()
              if knob.section != "priors" and policy_path(name, knob) in values}
    fields["drafters"] = tuple(fields.get("drafters", base.drafters))
    fields["k_max"] = int(fields.get("k_max", base.k_max))
    fields["k_min"] = min(int(fields.get("k_min", base.k_min)), fields["k_max"])
    given = {k.split(".", 1)[1]: float(v) for k, v in values.items() if k.startswith("priors.")}
    # the base's priors only for the trial's drafters: what is exported lists what is used
    base_priors = {d: m for d, m in base.prior_means.items() if d in fields["drafters"]}
    priors = merged_priors(fields["drafters"], base_priors, given)
    return dataclasses.replace(base, **fields, prior_means=priors)


def policy_for(params: ControllerSettings, provenance: Provenance = Provenance()) -> Policy:
    return Policy(SCHEMA_VERSION, params, MappingProxyType({}), MappingProxyType({}), provenance)


def build_controller(params: ControllerSettings) -> AdaptiveController:
    """The controller for resolved policy parameters (Policy.resolve(workload)): the same one
    `autospec serve` builds from the daemon's parameters (its host binds it to the drafters
    it can run)."""
    return AdaptiveController(params)
