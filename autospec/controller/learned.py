"""Deprecated (one release): the Learner moved to autospec.daemon.learner, the warm-start evaluation to autospec.bench.warm_start."""
import importlib

_MOVED = {
    'Learner': 'autospec.daemon.learner',
    'SLOW_DISCOUNT': 'autospec.daemon.learner',
    'token_seconds': 'autospec.bench.warm_start',
    'steps_to_steady': 'autospec.bench.warm_start',
    'warm_vs_cold': 'autospec.bench.warm_start',
}


def __getattr__(name):
    if name in _MOVED:
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(name)
