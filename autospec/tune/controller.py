"""From a trial's values to the controller a policy file describes.

A trial is a dict of policy field paths -> values (space.SearchSpace.suggest). It becomes a
`policy.Parameters` (what export writes) and the controller serve would build from it.
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping

from autospec.controller.adaptive import AdaptiveController
from autospec.policy import DEFAULT_PRIOR_MEAN, SCHEMA_VERSION, Parameters, Policy, Provenance

def parameters_for(values: Mapping[str, Any], base: Parameters = Parameters()) -> Parameters:
    """`base` with the trial's fields set; k_min is capped at k_max, ngram n_max raised to
    n_min (independent ranges in the space may cross; the policy file may not)."""
    controller = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("controller.")}
    if "ngram_n" in controller:
        lo, hi = controller["ngram_n"]
        controller["ngram_n"] = (lo, max(lo, hi))
    drafters = tuple(values.get("drafters", base.drafters))
    k_max = int(values.get("k_max", base.k_max))
    k_min = min(int(values.get("k_min", base.k_min)), k_max)
    priors = {d: base.priors.get(d, DEFAULT_PRIOR_MEAN) for d in drafters}
    priors.update({k.split(".", 1)[1]: float(v) for k, v in values.items() if k.startswith("priors.")})
    return Parameters(drafters=drafters, k_min=k_min, k_max=k_max,
                      controller=dataclasses.replace(base.controller, **controller),
                      priors=MappingProxyType(dict(sorted(priors.items()))))


def policy_for(params: Parameters, provenance: Provenance = Provenance()) -> Policy:
    return Policy(SCHEMA_VERSION, params, MappingProxyType({}), MappingProxyType({}), provenance)


def build_controller(params: Parameters, available: tuple[str, ...] | None = None,
                     seed: int = 0) -> AdaptiveController:
    """The controller for resolved policy parameters (Policy.resolve(workload)): the same one
    `autospec serve` builds from the daemon's parameters."""
    return AdaptiveController(dataclasses.replace(params.to_settings(), seed=seed),
                              available=available)
