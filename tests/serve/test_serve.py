"""`autospec serve` beside `autospec daemon`: real processes, loopback, a real SQLite store."""
from __future__ import annotations

import json
import signal
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import assert_lossless_text
from processes import request, sample, scrape, start, start_daemon, wait_for
from sqlalchemy import select

from autospec.store import open_store
from autospec.store.schema import RequestRow

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"


def stored(db) -> int:
    with open_store(f"sqlite:///{db}") as store:
        return store.count_requests()


def start_serve(tmp, tiny_dir, daemon_url: str | None, name: str = "serve"):
    args = ["serve", "--port", "0", "--target", str(tiny_dir / "target"),
            "--draft", str(tiny_dir / "draft"), "--params-interval", "0.5"]
    if daemon_url:
        args += ["--daemon", daemon_url]
    return start(args, tmp / f"{name}.log", env={"OMP_NUM_THREADS": "1"})


def complete(url, **fields):
    return request(url, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 12,
                                                    "temperature": 0, **fields})


def stream(url, **fields) -> list[dict]:
    body = json.dumps({"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stream": True,
                       **fields}).encode()
    events = []
    with urllib.request.urlopen(urllib.request.Request(f"{url}/v1/completions", body), timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _system(tmp, tiny_dir):
    daemon = start_daemon(tmp)
    serve = start_serve(tmp, tiny_dir, daemon.url)
    yield daemon, serve, tmp / "store.db"
    serve.stop()
    daemon.stop()


@pytest.fixture
def system(tmp_path, tiny_dir):
    """A daemon and a server of the test's own (for tests that kill one of them)."""
    yield from _system(tmp_path, tiny_dir)


@pytest.fixture(scope="module")
def shared(tmp_path_factory, tiny_dir):
    """One daemon and server for the tests that leave them running."""
    yield from _system(tmp_path_factory.mktemp("serve"), tiny_dir)


def test_completions_streaming_and_not_reach_the_store(system, tiny_pair):
    daemon, serve, db = system
    status, body = complete(serve.url)
    assert status == 200 and body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] == 12 == body["autospec"]["output_tokens"]
    assert body["autospec"]["method"] == "adaptive" and body["autospec"]["k_shares"]
    plain = complete(serve.url, autospec={"method": "plain"})[1]["choices"][0]["text"]
    # lossless (near-tie rule: trained weights, read off the text: the tokens stay in the server)
    assert_lossless_text(tiny_pair, PROMPT, plain, body["choices"][0]["text"], 12)
    chunks = stream(serve.url, autospec={"method": "static:ngram:4", "workload": "copy"})
    assert_lossless_text(tiny_pair, PROMPT, plain,
                         "".join(c["choices"][0]["text"] for c in chunks), 12)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]
    assert wait_for(lambda: stored(db) == 3)
    with open_store(f"sqlite:///{db}") as store, store.session_scope(write=False) as session:
        # the method each request ran with, through the daemon into the store
        assert sorted(session.scalars(select(RequestRow.method))) == \
            ["adaptive", "plain", "static:ngram:4"]
    _, metrics = request(daemon.url, "GET", "/metrics")
    assert 'autospec_requests_total{model_pair=' in metrics and 'workload="copy"} 1' in metrics


def test_a_seed_reproduces_alone_in_a_busy_batch_and_with_another_drafter(shared, tiny_pair):
    """The same seeded request, sampled (temperature 0.8), gives the same tokens alone, while
    eight others decode beside it, and with a fixed drafter in place of the controller."""
    from concurrent.futures import ThreadPoolExecutor
    _, serve, _ = shared
    seeded = {"temperature": 0.8, "seed": 123, "max_tokens": 24}
    alone = complete(serve.url, **seeded)[1]["choices"][0]["text"]
    with ThreadPoolExecutor(9) as pool:
        busy = [pool.submit(complete, serve.url, temperature=0.8, seed=i, max_tokens=24)
                for i in range(8)]
        crowded = pool.submit(complete, serve.url, **seeded)
        others = [f.result()[1]["choices"][0]["text"] for f in busy]
    assert crowded.result()[1]["choices"][0]["text"] == alone
    fixed = complete(serve.url, **seeded, autospec={"method": "static:ngram:4"})
    assert fixed[1]["choices"][0]["text"] == alone
    assert len(set(others)) > 1  # other seeds, other samples
    # temperature 0 with a seed is simply greedy: plain's text, by the near-tie rule (the
    # controller's K may differ between the two)
    plain = complete(serve.url, temperature=0, autospec={"method": "plain"})[1]
    plain = plain["choices"][0]["text"]
    for seed in ({"seed": 7}, {}):
        greedy = complete(serve.url, temperature=0, **seed)[1]["choices"][0]["text"]
        assert_lossless_text(tiny_pair, PROMPT, plain, greedy, 12)


