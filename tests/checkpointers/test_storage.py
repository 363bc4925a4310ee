"""Storage model: chunked large values, messages stored once, encryption, maintenance."""

from __future__ import annotations

import os
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from langgraph.checkpoint.serde.base import CipherProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from pymongo import MongoClient

from accord.checkpointers import AccordSaver
from tests.checkpointers.conftest import config

MB = 1024 * 1024


def _chain(saver: AccordSaver, thread: str, values: list[dict[str, Any]], **kw: Any) -> list[str]:
    """Put one checkpoint per entry of ``values`` (channel -> value), each child of the last."""
    ids: list[str] = []
    versions: dict[str, Any] = {}
    current: dict[str, Any] = {}
    for step, changed in enumerate(values):
        new_versions = {ch: saver.get_next_version(versions.get(ch), None) for ch in changed}
        versions.update(new_versions)
        current.update(changed)
        cp = generate_checkpoint(channel_values=dict(current), channel_versions=dict(versions))
        cfg = saver.put(
            config(thread, ids[-1] if ids else None, **kw),
            cp,
            generate_metadata(step=step),
            new_versions,
        )
        ids.append(cfg["configurable"]["checkpoint_id"])
    return ids


def test_40mb_value_round_trips(client: MongoClient, saver: AccordSaver) -> None:
    big = os.urandom(40 * MB)
    ids = _chain(saver, "big", [{"blob": big, "small": "x"}])
    tup = saver.get_tuple(config("big"))
    assert tup is not None and tup.checkpoint["channel_values"]["blob"] == big
    blobs = client[saver.db_name].checkpoint_blobs
    assert blobs.count_documents({"channel": "blob"}) == 5  # 8 MiB chunks
    # a 40 MB pending write round-trips too
    saver.put_writes(config("big", ids[-1]), [("blob", big)], "task-1")
    tup = saver.get_tuple(config("big"))
    assert tup is not None and tup.pending_writes == [("task-1", "blob", big)]


def test_only_changed_channels_get_blobs(client: MongoClient, saver: AccordSaver) -> None:
    _chain(saver, "inc", [{"a": 1, "b": "big" * 1000}, {"a": 2}, {"a": 3}])
    blobs = client[saver.db_name].checkpoint_blobs
    assert blobs.count_documents({"channel": "b"}) == 1
    assert blobs.count_documents({"channel": "a"}) == 3
    history = [t.checkpoint["channel_values"] for t in saver.list(config("inc"))]
    assert history == [{"a": a, "b": "big" * 1000} for a in (3, 2, 1)]


def test_messages_stored_once_and_reassembled_exactly(
    client: MongoClient, saver: AccordSaver
) -> None:
    msgs: list[Any] = []
    steps = []
    for i in range(50):
        msgs = [*msgs, HumanMessage(f"q{i}", id=f"h{i}"), AIMessage(f"a{i}", id=f"a{i}")]
        steps.append({"messages": msgs})
    # an edit (same id, new content) and a removal
    edited = [m if m.id != "a3" else AIMessage("a3 edited", id="a3") for m in msgs]
    steps.append({"messages": edited})
    removed = [m for m in edited if m.id != "h0"]
    steps.append({"messages": removed})
    ids = _chain(saver, "chat", steps)
    stm = client[saver.db_name].short_term_memory
    assert stm.count_documents({"thread_id": "chat"}) == 101  # 100 messages + 1 edit revision
    assert stm.find_one({"message_id": "a3", "text": "a3 edited"}) is not None
    for cid, expected in zip(ids, steps, strict=True):
        tup = saver.get_tuple(config("chat", cid))
        assert tup is not None
        got = tup.checkpoint["channel_values"]["messages"]
        assert [(type(m), m.id, m.content) for m in got] == [
            (type(m), m.id, m.content) for m in expected["messages"]
        ]
    # a fresh saver (no cache) reads the same and writes no duplicates
    fresh = AccordSaver(client, db_name=saver.db_name)
    more = [*removed, HumanMessage("new", id="hx")]
    cp = generate_checkpoint(
        channel_values={"messages": more}, channel_versions={"messages": "9" * 40}
    )
    fresh.put(config("chat", ids[-1]), cp, generate_metadata(step=99), {"messages": "9" * 40})
    assert stm.count_documents({"thread_id": "chat"}) == 102


