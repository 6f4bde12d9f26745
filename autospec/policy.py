"""Policy files: the controller's parameters as a reviewed, versioned YAML file.

    schema_version: 1
    drafters: [ngram, draft-model, early-exit]   # which drafters the controller may pick
    k_min: 1                                     # smallest K when drafting (K = 0 is always legal)
    k_max: 8
    controller: {discount: 0.97, ...}            # ControllerSettings' fields
    priors: {ngram: {acceptance_mean: 0.5}}      # per drafter, before any evidence
    workloads:                                   # per-workload overrides of any of the above
      copy-heavy: {k_max: 12, priors: {ngram: {acceptance_mean: 0.8}}}
    provenance: {study: ..., trial: ..., objective_value: ..., git_sha: ..., hardware: ..., date: ...}

Only schema_version is required: an omitted parameter takes the code's default, so a
hand-written file may say just what it changes. Unknown fields are errors, and every error
names the file, the field path and what is accepted (`PolicyError`).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

import yaml

from autospec.controller.adaptive import ControllerSettings
from autospec.drafters.base import known_drafters

SCHEMA_VERSION = 1
K_LIMIT = 64  # past this a draft costs more to verify than any acceptance rate repays
DEFAULT_PRIOR_MEAN = 0.5  # the controller's uninformed start (adaptive.AdaptiveController._prior)
_SETTINGS_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ControllerSettings)}


class PolicyError(ValueError):
    """A policy file that cannot be used; the message is one line: `FILE: FIELD: problem`."""


@dataclass(frozen=True)
class ControllerParams:
    """ControllerSettings' tunable fields (see controller/adaptive.py for their meaning)."""
    discount: float = _SETTINGS_DEFAULTS["discount"]
    prior_strength: float = _SETTINGS_DEFAULTS["prior_strength"]
    prior_discount: float = _SETTINGS_DEFAULTS["prior_discount"]
    hysteresis: float = _SETTINGS_DEFAULTS["hysteresis"]
    thompson: bool = _SETTINGS_DEFAULTS["thompson"]
    counterfactual: bool = _SETTINGS_DEFAULTS["counterfactual"]
    ngram_n: tuple[int, int] = _SETTINGS_DEFAULTS["ngram_n"]


@dataclass(frozen=True)
class Parameters:
    """Everything the controller needs for one workload, every field resolved."""
    drafters: tuple[str, ...] = _SETTINGS_DEFAULTS["drafters"]
    k_min: int = 1
    k_max: int = _SETTINGS_DEFAULTS["k_max"]
    controller: ControllerParams = ControllerParams()
    # drafter -> prior acceptance mean
    priors: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def to_settings(self) -> ControllerSettings:
        c = self.controller
        return ControllerSettings(
            drafters=self.drafters, k_min=self.k_min, k_max=self.k_max, discount=c.discount,
            prior_strength=c.prior_strength, prior_discount=c.prior_discount,
            hysteresis=c.hysteresis, thompson=c.thompson, counterfactual=c.counterfactual,
            ngram_n=tuple(c.ngram_n), prior_means=dict(self.priors))

    @classmethod
    def from_dict(cls, raw: dict) -> "Parameters":
        """The inverse of to_dict (for parameters that came over the wire, already valid)."""
        c = raw["controller"]
        return cls(drafters=tuple(raw["drafters"]), k_min=raw["k_min"], k_max=raw["k_max"],
                   controller=ControllerParams(**{**c, "ngram_n": tuple(c["ngram_n"])}),
                   priors=MappingProxyType({d: p["acceptance_mean"]
                                            for d, p in raw["priors"].items()}))

    def to_dict(self) -> dict:
        return {"drafters": list(self.drafters), "k_min": self.k_min, "k_max": self.k_max,
                "controller": {**dataclasses.asdict(self.controller),
                               "ngram_n": list(self.controller.ngram_n)},
                "priors": {d: {"acceptance_mean": m} for d, m in sorted(self.priors.items())}}


