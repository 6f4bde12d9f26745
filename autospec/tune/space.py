"""Search spaces: which policy fields `autospec tune` searches, and over what, from YAML.

    schema_version: 1
    drafters: {choices: [[ngram], [ngram, draft-model]]}   # a set, in priority order
    k_min: {low: 1, high: 3}
    k_max: {low: 2, high: 16, grid: [4, 8, 16]}
    controller:
      prior_strength: {low: 0.5, high: 32, log: true}
      confidence: {choices: [true, false]}
    priors: {ngram: {low: 0.2, high: 0.95}}                 # acceptance_mean per drafter

A field is a range (`low`, `high`, optional `log`, `step`), a list of `choices`, or a plain
value (fixed: written into every trial, not searched). `grid` lists the values an exhaustive
grid (`tune --grid`) and a discretised search (`--discrete`) use; without it a range
contributes `low`, the middle and `high` (geometric middle when `log`), an int range each
integer when there are at most 8. Trial parameter names are the policy's field paths
(`controller.prior_strength`, `priors.ngram`), so a trial exports to a policy field by field.
The fields a space may name, their kinds and bounds are the policy's (ControllerSettings'
tunable knobs), and each value is checked by the policy validator's own check.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autospec import configcheck as cc
from autospec.configcheck import ConfigError, Knob
from autospec.drafters.base import known_drafters
from autospec.policy import policy_knobs, policy_path

SCHEMA_VERSION = 1
SpaceError = ConfigError  # one error type for every config file (autospec.configcheck)
_KEYS = {"low", "high", "log", "step", "grid", "choices"}
# Optuna's kinds: lists travel as "a,b" strings (categorical choices must be scalars)
_OPTUNA_KIND = {"int": "int", "float": "float", "bool": "bool", "drafters": "list"}


def searchable() -> dict[str, Knob]:
    """{field path: Knob} for every policy field a space may name: `k_max`,
    `controller.prior_strength`, `priors` (as `priors.DRAFTER`). Derived from ControllerSettings."""
    return {policy_path(name, knob): knob for name, knob in policy_knobs().items()}


def knob_at(name: str) -> Knob:
    """The Knob behind a trial parameter name (`priors.ngram` -> the priors knob)."""
    return searchable()["priors" if name.startswith("priors.") else name]


@dataclass(frozen=True)
class Param:
    name: str  # the policy field path: "k_max", "controller.prior_strength", "priors.ngram"
    kind: str  # "int" | "float" | "bool" | "list" (lists travel as "a,b" strings: Optuna
    #            categorical choices must be scalars)
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple | None = None  # categorical (encoded); None for a range
    grid: tuple | None = None  # encoded values for --grid / --discrete

    @property
    def fixed(self) -> bool:
        return self.choices is not None and len(self.choices) == 1

    def values(self) -> tuple:
        """The discretised values: `grid` if given, else choices, else a few from the range."""
        if self.grid is not None:
            return self.grid
        if self.choices is not None:
            return self.choices
        step = int(self.step or 1)
        if self.kind == "int" and (self.high - self.low) / step <= 7:
            return tuple(range(int(self.low), int(self.high) + 1, step))
        mid = math.sqrt(self.low * self.high) if self.log else (self.low + self.high) / 2
        mid = round(mid) if self.kind == "int" else round(mid, 6)
        return tuple(dict.fromkeys((self.low, mid, self.high)))

    def suggest(self, trial, discrete: bool = False):
        if discrete or self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.values() if discrete else self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high),
                                     step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)


@dataclass(frozen=True)
class SearchSpace:
    params: tuple[Param, ...]
    path: str | None = None

    def searched(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if not p.fixed)

    def suggest(self, trial, discrete: bool = False) -> dict[str, Any]:
        """{field path: decoded value} for every field the space names (fixed ones included)."""
        values = {}
        for p in self.params:
            raw = p.choices[0] if p.fixed else p.suggest(trial, discrete)
            values[p.name] = decode(p, raw)
        return values

    def grid(self) -> dict[str, list]:
        """Optuna GridSampler's search space: every searched field's discretised values."""
        return {p.name: list(p.values()) for p in self.searched()}

    def grid_size(self) -> int:
        return math.prod(len(v) for v in self.grid().values())

    def clamp_k(self, k_limit: int) -> "SearchSpace":
        """The space with k_min / k_max capped at `k_limit` (a trace holds no longer drafts)."""
        out = []
        for p in self.params:
            if p.name in ("k_min", "k_max"):
                p = _clamp(p, k_limit)
            out.append(p)
        return replace(self, params=tuple(out))


def encode(kind: str, value: Any) -> Any:
    return ",".join(map(str, value)) if kind == "list" else value


def decode_value(name: str, value: Any) -> Any:
    """A trial's value for field `name` back to the policy's type ("1,4" -> (1, 4))."""
    kind = knob_at(name).kind
    if kind == "drafters":
        return tuple(v for v in str(value).split(",") if v)
    return tidy(value)


def tidy(value: Any) -> Any:
    """A float to 12 significant digits: 0.8320000000000001 (a stepped suggestion's rounding
    noise) reads back as 0.832, in the trial and in the exported file alike."""
    return float(f"{value:.12g}") if isinstance(value, float) else value


def decode(param: Param, value: Any) -> Any:
    return decode_value(param.name, value)


def _clamp(p: Param, k_limit: int) -> Param:
    if p.choices is not None:
        kept = tuple(dict.fromkeys(min(v, k_limit) for v in p.choices))
        return replace(p, choices=kept, grid=_clamp_grid(p.grid, k_limit))
    return replace(p, low=min(p.low, k_limit), high=min(p.high, k_limit),
                   grid=_clamp_grid(p.grid, k_limit))


def _clamp_grid(grid, k_limit):
    return None if grid is None else tuple(dict.fromkeys(min(v, k_limit) for v in grid))


# -- loading ---------------------------------------------------------------------------------
def load_space(path: str | Path) -> SearchSpace:
    """Read and check a space file; ConfigError naming the file and the field on any problem."""
    text = cc.read_text(path)
    try:
        return _space(cc.parse_yaml(text, str(path)), str(path))
    except ConfigError as exc:
        raise (exc if exc.file else exc.in_file(path)) from None


def _space(raw: Any, path: str) -> SearchSpace:
    fields = searchable()
    top = [n for n, k in fields.items() if k.section == ""]
    raw = cc.mapping("", raw, ("schema_version", *top, "controller", "priors"))
    cc.schema_version(raw, SCHEMA_VERSION)
    params = [_param(name, fields[name], raw[name]) for name in top if name in raw]
    controller = cc.mapping("controller", raw.get("controller") or {},
                            [n.split(".", 1)[1] for n in fields if n.startswith("controller.")])
    params += [_param(f"controller.{n}", fields[f"controller.{n}"], v) for n, v in controller.items()]
    priors = cc.mapping("priors", raw.get("priors") or {}, known_drafters())
    params += [_param(f"priors.{d}", fields["priors"], v) for d, v in priors.items()]
    if not params:
        raise ConfigError("top level", f"no field to search (expected any of "
                                       f"{', '.join(top)}, controller, priors)")
    return SearchSpace(tuple(params), path)


def _param(name: str, knob: Knob, raw: Any) -> Param:
    kind = _OPTUNA_KIND[knob.kind]
    if not isinstance(raw, dict):  # a plain value: fixed
        return Param(name, kind, choices=(_value(name, knob, raw),))
    raw = cc.mapping(name, raw, _KEYS)
    if "choices" in raw:
        if {"low", "high", "log", "step"} & set(raw):
            raise ConfigError(name, "give either choices or low/high, not both")
        choices = raw["choices"]
        if not isinstance(choices, list) or not choices:
            raise cc.expected(f"{name}.choices", "a non-empty list", choices)
        values = tuple(_value(f"{name}.choices[{i}]", knob, v) for i, v in enumerate(choices))
        grid = _grid(name, knob, raw, values)
        return Param(name, kind, choices=values, grid=grid)
    if kind not in ("int", "float"):
        raise ConfigError(name, f"expected choices: [...] (a {kind} field has no range)")
    for key in ("low", "high"):
        if key not in raw:
            raise ConfigError(f"{name}.{key}", "missing; a range needs low and high")
        _value(f"{name}.{key}", knob, raw[key])
    low, high = raw["low"], raw["high"]
    if low > high:
        raise ConfigError(name, f"low {low} is above high {high}")
    log = raw.get("log", False)
    if not isinstance(log, bool) or (log and low <= 0):
        raise ConfigError(f"{name}.log", "expected true or false (log needs low > 0)")
    step = raw.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0):
        raise cc.expected(f"{name}.step", "a positive number", step)
    if step is not None and log:
        raise ConfigError(name, "give log or step, not both (Optuna samples one or the other)")
    param = Param(name, kind, low, high, log, step)
    grid = _grid(name, knob, raw, None)
    for v in grid or ():
        if not low <= v <= high:
            raise ConfigError(f"{name}.grid", f"value {v} is outside [{low}, {high}]")
    return replace(param, grid=grid)


def _grid(name: str, knob: Knob, raw: dict, choices):
    if "grid" not in raw:
        return None
    grid = raw["grid"]
    if not isinstance(grid, list) or not grid:
        raise cc.expected(f"{name}.grid", "a non-empty list", grid)
    values = tuple(_value(f"{name}.grid[{i}]", knob, v) for i, v in enumerate(grid))
    if choices is not None and not set(values) <= set(choices):
        raise ConfigError(f"{name}.grid", "every grid value must be one of the choices")
    return values


def _value(where: str, knob: Knob, value: Any):
    """Check one value with the policy validator's own check (so a searched value can never
    make an invalid policy); encode it for Optuna."""
    try:
        checked = knob.check(where, value)
    except ConfigError:
        number = isinstance(value, int if knob.kind == "int" else (int, float))
        if knob.kind in ("int", "float") and number and not isinstance(value, bool):
            raise ConfigError(where, f"{value!r} is outside what a policy accepts "
                                     f"({knob.accepted})") from None
        raise
    if knob.kind == "drafters":
        return encode("list", list(checked))
    return checked


def shipped_space(name: str = "default") -> Path:
    """A space file shipped in autospec.configs/search_spaces."""
    from importlib.resources import files
    return Path(str(files("autospec.configs") / "search_spaces" / f"{name}.yaml"))