def test_metrics_show_the_k_chosen_the_accepted_length_and_acceptance_per_position(shared):
    """Known traffic (three requests at a fixed n-gram K = 4): serve's /metrics and, once their
    telemetry is stored, the daemon's count exactly the steps, K and acceptances the responses
    report."""
    daemon, serve, _ = shared
    before = scrape(serve.url)
    labels = {"workload": "metered"}
    replies = [complete(serve.url, max_tokens=24, autospec={"method": "static:ngram:4", **labels})[1]
               for _ in range(3)]
    bodies = [r["autospec"] for r in replies]
    drafting = sum(round(b["steps"] * b["drafter_shares"].get("ngram", 0)) for b in bodies)
    accepted = sum(b["accepted"] for b in bodies)
    assert drafting > 0  # what it accepted is the trained tiny pair's: any count is checked
    after = scrape(serve.url)
    grew = lambda name, **lab: sample(after, name, **lab) - sample(before, name, **lab)  # noqa: E731
    m = {"model": replies[0]["model"], "drafter": "ngram"}
    assert grew("autospec_serve_draft_k_count", **m) == drafting
    # K 4, less where fewer tokens were left to generate: the responses' own K shares
    k_sum = sum(int(k) * round(b["steps"] * share) for b in bodies for k, share in b["k_shares"].items())
    assert grew("autospec_serve_draft_k_sum", **m) == k_sum
    assert grew("autospec_serve_draft_k_bucket", **m, le="4.0") == drafting  # none above 4
    at = [grew("autospec_serve_draft_position_tokens_total", **m, position=j, result=r)
          for j in range(1, 5) for r in ("proposed", "accepted")]
    proposed_at, accepted_at = at[0::2], at[1::2]
    # an accepted length for each step that drafted anything (a look-up may find no match)
    assert grew("autospec_serve_accepted_length_count", **m) == proposed_at[0] <= drafting
    assert grew("autospec_serve_accepted_length_sum", **m) == accepted
    assert sum(accepted_at) == accepted and sum(proposed_at) == sum(b["proposed"] for b in bodies)
    assert all(a <= p for a, p in zip(accepted_at, proposed_at))
    assert accepted_at == sorted(accepted_at, reverse=True)  # a position is accepted after its earlier ones
    # the daemon: the same series, by model pair and workload, from the stored telemetry
    d = {"workload": "metered", "drafter": "ngram"}
    assert wait_for(lambda: sum(v for (name, lab), v in scrape(daemon.url).items()
                                if name == "autospec_draft_k_count" and d.items() <= dict(lab).items())
                    == drafting)
    at_daemon = scrape(daemon.url)
    pair = next(dict(lab)["model_pair"] for name, lab in at_daemon if name == "autospec_draft_k_count")
    assert sample(at_daemon, "autospec_accepted_length_sum", model_pair=pair, **d) == accepted
    assert [sample(at_daemon, "autospec_draft_position_tokens_total", model_pair=pair, **d,
                   position=j, result="accepted") for j in range(1, 5)] == accepted_at