@dataclass(frozen=True)
class Provenance:
    """Where a tuned policy came from; every field optional (None in a hand-written file)."""
    study: str | None = None
    trial: int | None = None
    objective_value: float | None = None
    git_sha: str | None = None
    hardware: str | None = None
    model_pair: str | None = None
    date: str | None = None  # ISO 8601

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Policy:
    schema_version: int
    parameters: Parameters  # for any workload without overrides
    workloads: Mapping[str, Parameters]  # resolved: the base with that workload's overrides
    overrides: Mapping[str, Mapping]  # the overrides as written (normalised), for show/diff
    provenance: Provenance = Provenance()
    path: str | None = field(default=None, compare=False)

    def resolve(self, workload: str | None = None) -> Parameters:
        """The parameters for a workload; one without overrides (or None) gets the base."""
        return self.workloads.get(workload, self.parameters) if workload else self.parameters

    def to_settings(self, workload: str | None = None) -> ControllerSettings:
        """ControllerSettings for a workload (every policy field has one)."""
        return self.resolve(workload).to_settings()

    def to_dict(self) -> dict:
        """The file's content, normalised: defaults filled in at the top, overrides as written."""
        out = {"schema_version": self.schema_version, **self.parameters.to_dict()}
        if self.overrides:
            out["workloads"] = {w: _written(o) for w, o in sorted(self.overrides.items())}
        if self.provenance.to_dict():
            out["provenance"] = self.provenance.to_dict()
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)

    @property
    def policy_hash(self) -> str:
        """sha256 (hex) of what the policy *does*: schema version, the resolved parameters and
        each workload's. Comments, key order, provenance and the file's path do not count."""
        content = {"schema_version": self.schema_version, "parameters": self.parameters.to_dict(),
                   "workloads": {w: p.to_dict() for w, p in sorted(self.workloads.items())}}
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


# -- validation ------------------------------------------------------------------------------
class _Invalid(Exception):
    def __init__(self, where: str, problem: str):
        super().__init__(f"{where}: {problem}")


def _expected(where: str, accepted: str, value: Any) -> _Invalid:
    hint = ""
    if isinstance(value, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value.strip()):
        # PyYAML (YAML 1.1) needs a '.' and a signed exponent to read a float
        hint = f" (YAML reads {value} as text: write e.g. 1.0e-3 or 1.0e+3)"
    return _Invalid(where, f"expected {accepted}, got {value!r}{hint}")


