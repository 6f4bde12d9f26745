"""Deprecated (one release): the daemon client is serve's side: autospec.serve.client."""
import importlib

_MOVED = {
    'DaemonClient': 'autospec.serve.client',
    'ClientStats': 'autospec.serve.client',
    'parse_daemon_url': 'autospec.serve.client',
}


def __getattr__(name):
    if name in _MOVED:
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(name)
