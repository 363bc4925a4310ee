"""The policy stored in the database is the one every process enforces (issue 23, item 2):
a part built alone (the drop-in ``AccordSaver(client)``) loads its database's applied
policy, notices a newer version without a restart, and an explicit policy (argument or
``ACCORD_POLICY``) wins over the stored one.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from pymongo import MongoClient

from accord import runtime
from accord.checkpointers import AccordSaver
from accord.errors import PermissionDenied, TaskWriteError
from accord.governance.apply import apply, plan
from accord.governance.loading import default_policy, parse_policy
from accord.platform.context import Principal, ReadContext
from tests.test_kernel_doors import _graph

ALL = '["find", "insert", "update", "remove"]'
#: the runtime may read checkpoints but no longer write them
NO_CHECKPOINTS = f'[classes.checkpoint.roles]\nruntime = ["find"]\nadmin = {ALL}\n'
REFRESH = 0.2
#: a refused checkpoint reaches the graph as itself, or inside the error of the task's
#: writes that ran from it (the saver's background commit: whichever LangGraph sees first)
REFUSED = (PermissionDenied, TaskWriteError)


@pytest.fixture(autouse=True)
def _fast_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCORD_POLICY", raising=False)
    monkeypatch.setenv("ACCORD_POLICY_REFRESH", str(REFRESH))


def _apply(client: MongoClient, db: str, text: str | None) -> int:
    admin = runtime.kernel(client, principal=Principal.os_user(), policy=default_policy())
    policy = default_policy() if text is None else parse_policy(text, f"{db}.toml")
    changes = plan(admin, db, policy)
    apply(admin, changes)
    return changes.version


def _turn(graph: Any, thread: str) -> None:
    graph.invoke({"messages": [HumanMessage("hi")], "log": []},
                 {"configurable": {"thread_id": thread}})  # fmt: skip


def test_a_saver_constructed_alone_enforces_the_policy_applied_to_its_database(
    client: MongoClient, db_name: str
) -> None:
    assert _apply(client, db_name, NO_CHECKPOINTS) == 1
    saver = AccordSaver(client, db_name=db_name)
    saver.setup()
    graph = _graph(saver)
    with pytest.raises(REFUSED) as refused:
        _turn(graph, "t-1")
    message = str(refused.value)
    assert "runtime may not insert checkpoint" in message
    assert f"policy {db_name}.accord_policies version 1" in message
    assert client[db_name].accord_checkpoints.count_documents({}) == 0
    # the same saver on another database (nothing applied there) runs under the default
    other = "stored_" + uuid.uuid4().hex[:10]
    try:
        free = AccordSaver(client, db_name=other)
        free.setup()
        _turn(_graph(free), "t-1")
        assert client[other].accord_checkpoints.count_documents({}) > 0
    finally:
        client.drop_database(other)


def test_a_running_saver_notices_a_newer_version_without_a_restart(
    client: MongoClient, db_name: str
) -> None:
    _apply(client, db_name, None)  # version 1: the default
    saver = AccordSaver(client, db_name=db_name)
    saver.setup()
    graph = _graph(saver)
    _turn(graph, "t-1")
    assert _apply(client, db_name, NO_CHECKPOINTS) == 2
    time.sleep(REFRESH * 1.5)
    with pytest.raises(REFUSED, match="version 2"):
        _turn(graph, "t-2")
    assert _apply(client, db_name, None) == 3  # the default again
    time.sleep(REFRESH * 1.5)
    _turn(graph, "t-3")
    threads = client[db_name].accord_checkpoints.distinct("thread_id")
    assert sorted(threads) == ["t-1", "t-3"]


def test_the_stored_policy_is_read_through_the_kernel_at_most_every_interval(
    client: MongoClient, db_name: str
) -> None:
    _apply(client, db_name, NO_CHECKPOINTS)
    uow = runtime.kernel(client, policy_refresh=60)
    hook = next(h for h in uow.hooks.all if h.name == "governance-policy")
    reads: list[str] = []

    class Spy:  # a read hook sees every read the kernel makes, the refresh included
        name = "spy"

        def read(self, request: Any) -> Any:
            reads.append(request.context.operation)
            return request

    uow.register(Spy())
    for _ in range(5):
        uow.find(ReadContext("default", operation="test"), "checkpoint", db_name,
                 "accord_checkpoints", {})  # fmt: skip
    assert reads.count("governance.policy_refresh") == 1 and reads.count("test") == 5
    assert hook.stored.version(db_name) == 1
    assert hook.rules(db_name).policy.classes["checkpoint"].roles["runtime"] == {"find"}


def test_an_explicit_policy_wins_over_the_stored_one(
    client: MongoClient, db_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _apply(client, db_name, NO_CHECKPOINTS)
    app = runtime.Accord(client=client, db_name=db_name, policy=default_policy())
    _turn(_graph(app.checkpointer()), "t-1")  # the argument: the default, not the stored
    path = tmp_path / "policy.toml"
    path.write_text("version = 1\n")  # the default, as a file
    monkeypatch.setenv("ACCORD_POLICY", str(path))
    saver = AccordSaver(client, db_name=db_name)
    saver.setup()
    _turn(_graph(saver), "t-2")
    assert sorted(client[db_name].accord_checkpoints.distinct("thread_id")) == ["t-1", "t-2"]


def test_a_tenant_bound_principal_loads_the_stored_policy_too(
    client: MongoClient, db_name: str
) -> None:
    _apply(client, db_name, NO_CHECKPOINTS)
    key = Principal.api_key("k1", tenant_id="acme", scopes=frozenset({"read"}))
    uow = runtime.kernel(client).acting_as(key)
    uow.find(ReadContext("acme", operation="test"), "long_term_memory", db_name,
             "long_term_memory", {})  # fmt: skip
    hook = next(h for h in uow.hooks.all if h.name == "governance-policy")
    assert hook.stored.version(db_name) == 1


async def _async_turn(client_uri: str, db: str) -> None:
    from pymongo import AsyncMongoClient

    from accord.checkpointers import AsyncAccordSaver

    async_client: AsyncMongoClient[Any] = AsyncMongoClient(client_uri)
    try:
        saver = AsyncAccordSaver(async_client, db_name=db)
        await saver.setup()
        await _graph(saver).ainvoke({"messages": [HumanMessage("hi")], "log": []},
                                    {"configurable": {"thread_id": "t-async"}})  # fmt: skip
    finally:
        await async_client.close()


def test_an_async_saver_constructed_alone_enforces_it_too(
    client: MongoClient, mongo_uri: str, db_name: str
) -> None:
    import asyncio

    _apply(client, db_name, NO_CHECKPOINTS)
    with pytest.raises(REFUSED, match=f"policy {db_name}.accord_policies version 1"):
        asyncio.run(_async_turn(mongo_uri, db_name))


WRITE_ONLY_API = """\
[classes.long_term_memory.roles]
runtime = ["find", "insert", "update", "remove"]
memory-api = ["insert", "update"]
"""


def test_the_http_api_enforces_the_stored_policy(
    client: MongoClient, mongo_uri: str, db_name: str
) -> None:
    from fastapi.testclient import TestClient

    from accord.memory.http_api import create_app
    from accord.memory.principals import ApiKeys
    from accord.memory.principals import Principal as KeyPrincipal

    runtime.Accord(client=client, db_name=db_name).store().put(("notes",), "n1", {"text": "x"})
    key = "acc_" + uuid.uuid4().hex
    keys = ApiKeys([KeyPrincipal(name="ops", tenant="default", key=key)])
    with TestClient(create_app(mongo_uri, keys=keys, db_name=db_name)) as api:
        assert api.get("/v1/memories/notes/n1", headers={"X-API-Key": key}).status_code == 200
        _apply(client, db_name, WRITE_ONLY_API)  # applied while the API runs
        time.sleep(REFRESH * 1.5)
        got = api.get("/v1/memories/notes/n1", headers={"X-API-Key": key})
    assert got.status_code == 403
    assert f"policy {db_name}.accord_policies version 1" in got.json()["detail"]


def test_the_mcp_server_enforces_the_stored_policy(
    client: MongoClient, mongo_uri: str, db_name: str
) -> None:
    import asyncio

    from mcp import Client

    from accord.memory.mcp_server import create_server

    runtime.Accord(client=client, db_name=db_name).store().put(("notes",), "n1", {"text": "x"})
    _apply(client, db_name, WRITE_ONLY_API)

    async def run() -> Any:
        server = create_server(mongo_uri, tenant_id="default", db_name=db_name)
        async with Client(server) as mcp:
            return await mcp.call_tool("get_memory", {"namespace": ["notes"], "key": "n1"})

    result = asyncio.run(run())
    assert result.is_error
    text = str(result.content[0].text)
    assert "mcp:default (role memory-api) may not find long_term_memory" in text
    assert f"{db_name}.accord_policies version 1" in text


#: the aggregator may no longer read messages
NO_AGGREGATOR_READS = f"[classes.short_term_memory.roles]\nruntime = {ALL}\nadmin = {ALL}\n"


def test_the_aggregator_worker_enforces_the_stored_policy(
    client: MongoClient, db_name: str
) -> None:
    _apply(client, db_name, NO_AGGREGATOR_READS)
    app = runtime.Accord(client=client, db_name=db_name)
    aggregator = app.aggregator()  # a consumer: the saver now writes outbox events
    _turn(_graph(app.checkpointer()), "t-1")
    key = ("aggregator", "find", "short_term_memory")
    before = runtime.policy_denials().get(key, 0)
    aggregator.drain()
    assert runtime.policy_denials().get(key, 0) > before
    assert client[db_name].long_term_memory.count_documents({}) == 0
