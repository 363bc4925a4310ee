"""The policy enforced on every operation (issue 23, item 4), under the built-in default.

One test per row of the roles-by-classes table of docs/governance.md: for every service
role and every action on the row's class, the operation goes through a real kernel (as
``runtime.kernel`` builds it) against the database; what the table grants is done (and
its effect is in the database), what it does not is refused with ``PermissionDenied``
naming the principal, the action, the class and the rule, nothing is written, and the
denial is counted. The table is written out here, not read from the policy, so a change
to the default that the docs do not follow fails.

Then the doors: the saver, the memory service, HTTP (403 with a JSON body) and MCP (a tool
error), tenants, and policies given by file (``ACCORD_POLICY``, ``Accord(policy=)``).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any, TypedDict

import pytest
from fastapi.testclient import TestClient
from langchain_core.messages import HumanMessage
from langgraph.graph import START, StateGraph
from mcp import Client
from pymongo import MongoClient

from accord import runtime
from accord.checkpointers import AccordSaver, business
from accord.errors import InvalidInputError, PermissionDenied, PolicyError
from accord.memory.http_api import create_app
from accord.memory.mcp_server import create_server
from accord.memory.principals import ApiKeys
from accord.memory.principals import Principal as KeyPrincipal
from accord.platform.context import SERVICE_ROLES, Principal, ReadContext, WriteContext
from accord.platform.plan import Group, Op, OutboxEvent, Plan
from accord.runtime import Accord
from tests.test_kernel_doors import _graph

R, A, M, U, D = "runtime", "aggregator", "memory-api", "auditor", "admin"
ALL = "fiur"
MEMORY = {R: ALL, A: ALL, M: ALL, D: ALL}
#: docs/governance.md, "Roles by classes" (f find, i insert, u update, r remove)
TABLE: dict[str, dict[str, str]] = {
    "checkpoint": {R: ALL, D: ALL},
    "checkpoint_blob": {R: ALL, D: ALL},
    "checkpoint_write": {R: ALL, D: ALL},
    "checkpoint_head": {R: ALL, D: ALL},
    "short_term_memory": {R: ALL, A: "f", D: ALL},
    "run": {R: ALL, D: ALL},
    "outbox": {R: ALL, A: ALL, D: ALL},
    "long_term_memory": MEMORY,
    "memory_history": MEMORY,
    "memory_vector": MEMORY,
    "business": {R: ALL, D: ALL},
    "workflow_event": {R: "fiu", D: ALL},
    "audit": {U: "f", D: "f"},
    "catalog": {R: "fiu", A: "fiu", M: "f", D: ALL},
    "migration": {R: ALL, D: ALL},
    "policy": {R: "f", A: "f", M: "f", U: "f", D: "fiu"},
    "recorded_call": {R: ALL, D: ALL},
    "queued_run": {R: ALL, D: ALL},
    "hold": {R: "f", A: "f", M: "f", U: "f", D: ALL},
    "artifact": {R: ALL, D: ALL},
    "artifact_chunk": {R: ALL, D: ALL},
    "business_undo": {R: ALL, D: ALL},
    "encryption_key": {R: "f", A: "f", M: "f", D: ALL},
}
TENANT = "acme"


class Log(TypedDict):
    log: list[str]


KEY = "acc_" + uuid.uuid4().hex


def acting(role: str) -> Principal:
    """The principal a role acts as at its door: an API key (bound to its tenant) for the
    memory API, the OS user for admin (the CLI), the service itself otherwise."""
    if role == M:
        return Principal.api_key("table", tenant_id=TENANT, scopes=frozenset({"read", "write"}))
    if role == D:
        return Principal.os_user()
    return Principal.service(role)


def _collection(artifact: str) -> str:
    """The collections are named after their classes here; a business one is ``orders``."""
    return "orders" if artifact == "business" else artifact


def _write(uow: Any, who: Principal, db: str, artifact: str, op: Op) -> None:
    context = WriteContext(TENANT, principal=who, operation="test.table")
    uow.execute(Plan(context, [Group("g", db, _collection(artifact), artifact, [op])]))


def _do(uow: Any, who: Principal, db: str, artifact: str, action: str) -> Any:
    """``action`` on ``artifact``."""
    mine = {"tenant_id": TENANT, "_id": f"{who.role}-{action}"}
    if action == "find":
        return uow.find(ReadContext(TENANT, principal=who, operation="test.table"),
                        artifact, db, _collection(artifact), {"tenant_id": TENANT})  # fmt: skip
    if action == "insert":
        return _write(uow, who, db, artifact, Op("insert", doc={**mine, "n": 0}))
    if action == "update":
        return _write(uow, who, db, artifact,
                      Op("update", {"_id": "seed", "tenant_id": TENANT}, {"$inc": {"n": 1}}))  # fmt: skip
    return _write(uow, who, db, artifact, Op("delete", {"_id": f"{who.role}-gone",
                                                         "tenant_id": TENANT}))  # fmt: skip


@pytest.mark.parametrize("artifact", list(TABLE))
def test_roles_by_classes_row(client: MongoClient, db_name: str, artifact: str) -> None:
    uow = runtime.kernel(client)
    coll = client[db_name][_collection(artifact)]
    label = "business:orders" if artifact == "business" else artifact
    coll.insert_one({"_id": "seed", "tenant_id": TENANT, "n": 0})  # the test's own setup
    coll.insert_many([{"_id": f"{r}-gone", "tenant_id": TENANT} for r in SERVICE_ROLES])
    hook = next(h for h in uow.hooks.all if h.name == "governance-policy")
    for role in SERVICE_ROLES:
        who = acting(role)
        for action in ("find", "insert", "update", "remove"):
            granted = action[0] in TABLE[artifact].get(role, "")
            before = list(coll.find().sort("_id"))
            denials = hook.denials.total()
            if granted:
                found = _do(uow, who, db_name, artifact, action)
                if action == "find":
                    assert {d["_id"] for d in found} >= {"seed"}, (role, action)
                elif action == "insert":
                    assert coll.count_documents({"_id": f"{role}-insert"}) == 1
                elif action == "remove":
                    assert coll.count_documents({"_id": f"{role}-gone"}) == 0
                else:
                    seed = next(d for d in before if d["_id"] == "seed")
                    assert coll.find_one({"_id": "seed"})["n"] == seed["n"] + 1
                continue
            with pytest.raises(PermissionDenied) as denied:
                _do(uow, who, db_name, artifact, action)
            message = str(denied.value)
            assert f"{who.describe()} may not {action} {label} documents" in message
            assert f"policy <built-in default policy>, [classes.{artifact}] roles.{role}" in message
            assert list(coll.find().sort("_id")) == before, (role, action)  # nothing written
            assert hook.denials.total() == denials + 1
            assert hook.denials.snapshot()[(who.name, action, label)] >= 1
            assert runtime.policy_denials()[(who.name, action, label)] >= 1  # the process's


def test_the_memory_api_cannot_read_checkpoints_or_messages(
    client: MongoClient, db_name: str
) -> None:
    config = {"configurable": {"thread_id": "t1"}}
    _graph(AccordSaver(client, db_name=db_name)).invoke(
        {"messages": [HumanMessage("hi", id="h1")]}, config
    )
    api = Principal.api_key("ops", tenant_id="default", scopes=frozenset({"read", "write"}))
    kernel = runtime.kernel(client).acting_as(api)
    saver = AccordSaver(client, db_name=db_name, uow=kernel, cache_threads=0)
    # refused at the saver's first read: its layout check, through the read hook
    with pytest.raises(PermissionDenied, match=r"key:ops \(role memory-api\) may not find "
                       r"checkpoint documents \(checkpoint\.setup\.layout\)"):  # fmt: skip
        saver.get_tuple(config)
    with pytest.raises(PermissionDenied, match="may not find checkpoint"):
        list(saver.list(config))
    with pytest.raises(PermissionDenied, match="may not find short_term_memory"):
        kernel.find(ReadContext("default"), "short_term_memory", db_name, "short_term_memory",
                    {"tenant_id": "default", "thread_id": "t1"})  # fmt: skip
    # nor through a pipeline that reaches checkpoints from memories
    # (nor through any stage that brings in other documents: the tenant's $match narrows
    # the read, not what a join or union adds; a same-class $lookup returned another
    # tenant's memories, and $unionWith's string form was never checked)
    ltm = ("default", "long_term_memory")
    for stage in (
        {"$lookup": {"from": "accord_checkpoints", "localField": "thread_id",
                     "foreignField": "thread_id", "as": "state"}},
        {"$lookup": {"from": "long_term_memory", "pipeline": [], "as": "everyone"}},
        {"$unionWith": "accord_checkpoints"},
        {"$facet": {"a": [{"$unionWith": {"coll": "long_term_memory"}}]}},
    ):  # fmt: skip
        with pytest.raises(PermissionDenied, match="may not bring in other documents"):
            kernel.aggregate(ReadContext(ltm[0]), ltm[1], db_name, ltm[1], [stage])
    with pytest.raises(PermissionDenied, match=r"a read may not write \(\$out stage\)"):
        kernel.aggregate(ReadContext("default"), "long_term_memory", db_name, "long_term_memory",
                         [{"$out": "stolen"}])  # fmt: skip
    # while its own class works through the same kernel
    root = Accord(client=client, db_name=db_name)
    service = root.memory("default").acting_as(api)
    service.put(("notes",), "n1", {"text": "mine"})
    assert service.get(("notes",), "n1") is not None


def test_the_runtime_cannot_update_or_remove_audit_records(
    client: MongoClient, db_name: str
) -> None:
    audit = client[db_name].audit
    audit.insert_one({"_id": "r1", "tenant_id": TENANT, "what": "checkpoint.put"})
    uow = runtime.kernel(client)  # acts as the runtime by default
    for op in (Op("update", {"_id": "r1"}, {"$set": {"what": "nothing"}}),
               Op("replace", {"_id": "r1"}, {"tenant_id": TENANT}),
               Op("delete", {"_id": "r1"}), Op("delete_many", {})):  # fmt: skip
        with pytest.raises(PermissionDenied, match=r"^runtime may not (update|remove) audit"):
            uow.execute(Plan(WriteContext(TENANT, operation="tamper"),
                             [Group("a", db_name, "audit", "audit", [op])]))  # fmt: skip
    assert list(audit.find()) == [{"_id": "r1", "tenant_id": TENANT, "what": "checkpoint.put"}]


def test_the_auditor_reads_audit_and_nothing_else(client: MongoClient, db_name: str) -> None:
    client[db_name].audit.insert_one({"_id": "r1", "tenant_id": TENANT})
    root = Accord(client=client, db_name=db_name)  # set up by the runtime
    service = root.memory(TENANT)
    auditor = root.uow.acting_as(Principal.service(U))
    found = auditor.find(ReadContext(TENANT), "audit", db_name, "audit", {})
    assert [d["_id"] for d in found] == ["r1"]
    with pytest.raises(PermissionDenied, match="auditor may not find long_term_memory"):
        service.acting_as(Principal.service(U)).get(("notes",), "n1")
    with pytest.raises(PermissionDenied, match="auditor may not insert audit"):
        auditor.execute(
            Plan(
                WriteContext(TENANT, operation="forge"),
                [Group("a", db_name, "audit", "audit", [Op("insert", doc={"tenant_id": TENANT})])],
            )
        )
    # a saver acting as the auditor: refused its first read (the catalog or checkpoints)
    saver = AccordSaver(client, db_name=db_name, uow=auditor, cache_threads=0)
    with pytest.raises(PermissionDenied, match="auditor may not find (catalog|checkpoint) "):
        saver.get_tuple({"configurable": {"thread_id": "t1"}})


def test_a_tenants_principal_cannot_reach_another_tenant(client: MongoClient, db_name: str) -> None:
    root = Accord(client=client, db_name=db_name)
    root.memory("b").put(("notes",), "secret", {"text": "b's"})
    a = Principal.api_key("a-key", tenant_id="a", scopes=frozenset({"read", "write"}))
    with pytest.raises(PermissionDenied, match="acts for tenant 'a' only and may not read "
                       "tenant 'b'"):  # fmt: skip
        root.memory("b").acting_as(a).get(("notes",), "secret")
    with pytest.raises(PermissionDenied, match="may not (read|write) tenant 'b'"):
        root.memory("b").acting_as(a).put(("notes",), "x", {"text": "planted"})
    assert client[db_name].long_term_memory.count_documents({"key": "x"}) == 0
    # a filter naming another tenant under its own tenant's context finds nothing
    view = root.uow.acting_as(a)
    found = view.find(ReadContext("a"), "long_term_memory", db_name, "long_term_memory",
                      {"tenant_id": "b"})  # fmt: skip
    assert found == []
    assert client[db_name].long_term_memory.count_documents({"tenant_id": "b"}) == 1


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


#: the memory API may save memories but not read them back (a write-only intake key)
WRITE_ONLY_API = """\
[classes.long_term_memory.roles]
runtime = ["find", "insert", "update", "remove"]
memory-api = ["insert", "update"]
"""


def test_http_answers_403_with_a_json_body(
    client: MongoClient, mongo_uri: str, db_name: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    Accord(client=client, db_name=db_name).store().put(("notes",), "n1", {"text": "a note"})
    monkeypatch.setenv("ACCORD_POLICY", str(_policy(tmp_path, WRITE_ONLY_API)))
    keys = ApiKeys([KeyPrincipal(name="ops", tenant="default", key=KEY)])
    with TestClient(create_app(mongo_uri, keys=keys, db_name=db_name)) as api:
        got = api.get("/v1/memories/notes/n1", headers={"X-API-Key": KEY})
    assert got.status_code == 403
    body = got.json()
    assert body["error"] == "forbidden"
    assert "key:ops (role memory-api) may not find long_term_memory" in body["detail"]
    assert "roles.memory-api = ['insert', 'update']" in body["detail"]


def test_mcp_answers_a_tool_error(
    client: MongoClient, mongo_uri: str, db_name: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    Accord(client=client, db_name=db_name).store().put(("notes",), "n1", {"text": "a note"})
    monkeypatch.setenv("ACCORD_POLICY", str(_policy(tmp_path, WRITE_ONLY_API)))

    async def run() -> Any:
        server = create_server(mongo_uri, tenant_id="default", db_name=db_name)
        async with Client(server) as mcp:
            return await mcp.call_tool("get_memory", {"namespace": ["notes"], "key": "n1"})

    result = asyncio.run(run())
    assert result.is_error
    assert "mcp:default (role memory-api) may not find long_term_memory" in str(
        result.content[0].text
    )


def test_a_policy_file_holds_the_drop_in_saver_and_the_root(
    client: MongoClient, db_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the runtime may read orders but not write them: a node's business write is refused
    path = _policy(tmp_path, '[classes."business:orders"]\nroles = { runtime = ["find"] }\n')
    monkeypatch.setenv("ACCORD_POLICY", str(path))
    config = {"configurable": {"thread_id": "t1"}}
    with pytest.raises(PermissionDenied, match=r"runtime may not insert business:orders"):
        _graph(AccordSaver(client, db_name=db_name)).invoke(
            {"messages": [HumanMessage("hi", id="h1")]}, config
        )
    assert client[db_name].orders.count_documents({}) == 0
    monkeypatch.delenv("ACCORD_POLICY")
    with pytest.raises(PermissionDenied, match="business:orders"):
        _graph(Accord(client=client, db_name=db_name, policy=path).checkpointer()).invoke(
            {"messages": [HumanMessage("hi", id="h1")]}, {"configurable": {"thread_id": "t2"}}
        )
    # without it, the default lets the runtime write its business records
    _graph(Accord(client=client, db_name=db_name).checkpointer()).invoke(
        {"messages": [HumanMessage("hi", id="h1")]}, {"configurable": {"thread_id": "t3"}}
    )
    assert client[db_name].orders.count_documents({}) == 1


def test_outbox_events_need_insert_on_the_outbox(client: MongoClient, db_name: str) -> None:
    uow = runtime.kernel(client).acting_as(Principal.service(M))
    event = OutboxEvent(db_name, "outbox", "note", "default", ("k",))
    with pytest.raises(PermissionDenied, match="memory-api may not insert outbox"):
        uow.execute(Plan(WriteContext("default", operation="sneak"), [], events=[event]))
    assert client[db_name].outbox.count_documents({}) == 0
    # a tenant's principal may not enqueue work for another tenant, whatever it may insert
    bound = Principal.api_key("a", tenant_id="a", scopes=frozenset({"write"}), role=R)
    other = OutboxEvent(db_name, "outbox", "note", "b", ("k",))
    with pytest.raises(PermissionDenied, match="acts for tenant 'a' only and may not write "
                       "tenant 'b'"):  # fmt: skip
        runtime.kernel(client).acting_as(bound).execute(
            Plan(WriteContext("a", operation="sneak"), [], events=[other])
        )
    assert client[db_name].outbox.count_documents({}) == 0


def test_a_bad_policy_file_stops_every_entry_point(
    client: MongoClient, db_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _policy(tmp_path, "# ours\n[classes.audit.roles]\nruntime = ['find', 'remove']\n")
    monkeypatch.setenv("ACCORD_POLICY", str(path))
    with pytest.raises(PolicyError, match=rf"{path}:3: classes\.audit\.roles\.runtime"):
        Accord(client=client, db_name=db_name)
    with pytest.raises(PolicyError, match=rf"{path}:3: "):
        AccordSaver(client, db_name=db_name)


@pytest.mark.parametrize("target", ["accord_audit", "accord_policies", "checkpoint_heads"])
def test_business_writes_never_land_in_accords_collections(
    client: MongoClient, db_name: str, target: str
) -> None:
    """Even where no part has recorded the collection in the catalog yet (audit records
    only once the audit is on; nothing writes checkpoint heads today; policies are
    recorded by apply)."""

    def node(state: dict[str, Any]) -> dict[str, Any]:
        business.insert_one(target, {"_id": "x", "tenant_id": "default"})
        return {"log": ["x"]}

    builder = StateGraph(Log)
    builder.add_node("n", node)
    builder.add_edge(START, "n")
    graph = builder.compile(checkpointer=AccordSaver(client, db_name=db_name))
    if target.startswith("accord_"):  # the saver knows accord's accord_ names: refused first
        refused = pytest.raises(InvalidInputError, match=f"'{target}' is one of accord's own")
    else:  # the policy knows every class's collection
        refused = pytest.raises(PermissionDenied, match=f"into '{target}' .*: it is accord's")
    with refused:
        graph.invoke({"log": []}, {"configurable": {"thread_id": "t1"}})
    assert client[db_name][target].count_documents({}) == 0


def test_apply_records_the_policies_collection_in_the_catalog(
    client: MongoClient, db_name: str
) -> None:
    from accord.governance.apply import apply, plan
    from accord.governance.loading import default_policy

    uow = runtime.kernel(client, principal=Principal.os_user())
    apply(uow, plan(uow, db_name, default_policy()))
    entry = client[db_name].accord_catalog.find_one({"_id": "accord_policies"})
    assert entry is not None and entry["artifact"] == "policy"
