"""Data subjects (issue 24, item 5; docs/governance.md, "Data subjects"): export and
erasure of everything accord holds about one subject, through the kernel.

The scenario: two users (``u-7`` the subject, ``u-8`` another) each chat on a thread of
their own through a graph whose node stages a business record and a workflow event
naming its user; the aggregator derives their memories; the audit trail is in ``full``
mode (images kept). Then:

- the export holds each class, with a manifest whose counts and SHA-256s are right;
- after erasing ``u-7``: no document of any collection of the database holds its id or
  its words; ``u-8``'s data is all there; the audit chains verify (``verify_chain`` and
  ``accord audit verify --live``); the erasure is recorded; vector search no longer
  finds its memories;
- a held subject is refused (naming the hold) and nothing changed;
- bad identifiers are refused before anything is read.
"""

from __future__ import annotations

import json
import operator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from bson import json_util
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from pymongo import MongoClient
from typer.testing import CliRunner

from accord import runtime
from accord.checkpointers import business
from accord.checkpointers.recorded import recorded_call
from accord.errors import InvalidInputError, PermissionDenied, SubjectHeld
from accord.governance.audit_records import RECORDS
from accord.governance.holding import place, release
from accord.governance.holds import Hold
from accord.governance.loading import parse_policy
from accord.governance.redaction import ERASE_OPERATION, erased_images, image_erasure_op
from accord.governance.verify import verify_chain
from accord.platform.cli import app as cli
from accord.platform.context import Principal, WriteContext
from accord.platform.plan import Group, Op, Plan
from accord.runtime import Accord

SUBJECT = "u-7"
OTHER = "u-8"
#: words only the subject said (its content)
SECRET = "Zanzibar"
ALL = '["find", "insert", "update", "remove"]'
POLICY = (
    f'[classes."business:orders"]\nsubject_fields = ["user_id"]\n'
    f"roles = {{ runtime = {ALL}, admin = {ALL} }}\n"
)


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    log: Annotated[list[str], operator.add]


def _lookup(user: str, words: str) -> str:
    return f"profile of {user}: {words}"


def _graph(saver: Any) -> Any:
    def answer(state: Chat, config: RunnableConfig) -> dict[str, Any]:
        conf = config["configurable"]
        user, thread, n = conf["user_id"], conf["thread_id"], len(state["messages"])
        business.insert_one("orders", {"_id": f"order-{thread}-{n}", "tenant_id": "default",
                                       "user_id": user, "item": f"{state['messages'][-1].content}"})  # fmt: skip
        business.append_event("checkout", {"user_id": user, "step": n})
        recorded_call(_lookup, user, str(state["messages"][-1].content))  # a tool's result
        # a file the step produced, by pointer (GridFS's layout): it names the subject too
        saver.put_artifact(config, f"receipt of {user}: {state['messages'][-1].content}".encode())
        return {"messages": [AIMessage("Noted.", id=f"ai-{thread}-{n}")], "log": ["answer"]}

    builder = StateGraph(Chat)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    return builder.compile(checkpointer=saver)


@pytest.fixture()
def policy_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    monkeypatch.setenv("ACCORD_POLICY", str(path))
    monkeypatch.setenv(runtime.AUDIT_ENV, "full")
    return path


def _populate(client: MongoClient, db_name: str) -> None:
    root = Accord(client=client, db_name=db_name)
    graph = _graph(root.checkpointer())
    with root.background_aggregator() as worker:
        for user, thread, words in (
            (SUBJECT, "chat-a", f"I live in {SECRET} and I prefer aisle seats."),
            (OTHER, "chat-b", "I live in Oslo and I prefer window seats."),
        ):
            config = {"configurable": {"thread_id": thread, "user_id": user}}
            graph.invoke({"messages": [HumanMessage(words, id=f"h-{thread}")]}, config)
            graph.invoke({"messages": [HumanMessage("Call me later.", id=f"h2-{thread}")]},
                         config)  # fmt: skip
        assert worker.wait_idle(timeout=60)
    store = root.store()
    store.put(("memories", SUBJECT), "diet", {"text": f"eats {SECRET} pepper"})
    store.put(("memories", OTHER), "diet", {"text": "eats Oslo pepper"})


