"""Controllers by name, as `autospec bench`, `autospec replay` and `tune` spell them."""
from __future__ import annotations

from autospec.controller.adaptive import DEFAULT_DRAFTERS, AdaptiveController, ControllerSettings
from autospec.controller.baselines import EMAController, HFHeuristicController
from autospec.engine.loop import Controller, StaticController

NAMES = ("plain", "static:DRAFTER:K", "adaptive", "adaptive:POLICY.yaml", "ctl:fixed[:DRAFTER:K]",
         "ctl:hf-heuristic[:DRAFTER]", "ctl:ema[:DRAFTER]")


def make_controller(name: str, available: tuple[str, ...] = DEFAULT_DRAFTERS,
                    settings: ControllerSettings | None = None) -> Controller:
    """A fresh controller for a name (validated by bench.methods.parse_methods)."""
    parts = name.split(":")
    if name == "plain":
        return StaticController(None, 0)
    if parts[0] == "static":
        return StaticController(parts[1], int(parts[2]))
    if name == "adaptive":
        return AdaptiveController(settings or ControllerSettings(), available=available)
    if parts[0] == "adaptive":  # adaptive:PATH, a policy file (validated by parse_methods)
        from autospec.policy import load_policy
        return AdaptiveController(load_policy(name[len("adaptive:"):]).to_settings(),
                                  available=available)
    if parts[0] == "ctl":
        drafter = parts[2] if len(parts) > 2 else "draft-model"
        if parts[1] == "fixed":
            return StaticController(drafter, int(parts[3]) if len(parts) == 4 else 4)
        if parts[1] == "hf-heuristic":
            return HFHeuristicController(drafter)
        if parts[1] == "ema":
            return EMAController(drafter)
    raise ValueError(f"unknown controller '{name}' (known: {', '.join(NAMES)})")
