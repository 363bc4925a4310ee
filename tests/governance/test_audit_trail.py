"""The mutation audit (docs/governance.md, "Audit trail"), wired by ``ACCORD_AUDIT``:

- every door's writes (the checkpointer sync and async, the drop-in saver, business
  writes, the store, the aggregator, HTTP, MCP) have a record naming every document
  written, with the principal that acted, in chains that verify; the audit collection
  has its validator;
- a refused write and a refused read are recorded; a plan that writes the audit
  collections is refused (and that refusal recorded);
- tampering (a changed field, a deleted record, a removed tail, a forged record, an
  altered image in full mode), made with raw pymongo, is found by ``verify_chain`` and
  by ``accord audit verify``, naming the stream and the seq.
"""

from __future__ import annotations

import asyncio
import json
import operator
import uuid
from collections import defaultdict
from typing import Annotated, Any, TypedDict

import pytest
from fastapi.testclient import TestClient
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from mcp import Client as McpClient
from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import WriteError
from typer.testing import CliRunner

from accord import runtime
from accord.checkpointers import AccordSaver, business
from accord.errors import ConfigurationError, PermissionDenied
from accord.governance.audit_records import HEADS, RECORDS
from accord.governance.verify import verify_chain
from accord.memory.http_api import create_app
from accord.memory.mcp_server import create_server
from accord.memory.principals import ApiKeys
from accord.memory.principals import Principal as KeyPrincipal
from accord.platform import undo_log
from accord.platform.cli import app as cli
from accord.platform.context import Principal, ReadContext, WriteContext
from accord.platform.plan import Group, Op, Plan
from accord.runtime import Accord, AsyncAccord

KEY = "acc_" + uuid.uuid4().hex


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    log: Annotated[list[str], operator.add]


def _graph(saver: Any, store: Any = None) -> Any:
    def answer(state: Chat, config: RunnableConfig) -> dict[str, Any]:
        n = len(state["messages"])
        thread = config["configurable"]["thread_id"]
        business.insert_one("orders", {"_id": f"{thread}-{n}", "tenant_id": "default", "n": n})
        business.insert_one("notes", {"tenant_id": "default", "n": n})  # no _id: one is given
        return {"messages": [AIMessage("Noted.", id=f"ai-{thread}-{n}")], "log": ["answer"]}

    builder = StateGraph(Chat)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    return builder.compile(checkpointer=saver, store=store)


@pytest.fixture()
def audited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runtime.AUDIT_ENV, "metadata")


def _unrecorded(client: MongoClient, db_name: str) -> dict[str, list[Any]]:
    """Documents of the database that no applied audit record names."""
    db = client[db_name]
    named: dict[str, set[Any]] = defaultdict(set)
    for r in db[RECORDS].find({"outcome": "applied"}, {"collection": 1, "ops.doc_id": 1}):
        named[r["collection"]].update(op["doc_id"] for op in r["ops"])
    missing: dict[str, list[Any]] = {}
    for name in db.list_collection_names():
        # the undo log is written by its seal hook (before-images of the business writes,
        # which are recorded): seal groups are not audited (docs/governance.md)
        if name in (RECORDS, HEADS, undo_log.COLLECTION) or name.startswith("system."):
            continue
        lost = [d["_id"] for d in db[name].find({}, {"_id": 1}) if d["_id"] not in named[name]]
        if lost:
            missing[name] = lost
    return missing


def _verify(client: MongoClient, db_name: str, **kwargs: Any) -> Any:
    return verify_chain(runtime.kernel(client), db_name, **kwargs)


