"""`autospec serve` driven by the client people use: the `openai` Python SDK, against a real
server process on loopback with API keys (tiny pair, a chat template on its target)."""
from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import assert_lossless_text
from processes import request, sample, scrape, start

openai = pytest.importorskip("openai")

CHAT = [{"role": "user", "content": "def add(a, b):"}]
PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_dir):
    from chat_models import chat_target
    tmp = tmp_path_factory.mktemp("sdk")
    target = chat_target(tiny_dir, tmp / "target")
    keys = tmp / "keys"
    keys.write_text("# one key a line\nkey-one\n")
    serve = start(["serve", "--port", "0", "--target", str(target), "--draft",
                   str(tiny_dir / "draft"), "--api-key-file", str(keys), "--max-batch", "1",
                   "--max-queue", "1", "--model-name", "tiny"], tmp / "serve.log",
                  env={"OMP_NUM_THREADS": "1", "AUTOSPEC_API_KEY": "key-env"})
    yield serve, target, keys
    serve.stop()


def client(serve, key="key-one", **options):
    return openai.OpenAI(base_url=f"{serve.url}/v1", api_key=key, **options)


def test_completions_and_chat_through_the_sdk_equal_the_engine(served, tiny_dir):
    from chat_models import chatml

    from autospec.engine.loop import Engine
    from autospec.models.pair import load_pair
    serve, target, _ = served
    engine = Engine(load_pair(str(target), str(tiny_dir / "draft")))
    sdk = client(serve)
    # the server's controller against plain decoding here: the near-tie rule (trained
    # weights), on the text (the tokens stay in the server)
    want = engine.generate(PROMPT, drafter=None, max_new_tokens=12).text
    got = sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    assert_lossless_text(engine.models, PROMPT, want, got.choices[0].text, 12)
    streamed = sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                      stream=True)
    assert_lossless_text(engine.models, PROMPT, want,
                         "".join(c.choices[0].text for c in streamed), 12)
    ids = engine.models.tokenizer.encode(chatml(CHAT), add_special_tokens=False)
    want = engine.generate(ids, drafter=None, max_new_tokens=12).text
    reply = sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, temperature=0)
    assert_lossless_text(engine.models, ids, want, reply.choices[0].message.content, 12)
    chunks = sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12,
                                         temperature=0, stream=True)
    assert_lossless_text(engine.models, ids, want,
                         "".join(c.choices[0].delta.content or "" for c in chunks), 12)


def test_a_missing_or_wrong_key_is_a_401_and_health_stays_open(served):
    serve, _, _ = served
    with pytest.raises(openai.AuthenticationError, match="missing or wrong API key"):
        client(serve, "wrong").completions.create(model="tiny", prompt="x", max_tokens=2)
    assert client(serve, "key-env").completions.create(model="tiny", prompt="x", max_tokens=2)
    assert request(serve.url, "GET", "/healthz")[0] == 200
    status, body = request(serve.url, "GET", "/v1/models")  # no Authorization at all
    assert status == 401 and body["error"]["type"] == "authentication_error"


def test_a_bad_field_is_a_bad_request_naming_it(served):
    serve, _, _ = served
    with pytest.raises(openai.BadRequestError, match="max_tokens") as caught:
        client(serve).completions.create(model="tiny", prompt="x", max_tokens=-3)
    assert caught.value.body["param"] == "max_tokens"


def test_a_key_is_rotated_by_editing_the_file(served):
    serve, _, keys = served
    with pytest.raises(openai.AuthenticationError):
        client(serve, "key-two").completions.create(model="tiny", prompt="x", max_tokens=2)
    keys.write_text("key-one\nkey-two\n")
    assert client(serve, "key-two").completions.create(model="tiny", prompt="x", max_tokens=2)
    keys.write_text("key-two\n")
    with pytest.raises(openai.AuthenticationError):
        client(serve, "key-one").completions.create(model="tiny", prompt="x", max_tokens=2)
    keys.write_text("key-one\n")


