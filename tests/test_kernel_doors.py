"""Every door goes through the kernel (issue 20's acceptance, docs/platform.md).

- A seal hook (an audit ledger's shape: one record per op, written in the same transaction)
  configured for every kernel of the process (``ACCORD_HOOKS``) sees every write of every
  door: the checkpointer (sync, async, and the drop-in ``AccordSaver(client)``), business
  writes, the store (put, delete, TTL sweep), the aggregator (memories, history, vectors),
  the HTTP API, MCP and the memory CLI. Every document in the database has its record.
- A read hook refusing a principal's reads is honoured by ``get_tuple``, ``list``, the
  store, HTTP (403 with a JSON body) and MCP (a tool error).
"""

from __future__ import annotations

import asyncio
import operator
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, TypedDict

import pytest
from fastapi.testclient import TestClient
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from mcp import Client
from pymongo import AsyncMongoClient, MongoClient
from typer.testing import CliRunner

from accord.checkpointers import AccordSaver, business
from accord.errors import PermissionDenied
from accord.memory.http_api import create_app
from accord.memory.mcp_server import create_server
from accord.memory.principals import ApiKeys
from accord.memory.principals import Principal as KeyPrincipal
from accord.platform import undo_log
from accord.platform.cli import app as cli
from accord.platform.hooks import ReadRequest, SealBatch, SealRead
from accord.platform.plan import Group, Op
from accord.runtime import Accord, AsyncAccord

LEDGER = "ledger"
KEY = "acc_" + uuid.uuid4().hex


class Ledger:
    """One record per op of every group, in the op's database, in the same transaction."""

    name = "ledger"

    def seal_reads(self, batch: SealBatch) -> Sequence[SealRead]:
        return []

    def seal(self, batch: SealBatch, found: Mapping[str, list[Any]]) -> Sequence[Group]:
        by_db: dict[str, list[Op]] = defaultdict(list)
        for plan, group in batch.groups():
            if group.collection == LEDGER:
                continue
            for op in group.ops:
                by_db[group.db].append(Op("insert", doc={
                    "collection": group.collection, "artifact": group.artifact,
                    "kind": op.kind, "id": _target(op), "operation": plan.context.operation,
                    "principal": plan.context.principal.name if plan.context.principal else None,
                }))  # fmt: skip
        return [Group(f"ledger:{db}", db, LEDGER, "audit", ops) for db, ops in by_db.items()]


def _target(op: Op) -> Any:
    if op.kind == "insert" and isinstance(op.doc, Mapping):
        return op.doc.get("_id")
    ident = (op.filter or {}).get("_id")
    return None if isinstance(ident, Mapping | list) else ident  # an operator: many ids


def ledger() -> Ledger:
    """``ACCORD_HOOKS`` factory."""
    return Ledger()


#: principals refused reads, by (principal name prefix, artifact class)
REFUSED: set[tuple[str, str]] = set()


class Refuser:
    name = "refuser"

    def read(self, request: ReadRequest) -> ReadRequest:
        who = request.context.principal.name if request.context.principal else ""
        for prefix, artifact in REFUSED:
            if who.startswith(prefix) and request.artifact == artifact:
                raise PermissionDenied(f"{who} may not read {artifact} (test policy)")
        return request


def refuser() -> Refuser:
    return Refuser()


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    log: Annotated[list[str], operator.add]


def _graph(saver: Any, store: Any = None) -> Any:
    def answer(state: Chat, config: RunnableConfig) -> dict[str, Any]:
        n = len(state["messages"])
        thread = config["configurable"]["thread_id"]
        business.insert_one("orders", {"_id": f"{thread}-{n}", "tenant_id": "default", "n": n})
        return {"messages": [AIMessage("Noted.", id=f"ai-{n}")], "log": ["answer"]}

    builder = StateGraph(Chat)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    return builder.compile(checkpointer=saver, store=store)


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "doors_" + uuid.uuid4().hex[:10]
    yield name
    client.drop_database(name)


def _missing_records(client: MongoClient, db_name: str) -> dict[str, list[Any]]:
    """Documents of the database without a ledger record of a write to them."""
    db = client[db_name]
    recorded: dict[str, set[Any]] = defaultdict(set)
    anonymous: dict[str, int] = defaultdict(int)  # inserts whose _id the server made
    for r in db[LEDGER].find():
        recorded[r["collection"]].add(r["id"])
        if r["id"] is None and r["kind"] == "insert":
            anonymous[r["collection"]] += 1
    missing: dict[str, list[Any]] = {}
    for name in db.list_collection_names():
        # the undo log is written by its seal hook, in the transaction of the business
        # writes whose before-images it records (the ledger sees those writes)
        if name in (LEDGER, "accord_catalog", undo_log.COLLECTION) or name.startswith("system."):
            continue
        ids = [d["_id"] for d in db[name].find({}, {"_id": 1})]
        lost = [i for i in ids if i not in recorded[name]]
        if len(lost) > anonymous[name]:
            missing[name] = lost
    return missing


