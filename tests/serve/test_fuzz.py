"""Random request bodies against a real `autospec serve` and `autospec daemon` on loopback:
wrong types, huge numbers, empty and long strings, unknown fields, deep nesting, bytes that
are not UTF-8. Never a 5xx, never a crash, and a valid request is still served after."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from processes import request, start, start_daemon

EXAMPLES = 120  # bodies per endpoint
FIELDS = ["prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
          "top_k", "seed", "stream", "stop", "n", "model", "user", "autospec", "logprobs",
          "top_logprobs",
          "batch_id", "requests", "instance", "model_pair", "hardware", "role", "content"]

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40)
           | st.sampled_from(["", "x" * 5000, "static:ngram:4", "adaptive", "user"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner,
                                        max_size=4), max_leaves=12)
bodies = (st.dictionaries(st.sampled_from(FIELDS), values, max_size=6)
          | values.map(lambda v: v))
raw = st.binary(max_size=64) | st.just(b'{"prompt": "\xff\xfe", "max_tokens": 2}') \
    | st.just(b"[" * 2000 + b"]" * 2000)


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tiny_dir):
    tmp = tmp_path_factory.mktemp("fuzz")
    daemon = start_daemon(tmp)
    serve = start(["serve", "--port", "0", "--target", str(tiny_dir / "target"), "--draft",
                   str(tiny_dir / "draft"), "--daemon", daemon.url], tmp / "serve.log",
                  env={"OMP_NUM_THREADS": "1"})
    yield serve, daemon
    serve.stop()
    daemon.stop()


def post(url: str, path: str, body) -> int:
    data = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True)
    status, _ = request(url, "POST", path, data, timeout=60)
    return status


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/telemetry"])
def test_random_bodies_never_get_a_server_error(servers, path):
    serve, daemon = servers
    url = daemon.url if path == "/v1/telemetry" else serve.url
    tried = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=bodies | raw)
    def one(body):
        status = post(url, path, body)
        tried.append(status)
        assert status < 500, (status, body if isinstance(body, bytes) else json.dumps(body)[:300])

    one()
    assert len(tried) >= EXAMPLES // 2
    print(f"{path}: {len(tried)} bodies, statuses {sorted(set(tried))}")
    ok = post(serve.url, "/v1/completions", {"prompt": "def f(x):", "max_tokens": 4})
    assert ok == 200 and request(daemon.url, "GET", "/healthz")[0] == 200