def test_every_door_is_recorded_and_the_chains_verify(
    client: MongoClient, mongo_uri: str, db_name: str, audited: None
) -> None:
    config = {"configurable": {"thread_id": "t1", "user_id": "u1"}}
    root = Accord(client=client, db_name=db_name)
    graph = _graph(root.checkpointer(), root.store())
    with root.background_aggregator() as worker:
        graph.invoke({"messages": [HumanMessage("I prefer aisle seats.", id="h1")]}, config)
        graph.invoke({"messages": [HumanMessage("Call me Ann.", id="h2")]}, config)
        assert worker.wait_idle(timeout=30)
    store = root.store()
    store.put(("notes",), "n1", {"text": "a note"})
    store.delete(("notes",), "n1")
    drop_in = _graph(AccordSaver(client, db_name=db_name))
    drop_in.invoke({"messages": [HumanMessage("hello", id="h3")]},
                   {"configurable": {"thread_id": "t2"}})  # fmt: skip

    async def run_async() -> None:
        aclient: AsyncMongoClient[Any] = AsyncMongoClient(mongo_uri)
        async with AsyncAccord(client=aclient, db_name=db_name) as aroot:
            agraph = _graph(await aroot.checkpointer(), await aroot.store())
            await agraph.ainvoke({"messages": [HumanMessage("async hi", id="h4")]},
                                 {"configurable": {"thread_id": "t3"}})  # fmt: skip
            await (await aroot.store()).aput(("notes",), "n2", {"text": "async note"})
        await aclient.close()

    asyncio.run(run_async())
    # HTTP and MCP: an API key's principal, the MCP server's
    keys = ApiKeys([KeyPrincipal(name="ops", tenant="default", key=KEY)])
    with TestClient(create_app(mongo_uri, keys=keys, db_name=db_name)) as api:
        put = api.put("/v1/memories/notes/n3", json={"value": {"text": "over http"}},
                      headers={"X-API-Key": KEY})  # fmt: skip
        assert put.status_code == 200, put.text

    async def run_mcp() -> None:
        async with McpClient(create_server(mongo_uri, tenant_id="default", db_name=db_name)) as mcp:
            result = await mcp.call_tool("save_memory", {"text": "likes tea", "key": "tea"})
            assert not result.is_error, result.content

    asyncio.run(run_mcp())

    assert _unrecorded(client, db_name) == {}
    records = client[db_name][RECORDS]
    classes = set(records.distinct("artifact"))
    assert {"checkpoint", "checkpoint_blob", "checkpoint_write", "short_term_memory",
            "business", "long_term_memory", "run", "outbox", "catalog"} <= classes, classes  # fmt: skip
    actions = set(records.distinct("action"))
    assert {"checkpoint.put", "checkpoint.put_writes", "memory.aggregate", "store.put",
            "checkpointer.setup"} <= actions, actions  # fmt: skip
    deleted = records.find_one({"action": "store.delete", "ops.op": {"$regex": "^delete"}})
    assert deleted is not None
    # a thread's writes chain in the thread's stream; a business collection has its own
    t1 = records.find_one({"thread_id": "t1", "artifact": "checkpoint"})
    assert t1["stream"] == '["default","thread","t1"]'
    assert t1["principal"] == {"name": "runtime", "role": "runtime", "kind": "service"}
    assert t1["run"]["fence"] >= 1 and t1["run"]["run_id"]
    order = records.find_one({"artifact": "business", "collection": "orders"})
    assert order["stream"] == '["default","collection","orders"]'
    assert order["ops"][0]["image_hash"] and "images" not in order  # metadata: no images
    note_ids = {d["_id"] for d in client[db_name].notes.find()}
    assert note_ids and note_ids <= set(records.distinct("ops.doc_id", {"collection": "notes"}))
    aggregated = records.find_one({"action": "memory.aggregate"})
    assert aggregated["principal"]["name"] == "aggregator"
    principals = set(records.distinct("principal.name"))
    assert {"runtime", "aggregator", "key:ops", "mcp:default"} <= principals, principals

    report = _verify(client, db_name)
    assert report.ok, report.breaks
    assert report.records == records.count_documents({})
    assert report.streams == len(records.distinct("stream"))
    # every stream's seqs run 1..n; its head names the last
    for head in client[db_name][HEADS].find():
        seqs = sorted(r["seq"] for r in records.find({"stream": head["_id"]}, {"seq": 1}))
        assert seqs == list(range(1, head["seq"] + 1))