@pytest.mark.parametrize("fields, param", [
    ({"prompt": ""}, "prompt"), ({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature"),
    ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"), ({"seed": "x"}, "seed"),
    ({"stop": list("abcde")}, "stop"), ({"n": 2}, "n"), ({"color": "red"}, "color"),
    ({"autospec": {"method": "static:ngarm:4"}}, "autospec.method"), ({"model": "gpt-9"}, "model"),
])
def test_bad_requests_get_openai_errors(shared, fields, param):
    _, serve, _ = shared
    status, body = complete(serve.url, **fields)
    assert status == 400 and body["error"]["param"] == param, body
    assert request(serve.url, "GET", "/healthz")[0] == 200


def test_daemon_killed_serving_continues_and_telemetry_arrives_later(system, tmp_path):
    daemon, serve, db = system
    assert complete(serve.url)[0] == 200
    assert wait_for(lambda: stored(db) == 1)
    # stored is not yet acknowledged: the ack travels back after the commit
    assert wait_for(lambda: request(serve.url, "GET", "/healthz")[1]["daemon"]["unacknowledged"] == 0)
    daemon.signal(signal.SIGKILL)
    daemon.wait()
    for _ in range(5):  # the daemon is gone: serving goes on
        assert complete(serve.url)[0] == 200
    health = request(serve.url, "GET", "/healthz")[1]
    assert health["served"] == 6 and health["daemon"]["unacknowledged"] == 5
    # restarted on the same socket (the killed one left its file behind): the buffer drains
    restarted = start(["daemon", "--listen", daemon.url, "--db", f"sqlite:///{db}",
                       "--flush-interval", "0.2"], tmp_path / "restarted.log")
    try:
        assert wait_for(lambda: stored(db) == 6, timeout=30), serve.log.read_text()[-2000:]
    finally:
        restarted.stop()


def test_load_8_clients_x_50_requests_all_reach_the_store(shared):
    _, serve, db = shared
    before = request(serve.url, "GET", "/healthz")[1]["served"]

    def client(n):
        for i in range(50):
            status, _ = request(serve.url, "POST", "/v1/completions",
                                {"prompt": f"x = {n * 100 + i}\n", "max_tokens": 3, "temperature": 0})
            assert status == 200

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(client, range(8)))
    served = request(serve.url, "GET", "/healthz")[1]["served"] - before
    assert served == 400
    assert wait_for(lambda: stored(db) == before + 400, timeout=60)


def test_sigterm_drains_telemetry_and_exits_zero(system):
    daemon, serve, db = system
    for _ in range(3):
        assert complete(serve.url)[0] == 200
    serve.signal(signal.SIGTERM)
    assert serve.wait() == 0
    assert stored(db) == 3


def test_serve_without_a_daemon(tmp_path, tiny_dir):
    serve = start_serve(tmp_path, tiny_dir, None)
    try:
        assert complete(serve.url)[0] == 200
        assert "daemon" not in request(serve.url, "GET", "/healthz")[1]
    finally:
        serve.stop()


def test_unreachable_daemon_at_start(tmp_path, tiny_dir):
    serve = start_serve(tmp_path, tiny_dir, f"unix:{tmp_path}/nobody.sock")
    try:
        assert complete(serve.url)[0] == 200
        assert request(serve.url, "GET", "/healthz")[1]["daemon"]["connected"] is False
    finally:
        serve.stop()



def test_the_daemons_policy_steers_the_servers_controller(tmp_path, tiny_dir):
    """A policy file limiting the drafters and K, put in force by the daemon, is what the
    server's adaptive controller obeys (after its next parameter pull)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("schema_version: 1\ndrafters: [ngram]\nk_max: 2\n")
    daemon = start_daemon(tmp_path, "--policy", str(policy))
    serve = start_serve(tmp_path, tiny_dir, daemon.url)
    try:
        for _ in range(3):
            body = complete(serve.url, max_tokens=24)[1]["autospec"]
            assert set(body["drafter_shares"]) <= {"ngram", "none"}
            assert max(int(k) for k in body["k_shares"]) <= 2
        policy.write_text("schema_version: 1\ndrafters: [draft-model]\nk_max: 3\n")
        new_hash = lambda: request(serve.url, "GET", "/healthz")[1]["policy_hash"]  # noqa: E731
        old = new_hash()
        assert wait_for(lambda: new_hash() != old, timeout=20)
        body = complete(serve.url, max_tokens=24)[1]["autospec"]
        assert set(body["drafter_shares"]) <= {"draft-model", "none"}
        assert max(int(k) for k in body["k_shares"]) <= 3
    finally:
        serve.stop()
        daemon.stop()


# -- /v1/chat/completions --------------------------------------------------------------------
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def chat_serve(tmp_path_factory, tiny_dir):
    """A daemon and a server whose target's tokenizer has a chat template."""
    from chat_models import chat_target
    tmp = tmp_path_factory.mktemp("chat-serve")
    target = chat_target(tiny_dir, tmp / "target")
    daemon = start_daemon(tmp)
    serve = start(["serve", "--port", "0", "--target", str(target), "--draft",
                   str(tiny_dir / "draft"), "--daemon", daemon.url], tmp / "serve.log",
                  env={"OMP_NUM_THREADS": "1"})
    yield serve, target, daemon
    serve.stop()
    daemon.stop()


def chat(url, **fields):
    return request(url, "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 12,
                                                         "temperature": 0, **fields})