def test_a_full_queue_is_a_429_the_sdk_retries(served):
    """One row, one queue place: of six requests sent at once, two are taken (the row, the
    queue place, whether or not the decode thread has admitted the first when the others
    arrive) and the others refused with Retry-After while those run; the SDK (its own retries
    off) raises RateLimitError, and with retries on gets through once a place frees."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    serve, _, _ = served
    once = client(serve, max_retries=0)
    # plain decoding, the slowest: a request holds its place for hundreds of steps, while the
    # six, released together, arrive within milliseconds of each other
    long = dict(model="tiny", prompt=PROMPT, max_tokens=300, temperature=0,
                extra_body={"autospec": {"method": "plain"}})
    start = threading.Barrier(6)

    def send():
        start.wait()
        try:
            return once.completions.create(**long)
        except openai.RateLimitError as exc:
            return exc

    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(lambda _: send(), range(6)))
    refused = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    served_ = [o for o in outcomes if not isinstance(o, openai.RateLimitError)]
    assert refused and len(served_) == 2, outcomes
    assert all(int(exc.response.headers["Retry-After"]) >= 1 for exc in refused)
    assert all(len(o.choices[0].text) for o in served_)
    patient = client(serve, max_retries=8)
    assert patient.completions.create(model="tiny", prompt="x", max_tokens=2).choices


def test_off_loopback_without_a_key_is_refused_at_start(tiny_dir):
    result = subprocess.run([sys.executable, "-m", "autospec", "serve", "--host", "0.0.0.0",
                             "--target", str(tiny_dir / "target")], capture_output=True,
                            text=True, timeout=120, env={"PATH": "/usr/bin:/bin",
                                                         "HOME": str(tiny_dir)})
    assert result.returncode == 2
    assert "--api-key" in result.stderr and "0.0.0.0" in result.stderr


def test_stop_through_the_sdk_streamed_and_not(served, tiny_dir):
    """A stop string taken from the middle of the plain output: both responses end right
    before it, with finish_reason stop; the stream never shows a piece of it."""
    from autospec.engine.loop import Engine
    from autospec.models.pair import load_pair
    serve, target, _ = served
    pair = load_pair(str(target), str(tiny_dir / "draft"))
    full = Engine(pair).generate(PROMPT, drafter=None, max_new_tokens=24).text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    want = full[:full.find(stop)]
    sdk = client(serve)
    for method in ("plain", "static:ngram:4"):  # a stop inside one step's accepted drafts too
        extra = {"autospec": {"method": method}}
        got = sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0,
                                     stop=[stop, "never seen"], extra_body=extra)
        chunks = list(sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=24,
                                             temperature=0, stop=stop, stream=True,
                                             extra_body=extra))
        texts = [(got.choices[0].text, got.choices[0].finish_reason),
                 ("".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason)]
        if method == "plain":  # plain here and there: exact
            assert texts == [(want, "stop")] * 2
            continue
        # speculative: the near-tie rule (trained weights); where the text is plain's, the stop
        # cut it there
        for text, reason in texts:
            if text == want:
                assert reason == "stop"
            else:
                assert_lossless_text(pair, PROMPT, want, text, 24)


def test_logprobs_through_the_sdk_streamed_and_not(served, tiny_dir):
    """completions' logprobs=2 and chat's logprobs + top_logprobs=2, whole and streamed, plain
    and speculative: a token per piece of the text (their texts joined are the text, cut at a
    stop too), each logprob the engine's own; a bad value is a 400 naming the field."""
    from chat_models import chatml

    from autospec.engine.loop import Engine
    from autospec.models.pair import load_pair
    serve, target, _ = served
    engine = Engine(load_pair(str(target), str(tiny_dir / "draft")))
    request = engine.start(PROMPT, 12, logprobs=2)
    while not request.done:
        engine.step(request, None, 0)
    want = engine.finish(request)
    sdk = client(serve)
    for method in ("plain", "static:ngram:4"):
        extra = {"autospec": {"method": method}}
        got = sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                     logprobs=2, extra_body=extra).choices[0]
        assert "".join(got.logprobs.tokens) == got.text
        if method == "plain" or got.text == want.text:
            assert got.text == want.text
            assert got.logprobs.token_logprobs == pytest.approx(
                [e.logprob for e in want.logprobs], abs=1e-4)
        else:  # parted from plain at a near-tie (trained weights): other tokens' logprobs
            assert_lossless_text(engine.models, PROMPT, want.text, got.text, 12)
        assert all(len(top) <= 2 for top in got.logprobs.top_logprobs)
        chunks = list(sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=12,
                                             temperature=0, logprobs=2, stream=True,
                                             extra_body=extra))
        streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
        assert streamed == got.logprobs.tokens
    stop = want.text[len(want.text) // 2:len(want.text) // 2 + 2]
    cut = sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                 logprobs=0, stop=stop).choices[0]
    joined = "".join(cut.logprobs.tokens)
    assert joined.startswith(cut.text) and len(joined) < len(cut.text) + len(want.text) // 2 + 3
    assert cut.logprobs.top_logprobs is None
    reply = sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, temperature=0,
                                        logprobs=True, top_logprobs=2).choices[0]
    content = reply.logprobs.content
    assert "".join(t.token for t in content) == reply.message.content
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in content)
    ids = engine.models.tokenizer.encode(chatml(CHAT), add_special_tokens=False)
    plain = engine.generate(ids, drafter=None, max_new_tokens=12).text
    assert_lossless_text(engine.models, ids, plain, reply.message.content, 12)
    chunks = sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12,
                                         temperature=0, logprobs=True, stream=True)
    streamed = [t.token for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    if "".join(streamed) == reply.message.content:
        assert streamed == [t.token for t in content]
    else:  # the controller's K differed, and one of the two parted from plain at a near-tie
        assert_lossless_text(engine.models, ids, plain, "".join(streamed), 12)
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(model="tiny", prompt="x", max_tokens=2, logprobs=6)
    assert caught.value.body["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, top_logprobs=2)
    assert caught.value.body["param"] == "top_logprobs"


def test_metrics_are_served_open_and_count_what_happened(served):
    """Run last in this module: the requests above, refusals included, are in the counts."""
    serve, _, _ = served
    scraped = scrape(serve.url)  # no key: open, like /healthz
    m = {"model": "tiny"}
    assert sample(scraped, "autospec_serve_requests_total", **m, finish_reason="stop") > 0
    for reason in ("unauthorized", "queue_full", "bad_request"):
        assert sample(scraped, "autospec_serve_refused_total", **m, reason=reason) > 0, reason
    assert sample(scraped, "autospec_serve_draft_tokens_total", **m, drafter="ngram",
                  result="accepted") > 0
    assert sample(scraped, "autospec_serve_queue_depth", **m) == 0
    assert sample(scraped, "autospec_serve_batch_rows_max", **m) == 1
    assert sample(scraped, "autospec_serve_time_to_first_token_seconds_count") >= 10
    assert sample(scraped, "autospec_serve_chunk_gap_seconds_bucket", le="+Inf") > 0
