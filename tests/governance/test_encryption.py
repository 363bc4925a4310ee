"""Encryption per class and crypto-shredding (issue 24, item 6; docs/governance.md,
"Encryption and crypto-shredding").

The scenario: two users (``u-7``, whose words hold ``Zanzibar``, and ``u-8``, whose
words hold ``Oslo``) chat on threads of their own through a real LangGraph graph with
the checkpointer and the store of one ``Accord`` root, under a policy that encrypts
checkpoints, channel values, pending writes, messages, memories and their history per
subject, with the aggregator deriving memories and the audit trail in ``full`` mode.

- the graph's state and history, the store's get and search (with a value filter) and
  the aggregator's memories read back as written;
- no raw document of any collection (BSON bytes as stored) holds either user's words;
- the acceptance test: a copy of every collection (a backup) is taken, ``u-7`` is
  erased, and in a database restored from that copy (with today's keys) ``u-8``'s thread
  and memory still read while ``u-7``'s raise ``KeyDestroyed``; the audit chain of the
  live database verifies (``verify_chain`` and ``accord audit verify --live``);
- a missing, malformed or other master key, a ciphertext moved to another document, and
  a policy that encrypts a class without payloads are refused with clear errors.
"""

from __future__ import annotations

import asyncio
import base64
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from pymongo import MongoClient
from typer.testing import CliRunner

from accord import runtime
from accord.errors import (
    EncryptionError,
    InvalidInputError,
    KeyDestroyed,
    MasterKeyError,
    PolicyError,
)
from accord.governance.audit_records import RECORDS
from accord.governance.crypto import MASTER_KEY_ENV, MasterKey
from accord.governance.loading import parse_policy
from accord.governance.verify import verify_chain
from accord.platform.cli import app as cli
from accord.runtime import Accord

A, B = "u-7", "u-8"
SECRET_A, SECRET_B = "Zanzibar", "Oslo"
ENCRYPTED = ("checkpoint", "checkpoint_blob", "checkpoint_write", "short_term_memory",
             "long_term_memory", "memory_history")  # fmt: skip
POLICY = "\n".join(f'[classes.{c}]\nencryption = "subject"\n' for c in ENCRYPTED)


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _graph(saver: Any, store: Any) -> Any:
    def answer(state: Chat, config: RunnableConfig) -> dict[str, Any]:
        conf = config["configurable"]
        words = str(state["messages"][-1].content)
        n = len(state["messages"])
        return {"messages": [AIMessage(f"Noted: {words}", id=f"ai-{conf['thread_id']}-{n}")]}

    builder = StateGraph(Chat)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    return builder.compile(checkpointer=saver, store=store)