def test_message_bytes_grow_linearly(client: MongoClient, saver: AccordSaver) -> None:
    msgs: list[Any] = []
    steps = []
    for i in range(100):
        msgs = [*msgs, HumanMessage("x" * 500, id=f"h{i}")]
        steps.append({"messages": msgs})
    _chain(saver, "lin", steps)
    db = client[saver.db_name]
    msg_bytes = sum(len(d["data"]) for d in db.short_term_memory.find({"thread_id": "lin"}))
    # each message body once (~100 * 500 bytes), not once per checkpoint (~100 * 100 * 500 / 2)
    assert msg_bytes < 100 * 1000


class XorCipher(CipherProtocol):
    """Test cipher (not secure): proves values go through the cipher and back."""

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "xor", bytes(b ^ 0x5A for b in plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "xor"
        return bytes(b ^ 0x5A for b in ciphertext)


def test_encrypted_serializer(client: MongoClient, db_name: str) -> None:
    saver = AccordSaver(client, db_name=db_name, serde=EncryptedSerializer(XorCipher()))
    saver.setup()
    secret = "top-secret-value"
    ids = _chain(saver, "enc", [{"v": secret, "messages": [HumanMessage(secret, id="m1")]}])
    saver.put_writes(config("enc", ids[0]), [("v", secret)], "t1")
    tup = saver.get_tuple(config("enc"))
    assert tup is not None
    assert tup.checkpoint["channel_values"]["v"] == secret
    assert tup.checkpoint["channel_values"]["messages"][0].content == secret
    assert tup.pending_writes == [("t1", "v", secret)]
    db = client[db_name]
    for name in ("checkpoint_blobs", "checkpoint_writes", "short_term_memory", "checkpoints"):
        for doc in db[name].find():
            assert secret.encode() not in repr(doc).encode(), (name, doc)
    assert "text" not in db.short_term_memory.find_one()


def test_tenants_are_isolated(client: MongoClient, saver: AccordSaver) -> None:
    _chain(saver, "same", [{"v": "default"}])
    _chain(saver, "same", [{"v": "acme"}], tenant_id="acme")
    a = saver.get_tuple(config("same", tenant_id="acme"))
    d = saver.get_tuple(config("same"))
    assert a is not None and d is not None
    assert a.checkpoint["channel_values"]["v"] == "acme"
    assert d.checkpoint["channel_values"]["v"] == "default"
    assert a.config["configurable"]["tenant_id"] == "acme"
    saver.delete_thread("same")
    assert saver.get_tuple(config("same")) is None
    assert saver.get_tuple(config("same", tenant_id="acme")) is not None
    for name in ("checkpoints", "checkpoint_blobs", "checkpoint_heads"):
        assert client[saver.db_name][name].count_documents({"tenant_id": {"$nin": ["acme"]}}) == 0


def test_prune_and_delete_for_runs_collect_garbage(client: MongoClient, saver: AccordSaver) -> None:
    db = client[saver.db_name]
    m1, m2, m3 = HumanMessage("1", id="1"), HumanMessage("2", id="2"), HumanMessage("3", id="3")
    _chain(
        saver,
        "gc",
        [{"messages": [m1], "x": "a"}, {"messages": [m1, m2]}, {"messages": [m2, m3], "x": "b"}],
    )
    assert db.short_term_memory.count_documents({"thread_id": "gc"}) == 3
    saver.prune(["gc"])
    # the latest checkpoint keeps exactly what it references
    assert db.checkpoints.count_documents({"thread_id": "gc"}) == 1
    assert sorted(d["message_id"] for d in db.short_term_memory.find({"thread_id": "gc"})) == [
        "2",
        "3",
    ]
    assert sorted(d["channel"] for d in db.checkpoint_blobs.find({"thread_id": "gc"})) == [
        "messages",
        "x",
    ]
    tup = saver.get_tuple(config("gc"))
    assert tup is not None and [m.id for m in tup.checkpoint["channel_values"]["messages"]] == [
        "2",
        "3",
    ]


def test_copy_thread_copies_messages_and_head(client: MongoClient, saver: AccordSaver) -> None:
    ids = _chain(saver, "src", [{"messages": [HumanMessage("hi", id="1")]}])
    saver.copy_thread("src", "dst")
    tup = saver.get_tuple(config("dst"))
    assert tup is not None and tup.checkpoint["channel_values"]["messages"][0].content == "hi"
    # the copy is writable: its head is its latest checkpoint
    cp = generate_checkpoint(channel_values={"v": 1}, channel_versions={"v": "1"})
    saver.put(config("dst", ids[-1]), cp, generate_metadata(step=1), {"v": "1"})