def test_a_hook_of_every_kernel_sees_every_door(
    client: MongoClient, mongo_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCORD_HOOKS", "tests.test_kernel_doors:ledger")
    config = {"configurable": {"thread_id": "t1", "user_id": "u1"}}
    # the root, sync: checkpointer, business writes, store, aggregator
    root = Accord(client=client, db_name=db_name)
    graph = _graph(root.checkpointer(), root.store())
    with root.background_aggregator() as worker:
        graph.invoke({"messages": [HumanMessage("I prefer aisle seats.", id="h1")]}, config)
        graph.invoke({"messages": [HumanMessage("Call me Ann.", id="h2")]}, config)
        assert worker.wait_idle(timeout=30)
    store = root.store()
    store.put(("notes",), "n1", {"text": "a note"})
    store.put(("notes",), "n2", {"text": "brief"}, ttl=0.001)
    store.delete(("notes",), "n1")
    # the drop-in saver on its own
    drop_in = _graph(AccordSaver(client, db_name=db_name))
    drop_in.invoke({"messages": [HumanMessage("hello", id="h3")]},
                   {"configurable": {"thread_id": "t2"}})  # fmt: skip

    # the async root
    async def run_async() -> None:
        aclient: AsyncMongoClient[Any] = AsyncMongoClient(mongo_uri)
        async with AsyncAccord(client=aclient, db_name=db_name) as aroot:
            agraph = _graph(await aroot.checkpointer())
            await agraph.ainvoke({"messages": [HumanMessage("async hi", id="h4")]},
                                 {"configurable": {"thread_id": "t3"}})  # fmt: skip
        await aclient.close()

    asyncio.run(run_async())
    # HTTP
    keys = ApiKeys([KeyPrincipal(name="ops", tenant="default", key=KEY)])
    with TestClient(create_app(mongo_uri, keys=keys, db_name=db_name)) as api:
        put = api.put("/v1/memories/notes/n3", json={"value": {"text": "over http"}},
                      headers={"X-API-Key": KEY})  # fmt: skip
        assert put.status_code == 200, put.text

    # MCP
    async def run_mcp() -> None:
        async with Client(create_server(mongo_uri, tenant_id="default", db_name=db_name,
                                        )) as mcp:  # fmt: skip
            result = await mcp.call_tool("save_memory", {"text": "likes tea", "key": "tea"})
            assert not result.is_error, result.content

    asyncio.run(run_mcp())
    # the memory CLI: dead-letter an event, requeue it, drain it with the worker
    client[db_name].outbox.update_one({"kind": "checkpoint"}, {"$set": {"status": "dead"}})
    dead_id = client[db_name].outbox.find_one({"status": "dead"})["_id"]
    client[db_name][LEDGER].delete_many({"id": dead_id})  # the test's own write, unrecorded
    cli_env = {"MONGODB_URI": mongo_uri}
    done = CliRunner().invoke(cli, ["memory", "requeue", dead_id, "--db", db_name], env=cli_env)
    assert done.exit_code == 0, done.output
    done = CliRunner().invoke(cli, ["memory", "worker", "--db", db_name, "--drain"], env=cli_env)
    assert done.exit_code == 0, done.output

    store.sweep_ttl()  # the expired note goes (or the TTL monitor took it already)
    assert client[db_name].long_term_memory.count_documents({"key": "n2"}) == 0
    assert _missing_records(client, db_name) == {}
    ops = {r["operation"] for r in client[db_name][LEDGER].find()}
    assert {"checkpoint.put", "checkpoint.put_writes", "memory.aggregate", "store.put",
            "memory.requeue", "run.claim", "outbox.claim"} <= ops, ops  # fmt: skip
    deletes = {r["id"] for r in client[db_name][LEDGER].find({"kind": {"$regex": "^delete"}})}
    assert deletes, "the store's delete and the TTL sweep are recorded"
    principals = {r["principal"] for r in client[db_name][LEDGER].find()}
    assert {"runtime", "aggregator", "key:ops", "mcp:default"} <= principals, principals
    assert any(p.startswith("user:") for p in principals), principals  # the CLI's


def test_a_read_hook_refusal_reaches_every_door(
    client: MongoClient, mongo_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCORD_HOOKS", "tests.test_kernel_doors:refuser")
    config = {"configurable": {"thread_id": "t1"}}
    saver = AccordSaver(client, db_name=db_name)
    graph = _graph(saver)
    graph.invoke({"messages": [HumanMessage("hi", id="h1")]}, config)
    root = Accord(client=client, db_name=db_name)
    root.store().put(("notes",), "n1", {"text": "a note"})

    monkeypatch.setattr(
        "tests.test_kernel_doors.REFUSED",
        {("runtime", "checkpoint"), ("runtime", "long_term_memory"),
         ("key:", "long_term_memory"), ("mcp:", "long_term_memory")},
    )  # fmt: skip
    fresh = AccordSaver(client, db_name=db_name, cache_threads=0)  # no cached state to serve
    with pytest.raises(PermissionDenied, match="may not read checkpoint"):
        fresh.get_tuple(config)
    with pytest.raises(PermissionDenied, match="may not read checkpoint"):
        list(fresh.list(config))
    with pytest.raises(PermissionDenied, match="may not read long_term_memory"):
        root.store().get(("notes",), "n1")
    keys = ApiKeys([KeyPrincipal(name="ops", tenant="default", key=KEY)])
    with TestClient(create_app(mongo_uri, keys=keys, db_name=db_name)) as api:
        got = api.get("/v1/memories/notes/n1", headers={"X-API-Key": KEY})
        assert got.status_code == 403
        assert got.json()["error"] == "forbidden" and "test policy" in got.json()["detail"]

    async def run_mcp() -> str:
        async with Client(create_server(mongo_uri, tenant_id="default", db_name=db_name,
                                        )) as mcp:  # fmt: skip
            result = await mcp.call_tool("get_memory", {"namespace": ["notes"], "key": "n1"})
            assert result.is_error
            return str(result.content[0].text)

    assert "test policy" in asyncio.run(run_mcp())
