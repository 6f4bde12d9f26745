"""Who the suffix drafter's shared index is shared with, through the server: tenants kept
apart (`--tenant-field`), nothing shared (`--no-share`), the request fields' errors, and other
serving processes through a real daemon (`--share-outputs`).

The target is conftest's counting_llama, whose greedy output is provably a cycle: a short
request with no token twice can only draft from an earlier request's output, so its
`proposed` count says whether it saw one."""
from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from autospec.engine.loop import Engine
from autospec.models.pair import ModelPair
from autospec.serve.client import DaemonClient
from autospec.serve.server import Server
from conftest import IdTokenizer, counting_llama
from processes import batch, record, request, start_daemon

VOCAB = 12


def server(tenant_field=None, **suffix_options) -> Server:
    engine = Engine(ModelPair(counting_llama(VOCAB), IdTokenizer()), {"suffix": suffix_options})
    return Server(engine, "counting", tenant_field=tenant_field)


async def post(client: TestClient, body: dict) -> tuple[int, dict]:
    """One greedy static:suffix:4 completion."""
    extension = {"method": "static:suffix:4", **body.get("autospec", {})}
    reply = await client.post("/v1/completions", json={"temperature": 0, **body,
                                                       "autospec": extension})
    return reply.status, await reply.json()


def completions(srv: Server, bodies: list[dict]) -> list[tuple[int, dict]]:
    """POST each body in turn to the server on a loopback socket."""
    async def go():
        async with TestClient(TestServer(srv.app())) as client:
            return [await post(client, body) for body in bodies]
    return asyncio.run(go())


LONG = {"prompt": [0], "max_tokens": 30}  # the cycle, twice and more
SHORT = {"prompt": [5], "max_tokens": 10}  # 5..15 mod 12: no token twice


def proposed(reply: tuple[int, dict]) -> int:
    status, body = reply
    assert status == 200, body
    return body["autospec"]["proposed"]


def as_tenant(body: dict, tenant: str) -> dict:
    return {**body, "autospec": {"tenant": tenant}}


def test_one_index_for_all_by_default():
    replies = completions(server(), [LONG, {**SHORT, "user": "someone else"}])
    assert proposed(replies[1]) > 0  # `user` is ignored: the second drafts from the first


def test_no_share_drafts_from_the_request_only():
    replies = completions(server(share=False), [LONG, SHORT])
    assert proposed(replies[1]) == 0


@pytest.mark.parametrize("field", ["autospec.tenant", "user"])
def test_tenants_never_see_each_others_outputs(field):
    def named(body, tenant):
        return {**body, "user": tenant} if field == "user" else as_tenant(body, tenant)
    replies = completions(server(field), [named(LONG, "a"), named(SHORT, "b"),
                                          named(SHORT, "a")])
    assert proposed(replies[1]) == 0  # b: nothing of a's
    assert proposed(replies[2]) > 0  # a: its own earlier output
    assert replies[2][1]["autospec"]["accepted"] == proposed(replies[2])


@pytest.mark.parametrize("field, body, message", [
    ("autospec.tenant", SHORT, "autospec.tenant: required by this server"),
    ("autospec.tenant", {**SHORT, "autospec": {"tenant": ""}}, "a string of 1..256 characters"),
    ("user", {**SHORT, "user": 7}, "user: required by this server"),
    ("user", {**SHORT, "autospec": {"tenant": "a"}}, "reads the tenant from user"),
    (None, {**SHORT, "autospec": {"tenant": "a"}}, "--tenant-field autospec.tenant"),
])
def test_tenant_errors_name_the_field(field, body, message):
    status, reply = completions(server(field), [body])[0]
    assert status == 400 and message in reply["error"]["message"]
    assert reply["error"]["param"] in ("autospec.tenant", "user")