def test_the_audit_collection_has_its_validator(
    client: MongoClient, db_name: str, audited: None
) -> None:
    Accord(client=client, db_name=db_name).checkpointer()
    info = client[db_name].command("listCollections", filter={"name": RECORDS})
    options = info["cursor"]["firstBatch"][0]["options"]
    assert "$jsonSchema" in options["validator"]
    assert options["validationLevel"] == "strict"
    with pytest.raises(WriteError) as caught:
        client[db_name][RECORDS].insert_one({"_id": "forged", "seq": "one"})
    assert caught.value.code == 121  # DocumentValidationFailure
    entry = client[db_name].accord_catalog.find_one({"_id": RECORDS})
    assert entry["component"] == "hook:audit" and entry["artifact"] == "audit"


class RefuseOrders:
    """A policy check: nobody may delete orders; analysts may not read them."""

    name = "refuse-orders"

    def check(self, plan: Plan) -> None:
        for g in plan.groups:
            if g.collection == "orders" and any(op.kind.startswith("delete") for op in g.ops):
                raise PermissionDenied("nobody may delete orders (test policy)")

    def read(self, request: Any) -> Any:
        principal = request.context.principal
        if request.collection == "orders" and principal is not None and principal.role == "analyst":
            raise PermissionDenied(f"{principal.name} may not read orders (test policy)")
        return request


def test_refused_writes_and_reads_are_recorded(client: MongoClient, db_name: str) -> None:
    uow = runtime.kernel(client, hooks=[RefuseOrders()], audit="metadata")
    ctx = WriteContext("acme", operation="orders.write")
    uow.execute(Plan(ctx, [Group("w", db_name, "orders", "business",
                                 [Op("insert", doc={"_id": "o1", "tenant_id": "acme"})])]))  # fmt: skip
    with pytest.raises(PermissionDenied, match="nobody may delete orders"):
        uow.execute(Plan(WriteContext("acme", operation="orders.purge"),
                         [Group("d", db_name, "orders", "business",
                                [Op("delete", {"_id": "o1", "tenant_id": "acme"})])]))  # fmt: skip
    assert client[db_name].orders.count_documents({}) == 1  # nothing of it was written
    analyst = Principal("user:ann", "analyst", kind="user")
    # the policy (an analyst has no role on business collections) or the test's hook
    with pytest.raises(PermissionDenied, match="may not (read|find) (business:)?orders"):
        uow.find(ReadContext("acme", principal=analyst, operation="orders.read"),
                 "business", db_name, "orders", {"tenant_id": "acme"})  # fmt: skip
    # no role may change audit records (the policy refuses first; the audit hook's own
    # append-only check stands behind it), and that refusal is recorded too
    with pytest.raises(PermissionDenied, match="append-only|may not remove audit"):
        uow.execute(Plan(WriteContext("acme", operation="cover.tracks"),
                         [Group("x", db_name, RECORDS, "audit",
                                [Op("delete_many", {"tenant_id": "acme"})])]))  # fmt: skip
    records = client[db_name][RECORDS]
    refused = list(records.find({"outcome": "refused"}).sort([("at", 1)]))
    assert [(r["action"], r["ops"][0]["op"], r["collection"]) for r in refused] == [
        ("orders.purge", "delete", "orders"),
        ("orders.read", "find", "orders"),
        ("cover.tracks", "delete_many", RECORDS),
    ]
    assert refused[0]["ops"][0]["doc_id"] == "o1" and "test policy" in refused[0]["reason"]
    assert refused[1]["principal"] == {"name": "user:ann", "role": "analyst", "kind": "user"}
    # refusals chain in the stream the write would have gone to, after the applied write
    seqs = [(r["seq"], r["outcome"]) for r in records.find({"collection": "orders"}).sort("seq")]
    assert seqs == [(1, "applied"), (2, "refused"), (3, "refused")]
    assert _verify(client, db_name).ok


def test_an_unknown_audit_mode_is_a_configuration_error(client: MongoClient) -> None:
    with pytest.raises(ConfigurationError, match="'everything'.*off, metadata, full"):
        runtime.kernel(client, audit="everything")
    assert runtime.audit_hooks("off") == [] and runtime.audit_hooks("") == []


