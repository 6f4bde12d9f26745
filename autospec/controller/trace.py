"""Deprecated (one release): trace record and replay moved to autospec.bench.trace."""
import importlib

_MOVED = {
    'SCHEMA_VERSION': 'autospec.bench.trace',
    'Trace': 'autospec.bench.trace',
    'TraceRequest': 'autospec.bench.trace',
    'SimRequest': 'autospec.bench.trace',
    'record': 'autospec.bench.trace',
    'replay': 'autospec.bench.trace',
    'calibrate_verify': 'autospec.bench.trace',
}


def __getattr__(name):
    if name in _MOVED:
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(name)
