"""Search spaces: which policy fields `autospec tune` searches, and over what, from YAML.

    schema_version: 1
    drafters: {choices: [[ngram], [ngram, draft-model]]}   # a set, in priority order
    k_min: {low: 1, high: 3}
    k_max: {low: 2, high: 16, grid: [4, 8, 16]}
    controller:
      discount: {low: 0.85, high: 0.999, grid: [0.9, 0.97, 0.995]}
      prior_strength: {low: 0.5, high: 32, log: true}
      thompson: {choices: [true, false]}
      ngram_n: {choices: [[1, 4], [2, 4]]}
    priors: {ngram: {low: 0.2, high: 0.95}}                 # acceptance_mean per drafter
    tiling: {kernels: [greedy_verify]}                      # GPU only (autospec.kernels)

A field is a range (`low`, `high`, optional `log`, `step`), a list of `choices`, or a plain
value (fixed: written into every trial, not searched). `grid` lists the values an exhaustive
grid (`tune --grid`) and a discretised search (`--discrete`) use; without it a range
contributes `low`, the middle and `high` (geometric middle when `log`), an int range each
integer when there are at most 8. Trial parameter names are the policy's field paths
(`controller.discount`, `priors.ngram`), so a trial exports to a policy field by field.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from autospec.drafters.base import known_drafters
from autospec.policy import K_LIMIT

SCHEMA_VERSION = 1
FIELDS = {"drafters": "list", "k_min": "int", "k_max": "int"}
CONTROLLER_FIELDS = {"discount": "float", "prior_strength": "float", "prior_discount": "float",
                     "hysteresis": "float", "thompson": "bool", "counterfactual": "bool",
                     "ngram_n": "list"}
# the policy validator's bounds, so a searched value can never make an invalid policy
BOUNDS = {"k_min": (1, K_LIMIT), "k_max": (1, K_LIMIT), "controller.discount": (1e-9, 1.0),
          "controller.prior_strength": (0.0, math.inf), "controller.prior_discount": (1e-9, 1.0),
          "controller.hysteresis": (0.0, 1.0), "priors": (1e-9, 1 - 1e-9)}
_KEYS = {"low", "high", "log", "step", "grid", "choices"}
_TOP = ("schema_version", "drafters", "k_min", "k_max", "controller", "priors", "tiling")


class SpaceError(ValueError):
    """A search space that cannot be used; one line: `FILE: FIELD: problem`."""


@dataclass(frozen=True)
class Param:
    name: str  # the policy field path: "k_max", "controller.discount", "priors.ngram"
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
    tiling_kernels: tuple[str, ...] = ()
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


def tidy(value: Any) -> Any:
    """A float to 12 significant digits: 0.8320000000000001 (a stepped suggestion's rounding
    noise) reads back as 0.832, in the trial and in the exported file alike."""
    return float(f"{value:.12g}") if isinstance(value, float) else value


def decode(param: Param, value: Any) -> Any:
    if param.kind != "list":
        return tidy(value)
    parts = [v for v in str(value).split(",") if v]
    return tuple(int(v) for v in parts) if param.name == "controller.ngram_n" else tuple(parts)


def _clamp(p: Param, k_limit: int) -> Param:
    if p.choices is not None:
        kept = tuple(dict.fromkeys(min(v, k_limit) for v in p.choices))
        return replace(p, choices=kept, grid=_clamp_grid(p.grid, k_limit))
    return replace(p, low=min(p.low, k_limit), high=min(p.high, k_limit),
                   grid=_clamp_grid(p.grid, k_limit))


def _clamp_grid(grid, k_limit):
    return None if grid is None else tuple(dict.fromkeys(min(v, k_limit) for v in grid))


# -- loading ---------------------------------------------------------------------------------
class _Invalid(Exception):
    def __init__(self, where: str, problem: str):
        super().__init__(f"{where}: {problem}")


def load_space(path: str | Path) -> SearchSpace:
    """Read and check a space file; SpaceError naming the file and the field on any problem."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise SpaceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise SpaceError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    try:
        return _space(raw, str(path))
    except _Invalid as exc:
        raise SpaceError(f"{path}: {exc}") from None