def _writes(client: MongoClient, db_name: str, mode: str = "metadata") -> None:
    uow = runtime.kernel(client, audit=mode)
    for tenant in ("acme", "globex"):
        for i in range(10):
            uow.execute(Plan(WriteContext(tenant, operation="orders.write"), [
                Group("w", db_name, "orders", "business", [
                    Op("insert", doc={"_id": f"{tenant}-{i}", "tenant_id": tenant, "n": i}),
                    Op("update", {"_id": f"{tenant}-{i}", "tenant_id": tenant}, {"$inc": {"n": 1}}),
                ]),
            ]))  # fmt: skip


ACME = '["acme","collection","orders"]'


def test_tampering_is_found_naming_the_stream_and_seq(client: MongoClient, db_name: str) -> None:
    _writes(client, db_name)
    records = client[db_name][RECORDS]
    assert _verify(client, db_name).ok
    assert records.count_documents({"stream": ACME}) == 10

    # one field changed: that record's hash no longer matches
    records.update_one({"stream": ACME, "seq": 4}, {"$set": {"principal.name": "mallory"}})
    report = _verify(client, db_name)
    assert [(b.stream, b.seq) for b in report.breaks] == [(ACME, 4)]
    assert "altered" in report.breaks[0].problem
    assert _verify(client, db_name, tenant="globex").ok  # the other tenant's chain holds
    result = CliRunner().invoke(cli, ["audit", "verify", "--db", db_name, "--tenant", "acme"],
                                env={"MONGODB_URI": client_uri(client)})  # fmt: skip
    assert result.exit_code == 1, result.output
    assert f"stream {ACME} breaks at seq 4" in result.output
    result = CliRunner().invoke(cli, ["audit", "verify", "--db", db_name, "--tenant", "globex"],
                                env={"MONGODB_URI": client_uri(client)})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "10 audit records in 1 streams of tenant 'globex': verified" in result.output
    result = CliRunner().invoke(cli, ["audit", "verify", "--db", db_name, "--json"],
                                env={"MONGODB_URI": client_uri(client)})  # fmt: skip
    assert result.exit_code == 1, result.output
    found = json.loads(result.output)
    assert found["ok"] is False and found["records"] == 20 and found["streams"] == 2
    assert [(b["stream"], b["seq"]) for b in found["breaks"]] == [(ACME, 4)]


def client_uri(client: MongoClient) -> str:
    host, port = client.address  # type: ignore[misc]
    return f"mongodb://{host}:{port}/?directConnection=true"


def test_a_deleted_record_a_removed_tail_and_a_forged_record_are_found(
    client: MongoClient, db_name: str
) -> None:
    _writes(client, db_name)
    records = client[db_name][RECORDS]
    records.delete_one({"stream": ACME, "seq": 6})
    report = _verify(client, db_name, tenant="acme")
    assert [(b.stream, b.seq, b.problem) for b in report.breaks] == [
        (ACME, 6, "a record is missing")
    ]
    assert (report.breaks[0].expected, report.breaks[0].found) == (6, 7)

    globex = '["globex","collection","orders"]'
    records.delete_one({"stream": globex, "seq": 10})  # the tail: only the head knows
    report = _verify(client, db_name, tenant="globex")
    assert [(b.stream, b.seq) for b in report.breaks] == [(globex, 10)]  # the first missing
    assert report.breaks[0].expected == (9, records.find_one({"stream": globex, "seq": 9})["hash"])

    # a forged record whose hash is right but whose prev is not the chain's
    forged = records.find_one({"stream": globex, "seq": 3})
    forged.update(prev="f" * 64, doc_id="globex-forged")
    from accord.governance.audit_records import chain_hash

    forged["hash"] = chain_hash(forged)
    records.replace_one({"_id": forged["_id"]}, forged)
    report = _verify(client, db_name, tenant="globex")
    assert [(b.seq, b.problem) for b in report.breaks] == [
        (3, "its prev is not the previous record's hash")
    ]