@pytest.mark.parametrize("args, message", [
    (["--no-share", "--tenant-field", "user"], "give one of --no-share, --tenant-field"),
    (["--share-outputs"], "it needs --daemon and not --no-share"),
    (["--share-outputs", "--daemon", "unix:/nowhere", "--no-share"], "needs --daemon and not"),
])
def test_serve_refuses_contradictory_sharing_flags(args, message):
    from click.testing import CliRunner
    from autospec.cli import main
    result = CliRunner().invoke(main, ["serve", *args])
    assert result.exit_code == 2 and message in result.output


# -- across processes, through a real daemon --------------------------------------------------
def member(daemon_url: str, share_outputs: bool = True) -> Server:
    """A serving process as the daemon sees it: its own pair object (so its own in-process
    shared indexes), its own daemon client (instance), one pair key for the fleet."""
    engine = Engine(ModelPair(counting_llama(VOCAB), IdTokenizer()))
    return Server(engine, "counting", DaemonClient(daemon_url, "counting", "cpu:test"),
                  tenant_field="autospec.tenant", share_outputs=share_outputs)


def test_outputs_reach_other_processes_by_tenant_through_the_daemon(tmp_path):
    daemon = start_daemon(tmp_path)

    async def go():
        a, b, quiet = member(daemon.url), member(daemon.url), member(daemon.url, False)
        async with TestClient(TestServer(a.app())) as at_a, \
                TestClient(TestServer(b.app())) as at_b, \
                TestClient(TestServer(quiet.app())) as at_quiet:
            assert proposed(await post(at_quiet, as_tenant(LONG, "a"))) >= 0
            assert await quiet.daemon.drain(10)
            assert await b.pull_outputs() == 0  # the quiet one sent telemetry, no outputs
            assert proposed(await post(at_a, as_tenant(LONG, "a"))) > 0
            assert await a.daemon.drain(10) and a.daemon.stats.outputs_sent == 1
            assert await a.pull_outputs() == 0  # its own are not sent back
            assert await b.pull_outputs() == 1
            assert proposed(await post(at_b, as_tenant(SHORT, "b"))) == 0  # not b's
            reply = await post(at_b, as_tenant(SHORT, "a"))
            assert proposed(reply) > 0 and reply[1]["autospec"]["accepted"] == proposed(reply)
            assert await b.pull_outputs() == 0  # nothing new
        for srv in (a, b, quiet):
            await srv.daemon.close()
    try:
        asyncio.run(go())
    finally:
        daemon.stop()


def test_the_daemons_log_once_per_batch_by_pair_and_epoch(tmp_path):
    daemon = start_daemon(tmp_path)
    try:
        outputs = {"instance": "p1", "segments": [{"tenant": None, "tokens": [1, 2, 3]},
                                                  {"tenant": "t", "tokens": [4, 5]}]}
        body = {**batch("b1", [record("r1")], model_pair="counting"), "outputs": outputs}
        for _ in range(2):  # a re-sent batch is stored, and logged, once
            assert request(daemon.url, "POST", "/v1/telemetry", body)[0] == 200
        pull = "/v1/suffix?model_pair=counting&instance=p2"
        status, reply = request(daemon.url, "GET", pull)
        assert status == 200 and reply["next"] == 2 and not reply["more"]
        assert reply["segments"] == outputs["segments"]
        since = f"{pull}&since=2&epoch={reply['epoch']}"
        assert request(daemon.url, "GET", since)[1]["segments"] == []
        # another daemon run's position means nothing here: from the start
        assert len(request(daemon.url, "GET", f"{pull}&since=2&epoch=old")[1]["segments"]) == 2
        assert request(daemon.url, "GET", pull.replace("=p2", "=p1"))[1]["segments"] == []
        other_pair = pull.replace("counting", "another")
        assert request(daemon.url, "GET", other_pair)[1]["segments"] == []
        assert request(daemon.url, "GET", f"{pull}&since=-1")[0] == 400
        bad = {**body, "batch_id": "b2", "outputs": {"instance": "p1", "segments": [
            {"tenant": None, "tokens": [1, -2]}]}}
        status, reply = request(daemon.url, "POST", "/v1/telemetry", bad)
        assert status == 400 and "outputs.segments[0].tokens" in reply["error"]
    finally:
        daemon.stop()