def _number(lo: float = -math.inf, hi: float = math.inf, lo_open: bool = False,
            hi_open: bool = False):
    if lo == -math.inf:
        label = "a finite number"
    elif hi == math.inf:
        label = f"a number {'>' if lo_open else '>='} {lo:g}"
    else:
        label = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def check(where: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _expected(where, label, value)
        if value < lo or (lo_open and value == lo) or value > hi or (hi_open and value == hi):
            raise _expected(where, label, value)
        return float(value)
    return check


def _integer(lo: int, hi: int | None = None):
    label = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"

    def check(where: str, value: Any) -> int:
        if (isinstance(value, bool) or not isinstance(value, int) or value < lo
                or (hi is not None and value > hi)):
            raise _expected(where, label, value)
        return value
    return check


def _boolean(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _expected(where, "true or false", value)
    return value


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        hint = " (in quotes, if YAML reads it as a number or date)" if value else ""
        raise _expected(where, "a non-empty string" + hint, value)
    return value


def _drafter(where: str, value: Any) -> str:
    known = known_drafters()
    if value not in known:
        raise _Invalid(where, f"unknown drafter {value!r} (known: {', '.join(known)})")
    return value


def _drafters(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _expected(where, f"a list of drafters from {', '.join(known_drafters())} "
                               f"([] = plain decoding only)", value)
    names = tuple(_drafter(f"{where}[{i}]", v) for i, v in enumerate(value))
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _Invalid(f"{where}[{i}]", f"drafter {name!r} listed twice")
    return names


def _ngram_n(where: str, value: Any) -> tuple[int, int]:
    accepted = "[n_min, n_max], integers with 1 <= n_min <= n_max"
    if (not isinstance(value, list) or len(value) != 2
            or any(isinstance(n, bool) or not isinstance(n, int) for n in value)
            or not 1 <= value[0] <= value[1]):
        raise _expected(where, accepted, value)
    return value[0], value[1]


def _date(where: str, value: Any) -> str:
    if isinstance(value, (dt.date, dt.datetime)):  # YAML reads 2026-01-31 as a date
        return value.isoformat()
    try:  # a date stays a date: "2026-01-31" must read back as itself
        return dt.date.fromisoformat(_text(where, value)).isoformat()
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(value).isoformat()
    except ValueError:
        raise _expected(where, "an ISO 8601 date, e.g. 2026-01-31 or 2026-01-31T12:00:00Z",
                        value) from None


_CONTROLLER: dict[str, Callable] = {
    "discount": _number(0, 1, lo_open=True),
    "prior_strength": _number(0),
    "prior_discount": _number(0, 1, lo_open=True),
    "hysteresis": _number(0, 1),
    "thompson": _boolean,
    "counterfactual": _boolean,
    "ngram_n": _ngram_n,
}
# 0 and 1 would be certainties: a Beta prior with that mean cannot be moved by evidence
_PRIOR: dict[str, Callable] = {"acceptance_mean": _number(0, 1, lo_open=True, hi_open=True)}
_PROVENANCE: dict[str, Callable] = {
    "study": _text, "trial": _integer(0), "objective_value": _number(),
    "git_sha": _text, "hardware": _text, "model_pair": _text, "date": _date,
}
_PARAMETERS = ("drafters", "k_min", "k_max", "controller", "priors")
_TOP = ("schema_version", *_PARAMETERS, "workloads", "provenance")


def _mapping(where: str, value: Any, accepted: tuple[str, ...] | None) -> dict:
    """A YAML mapping with string keys, all in `accepted` (None = any name)."""
    if not isinstance(value, dict):
        raise _expected(where or "top level", "a mapping (key: value lines)", value)
    for key in value:
        at = f"{where}.{key}" if where else str(key)
        if not isinstance(key, str):
            raise _expected(at, "a name (string) as key", key)
        if accepted is not None and key not in accepted:
            close = difflib.get_close_matches(key, accepted, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise _Invalid(at, f"unknown field ({hint}accepted: {', '.join(sorted(accepted))})")
    return value


def _fields(where: str, raw: Any, checks: Mapping[str, Callable]) -> dict:
    raw = _mapping(where, raw, tuple(checks))
    return {key: checks[key](f"{where}.{key}", value) for key, value in raw.items()}


def _parameters(prefix: str, raw: dict) -> dict:
    """Check the parameter fields present in `raw` (top level or one workload's overrides)."""
    out: dict[str, Any] = {}
    for key in _PARAMETERS:
        if key not in raw:
            continue
        where, value = prefix + key, raw[key]
        if key == "drafters":
            out[key] = _drafters(where, value)
        elif key in ("k_min", "k_max"):
            out[key] = _integer(1, K_LIMIT)(where, value)
        elif key == "controller":
            out[key] = _fields(where, value, _CONTROLLER)
        else:
            out[key] = {}
            for drafter, prior in _mapping(where, value, None).items():
                at = f"{where}.{drafter}"
                _drafter(at, drafter)
                checked = _fields(at, prior, _PRIOR)
                if "acceptance_mean" not in checked:
                    raise _Invalid(f"{at}.acceptance_mean", "missing; expected a number in (0, 1)")
                out[key][drafter] = checked["acceptance_mean"]
    return out


def _written(given: Mapping) -> dict:
    """Checked fields back in the file's own shape (priors nested, tuples as lists)."""
    out = _thaw(given)
    if "priors" in out:
        out["priors"] = {d: {"acceptance_mean": m} for d, m in sorted(out["priors"].items())}
    return out


def _apply(base: Parameters, given: dict, prefix: str) -> Parameters:
    """`base` with the given fields replaced (controller and priors merged field by field)."""
    drafters = given.get("drafters", base.drafters)
    priors = {d: base.priors.get(d, DEFAULT_PRIOR_MEAN) for d in drafters}
    priors.update({d: m for d, m in base.priors.items() if d not in priors})
    priors.update(given.get("priors", {}))
    params = Parameters(
        drafters=drafters, k_min=given.get("k_min", base.k_min),
        k_max=given.get("k_max", base.k_max),
        controller=dataclasses.replace(base.controller, **given.get("controller", {})),
        priors=MappingProxyType(dict(sorted(priors.items()))))
    if params.k_min > params.k_max:
        key = "k_min" if "k_min" in given else "k_max"
        raise _Invalid(prefix + key, f"k_min {params.k_min} is above k_max {params.k_max}; "
                                     f"expected k_min <= k_max")
    return params


def _policy(raw: Any, path: str | None) -> Policy:
    if raw is None:
        raise _Invalid("top level", f"empty file; expected at least 'schema_version: {SCHEMA_VERSION}'")
    # the version first: a newer file's unknown fields are explained by its version
    raw = _mapping("", raw, None)
    if "schema_version" not in raw:
        raise _Invalid("schema_version", f"missing; expected {SCHEMA_VERSION}")
    version = raw["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int) or version != SCHEMA_VERSION:
        raise _Invalid("schema_version", f"expected {SCHEMA_VERSION} (the version this autospec "
                                         f"reads), got {version!r}")
    _mapping("", raw, _TOP)
    base = _apply(Parameters(), _parameters("", raw), "")
    workloads, overrides = {}, {}
    listed = raw.get("workloads")
    for name, override in _mapping("workloads", {} if listed is None else listed, None).items():
        prefix = f"workloads.{name}."
        given = _parameters(prefix, _mapping(prefix[:-1], {} if override is None else override,
                                                    _PARAMETERS))
        workloads[name] = _apply(base, given, prefix)
        overrides[name] = MappingProxyType(given)
    given = raw.get("provenance")
    provenance = Provenance(**_fields("provenance", {} if given is None else given, _PROVENANCE))
    return Policy(SCHEMA_VERSION, base, MappingProxyType(workloads), MappingProxyType(overrides),
                  provenance, path)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice (PyYAML keeps the last one, silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def parse_policy(text: str, path: str | None = None) -> Policy:
    """A Policy from YAML text; errors name `path` (or `<string>`)."""
    source = path or "<string>"
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError(f"{source}: not valid YAML: {where}{problem}") from None
    try:
        return _policy(raw, path)
    except _Invalid as exc:
        raise PolicyError(f"{source}: {exc}") from None


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file; PolicyError (naming the file) on any problem."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_policy(text, str(path))


# -- comparison ------------------------------------------------------------------------------
def flatten(content: Any, prefix: str = "") -> dict[str, Any]:
    """{"controller.discount": 0.97, ...} from nested mappings; lists stay values."""
    if not isinstance(content, dict):
        return {prefix: content}
    out: dict[str, Any] = {}
    for key, value in content.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def diff_policies(a: Policy, b: Policy) -> list[str]:
    """One line per field that differs, `FIELD: A_VALUE -> B_VALUE` (`(unset)` if absent);
    parameters with defaults filled in, workload overrides as written, then provenance."""
    flat_a, flat_b = flatten(a.to_dict()), flatten(b.to_dict())
    lines = []
    for key in list(flat_a) + [k for k in flat_b if k not in flat_a]:
        old, new = flat_a.get(key, _UNSET), flat_b.get(key, _UNSET)
        if old != new:
            lines.append(f"{key}: {_show(old)} -> {_show(new)}")
    return lines


_UNSET = object()


def _show(value: Any) -> str:
    if value is _UNSET:
        return "(unset)"
    return json.dumps(value) if not isinstance(value, str) else value


def _thaw(value: Any) -> Any:
    """Plain dicts / lists from the frozen mappings and tuples, for YAML and JSON."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thaw(v) for v in value]
    return value