def test_one_transaction_has_one_record_per_stream_action_class_and_collection(
    client: MongoClient, db_name: str
) -> None:
    """The plans of one transaction share a record where the stream, the action, the class,
    the collection, the principal and the run are the same (their ops in plan order);
    anything that differs gets its own record, and every op is named exactly once."""
    uow = runtime.kernel(client, audit="full")
    ann = Principal(name="user:ann", role="runtime", kind="user")

    def plan(
        n: int,
        operation: str = "orders.write",
        tenant: str = "acme",
        principal: Principal | None = None,
        collection: str = "orders",
    ) -> Plan:
        return Plan(WriteContext(tenant, operation=operation, principal=principal), [
            Group(f"w{n}", db_name, collection, "business", [
                Op("insert", doc={"_id": f"{tenant}-{n}", "tenant_id": tenant}),
            ]),
        ])  # fmt: skip

    uow.execute_all([
        plan(1), plan(2, "orders.fix"), plan(3), plan(4, tenant="globex"),
        plan(5, principal=ann), plan(6, collection="invoices"), plan(7),
    ])  # fmt: skip
    records = list(client[db_name][RECORDS].find({"action": {"$regex": "^orders"}}))
    assert len({r["txn"] for r in records}) == 1
    named = sorted(
        (r["stream"], r["action"], r["collection"], r["principal"]["name"],
         [op["doc_id"] for op in r["ops"]])
        for r in records
    )  # fmt: skip
    assert named == [
        ('["acme","collection","invoices"]', "orders.write", "invoices", "runtime", ["acme-6"]),
        (ACME, "orders.fix", "orders", "runtime", ["acme-2"]),
        (ACME, "orders.write", "orders", "runtime", ["acme-1", "acme-3", "acme-7"]),
        (ACME, "orders.write", "orders", "user:ann", ["acme-5"]),
        ('["globex","collection","orders"]', "orders.write", "orders", "runtime", ["globex-4"]),
    ]
    merged = next(r for r in records if len(r["ops"]) == 3)
    assert [json.loads(i["image"])["_id"] for i in merged["images"]] == [
        "acme-1",
        "acme-3",
        "acme-7",
    ]
    assert _verify(client, db_name).ok


def test_full_mode_keeps_images_and_verify_checks_them(client: MongoClient, db_name: str) -> None:
    _writes(client, db_name, mode="full")
    records = client[db_name][RECORDS]
    first = records.find_one({"stream": ACME, "seq": 1})
    inserted, updated = first["images"]
    assert inserted["image"] == '{"_id":"acme-0","n":0,"tenant_id":"acme"}'
    assert updated["change"] == '{"$inc":{"n":1}}' and updated["image"] is None
    assert [op["op"] for op in first["ops"]] == ["insert", "update"]
    assert _verify(client, db_name).ok
    # an image may be erased (the chain covers its hash, not the image) ...
    records.update_one({"_id": first["_id"]}, {"$set": {"images.0.image": None}})
    assert _verify(client, db_name).ok
    # ... but not altered
    records.update_one({"_id": first["_id"]}, {"$set": {"images.1.change": '{"$inc":{"n":100}}'}})
    report = _verify(client, db_name)
    assert [(b.stream, b.seq) for b in report.breaks] == [(ACME, 1)]
    assert "change image of its op 1" in report.breaks[0].problem


def test_wide_integers_verify_after_their_round_trip(client: MongoClient, db_name: str) -> None:
    """An ``int`` outside int32 is stored as int64 and read back as ``Int64``: the record
    hashed with the one verifies with the other (an ``_id`` of 2**40, epoch milliseconds)."""
    uow = runtime.kernel(client, audit="full")
    uow.execute(Plan(WriteContext("acme", operation="orders.write"), [
        Group("w", db_name, "orders", "business", [
            Op("insert", doc={"_id": 2**40, "tenant_id": "acme", "at_ms": 1_796_000_000_000}),
            Op("update", {"_id": 2**40, "tenant_id": "acme"}, {"$inc": {"at_ms": 2**33}}),
        ]),
    ]))  # fmt: skip
    assert _verify(client, db_name).ok