def chat_stream(url, **fields) -> list[dict]:
    body = json.dumps({"messages": CHAT, "max_tokens": 12, "temperature": 0, "stream": True,
                       **fields}).encode()
    events = []
    with urllib.request.urlopen(urllib.request.Request(f"{url}/v1/chat/completions", body),
                                timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = [line.decode().strip()[6:] for line in r if line.startswith(b"data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_chat_stream_equals_whole_equals_the_engine(chat_serve, tiny_dir):
    from chat_models import chatml

    from autospec.engine.loop import Engine
    from autospec.models.pair import load_pair
    serve, target, daemon = chat_serve
    engine = Engine(load_pair(str(target), str(tiny_dir / "draft")))
    ids = engine.models.tokenizer.encode(chatml(CHAT), add_special_tokens=False)
    expected = engine.generate(ids, drafter=None, max_new_tokens=12).text

    # the replies are the controller's or a drafter's: near-tie rule (trained weights), on text
    def lossless(text):
        assert_lossless_text(engine.models, ids, expected, text, 12)
    status, body = chat(serve.url)
    assert status == 200 and body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert sorted(choice["message"]) == ["content", "role"]
    assert choice["message"]["role"] == "assistant"
    lossless(choice["message"]["content"])
    assert choice["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == len(ids) == body["autospec"]["prompt_tokens"]
    assert body["autospec"]["method"] == "adaptive"

    chunks = chat_stream(serve.url, autospec={"method": "static:draft-model:3", "workload": "chat"})
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    lossless("".join(c["choices"][0]["delta"].get("content", "") for c in chunks))
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]
    assert chunks[-1]["autospec"]["method"] == "static:draft-model:3"
    # the same rendered prompt through /v1/completions (as token ids): the same text
    plain = request(serve.url, "POST", "/v1/completions", {"prompt": ids, "max_tokens": 12,
                                                           "temperature": 0})[1]
    lossless(plain["choices"][0]["text"])
    # OpenAI's newer name for the limit (its reply the same but for the text, itself lossless)
    newer = chat(serve.url, max_tokens=None, max_completion_tokens=12)[1]["choices"][0]
    lossless(newer["message"].pop("content"))
    assert newer == {**choice, "message": {"role": "assistant"}}
    # telemetry reaches the daemon as for completions
    metrics = lambda: request(daemon.url, "GET", "/metrics")[1]  # noqa: E731
    assert wait_for(lambda: 'workload="chat"} 1' in metrics())


@pytest.mark.parametrize("fields, param", [
    ({"messages": None}, "messages"), ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content"),
    ({"messages": ["x"]}, "messages[0]"), ({"prompt": "x"}, "prompt"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_completion_tokens": 5}, "max_completion_tokens"),  # differs from max_tokens: 12
    ({"temperature": 3}, "temperature"), ({"tools": [{"type": "function"}]}, "tools"),
    ({"n": 2}, "n"), ({"stream": "yes"}, "stream"), ({"model": "gpt-9"}, "model"),
    ({"autospec": {"method": "static:ngarm:4"}}, "autospec.method"),
    ({"messages": [{"role": "user", "content": "x " * 3000}]}, "messages"),
])
def test_bad_chat_requests_get_openai_errors(chat_serve, fields, param):
    serve = chat_serve[0]
    status, body = chat(serve.url, **fields)
    assert status == 400 and body["error"]["param"] == param, body
    assert body["error"]["type"] == "invalid_request_error"


def test_chat_on_a_pair_without_a_template_is_a_400(shared):
    _, serve, _ = shared
    status, body = chat(serve.url)
    assert status == 400 and "has no chat template" in body["error"]["message"], body


def test_chat_to_the_reference_pair_is_refused_naming_why(reference_pair):
    """The shipped reference pair continues code and prose: a chat to it would come back as
    junk, so the server refuses it (a 400 on `messages`), and `generate --chat` too."""
    from autospec.engine.loop import Engine
    from autospec.serve import openai as api
    from autospec.serve.server import Server
    from clirun import error_line, invoke
    server = Server(Engine(reference_pair), "reference", decode_thread=False)
    request = api.parse_chat({"messages": [{"role": "user", "content": "Hi!"}]}, "reference", 512)
    with pytest.raises(api.InvalidRequest, match="not a chat model") as refused:
        server.render(request)
    assert refused.value.param == "messages"
    line = error_line(invoke(["generate", "--chat", "--prompt", "Hi!", "--pair", "reference"]))
    assert "the reference pair is not a chat model" in line and "smollm2" in line
