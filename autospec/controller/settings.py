"""The controller's settings: every knob declared once (ControllerSettings).

The policy file's schema (policy.py), the search space's kinds and bounds (tune/space.py) and
docs/controller.md's knob table are derived from these fields; the controller (adaptive.py) reads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from autospec.configcheck import knob
from autospec.controller.estimates import DEFAULT_PRIOR_MEAN
from autospec.drafters.base import DEFAULT_DRAFTERS, check_drafters, drafter_class

K_LIMIT = 64  # past this a draft costs more to verify than any acceptance rate repays


@dataclass(frozen=True)
class ControllerSettings:
    """Every knob of the controller, declared once: type, range, default, whether a policy
    file may set it (and `tune` search it) and what it means, in each field's `Knob`. The
    policy file's schema, the search space's kinds and bounds and docs/controller.md's table are derived
    from these fields (policy.py, tune/space.py); a new knob is one field here."""
    drafters: tuple[str, ...] = knob(
        DEFAULT_DRAFTERS, "drafters the controller may pick (plain decoding is always an option)",
        "drafters", section="", check_value=check_drafters)
    k_min: int = knob(1, "smallest K whenever a drafter runs (K = 0, plain, stays legal)",
                      "int", low=1, high=K_LIMIT, section="")
    # n-gram on repetitive text pays up to ~16 (hf-heuristic caps there too)
    k_max: int = knob(16, "largest K (draft length) the controller considers", "int",
                      low=1, high=K_LIMIT, section="")
    # > 0: with none, a drafter no request has drafted yet has Beta(0, 0), no distribution.
    # 4: with 0.1 instead, replay lost 2.1 % of tokens/s on mixed, beyond noise
    # (docs/controller.md)
    prior_strength: float = knob(
        4.0, "pseudo-observations a workload's pooled estimate is worth per position", "float",
        low=0, low_open=True)
    # switched off, replay lost 1.7-4.9 % of tokens/s, beyond noise, on reference (batch 1),
    # held-out and the drifting trace at 16 rows (docs/controller.md)
    confidence: bool = knob(True, "price each drafted token by its own calibrated confidence "
                                  "(off: by its drafter's mean acceptance at its position)",
                            "bool")
    # 64: the lock-in test recovers in ~110 steps; replay tokens/s on the shipped traces
    # unchanged (it never fires where the controller drafts). Counted in rows instead (a
    # 16-row step 16), 16 SmolLM2 rows drafted deep at a loss every few plain steps
    cost_stale_steps: int = knob(64, "steps without a drafted one after which what drafted "
                                    "steps cost is trusted less, not at all after as many "
                                    "again (0: never)",
                                 "int", low=0, high=1024)
    # for an ITL p99 no worse than plain's: a token whose draft was rejected waits a whole
    # step, so bounding the step bounds the tail of inter-token latency, at a cost in throughput
    # (policies/latency.yaml sets it; docs/benchmarks.md shows both)
    step_cap: float = knob(0.0, "largest predicted step (drafting + verify) a decision may "
                                "choose, as a multiple of a plain step at the same batch size: "
                                "a bound on inter-token latency (0: none; else >= 1)",
                           "float", low=0, high=16)
    # 0 and 1 would be certainties: a Beta prior with that mean cannot be moved by evidence
    prior_means: Mapping[str, float] = knob(
        dict, f"acceptance mean per drafter before any evidence (unset: {DEFAULT_PRIOR_MEAN})",
        "float", low=0, high=1, low_open=True, high_open=True, section="priors")

    def __post_init__(self):
        if self.k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {self.k_max}")
        if 0 < self.step_cap < 1:
            raise ValueError(f"step_cap must be 0 (no bound) or >= 1 (a plain step), "
                             f"got {self.step_cap}")
        if not 1 <= self.k_min <= self.k_max:
            raise ValueError(f"k_min must be in [1, k_max = {self.k_max}], got {self.k_min}")
        for name in self.drafters:
            drafter_class(name)  # unknown names fail here, with the list of known ones
        # frozen all the way down: a resolved policy's parameters cannot be edited in place
        object.__setattr__(self, "drafters", tuple(self.drafters))
        object.__setattr__(self, "prior_means", MappingProxyType(dict(self.prior_means)))