def _config(user: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": f"chat-{user}", "user_id": user}}


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "enc_" + uuid.uuid4().hex[:10]
    yield name
    client.drop_database(name)
    client.drop_database(name + "_restored")


@pytest.fixture()
def master(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> MasterKey:
    key = MasterKey.generate()
    monkeypatch.setenv(MASTER_KEY_ENV, key.text())
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    monkeypatch.setenv("ACCORD_POLICY", str(path))
    monkeypatch.setenv(runtime.AUDIT_ENV, "full")
    return key


def _populate(client: MongoClient, db_name: str) -> Accord:
    root = Accord(client=client, db_name=db_name)
    graph = _graph(root.checkpointer(), root.store())
    with root.background_aggregator() as worker:
        for user, words in ((A, f"I live in {SECRET_A} and I prefer aisle seats."),
                            (B, f"I live in {SECRET_B} and I prefer window seats.")):  # fmt: skip
            graph.invoke({"messages": [HumanMessage(words, id=f"h-{user}")]}, _config(user))
            graph.invoke({"messages": [HumanMessage("Call me later.", id=f"h2-{user}")]},
                         _config(user))  # fmt: skip
        assert worker.wait_idle(timeout=60)
    store = root.store()
    store.put(("memories", A), "diet", {"food": f"{SECRET_A} pepper", "n": 1})
    store.put(("memories", A), "diet", {"food": f"{SECRET_A} pepper", "n": 2})  # history
    store.put(("memories", B), "diet", {"food": f"{SECRET_B} pepper", "n": 1})
    return root


def _mentions(client: MongoClient, db_name: str, needle: str) -> dict[str, int]:
    found: dict[str, int] = {}
    raw: CodecOptions[RawBSONDocument] = CodecOptions(document_class=RawBSONDocument)
    db = client.get_database(db_name, codec_options=raw)
    for name in db.list_collection_names():
        for doc in db[name].find():
            if needle.encode() in doc.raw:
                found[name] = found.get(name, 0) + 1
    return found


def test_a_graph_and_the_store_read_back_what_they_wrote_and_nothing_is_stored_in_clear(
    client: MongoClient, db_name: str, master: MasterKey
) -> None:
    root = _populate(client, db_name)
    graph = _graph(root.checkpointer(), root.store())
    state = graph.get_state(_config(A))
    assert [m.content for m in state.values["messages"]] == [
        f"I live in {SECRET_A} and I prefer aisle seats.",
        f"Noted: I live in {SECRET_A} and I prefer aisle seats.",
        "Call me later.", "Noted: Call me later.",
    ]  # fmt: skip
    history = list(graph.get_state_history(_config(A)))
    assert len(history) >= 4 and [len(h.values.get("messages", [])) for h in history][0] == 4
    store = root.store()
    assert store.get(("memories", A), "diet").value == {"food": f"{SECRET_A} pepper", "n": 2}
    hits = store.search(("memories",), filter={"n": 2})  # a value filter, after decryption
    assert [h.value["food"] for h in hits] == [f"{SECRET_A} pepper"]
    found = store.search(("memories", A), query=f"{SECRET_A} pepper")
    assert found and found[0].value["food"] == f"{SECRET_A} pepper"
    assert root.memory().history(("memories", A), "diet")[0]["value"]["n"] == 1
    derived = [m for m in store.search(("memories", B)) if m.key != "diet"]
    assert derived and any(SECRET_B in str(m.value) for m in derived)  # the aggregator's
    # the raw documents: no user's words in any collection, audit images included
    assert _mentions(client, db_name, SECRET_A) == {}
    assert _mentions(client, db_name, SECRET_B) == {}
    keys = client[db_name]["accord_keys"]
    # a key per thread (its state, messages and the memories derived from it), one per
    # namespace the store wrote without a thread
    assert keys.count_documents({"scope": "thread"}) == 2
    assert sorted(d["subject"] for d in keys.find({"scope": "subject"})) == [
        ["memories", A],
        ["memories", B],
    ]
    assert all(bytes(d["wrapped"]) and d["master"] == master.fingerprint for d in keys.find())


def test_crypto_shredding_a_backup_taken_before_the_erasure_is_unreadable_for_that_subject(
    client: MongoClient, mongo_uri: str, db_name: str, master: MasterKey, tmp_path: Path
) -> None:
    _populate(client, db_name)
    live = client[db_name]
    # the backup: every collection but the keys (kept apart from backups: docs)
    backup = {n: list(live[n].find()) for n in live.list_collection_names() if n != "accord_keys"}
    # the subject's own export (Art. 15), taken before: decrypted, it is the subject's copy
    manifest = runtime.export_subject_data(client, A, tmp_path / "export", db_name)
    exported = b"".join((tmp_path / "export" / f).read_bytes() for f in manifest["files"])
    assert SECRET_A.encode() in exported and SECRET_B.encode() not in exported
    report = runtime.erase_subject_data(client, A, db_name)
    assert report.keys_destroyed == 2  # its thread's key and its namespace's
    assert live["accord_keys"].count_documents({}) == 2  # u-8's
    assert verify_chain(runtime.kernel(client), db_name).ok
    # the key deletions are audit records like any write (no identifier in them)
    shredded = list(live[RECORDS].find({"collection": "accord_keys"}))
    assert len(shredded) == 2 and {r["action"] for r in shredded} == {"governance.erase"}
    assert A.encode() not in b"".join(str(r).encode() for r in shredded)
    result = CliRunner().invoke(cli, ["audit", "verify", "--live", "--db", db_name,
                                      "--uri", mongo_uri])  # fmt: skip
    assert result.exit_code == 0, result.output

    # restore the backup beside today's keys, and read it through accord
    restored = client[db_name + "_restored"]
    for name, docs in backup.items():
        if docs:
            restored[name].insert_many(docs)
    keys = list(live["accord_keys"].find())
    restored["accord_keys"].insert_many(keys)
    root = Accord(client=client, db_name=restored.name)
    graph = _graph(root.checkpointer(), root.store())
    b_state = graph.get_state(_config(B))
    assert SECRET_B in str(b_state.values["messages"][0].content)
    assert root.store().get(("memories", B), "diet").value["food"] == f"{SECRET_B} pepper"
    with pytest.raises(KeyDestroyed, match="no longer exists") as caught:
        graph.get_state(_config(A))
    assert caught.value.kid
    with pytest.raises(KeyDestroyed):
        root.store().get(("memories", A), "diet")
    with pytest.raises(KeyDestroyed):
        root.memory().history(("memories", A), "diet")
    with pytest.raises(KeyDestroyed):  # what the aggregator derived from its thread
        root.store().search(("episodes", f"chat-{A}"))
    assert root.store().search(("episodes", f"chat-{B}"))
    # what the backup holds of u-7 is ciphertext only: no key, no words
    a_docs = [d for docs in backup.values() for d in docs if "chat-u-7" in str(d.get("_id"))]
    assert a_docs and SECRET_A.encode() not in b"".join(
        bytes(v) for d in a_docs for v in d.values() if isinstance(v, bytes)
    )


def test_shredding_a_tenant_makes_all_its_data_unreadable(
    client: MongoClient, mongo_uri: str, db_name: str, master: MasterKey
) -> None:
    _populate(client, db_name)
    refused = CliRunner().invoke(cli, ["governance", "shred-tenant", "default", "--db", db_name,
                                       "--uri", mongo_uri], input="n\n")  # fmt: skip
    assert refused.exit_code == 1 and client[db_name]["accord_keys"].count_documents({}) == 4
    result = CliRunner().invoke(cli, ["governance", "shred-tenant", "default", "--yes",
                                      "--db", db_name, "--uri", mongo_uri])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "4 data key(s) of tenant 'default' destroyed" in result.output
    root = Accord(client=client, db_name=db_name)
    graph = _graph(root.checkpointer(), root.store())
    for user in (A, B):
        with pytest.raises(KeyDestroyed):
            graph.get_state(_config(user))
    assert runtime.shred_tenant_keys(client, "default", db_name) == 0  # idempotent
    for bad in ({"$ne": ""}, "", "$where"):
        with pytest.raises(InvalidInputError, match="tenant"):
            runtime.shred_tenant_keys(client, bad, db_name)  # type: ignore[arg-type]


def test_a_missing_malformed_or_other_master_key_is_refused(
    client: MongoClient, db_name: str, master: MasterKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    _populate(client, db_name)
    monkeypatch.delenv(MASTER_KEY_ENV)
    with pytest.raises(MasterKeyError, match="ACCORD_MASTER_KEY is not set"):
        Accord(client=client, db_name=db_name)
    for bad, said in (("not base64!", "not base64"),
                      (base64.b64encode(os.urandom(16)).decode(), "decodes to 16 bytes")):  # fmt: skip
        monkeypatch.setenv(MASTER_KEY_ENV, bad)
        with pytest.raises(MasterKeyError, match=said):
            Accord(client=client, db_name=db_name)
    monkeypatch.setenv(MASTER_KEY_ENV, MasterKey.generate().text())  # another key
    root = Accord(client=client, db_name=db_name)
    with pytest.raises(MasterKeyError, match="wrapped under master key"):
        root.checkpointer().get_tuple(_config(A))


def test_a_ciphertext_moved_to_another_document_is_refused(
    client: MongoClient, db_name: str, master: MasterKey
) -> None:
    root = _populate(client, db_name)
    memories = client[db_name]["long_term_memory"]
    a = memories.find_one({"namespace": ["memories", A], "key": "diet"})
    b = memories.find_one({"namespace": B, "key": "diet"})
    assert a is not None and b is not None
    # u-8's ciphertext (a key u-7's reader also holds) moved into u-7's memory
    memories.update_one({"_id": a["_id"]}, {"$set": {"value": b["value"]}})
    with pytest.raises(EncryptionError, match="moved from another document"):
        root.store().get(("memories", A), "diet")
    blobs = client[db_name]["accord_checkpoint_blobs"]
    one, two = list(blobs.find({"thread_id": f"chat-{B}", "data": {"$exists": True}}).limit(2))
    blobs.update_one({"_id": one["_id"]}, {"$set": {"data": two["data"]}})
    with pytest.raises(EncryptionError, match="does not decrypt"):
        list(_graph(root.checkpointer(), root.store()).get_state_history(_config(B)))


def test_a_policy_cannot_encrypt_a_class_without_payloads() -> None:
    from accord.governance.policy import to_toml

    policy = parse_policy(POLICY, "<test>")
    assert {n for n, c in policy.classes.items() if c.encryption != "off"} == set(ENCRYPTED)
    again = parse_policy(to_toml(policy), "<shown>", base=None)  # `governance show --toml`
    assert {n: c.encryption for n, c in again.classes.items()} == {
        n: c.encryption for n, c in policy.classes.items()
    }
    with pytest.raises(PolicyError, match="outbox has no payload fields accord encrypts"):
        parse_policy('[classes.outbox]\nencryption = "subject"\n', "<test>")
    with pytest.raises(PolicyError, match="encryption"):
        parse_policy('[classes.checkpoint]\nencryption = "always"\n', "<test>")


def test_the_async_root_encrypts_and_decrypts_the_same_way(
    client: MongoClient, mongo_uri: str, db_name: str, master: MasterKey
) -> None:
    from pymongo import AsyncMongoClient

    from accord.runtime import AsyncAccord

    async def run() -> list[str]:
        async with AsyncAccord(client=AsyncMongoClient(mongo_uri), db_name=db_name) as root:
            graph = _graph(await root.checkpointer(), await root.store())
            words = f"I live in {SECRET_A}"
            await graph.ainvoke({"messages": [HumanMessage(words, id="h-async")]}, _config(A))
            store = await root.store()
            await store.aput(("memories", A), "diet", {"food": f"{SECRET_A} pepper"})
            item = await store.aget(("memories", A), "diet")
            assert item is not None and item.value == {"food": f"{SECRET_A} pepper"}
            state = await graph.aget_state(_config(A))
            return [str(m.content) for m in state.values["messages"]]

    assert asyncio.run(run()) == [f"I live in {SECRET_A}", f"Noted: I live in {SECRET_A}"]
    assert _mentions(client, db_name, SECRET_A) == {}
    # and the sync root reads what the async one wrote
    assert Accord(client=client, db_name=db_name).store().get(("memories", A), "diet")


def test_writers_racing_to_create_one_key_end_with_one_key_and_readable_data(
    client: MongoClient, db_name: str, master: MasterKey
) -> None:
    roots = [Accord(client=client, db_name=db_name) for _ in range(4)]  # 4 key caches
    stores = [r.store() for r in roots]
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def put(i: int) -> None:
        try:
            barrier.wait()
            for n in range(5):
                stores[i].put(("memories", "u-new"), f"k{i}-{n}", {"n": n, "by": i})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert client[db_name]["accord_keys"].count_documents({"subject": "u-new"}) == 1
    fresh = Accord(client=client, db_name=db_name).store()
    found = {(m.key, m.value["n"]) for m in fresh.search(("memories", "u-new"), limit=100)}
    assert found == {(f"k{i}-{n}", n) for i in range(4) for n in range(5)}


def test_langgraphs_checkpointer_conformance_suite_is_full_with_encryption_on(
    client: MongoClient, master: MasterKey
) -> None:
    """The checkpointer's contract (langgraph-checkpoint-conformance: FULL) holds with every
    value encrypted (the policy comes from ACCORD_POLICY, as for any drop-in saver)."""
    from langgraph.checkpoint.conformance import checkpointer_test, validate

    from accord.checkpointers import AccordSaver
    from tests.checkpointers.test_conformance import _assert_full

    dbs: list[str] = []

    @checkpointer_test(name="AccordSaver, encrypted")
    async def factory() -> Any:
        name = "encconf_" + uuid.uuid4().hex[:10]
        dbs.append(name)
        saver = AccordSaver(client, db_name=name)
        saver.setup()
        yield saver

    try:
        _assert_full(asyncio.run(validate(factory)))
        raw = [d for name in dbs for d in client[name]["accord_checkpoints"].find()]
        assert raw and all(d["checkpoint"]["data"].subtype == 0x80 for d in raw)  # encrypted
    finally:
        for name in dbs:
            client.drop_database(name)


def test_data_keys_are_read_through_the_policy_as_the_reader(
    client: MongoClient, db_name: str, master: MasterKey, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from accord.errors import PermissionDenied
    from accord.platform.context import Principal

    Accord(client=client, db_name=db_name).store().put(("memories", A), "diet", {"food": "x"})
    api = Principal.api_key("reader", tenant_id="default", scopes=frozenset({"read", "write"}))
    reader = Accord(client=client, db_name=db_name).memory().acting_as(api)
    memory = reader.get(("memories", A), "diet")
    assert memory is not None and memory.value == {"food": "x"}
    # a policy that takes find on the keys from the memory API: its decryption is refused
    path = tmp_path / "no-keys.toml"
    path.write_text(POLICY + '[classes.encryption_key]\nroles = { runtime = ["find"], '
                    'admin = ["find", "insert", "remove"] }\n')  # fmt: skip
    monkeypatch.setenv("ACCORD_POLICY", str(path))
    refused = Accord(client=client, db_name=db_name).memory().acting_as(api)
    with pytest.raises(PermissionDenied, match="encryption_key"):
        refused.get(("memories", A), "diet")


def test_the_master_key_rotates_by_rewrapping_the_data_keys(
    client: MongoClient, mongo_uri: str, db_name: str, master: MasterKey,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from accord.governance.crypto import PREVIOUS_MASTER_KEY_ENV

    _populate(client, db_name)
    new = MasterKey.generate()
    monkeypatch.setenv(MASTER_KEY_ENV, new.text())
    with pytest.raises(MasterKeyError, match="wrapped under master key"):
        Accord(client=client, db_name=db_name).checkpointer().get_tuple(_config(A))
    monkeypatch.setenv(PREVIOUS_MASTER_KEY_ENV, master.text())  # the rotation window
    root = Accord(client=client, db_name=db_name)
    assert root.checkpointer().get_tuple(_config(A)) is not None  # the old key unwraps
    result = CliRunner().invoke(cli, ["governance", "rewrap-keys", "--db", db_name,
                                      "--uri", mongo_uri])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "4 data key(s) re-wrapped" in result.output
    keys = client[db_name]["accord_keys"]
    assert {d["master"] for d in keys.find()} == {new.fingerprint}
    assert runtime.rewrap_data_keys(client, db_name) == 0  # idempotent
    monkeypatch.delenv(PREVIOUS_MASTER_KEY_ENV)  # the old key retired
    graph = _graph(Accord(client=client, db_name=db_name).checkpointer(), None)
    assert SECRET_A in str(graph.get_state(_config(A)).values["messages"][0].content)
    assert "secret" not in repr(new) and new.text() not in repr(new)  # never printed
    monkeypatch.setenv(PREVIOUS_MASTER_KEY_ENV, "short")
    with pytest.raises(MasterKeyError, match="ACCORD_MASTER_KEY_PREVIOUS is not base64"):
        MasterKey.from_env()


def test_key_rotation_and_shredding_are_recorded_even_with_the_audit_setting_off(
    client: MongoClient, db_name: str, master: MasterKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accord.governance.crypto import PREVIOUS_MASTER_KEY_ENV
    from accord.platform.context import Principal

    _populate(client, db_name)  # with the audit on: the database has an audit trail
    monkeypatch.delenv(runtime.AUDIT_ENV)  # an operator's shell without the setting
    records = client[db_name][RECORDS]

    def recorded(action: str) -> int:
        return records.count_documents({"collection": "accord_keys", "action": action})

    monkeypatch.setenv(MASTER_KEY_ENV, MasterKey.generate().text())
    monkeypatch.setenv(PREVIOUS_MASTER_KEY_ENV, master.text())
    assert runtime.rewrap_data_keys(client, db_name) == 4
    assert recorded("encryption.rewrap") >= 1
    before = recorded("governance.erase")
    assert runtime.shred_tenant_keys(client, "default", db_name) == 4
    assert recorded("governance.erase") > before
    auditor = runtime.kernel(client, principal=Principal.service("auditor"))
    assert verify_chain(auditor, db_name).ok


def test_no_copy_of_a_destroyed_key_stays_in_the_audit_trail(
    client: MongoClient, db_name: str, master: MasterKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``full`` trail kept each key's wrapped bytes in its records' images (the insert,
    and a rotation's ``$set``), which the master key still unwrapped after the key was
    destroyed: a backup of the erased subject decrypted. Keys are recorded in hashes
    only, and a destruction erases the images of its key's records made before."""
    from bson import ObjectId

    from accord.governance.crypto import PREVIOUS_MASTER_KEY_ENV

    _populate(client, db_name)
    db = client[db_name]
    monkeypatch.setenv(MASTER_KEY_ENV, MasterKey.generate().text())
    monkeypatch.setenv(PREVIOUS_MASTER_KEY_ENV, master.text())
    assert runtime.rewrap_data_keys(client, db_name) == 4
    key_records = {"collection": "accord_keys"}
    assert db[RECORDS].count_documents(key_records) > 0
    assert db[RECORDS].count_documents({**key_records, "images": {"$exists": True}}) == 0
    # a record as a full trail wrote it before (raw: the trail refuses such a write)
    key = db.accord_keys.find_one({"tenant_id": "default", "scope": "subject", "subject": A})
    assert key is not None
    record = db[RECORDS].find_one({**key_records, "ops.doc_id": key["_id"]})
    assert record is not None
    forged = ObjectId()
    record.update(_id=forged, images=[
        {"filter": None, "change": None, "image": '{"wrapped": "..."}'} for _ in record["ops"]
    ])  # fmt: skip
    db[RECORDS].insert_one(record, bypass_document_validation=True)
    runtime.erase_subject_data(client, A, db_name, compact=False)
    erased = db[RECORDS].find_one({"_id": forged})
    assert erased is not None and erased["images"][0]["image"] is None
    assert "erased" in erased["images"][0]


def test_a_shredding_is_refused_while_a_hold_for_every_tenant_covers_its_data(
    client: MongoClient, db_name: str, master: MasterKey
) -> None:
    """Holds without a tenant (a class, a subject) cover every tenant: shredding one
    destroyed the keys of held data (only a tenant's own holds were asked)."""
    from accord.errors import LegalHoldError
    from accord.governance.holding import place, release
    from accord.governance.holds import Hold
    from accord.platform.context import Principal

    _populate(client, db_name)
    admin = runtime.kernel(client, principal=Principal.os_user())
    policy = runtime.effective_policy(admin, db_name)
    keys = client[db_name]["accord_keys"]
    for kind, value in (("class", "long_term_memory"), ("subject", A),
                        ("class", "encryption_key")):  # fmt: skip
        hold = Hold(kind, value, reason="case 9")  # type: ignore[arg-type]
        place(admin, db_name, hold, policy)
        with pytest.raises(LegalHoldError, match="case 9"):
            runtime.shred_tenant_keys(client, "default", db_name)
        assert keys.count_documents({}) == 4
        release(admin, db_name, hold, policy)
    # a class that is not encrypted, a subject with nothing in the tenant: no cover
    place(admin, db_name, Hold("class", "outbox"), policy)
    place(admin, db_name, Hold("subject", "u-nobody"), policy)
    assert runtime.shred_tenant_keys(client, "default", db_name) == 4


def test_writes_that_cannot_be_encrypted_field_by_field_are_refused(
    client: MongoClient, db_name: str, master: MasterKey
) -> None:
    from accord.platform.context import WriteContext
    from accord.platform.plan import Group, Op, Plan

    root = Accord(client=client, db_name=db_name)
    root.store().put(("memories", A), "diet", {"food": "x"})
    memory_id = client[db_name]["long_term_memory"].find_one({"key": "diet"})["_id"]

    def write(op: Op, artifact: str = "long_term_memory") -> None:
        coll = {"long_term_memory": "long_term_memory"}.get(artifact, "accord_checkpoint_blobs")
        group = Group("g", db_name, coll, artifact, [op])
        root.uow.execute(Plan(WriteContext("default", operation="test.write"), [group]))

    for op, said in (
        (Op("update", {"_id": memory_id}, {"$set": {"value.food": "y"}}), "part of an encrypted"),
        (Op("update", {"_id": memory_id}, {"$push": {"value": 1}}), r"\$push on the encrypted"),
        (Op("update_many", {"tenant_id": "default"}, {"$set": {"text": "t"}}), "several documents"),
        (Op("update", {"key": "diet"}, {"$set": {"text": "t"}}), "without naming its document"),
    ):  # fmt: skip
        with pytest.raises(EncryptionError, match=said):
            write(op)
    with pytest.raises(EncryptionError, match="pipeline update"):
        write(Op("update", {"_id": "b"}, [{"$set": {"data": "$x"}}]), "checkpoint_blob")
    assert root.store().get(("memories", A), "diet").value == {"food": "x"}  # nothing written
    write(Op("update", {"_id": memory_id}, {"$set": {"text": "whole field"}}))  # allowed
    assert root.memory().get(("memories", A), "diet").text == "whole field"
