"""Who the suffix drafter's shared index is shared with, through the server: tenants kept
apart (`--tenant-field`), nothing shared (`--no-share`), and the request fields' errors.

The target is test_suffix's counting model, whose greedy output is provably a cycle: a short
request with no token twice can only draft from an earlier request's output, so its
`proposed` count says whether it saw one."""
from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from autospec.engine.loop import Engine
from autospec.models.pair import ModelPair
from autospec.serve.server import Server
from conftest import IdTokenizer
from test_lossless import counting_llama

VOCAB = 12


def server(tenant_field=None, **suffix_options) -> Server:
    engine = Engine(ModelPair(counting_llama(VOCAB), IdTokenizer()), {"suffix": suffix_options})
    return Server(engine, "counting", tenant_field=tenant_field)


def completions(srv: Server, bodies: list[dict]) -> list[tuple[int, dict]]:
    """POST each body in turn (greedy, static:suffix:4) to the server on a loopback socket."""
    async def go():
        async with TestClient(TestServer(srv.app())) as client:
            replies = []
            for body in bodies:
                extension = {"method": "static:suffix:4", **body.get("autospec", {})}
                reply = await client.post("/v1/completions", json={
                    "temperature": 0, **body, "autospec": extension})
                replies.append((reply.status, await reply.json()))
            return replies
    return asyncio.run(go())


LONG = {"prompt": [0], "max_tokens": 30}  # the cycle, twice and more
SHORT = {"prompt": [5], "max_tokens": 10}  # 5..15 mod 12: no token twice


def proposed(reply: tuple[int, dict]) -> int:
    status, body = reply
    assert status == 200, body
    return body["autospec"]["proposed"]


def test_one_index_for_all_by_default():
    replies = completions(server(), [LONG, {**SHORT, "user": "someone else"}])
    assert proposed(replies[1]) > 0  # `user` is ignored: the second drafts from the first


def test_no_share_drafts_from_the_request_only():
    replies = completions(server(share=False), [LONG, SHORT])
    assert proposed(replies[1]) == 0


@pytest.mark.parametrize("field", ["autospec.tenant", "user"])
def test_tenants_never_see_each_others_outputs(field):
    def as_tenant(body, tenant):
        if field == "user":
            return {**body, "user": tenant}
        return {**body, "autospec": {"tenant": tenant}}
    replies = completions(server(field), [as_tenant(LONG, "a"), as_tenant(SHORT, "b"),
                                          as_tenant(SHORT, "a")])
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


def test_serve_refuses_no_share_with_tenants():
    from click.testing import CliRunner
    from autospec.cli import main
    result = CliRunner().invoke(main, ["serve", "--no-share", "--tenant-field", "user"])
    assert result.exit_code == 2 and "give one of --no-share, --tenant-field" in result.output