def _mentions(client: MongoClient, db_name: str, needle: str) -> dict[str, int]:
    """Documents of each collection whose bytes (BSON as stored: strings and binary
    values, serialized checkpoints and messages included) hold ``needle``."""
    found: dict[str, int] = {}
    raw: CodecOptions[RawBSONDocument] = CodecOptions(document_class=RawBSONDocument)
    db = client.get_database(db_name, codec_options=raw)
    for name in db.list_collection_names():
        for doc in db[name].find():
            if needle.encode() in doc.raw:
                found[name] = found.get(name, 0) + 1
    return found


def _counts(client: MongoClient, db_name: str) -> dict[str, int]:
    db = client[db_name]
    return {n: db[n].count_documents({}) for n in sorted(db.list_collection_names())}


def test_export_holds_each_class_with_a_manifest(
    client: MongoClient, mongo_uri: str, db_name: str, policy_file: Path, tmp_path: Path
) -> None:
    _populate(client, db_name)
    out = tmp_path / "export"
    result = CliRunner().invoke(cli, ["governance", "export-subject", SUBJECT, "--out", str(out),
                                      "--db", db_name, "--uri", mongo_uri])  # fmt: skip
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    files = manifest["files"]
    by_class = {f["class"]: f for f in files.values()}
    for name in ("checkpoint", "checkpoint_blob", "checkpoint_write", "short_term_memory",
                 "long_term_memory", "memory_history", "business:orders", "workflow_event",
                 "outbox"):  # fmt: skip
        assert name in by_class, sorted(by_class)
    for name in ("checkpoint", "checkpoint_blob", "short_term_memory", "long_term_memory",
                 "business:orders", "workflow_event", "recorded_call", "artifact",
                 "artifact_chunk"):  # fmt: skip
        assert by_class[name]["documents"] > 0, name
    assert manifest["threads"] == [{"tenant_id": "default", "thread_id": "chat-a"}]
    import hashlib

    for file_name, entry in files.items():
        data = (out / file_name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert len(data.splitlines()) == entry["documents"]
        assert OTHER.encode() not in data and b"Oslo" not in data  # only the subject's
    text = b"".join((out / f).read_bytes() for f in files)
    assert SECRET.encode() in text  # its memory, its order, its message summary
    orders = [
        json_util.loads(line) for line in (out / "business-orders.jsonl").read_text().splitlines()
    ]
    assert {o["user_id"] for o in orders} == {SUBJECT} and len(orders) == 2
    # an existing, non-empty directory is refused
    again = CliRunner().invoke(cli, ["governance", "export-subject", SUBJECT, "--out", str(out),
                                     "--db", db_name, "--uri", mongo_uri])  # fmt: skip
    assert again.exit_code == 2 and "not an empty directory" in again.output


def test_erasure_leaves_no_trace_and_the_chain_verifies(
    client: MongoClient, mongo_uri: str, db_name: str, policy_file: Path, tmp_path: Path
) -> None:
    _populate(client, db_name)
    assert _mentions(client, db_name, SUBJECT) and _mentions(client, db_name, SECRET)
    assert client[db_name][RECORDS].count_documents({"images": {"$exists": True}}) > 0
    other_before = _mentions(client, db_name, OTHER)
    assert other_before

    result = CliRunner().invoke(
        cli, ["governance", "erase", SUBJECT, "--yes", "--db", db_name, "--uri", mongo_uri]
    )
    assert result.exit_code == 0, result.output
    assert "erased 1 thread(s)" in result.output

    assert _mentions(client, db_name, SUBJECT) == {}
    assert _mentions(client, db_name, SECRET) == {}
    # the other subject's data is all there
    assert _mentions(client, db_name, OTHER) == other_before
    db = client[db_name]
    assert db.accord_checkpoints.count_documents({"thread_id": "chat-b"}) > 0
    assert db.accord_checkpoints.count_documents({"thread_id": "chat-a"}) == 0
    for name in ("accord_checkpoint_blobs", "accord_checkpoint_writes", "short_term_memory",
                 "runs", "checkpoint_heads", "accord_recorded_calls", "accord_artifacts.files",
                 "accord_artifacts.chunks", "accord_business_undo"):  # fmt: skip
        assert db[name].count_documents({"thread_id": "chat-a"}) == 0, name
    assert db["accord_artifacts.files"].count_documents({"thread_id": "chat-b"}) == 2
    # the audit chains verify, live and from the CLI
    report = verify_chain(runtime.kernel(client, principal=Principal.service("auditor")), db_name)
    assert report.ok, report.breaks
    live = CliRunner().invoke(
        cli, ["audit", "verify", "--live", "--db", db_name, "--uri", mongo_uri]
    )
    assert live.exit_code == 0, live.output
    # a digest and a compliance export taken after the erasure verify without the database
    runner = CliRunner()
    digest = runner.invoke(cli, ["audit", "digest", "--db", db_name, "--uri", mongo_uri,
                                 "--out", str(tmp_path / "d.json")])  # fmt: skip
    assert digest.exit_code == 0, digest.output
    exported = runner.invoke(cli, ["audit", "export", "--tenant", "default", "--db", db_name,
                                   "--uri", mongo_uri, "--out", str(tmp_path / "audit")])  # fmt: skip
    assert exported.exit_code == 0, exported.output
    checked = runner.invoke(cli, ["audit", "verify", str(tmp_path / "audit"), "--digest",
                                  str(tmp_path / "d.json")])  # fmt: skip
    assert checked.exit_code == 0, checked.output
    assert SUBJECT.encode() not in b"".join(
        f.read_bytes() for f in (tmp_path / "audit").iterdir() if f.is_file()
    )
    # the erasure is recorded, by whom, and its records keep no image of the subject
    erase_records = list(db[RECORDS].find({"action": "governance.erase"}))
    assert erase_records and {r["principal"]["role"] for r in erase_records} == {"admin"}
    erased = db[RECORDS].count_documents({"images.erased": {"$exists": True}})
    assert erased > 0
    # vector search finds the other's memory and not the subject's
    memory = Accord(client=client, db_name=db_name).memory("default")
    hits = memory.search(("memories",), query="pepper", include_unscored=False)
    assert hits and all(SUBJECT not in h.namespace for h in hits)
    assert db.memory_vectors.count_documents({}) == db.memory_vectors.count_documents(
        {"memory_id": {"$in": [m["_id"] for m in db.long_term_memory.find()]}}
    )
    # a second erasure finds nothing and changes nothing
    again = runtime.erase_subject_data(client, SUBJECT, db_name, compact=False)
    assert again.threads == 0 and not any(again.deleted.values())


def test_a_held_subject_is_refused_and_nothing_changes(
    client: MongoClient, mongo_uri: str, db_name: str, policy_file: Path
) -> None:
    _populate(client, db_name)
    admin = runtime.kernel(client, principal=Principal.os_user())
    policy = runtime.effective_policy(admin, db_name)
    hold = Hold("subject", SUBJECT, reason="case 2026-17")
    place(admin, db_name, hold, policy)
    before = _counts(client, db_name)
    result = CliRunner().invoke(
        cli, ["governance", "erase", SUBJECT, "--yes", "--db", db_name, "--uri", mongo_uri]
    )
    assert result.exit_code == 1
    assert "legal hold" in result.output and "case 2026-17" in result.output
    with pytest.raises(SubjectHeld, match=r"subject 'u-7'.*case 2026-17"):
        runtime.erase_subject_data(client, SUBJECT, db_name, compact=False)
    assert _counts(client, db_name) == before
    # a thread hold on one of its threads refuses it too
    release(admin, db_name, hold, policy)
    thread_hold = Hold("thread", "chat-a", tenant_id="default", reason="litigation")
    place(admin, db_name, thread_hold, policy)
    before = _counts(client, db_name)
    with pytest.raises(SubjectHeld, match="thread 'chat-a'"):
        runtime.erase_subject_data(client, SUBJECT, db_name, compact=False)
    assert _counts(client, db_name) == before
    release(admin, db_name, thread_hold, policy)
    report = runtime.erase_subject_data(client, SUBJECT, db_name, compact=False)
    assert report.threads == 1 and _mentions(client, db_name, SECRET) == {}
    # what stays is the record of the legal hold itself (its id names the subject, in
    # the hashed body of the records of the hold's placement and release)
    assert _mentions(client, db_name, SUBJECT) == {RECORDS: 2}
    held = [r for r in client[db_name][RECORDS].find() if SUBJECT in json_util.dumps(r)]
    assert {r["artifact"] for r in held} == {"hold"}


def test_an_erasure_is_refused_where_another_subjects_hold_covers_what_it_deletes(
    client: MongoClient, db_name: str, policy_file: Path
) -> None:
    """A thread both subjects are in goes whole: a hold on the other refuses it (as it
    refuses delete_thread); class holds on the audit trail or the keys refuse every
    erasure (it erases images and destroys keys)."""
    _populate(client, db_name)
    graph = _graph(Accord(client=client, db_name=db_name).checkpointer())
    shared = {"configurable": {"thread_id": "chat-a", "user_id": OTHER}}
    graph.invoke({"messages": [HumanMessage("Me too.", id="h3-chat-a")]}, shared)
    admin = runtime.kernel(client, principal=Principal.os_user())
    policy = runtime.effective_policy(admin, db_name)
    for hold in (Hold("subject", OTHER, reason="case 8"), Hold("class", "audit", reason="case 8"),
                 Hold("class", "encryption_key", reason="case 8")):  # fmt: skip
        place(admin, db_name, hold, policy)
        before = _counts(client, db_name)
        with pytest.raises(SubjectHeld, match="case 8"):
            runtime.erase_subject_data(client, SUBJECT, db_name, compact=False)
        assert _counts(client, db_name) == before
        release(admin, db_name, hold, policy)
    # a hold on a subject that shares nothing with it does not
    place(admin, db_name, Hold("subject", "u-nobody"), policy)
    assert runtime.erase_subject_data(client, SUBJECT, db_name, compact=False).threads == 1


def test_only_records_naming_the_identifier_as_a_value_lose_their_images(
    client: MongoClient, db_name: str, policy_file: Path
) -> None:
    """The last pass matched the identifier anywhere in an image: erasing "u-4" erased
    "u-42"'s images, "e" everybody's; and an identifier with a backslash, which the
    images' JSON escapes, was missed."""
    root = Accord(client=client, db_name=db_name)
    store = root.store()
    for user in ("u-4", "u-42", "CORP\\alice"):
        store.put(("memories", user), "diet", {"text": f"{user} eats pepper"})
    records = client[db_name][RECORDS]

    def intact_naming(text: str) -> int:
        return sum(
            1 for r in records.find({"images": {"$exists": True}})
            for i in r["images"] if "erased" not in i and text in str(i.get("image"))
        )  # fmt: skip

    assert intact_naming('"u-42"') > 0
    before = intact_naming('"u-42"')
    runtime.erase_subject_data(client, "e", db_name, compact=False)
    runtime.erase_subject_data(client, "u-4", db_name, compact=False)
    assert intact_naming('"u-42"') == before and intact_naming('"u-4"') == 0
    runtime.erase_subject_data(client, "CORP\\alice", db_name, compact=False)
    assert _mentions(client, db_name, "CORP") == {}


# "memories" names every user's memories (a label of accord's own namespaces); a lone
# surrogate is what a non-UTF-8 byte of a command line becomes
@pytest.mark.parametrize(
    "bad",
    ["", "   ", {"$ne": ""}, "$where", "a\x00b", 7, None, "x" * 501, "memories", "u-\udcff"],
)
def test_bad_subject_identifiers_are_refused(
    client: MongoClient, db_name: str, bad: Any, tmp_path: Path
) -> None:
    with pytest.raises(InvalidInputError):
        runtime.erase_subject_data(client, bad, db_name, compact=False)
    with pytest.raises(InvalidInputError):
        runtime.export_subject_data(client, bad, tmp_path / "x", db_name)
    assert not (tmp_path / "x").exists()


def test_bad_identifiers_are_refused_by_the_cli(mongo_uri: str, db_name: str) -> None:
    for bad in ("", "$gt"):
        result = CliRunner().invoke(
            cli, ["governance", "erase", bad, "--yes", "--db", db_name, "--uri", mongo_uri]
        )
        assert result.exit_code == 2 and "subject" in result.output, result.output


def test_a_tenant_scoped_erasure_leaves_no_trace_in_accords_own_records(
    client: MongoClient, db_name: str, policy_file: Path
) -> None:
    """The outbox's claims of the subject's events are recorded under tenant ``*`` (the
    aggregator's work belongs to no tenant); their images name the subject too."""
    _populate(client, db_name)
    shared = {"tenant_id": "*", "images": {"$exists": True}}
    assert any(SUBJECT in json.dumps(r["images"]) for r in client[db_name][RECORDS].find(shared))
    runtime.erase_subject_data(client, SUBJECT, db_name, tenant_id="default", compact=False)
    assert _mentions(client, db_name, SUBJECT) == {}
    assert _mentions(client, db_name, SECRET) == {}


class _Killed(Exception):
    """The erasure's process dying between two of its transactions."""


class _DiesAfter:
    """A kernel that commits ``plans`` plans, then dies before the next one."""

    def __init__(self, uow: Any, plans: int) -> None:
        self._uow, self.left = uow, plans

    def __getattr__(self, name: str) -> Any:
        return getattr(self._uow, name)

    def execute(self, plan: Plan, **kwargs: Any) -> Any:
        if self.left == 0:
            raise _Killed
        self.left -= 1
        return self._uow.execute(plan, **kwargs)


def test_an_erasure_interrupted_between_any_two_transactions_is_finished_by_a_rerun(
    client: MongoClient, db_name: str, policy_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of 2 documents, so the subject's thread is deleted class by class in many
    transactions (as a thread of more than 1,000 documents a class is): wherever the
    erasure stops, running it again finds what is left (the memories derived from the
    thread included) and leaves nothing of the subject."""
    from accord.governance import erasure

    monkeypatch.setattr(erasure, "PAGE", 2)
    admin = Principal.os_user()

    def erase(uow: Any, db: str) -> None:
        policy = runtime.effective_policy(uow, db)
        erasure.erase_subject(uow, db, policy, SUBJECT)

    _populate(client, db_name)  # the whole erasure once: how many transactions it takes
    counting = _DiesAfter(runtime.kernel(client, principal=admin), 10**6)
    erase(counting, db_name)
    total = 10**6 - counting.left
    assert total > 10 and _mentions(client, db_name, SECRET) == {}
    for plans in sorted({1, total // 4, total // 2, 3 * total // 4, total - 1}):
        db = f"{db_name}_{plans}"
        try:
            _populate(client, db)
            with pytest.raises(_Killed):
                erase(_DiesAfter(runtime.kernel(client, principal=admin), plans), db)
            erase(runtime.kernel(client, principal=admin), db)  # run again
            assert _mentions(client, db, SECRET) == {}, plans
            assert _mentions(client, db, SUBJECT) == {}, plans
            assert client[db].accord_checkpoints.count_documents({"thread_id": "chat-b"}) > 0
        finally:
            client.drop_database(db)


def test_a_tenant_scoped_erasure_keeps_the_subjects_other_tenants(
    client: MongoClient, db_name: str
) -> None:
    policy = parse_policy(POLICY, "p.toml")
    app = Accord(client=client, db_name=db_name, policy=policy)
    app.memory("acme").put(("memories", SUBJECT), "k", {"text": "acme fact"})
    app.memory("beta").put(("memories", SUBJECT), "k", {"text": "beta fact"})
    report = runtime.erase_subject_data(client, SUBJECT, db_name, tenant_id="acme",
                                        policy=policy, compact=False)  # fmt: skip
    assert report.deleted["long_term_memory"] == 1
    assert [d["tenant_id"] for d in client[db_name].long_term_memory.find()] == ["beta"]


def test_a_tenant_scoped_erasure_leaves_other_tenants_audit_images(
    client: MongoClient, db_name: str
) -> None:
    policy = parse_policy(POLICY, "p.toml")
    app = Accord(client=client, db_name=db_name, policy=policy, audit="full")
    app.memory("acme").put(("memories", SUBJECT), "k", {"text": f"acme {SECRET}"})
    app.memory("beta").put(("memories", SUBJECT), "k", {"text": f"beta {SECRET}"})
    records = client[db_name][RECORDS]

    def images(tenant: str) -> list[Any]:
        return [
            r["images"] for r in records.find({"tenant_id": tenant, "images": {"$exists": True}})
        ]

    beta = images("beta")
    assert any(SUBJECT in json.dumps(i) for i in beta)  # beta's trail names the subject
    runtime.erase_subject_data(client, SUBJECT, db_name, tenant_id="acme", policy=policy,
                               audit="full", compact=False)  # fmt: skip
    assert images("beta") == beta  # untouched: a tenant's erasure reaches its own records
    assert not any(SUBJECT in json.dumps(i, default=str) for i in images("acme"))
    kernel = runtime.kernel(client, principal=Principal.service("auditor"))
    assert verify_chain(kernel, db_name).ok


def test_the_audit_trail_allows_an_admins_image_erasure_and_nothing_else(
    client: MongoClient, db_name: str, policy_file: Path
) -> None:
    _populate(client, db_name)
    db = client[db_name]
    record = db[RECORDS].find_one({"images": {"$exists": True}})
    assert record is not None
    at = datetime.now(UTC)
    n = len(record["images"])
    good = image_erasure_op(record["_id"], n, at)
    forged = [
        Op("update", {"_id": record["_id"]}, {"$set": {"images": [{"filter": "{}", "change": None,
                                                                "image": None, "erased": at}] * n}}),
        Op("update", {"_id": record["_id"]}, {"$set": {"hash": "0" * 64}}),
        Op("update", {"_id": record["_id"]}, {"$set": {"images": erased_images(n, at),
                                                       "action": "x"}}),
        Op("update", {"stream": record["stream"]}, {"$set": {"images": erased_images(n, at)}}),
        Op("delete", {"_id": record["_id"]}),
    ]  # fmt: skip
    admin = runtime.kernel(client, principal=Principal.os_user())

    def plan(op: Op, operation: str = ERASE_OPERATION) -> Plan:
        return Plan(WriteContext(record["tenant_id"], operation=operation),
                    [Group("audit", db_name, RECORDS, "audit", [op])])  # fmt: skip

    for op in forged:
        with pytest.raises(PermissionDenied):
            admin.execute(plan(op))
    with pytest.raises(PermissionDenied):
        admin.execute(plan(good, operation="governance.sweep"))
    with pytest.raises(PermissionDenied):
        runtime.kernel(client, principal=Principal.service("runtime")).execute(plan(good))
    assert db[RECORDS].find_one({"_id": record["_id"]}) == record  # nothing changed
    admin.execute(plan(good))
    after = db[RECORDS].find_one({"_id": record["_id"]})
    assert [i["erased"] is not None and i["image"] is None for i in after["images"]] == [True] * n
    assert {k: v for k, v in after.items() if k != "images"} == {
        k: v for k, v in record.items() if k != "images"
    }
    assert verify_chain(runtime.kernel(client), db_name).ok
