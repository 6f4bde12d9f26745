"""Deprecated (one release): trace record and replay moved to autospec.bench.trace."""
from autospec.moved import forward

__getattr__ = forward({
    'SCHEMA_VERSION': 'autospec.bench.trace',
    'Trace': 'autospec.bench.trace',
    'TraceRequest': 'autospec.bench.trace',
    'SimRequest': 'autospec.bench.trace',
    'record': 'autospec.bench.trace',
    'replay': 'autospec.bench.trace',
    'calibrate_verify': 'autospec.bench.trace',
})
