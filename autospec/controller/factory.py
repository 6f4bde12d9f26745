"""Controllers by method (a parsed autospec.method.Method): what bench, replay and serve run.
Takes the parsed value only, so the controller room never imports method.py (which imports
policy.py, which imports the controller)."""
from __future__ import annotations

from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.controller.baselines import (DEFAULT_BATCH_TABLE, BatchTableController, EMAController,
                                           HFHeuristicController)
from autospec.controller.interface import Controller, StaticController

NAMES = ("plain", "static:DRAFTER:K", "adaptive", "adaptive:POLICY.yaml", "ctl:fixed[:DRAFTER:K]",
         "ctl:hf-heuristic[:DRAFTER]", "ctl:ema[:DRAFTER]", "ctl:batch-table[:DRAFTER[:TABLE]]")


def make_controller(method: "Method", *, settings: ControllerSettings | None = None) -> Controller:
    """A fresh controller for a Method (`settings` replace the adaptive controller's
    defaults); the host that drives it binds it to the drafters it can run."""
    if method.kind == "plain":
        return StaticController(None, 0)
    if method.kind == "static" or (method.kind == "ctl" and method.baseline == "fixed"):
        return StaticController(method.drafter, method.k)
    if method.kind == "adaptive":
        return AdaptiveController(method.settings or settings or ControllerSettings())
    if method.kind == "ctl" and method.baseline == "hf-heuristic":
        return HFHeuristicController(method.drafter)
    if method.kind == "ctl" and method.baseline == "ema":
        return EMAController(method.drafter)
    if method.kind == "ctl" and method.baseline == "batch-table":
        return BatchTableController(method.drafter, method.table or DEFAULT_BATCH_TABLE)
    raise ValueError(f"method '{method}' is not a controller (known: {', '.join(NAMES)})")