def _known(where: str, raw: Any, accepted) -> dict:
    if not isinstance(raw, dict):
        raise _Invalid(where or "top level", f"expected a mapping, got {raw!r}")
    for key in raw:
        if key not in accepted:
            close = difflib.get_close_matches(str(key), list(accepted), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            at = f"{where}.{key}" if where else str(key)
            raise _Invalid(at, f"unknown field ({hint}accepted: {', '.join(sorted(accepted))})")
    return raw


def _space(raw: Any, path: str) -> SearchSpace:
    raw = _known("", raw, _TOP)
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise _Invalid("schema_version", f"expected {SCHEMA_VERSION}, got {raw.get('schema_version')!r}")
    params = [_param(name, kind, raw[name]) for name, kind in FIELDS.items() if name in raw]
    controller = _known("controller", raw.get("controller") or {}, CONTROLLER_FIELDS)
    params += [_param(f"controller.{n}", CONTROLLER_FIELDS[n], v) for n, v in controller.items()]
    priors = raw.get("priors") or {}
    _known("priors", priors, known_drafters())
    params += [_param(f"priors.{d}", "float", v) for d, v in priors.items()]
    tiling = _known("tiling", raw.get("tiling") or {}, ("kernels",))
    kernels = tuple(tiling.get("kernels") or ())
    from autospec.kernels import TILING_SPACES  # noqa: PLC0415 (imports triton: only when loading)
    for i, name in enumerate(kernels):
        if name not in TILING_SPACES:
            raise _Invalid(f"tiling.kernels[{i}]",
                           f"unknown kernel {name!r} (known: {', '.join(TILING_SPACES)})")
    if not params:
        raise _Invalid("top level", "no field to search (expected any of drafters, k_min, k_max, "
                                    "controller, priors)")
    return SearchSpace(tuple(params), kernels, path)


def _param(name: str, kind: str, raw: Any) -> Param:
    if not isinstance(raw, dict):  # a plain value: fixed
        return Param(name, kind, choices=(_value(name, name, kind, raw),))
    raw = _known(name, raw, _KEYS)
    if "choices" in raw:
        if {"low", "high", "log", "step"} & set(raw):
            raise _Invalid(name, "give either choices or low/high, not both")
        choices = raw["choices"]
        if not isinstance(choices, list) or not choices:
            raise _Invalid(f"{name}.choices", f"expected a non-empty list, got {choices!r}")
        values = tuple(_value(f"{name}.choices[{i}]", name, kind, v) for i, v in enumerate(choices))
        grid = _grid(name, kind, raw, values)
        return Param(name, kind, choices=values, grid=grid)
    if kind not in ("int", "float"):
        raise _Invalid(name, f"expected choices: [...] (a {kind} field has no range)")
    for key in ("low", "high"):
        if key not in raw:
            raise _Invalid(f"{name}.{key}", "missing; a range needs low and high")
        _value(f"{name}.{key}", name, kind, raw[key])
    low, high = raw["low"], raw["high"]
    if low > high:
        raise _Invalid(name, f"low {low} is above high {high}")
    log = raw.get("log", False)
    if not isinstance(log, bool) or (log and low <= 0):
        raise _Invalid(f"{name}.log", "expected true or false (log needs low > 0)")
    step = raw.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0):
        raise _Invalid(f"{name}.step", f"expected a positive number, got {step!r}")
    if step is not None and log:
        raise _Invalid(name, "give log or step, not both (Optuna samples one or the other)")
    param = Param(name, kind, low, high, log, step)
    grid = _grid(name, kind, raw, None)
    for v in grid or ():
        if not low <= v <= high:
            raise _Invalid(f"{name}.grid", f"value {v} is outside [{low}, {high}]")
    return replace(param, grid=grid)


def _grid(name, kind, raw, choices):
    if "grid" not in raw:
        return None
    grid = raw["grid"]
    if not isinstance(grid, list) or not grid:
        raise _Invalid(f"{name}.grid", f"expected a non-empty list, got {grid!r}")
    values = tuple(_value(f"{name}.grid[{i}]", name, kind, v) for i, v in enumerate(grid))
    if choices is not None and not set(values) <= set(choices):
        raise _Invalid(f"{name}.grid", "every grid value must be one of the choices")
    return values


def _value(where: str, field_name: str, kind: str, value: Any):
    """Check one value against the field's type and the policy validator's bounds; encode."""
    if kind == "bool":
        if not isinstance(value, bool):
            raise _Invalid(where, f"expected true or false, got {value!r}")
        return value
    if kind == "list":
        return encode(kind, _list(where, field_name, value))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Invalid(where, f"expected a number, got {value!r}")
    if kind == "int" and not isinstance(value, int):
        raise _Invalid(where, f"expected an integer, got {value!r}")
    lo, hi = BOUNDS.get(field_name, BOUNDS["priors"] if field_name.startswith("priors.") else
                        (-math.inf, math.inf))
    if not lo <= value <= hi:
        raise _Invalid(where, f"{value!r} is outside what a policy accepts ([{lo:g}, {hi:g}])")
    return float(value) if kind == "float" else value


def _list(where: str, field_name: str, value: Any) -> list:
    if field_name == "drafters":
        known = known_drafters()
        if not isinstance(value, list) or any(v not in known for v in value) \
                or len(set(value)) != len(value):
            raise _Invalid(where, f"expected a list of distinct drafters from "
                                  f"{', '.join(known)}, got {value!r}")
        return value
    if (not isinstance(value, list) or len(value) != 2
            or any(isinstance(n, bool) or not isinstance(n, int) for n in value)
            or not 1 <= value[0] <= value[1]):
        raise _Invalid(where, f"expected [n_min, n_max] with 1 <= n_min <= n_max, got {value!r}")
    return value


def shipped_space(name: str = "default") -> Path:
    """A space file shipped in autospec.configs/search_spaces."""
    from importlib.resources import files
    return Path(str(files("autospec.configs") / "search_spaces" / f"{name}.yaml"))
