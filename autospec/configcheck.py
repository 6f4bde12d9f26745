"""Checking human-written YAML — policy files and search spaces — with one error type.

Every problem is one `ConfigError`, one line: `FILE: FIELD.PATH: problem (what is accepted)`.
A setting's type, range, default and meaning are declared once, as a `Knob` in the metadata
of its dataclass field (see controller/settings.py, ControllerSettings); `Knob.check` is the
validator both file formats use, so a search space can never propose a value a policy file
would refuse.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml


class ConfigError(ValueError):
    """A file that cannot be used. `where` is the field path ("controller.confidence",
    "drafters[1]"; empty for the whole file), `problem` says what is wrong and what is
    accepted, `file` names the file once it is known."""

    def __init__(self, where: str, problem: str, file: str | None = None):
        self.where, self.problem, self.file = where, problem, file
        super().__init__(": ".join([p for p in (file, where) if p] + [problem]))

    def __reduce__(self):
        return ConfigError, (self.where, self.problem, self.file)

    def in_file(self, file: str | Path) -> "ConfigError":
        return ConfigError(self.where, self.problem, str(file))


Check = Callable[[str, Any], Any]  # (field path, raw value) -> checked value, or ConfigError


# -- the checks ------------------------------------------------------------------------------
def expected(where: str, accepted: str, value: Any) -> ConfigError:
    hint = ""
    if isinstance(value, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value.strip()):
        # PyYAML (YAML 1.1) needs a '.' and a signed exponent to read a float
        hint = f" (YAML reads {value} as text: write e.g. 1.0e-3 or 1.0e+3)"
    return ConfigError(where, f"expected {accepted}, got {value!r}{hint}")


def unknown_field(where: str, key: str, accepted) -> ConfigError:
    """`unknown field (did you mean 'k_max'? accepted: ...)`: the closest accepted name."""
    close = difflib.get_close_matches(key, list(accepted), n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return ConfigError(where, f"unknown field ({hint}accepted: {', '.join(sorted(accepted))})")


def mapping(where: str, value: Any, accepted=None) -> dict:
    """A YAML mapping with string keys, all in `accepted` (None = any name)."""
    if not isinstance(value, dict):
        raise expected(where or "top level", "a mapping (key: value lines)", value)
    for key in value:
        at = f"{where}.{key}" if where else str(key)
        if not isinstance(key, str):
            raise expected(at, "a name (string) as key", key)
        if accepted is not None and key not in accepted:
            raise unknown_field(at, key, accepted)
    return value


def number(lo: float = -math.inf, hi: float = math.inf, lo_open: bool = False,
           hi_open: bool = False) -> Check:
    if lo == -math.inf:
        label = "a finite number"
    elif hi == math.inf:
        label = f"a number {'>' if lo_open else '>='} {lo:g}"
    else:
        label = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def check(where: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise expected(where, label, value)
        if value < lo or (lo_open and value == lo) or value > hi or (hi_open and value == hi):
            raise expected(where, label, value)
        return float(value)
    check.label = label
    return check


def integer(lo: int, hi: int | None = None) -> Check:
    label = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"

    def check(where: str, value: Any) -> int:
        if (isinstance(value, bool) or not isinstance(value, int) or value < lo
                or (hi is not None and value > hi)):
            raise expected(where, label, value)
        return value
    check.label = label
    return check


def boolean(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise expected(where, "true or false", value)
    return value


def text(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        hint = " (in quotes, if YAML reads it as a number or date)" if value else ""
        raise expected(where, "a non-empty string" + hint, value)
    return value


def schema_version(raw: dict, version: int) -> None:
    """The version first: a newer file's unknown fields are explained by its version."""
    if "schema_version" not in raw:
        raise ConfigError("schema_version", f"missing; expected {version}")
    given = raw["schema_version"]
    if isinstance(given, bool) or not isinstance(given, int) or given != version:
        raise ConfigError("schema_version", f"expected {version} (the version this autospec "
                                            f"reads), got {given!r}")


# -- settings declared once ------------------------------------------------------------------
@dataclass(frozen=True)
class Knob:
    """What a settings dataclass field declares about itself, in its metadata.

    kind: "int" | "float" | "bool" | "drafters" (a list of drafter names, checked by `check`:
    the registry lives with the drafters). low/high bound a
    number (open at an end when low_open / high_open). check: replaces the kind's own check.
    section: where a policy file writes it — "" (top level), "controller", or "priors" (one
    value per drafter: `priors: {DRAFTER: {acceptance_mean: VALUE}}`). tunable: read from
    policy files and searchable by `tune`; False for run-time settings (a seed)."""
    doc: str
    kind: str
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    section: str = "controller"
    tunable: bool = True
    check_value: Check | None = dataclasses.field(default=None, compare=False)

    def checker(self) -> Check:
        if self.check_value is not None:
            return self.check_value
        if self.kind == "int":
            return integer(int(self.low), None if self.high == math.inf else int(self.high))
        if self.kind == "float":
            return number(self.low, self.high, self.low_open, self.high_open)
        return boolean

    def check(self, where: str, value: Any) -> Any:
        """The checked value (tuples for lists, float for a float); ConfigError naming
        `where` and what is accepted otherwise."""
        return self.checker()(where, value)

    @property
    def accepted(self) -> str:
        """What the check accepts, in words (the docs table's range column)."""
        label = getattr(self.checker(), "label", None)
        return label or {"bool": "true or false", "drafters": "a list of drafter names"}[self.kind]


def knob(default, doc: str, kind: str, **declared) -> Any:
    """A dataclass field carrying its `Knob`; `default` may be a zero-argument factory."""
    meta = {"knob": Knob(doc, kind, **declared)}
    if callable(default):
        return dataclasses.field(default_factory=default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def knobs(settings_class) -> dict[str, tuple[Knob, dataclasses.Field]]:
    """{field name: (Knob, field)} for every field of `settings_class` that declares one."""
    return {f.name: (f.metadata["knob"], f) for f in dataclasses.fields(settings_class)
            if "knob" in f.metadata}


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


# -- YAML ------------------------------------------------------------------------------------
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


def parse_yaml(text: str, source: str) -> Any:
    """YAML text -> Python values; ConfigError `SOURCE: not valid YAML: line L, column C: ...`."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError("", f"not valid YAML: {where}{problem}", source) from None


def read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"cannot read: {getattr(exc, 'strerror', None) or exc}",
                          str(path)) from None
