"""Deprecated (one release): the daemon client is serve's side: autospec.serve.client."""
from autospec.moved import forward

__getattr__ = forward({
    'DaemonClient': 'autospec.serve.client',
    'ClientStats': 'autospec.serve.client',
    'parse_daemon_url': 'autospec.serve.client',
})
