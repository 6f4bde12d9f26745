"""Policy files: the controller's parameters as a reviewed, versioned YAML file.

    schema_version: 1
    drafters: [ngram, draft-model, early-exit]   # which drafters the controller may pick
    k_min: 1                                     # smallest K when drafting (K = 0 is always legal)
    k_max: 8
    controller: {prior_strength: 4.0, ...}       # ControllerSettings' fields
    priors: {ngram: {acceptance_mean: 0.5}}      # per drafter, before any evidence
    workloads:                                   # per-workload overrides of any of the above
      copy-heavy: {k_max: 12, priors: {ngram: {acceptance_mean: 0.8}}}
    provenance: {study: ..., trial: ..., objective_value: ..., git_sha: ..., hardware: ..., date: ...}

Only schema_version is required: an omitted parameter takes the code's default, so a
hand-written file may say just what it changes. Unknown fields are errors, and every error
names the file, the field path and what is accepted (`ConfigError`, alias `PolicyError`).

Which fields exist, their types, ranges and defaults are not written here: they are
ControllerSettings' tunable knobs (controller/settings.py), and a policy resolves to
ControllerSettings — the base, and one per listed workload.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

import yaml

from autospec import configcheck as cc
from autospec.configcheck import ConfigError, Knob
from autospec.controller.adaptive import ControllerSettings
from autospec.controller.estimates import DEFAULT_PRIOR_MEAN
from autospec.drafters.base import check_drafter

SCHEMA_VERSION = 1
PolicyError = ConfigError  # one error type for every config file (autospec.configcheck)
PRIOR_FIELD = "acceptance_mean"  # priors: {DRAFTER: {acceptance_mean: VALUE}}
# controller fields a schema-1 file may still carry though the knob is gone: read, warned
# about and ignored, so a policy kept in version control keeps loading
_NO_EFFECT = ("removed: with it on or off the controller's replayed tokens/s moved less than "
              "the noise (autospec replay TRACE --knobs)")
RETIRED = {name: _NO_EFFECT for name in
           ("hysteresis", "discount", "prior_discount", "thompson", "explore_pooled", "regimes")}
RETIRED["counterfactual"] = ("removed as a knob: with it on or off the controller's replayed "
                             "tokens/s moved less than the noise; the look-ups that did not run "
                             "are always scored (they teach the confidence calibration)")
log = logging.getLogger("autospec.policy")


def policy_knobs() -> dict[str, Knob]:
    """{field name: Knob} for every ControllerSettings field a policy file may set."""
    return {name: k for name, (k, _) in cc.knobs(ControllerSettings).items() if k.tunable}


def policy_path(name: str, knob: Knob) -> str:
    """The field's path in a policy file and a search space: `k_max`, `controller.confidence`,
    `priors` (each drafter's value under `priors.DRAFTER`)."""
    return {"": name, "controller": f"controller.{name}", "priors": "priors"}[knob.section]


def _sections() -> tuple[dict[str, Knob], dict[str, Knob], tuple[str, Knob]]:
    """(top-level knobs, controller knobs, (name, knob) of the per-drafter priors)."""
    knobs = policy_knobs()
    top = {n: k for n, k in knobs.items() if k.section == ""}
    controller = {n: k for n, k in knobs.items() if k.section == "controller"}
    (prior,) = [(n, k) for n, k in knobs.items() if k.section == "priors"]
    return top, controller, prior


def parameters_to_dict(settings: ControllerSettings) -> dict:
    """A policy file's parameter fields (every one, defaults included), as YAML / JSON."""
    out: dict[str, Any] = {}
    for name, knob in policy_knobs().items():
        value = _thaw(getattr(settings, name))
        if knob.section == "":
            out[name] = value
        elif knob.section == "controller":
            out.setdefault("controller", {})[name] = value
        else:
            out["priors"] = {d: {PRIOR_FIELD: m} for d, m in sorted(value.items())}
    return out


def parameters_from_dict(raw: dict) -> ControllerSettings:
    """The inverse of parameters_to_dict (e.g. GET /v1/params' parameters), checked as a
    policy file's fields are."""
    return _apply(ControllerSettings(), _parameters("", cc.mapping("", raw, _PARAMETERS)), "")


def merged_priors(drafters, base: Mapping[str, float], given: Mapping[str, float]) -> dict:
    """Each listed drafter's prior mean (the base's, else DEFAULT_PRIOR_MEAN), the base's
    other drafters kept, `given` over them; by drafter name."""
    priors = {d: base.get(d, DEFAULT_PRIOR_MEAN) for d in drafters}
    priors.update({d: m for d, m in base.items() if d not in priors})
    priors.update(given)
    return dict(sorted(priors.items()))


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
    parameters: ControllerSettings  # for any workload without overrides
    workloads: Mapping[str, ControllerSettings]  # resolved: the base with that workload's overrides
    overrides: Mapping[str, Mapping]  # the overrides as written (normalised), for show/diff
    provenance: Provenance = Provenance()
    path: str | None = field(default=None, compare=False)

    def resolve(self, workload: str | None = None) -> ControllerSettings:
        """The settings for a workload; one without overrides (or None) gets the base."""
        return self.workloads.get(workload, self.parameters) if workload else self.parameters

    def to_settings(self, workload: str | None = None) -> ControllerSettings:
        """The same as resolve (kept from when a policy's parameters were their own type)."""
        return self.resolve(workload)

    def to_dict(self) -> dict:
        """The file's content, normalised: defaults filled in at the top, overrides as written."""
        out = {"schema_version": self.schema_version, **parameters_to_dict(self.parameters)}
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
        content = {"schema_version": self.schema_version,
                   "parameters": parameters_to_dict(self.parameters),
                   "workloads": {w: parameters_to_dict(p) for w, p in sorted(self.workloads.items())}}
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


# -- validation ------------------------------------------------------------------------------
def _date(where: str, value: Any) -> str:
    if isinstance(value, (dt.date, dt.datetime)):  # YAML reads 2026-01-31 as a date
        return value.isoformat()
    try:  # a date stays a date: "2026-01-31" must read back as itself
        return dt.date.fromisoformat(cc.text(where, value)).isoformat()
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(value).isoformat()
    except ValueError:
        raise cc.expected(where, "an ISO 8601 date, e.g. 2026-01-31 or 2026-01-31T12:00:00Z",
                          value) from None


_PROVENANCE: dict[str, Callable] = {
    "study": cc.text, "trial": cc.integer(0), "objective_value": cc.number(),
    "git_sha": cc.text, "hardware": cc.text, "model_pair": cc.text, "date": _date,
}
_PARAMETERS = (*_sections()[0], "controller", "priors")
_TOP = ("schema_version", *_PARAMETERS, "workloads", "provenance")


def _parameters(prefix: str, raw: dict) -> dict:
    """Check the parameter fields present in `raw` (top level or one workload's overrides):
    {top-level field: value, "controller": {field: value}, "priors": {drafter: mean}}."""
    top, controller, (_, prior) = _sections()
    out: dict[str, Any] = {}
    for key in _PARAMETERS:
        if key not in raw:
            continue
        where, value = prefix + key, raw[key]
        if key == "controller":
            if isinstance(value, dict):
                for name in RETIRED.keys() & value.keys():
                    log.warning("%s.%s: %s; ignored", where, name, RETIRED[name])
                value = {n: v for n, v in value.items() if n not in RETIRED}
            given = cc.mapping(where, value, tuple(controller))
            out[key] = {n: controller[n].check(f"{where}.{n}", v) for n, v in given.items()}
        elif key == "priors":
            out[key] = {}
            for drafter, given in cc.mapping(where, value).items():
                at = f"{where}.{drafter}"
                check_drafter(at, drafter)
                cc.mapping(at, given, (PRIOR_FIELD,))
                if PRIOR_FIELD not in given:
                    raise ConfigError(f"{at}.{PRIOR_FIELD}", f"missing; expected {prior.accepted}")
                out[key][drafter] = prior.check(f"{at}.{PRIOR_FIELD}", given[PRIOR_FIELD])
        else:
            out[key] = top[key].check(where, value)
    return out


def _written(given: Mapping) -> dict:
    """Checked fields back in the file's own shape (priors nested, tuples as lists)."""
    out = _thaw(given)
    if "priors" in out:
        out["priors"] = {d: {PRIOR_FIELD: m} for d, m in sorted(out["priors"].items())}
    return out


def _apply(base: ControllerSettings, given: dict, prefix: str) -> ControllerSettings:
    """`base` with the given fields replaced (controller fields and priors one by one)."""
    fields = {k: v for k, v in given.items() if k not in ("controller", "priors")}
    fields.update(given.get("controller", {}))
    k_min, k_max = fields.get("k_min", base.k_min), fields.get("k_max", base.k_max)
    if k_min > k_max:
        key = "k_min" if "k_min" in given else "k_max"
        raise ConfigError(prefix + key, f"k_min {k_min} is above k_max {k_max}; "
                                        f"expected k_min <= k_max")
    priors = merged_priors(fields.get("drafters", base.drafters), base.prior_means,
                           given.get("priors", {}))
    return dataclasses.replace(base, **fields, prior_means=priors)


def _policy(raw: Any, path: str | None) -> Policy:
    if raw is None:
        raise ConfigError("top level", f"empty file; expected at least 'schema_version: "
                                       f"{SCHEMA_VERSION}'")
    raw = cc.mapping("", raw)
    cc.schema_version(raw, SCHEMA_VERSION)
    cc.mapping("", raw, _TOP)
    base = _apply(ControllerSettings(), _parameters("", raw), "")
    workloads, overrides = {}, {}
    listed = raw.get("workloads")
    for name, override in cc.mapping("workloads", {} if listed is None else listed).items():
        prefix = f"workloads.{name}."
        given = _parameters(prefix, cc.mapping(prefix[:-1], {} if override is None else override,
                                               _PARAMETERS))
        workloads[name] = _apply(base, given, prefix)
        overrides[name] = MappingProxyType(given)
    given = cc.mapping("provenance", {} if raw.get("provenance") is None else raw["provenance"],
                       tuple(_PROVENANCE))
    provenance = Provenance(**{k: _PROVENANCE[k](f"provenance.{k}", v) for k, v in given.items()})
    return Policy(SCHEMA_VERSION, base, MappingProxyType(workloads), MappingProxyType(overrides),
                  provenance, path)


def parse_policy(text: str, path: str | None = None) -> Policy:
    """A Policy from YAML text; errors name `path` (or `<string>`)."""
    source = path or "<string>"
    try:
        return _policy(cc.parse_yaml(text, source), path)
    except ConfigError as exc:
        raise (exc if exc.file else exc.in_file(source)) from None


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file; PolicyError (naming the file) on any problem."""
    return parse_policy(cc.read_text(path), str(path))


# -- the docs table --------------------------------------------------------------------------
def knobs_table() -> str:
    """docs/controller.md's table of the controller's knobs, rendered from ControllerSettings."""
    lines = ["| field | accepted | default | policy file, `tune` | meaning |",
             "|---|---|---|---|---|"]
    for name, (knob, f) in cc.knobs(ControllerSettings).items():
        default = cc.default_of(f)
        if knob.section == "priors":
            path, default = f"priors.DRAFTER.{PRIOR_FIELD}", DEFAULT_PRIOR_MEAN
        else:
            path = policy_path(name, knob) if knob.tunable else f"ControllerSettings.{name}"
        shown = json.dumps(_thaw(default))
        lines.append(f"| `{path}` | {knob.accepted} | `{shown}` | "
                     f"{'yes' if knob.tunable else 'no'} | {knob.doc} |")
    return "\n".join(lines)


# -- comparison ------------------------------------------------------------------------------
def flatten(content: Any, prefix: str = "") -> dict[str, Any]:
    """{"controller.prior_strength": 4.0, ...} from nested mappings; lists stay values."""
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
