"""Controllers by name, as `autospec bench` and `autospec replay` spell them."""
from __future__ import annotations

from autospec.controller.adaptive import DEFAULT_DRAFTERS, AdaptiveController, ControllerSettings
from autospec.controller.baselines import EMAPolicy, HFHeuristicPolicy
from autospec.engine.loop import StaticPolicy

NAMES = ("plain", "static:DRAFTER:K", "adaptive", "adaptive:POLICY.yaml", "ctl:fixed[:DRAFTER:K]",
         "ctl:hf-heuristic[:DRAFTER]", "ctl:ema[:DRAFTER]")


def make_policy(name: str, available: tuple[str, ...] = DEFAULT_DRAFTERS,
                settings: ControllerSettings | None = None):
    """A fresh policy object for a controller name (validated by bench.methods.parse_methods)."""
    parts = name.split(":")
    if name == "plain":
        return StaticPolicy(None, 0)
    if parts[0] == "static":
        return StaticPolicy(parts[1], int(parts[2]))
    if name == "adaptive":
        return AdaptiveController(settings or ControllerSettings(), available=available)
    if parts[0] == "adaptive":  # adaptive:PATH, a policy file (validated by parse_methods)
        from autospec.policy import load_policy
        return AdaptiveController(load_policy(name[len("adaptive:"):]).to_settings(),
                                  available=available)
    if parts[0] == "ctl":
        drafter = parts[2] if len(parts) > 2 else "draft-model"
        if parts[1] == "fixed":
            return StaticPolicy(drafter, int(parts[3]) if len(parts) == 4 else 4)
        if parts[1] == "hf-heuristic":
            return HFHeuristicPolicy(drafter)
        if parts[1] == "ema":
            return EMAPolicy(drafter)
    raise ValueError(f"unknown controller '{name}' (known: {', '.join(NAMES)})")