def test_a_single_op_claim_is_recorded_when_it_changes_something(
    client: MongoClient, db_name: str
) -> None:
    """A single-op plan (``transaction=False``, a lease's claim) runs in a transaction
    with its record; a claim that matched nothing leaves none."""
    client[db_name].jobs.insert_one({"_id": "j1", "tenant_id": "acme", "state": "free"})
    uow = runtime.kernel(client, audit="metadata")

    def claim() -> Any:
        op = Op(
            "find_one_and_update",
            {"_id": "j1", "tenant_id": "acme", "state": "free"},
            {"$set": {"state": "taken"}},
        )
        plan = Plan(WriteContext("acme", operation="job.claim"),
                    [Group("claim", db_name, "jobs", "business", [op])])  # fmt: skip
        return uow.execute(plan, transaction=False)

    assert claim().found["claim"][0]["state"] == "taken"
    assert claim().found["claim"] == [None]  # taken already: nothing changed
    records = list(client[db_name][RECORDS].find({"action": "job.claim"}))
    assert len(records) == 1
    assert records[0]["ops"] == [{
        "op": "find_one_and_update", "doc_id": "j1",
        "filter_hash": records[0]["ops"][0]["filter_hash"],
        "change_hash": records[0]["ops"][0]["change_hash"],
        "image_hash": records[0]["ops"][0]["image_hash"],
    }]  # fmt: skip
    from accord.governance.canonical import digest

    taken = client[db_name].jobs.find_one({"_id": "j1"})
    assert records[0]["ops"][0]["image_hash"] == digest(taken)  # the document after the op


def test_large_images_and_large_groups_stay_within_a_document(
    client: MongoClient, db_name: str
) -> None:
    """full mode keeps an image over IMAGE_LIMIT as its hash only (``omitted``); a group
    of more than OPS_PER_RECORD ops is recorded in several records of one transaction."""
    from accord.governance.audit_records import IMAGE_LIMIT, OPS_PER_RECORD

    uow = runtime.kernel(client, audit="full")
    big = {"_id": "big", "tenant_id": "acme", "blob": b"x" * IMAGE_LIMIT}
    small = {"_id": "small", "tenant_id": "acme", "n": 1}
    uow.execute(Plan(WriteContext("acme", operation="blobs.write"), [
        Group("w", db_name, "blobs", "business", [Op("insert", doc=big), Op("insert", doc=small)]),
    ]))  # fmt: skip
    record = client[db_name][RECORDS].find_one({"action": "blobs.write"})
    assert record["images"][0]["image"] is None and record["images"][0]["omitted"] == ["image"]
    assert record["images"][1]["image"] == '{"_id":"small","n":1,"tenant_id":"acme"}'
    assert record["ops"][0]["image_hash"]  # the omitted image is still covered by its hash

    n = OPS_PER_RECORD * 2 + 5
    many = [Op("insert", doc={"_id": i, "tenant_id": "acme"}) for i in range(n)]
    uow.execute(Plan(WriteContext("acme", operation="bulk.load"),
                     [Group("w", db_name, "rows", "business", many)]))  # fmt: skip
    chunks = list(client[db_name][RECORDS].find({"action": "bulk.load"}).sort("seq"))
    assert [len(r["ops"]) for r in chunks] == [OPS_PER_RECORD, OPS_PER_RECORD, 5]
    assert len({r["txn"] for r in chunks}) == 1
    assert _verify(client, db_name).ok


def test_the_async_kernel_records_writes_and_refusals_alike(
    client: MongoClient, mongo_uri: str, db_name: str
) -> None:
    async def run() -> None:
        aclient: AsyncMongoClient[Any] = AsyncMongoClient(mongo_uri)
        try:
            uow = runtime.kernel(aclient, hooks=[RefuseOrders()], audit="metadata")
            ctx = WriteContext("acme", thread_id="t9", operation="orders.write")
            for i in range(3):
                await uow.execute(Plan(ctx, [Group("w", db_name, "orders", "business", [
                    Op("insert", doc={"_id": f"a{i}", "tenant_id": "acme"})])]))  # fmt: skip
            with pytest.raises(PermissionDenied, match="nobody may delete orders"):
                await uow.execute(Plan(ctx, [Group("d", db_name, "orders", "business", [
                    Op("delete", {"_id": "a0", "tenant_id": "acme"})])]))  # fmt: skip
        finally:
            await aclient.close()

    asyncio.run(run())
    outcomes = [
        (r["seq"], r["outcome"])
        for r in client[db_name][RECORDS].find({"collection": "orders"}).sort("seq")
    ]
    assert outcomes == [(1, "applied"), (2, "applied"), (3, "applied"), (4, "refused")]
    assert _verify(client, db_name).ok
