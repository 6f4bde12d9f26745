"""The drafter API: the contract (drafters/contract.py, whose names this module offers too),
and the registry every drafter is created through.

A drafter is per request (the engine makes one for each request from a factory, so
interleaved requests never share state). The engine never branches on drafter type.

Third-party drafters register through the entry-point group `autospec.drafters`:
    [project.entry-points."autospec.drafters"]
    my-drafter = "my_pkg.drafter:MyDrafter"
where MyDrafter(models: ModelPair, **options) is a Drafter subclass.
"""
from __future__ import annotations

from importlib.metadata import entry_points

from autospec.confidence import check_confidences
from autospec.drafters.contract import (_REGISTRY, Draft, DraftContext, Drafter,  # noqa: F401
                                        Verified, agreeing_prefix, register)

# The built-in drafters a controller may pick, in its default order (synthetic is for tests).
DEFAULT_DRAFTERS = ("ngram", "eagle", "draft-model", "early-exit")
_entry_points_loaded = False


def _load_builtin_and_plugins() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:  # every look-up asks (drafter_class): once is enough
        return
    # here, not at the top: the model drafters import transformers, which a look-up of names
    # (a policy's check, a method string) need not pay for until it asks
    from autospec.drafters import draft_model, eagle, early_exit, ngram, suffix, synthetic  # noqa: F401
    _entry_points_loaded = True
    for ep in entry_points(group="autospec.drafters"):
        if ep.name not in _REGISTRY:
            cls = ep.load()
            cls.name = ep.name
            _REGISTRY[ep.name] = cls


def check_drafter(where: str, value) -> str:
    """A config field naming one drafter (configcheck's contract: ConfigError naming `where`)."""
    from autospec.configcheck import ConfigError
    known = known_drafters()
    if value not in known:
        raise ConfigError(where, f"unknown drafter {value!r} (known: {', '.join(known)})")
    return value


def check_drafters(where: str, value) -> tuple[str, ...]:
    """A config field listing distinct drafters, in priority order ([] = plain decoding only)."""
    from autospec.configcheck import ConfigError, expected
    if not isinstance(value, (list, tuple)):
        raise expected(where, f"a list of drafters from {', '.join(known_drafters())} "
                              f"([] = plain decoding only)", value)
    names = tuple(check_drafter(f"{where}[{i}]", v) for i, v in enumerate(value))
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"{where}[{i}]", f"drafter {name!r} listed twice")
    return names


def known_drafters() -> list[str]:
    _load_builtin_and_plugins()
    return sorted(_REGISTRY)


def drafter_class(name: str) -> type:
    _load_builtin_and_plugins()
    if name not in _REGISTRY:
        raise ValueError(f"unknown drafter '{name}' (known: {', '.join(sorted(_REGISTRY))})")
    return _REGISTRY[name]


def available_drafters(models, candidates: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The drafters the pair `models` can run, of `candidates` (default: the built-in ones, in
    the controller's order): those whose needs it has (`Drafter.runs_on`: a draft model, a
    feature head)."""
    return tuple(d for d in (DEFAULT_DRAFTERS if candidates is None else candidates)
                 if drafter_class(d).runs_on(models))


def runnable_drafters(models) -> tuple[str, ...]:
    """Every registered drafter the pair `models` can run (a controller picks among the ones
    its settings list: the suffix drafter, opt-in, among them). Asked before every step
    (Controller.bind): found once, kept on the pair (`ModelPair.runnable`)."""
    if models.runnable is None:
        models.runnable = available_drafters(models, tuple(known_drafters()))
    return models.runnable


def check_draft(name: str, draft: Draft) -> Draft:
    """A drafter's proposal as a host takes it: its confidences one per token in [0, 1] or
    None (a ValueError names the drafter otherwise). Returns the draft."""
    check_confidences(name, draft.tokens, draft.confidences)
    return draft


def create_drafter(name: str, models, **options) -> Drafter:
    """A fresh per-request drafter. `models` is the engine's ModelPair."""
    return drafter_class(name)(models, **options)
