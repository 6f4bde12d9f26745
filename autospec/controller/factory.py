"""Controllers by method (autospec.method): what bench, replay, serve and tune run."""
from __future__ import annotations

from autospec.controller.adaptive import DEFAULT_DRAFTERS, AdaptiveController, ControllerSettings
from autospec.controller.baselines import EMAController, HFHeuristicController
from autospec.engine.loop import Controller, StaticController
from autospec.method import Method, parse_method

NAMES = ("plain", "static:DRAFTER:K", "adaptive", "adaptive:POLICY.yaml", "ctl:fixed[:DRAFTER:K]",
         "ctl:hf-heuristic[:DRAFTER]", "ctl:ema[:DRAFTER]")


def make_controller(method: Method | str, available: tuple[str, ...] = DEFAULT_DRAFTERS,
                    settings: ControllerSettings | None = None) -> Controller:
    """A fresh controller for a method (text is parsed first). `available`: the drafters the
    engine can run, for the adaptive controller; `settings` replace its defaults."""
    if isinstance(method, str):
        method = parse_method(method)
    if method.kind == "plain":
        return StaticController(None, 0)
    if method.kind == "static" or (method.kind == "ctl" and method.baseline == "fixed"):
        return StaticController(method.drafter, method.k)
    if method.kind == "adaptive":
        return AdaptiveController(method.settings or settings or ControllerSettings(),
                                  available=available)
    if method.kind == "ctl" and method.baseline == "hf-heuristic":
        return HFHeuristicController(method.drafter)
    if method.kind == "ctl" and method.baseline == "ema":
        return EMAController(method.drafter)
    raise ValueError(f"method '{method}' is not a controller (known: {', '.join(NAMES)})")
