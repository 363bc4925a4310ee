"""Storage model: chunked large values, messages stored once, encryption, maintenance.

Every test runs for both savers (``saver`` / ``saver_factory`` are parametrized).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from langgraph.checkpoint.mongodb import MongoDBSaver
from langgraph.checkpoint.serde.base import CipherProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from pymongo import MongoClient

from accord.checkpointers import AccordSaver, AsyncAccordSaver, maintenance
from accord.checkpointers.chains import PAGE
from accord.checkpointers.reads import ReadBatch
from accord.errors import ConcurrentRunError, InvalidInputError
from tests.checkpointers.conftest import config

MB = 1024 * 1024


def _chain(saver: Any, thread: str, values: list[dict[str, Any]], **kw: Any) -> list[str]:
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


def test_40mb_value_round_trips(client: MongoClient, saver: Any) -> None:
    big = os.urandom(40 * MB)
    ids = _chain(saver, "big", [{"blob": big, "small": "x"}])
    tup = saver.get_tuple(config("big"))
    assert tup is not None and tup.checkpoint["channel_values"]["blob"] == big
    blobs = client[saver.db_name].accord_checkpoint_blobs
    assert blobs.count_documents({"channel": "blob"}) == 5  # 8 MiB chunks
    # a 40 MB pending write round-trips too
    saver.put_writes(config("big", ids[-1]), [("blob", big)], "task-1")
    tup = saver.get_tuple(config("big"))
    assert tup is not None and tup.pending_writes == [("task-1", "blob", big)]


def test_only_changed_channels_get_blobs(client: MongoClient, saver: Any) -> None:
    _chain(saver, "inc", [{"a": 1, "b": "big" * 1000}, {"a": 2}, {"a": 3}])
    blobs = client[saver.db_name].accord_checkpoint_blobs
    assert blobs.count_documents({"channel": "b"}) == 1
    assert blobs.count_documents({"channel": "a"}) == 3
    history = [t.checkpoint["channel_values"] for t in saver.list(config("inc"))]
    assert history == [{"a": a, "b": "big" * 1000} for a in (3, 2, 1)]


def test_messages_stored_once_and_reassembled_exactly(
    client: MongoClient, saver: Any, saver_factory: Any
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
    fresh = saver_factory(setup=False)
    more = [*removed, HumanMessage("new", id="hx")]
    cp = generate_checkpoint(
        channel_values={"messages": more}, channel_versions={"messages": "9" * 40}
    )
    fresh.put(config("chat", ids[-1]), cp, generate_metadata(step=99), {"messages": "9" * 40})
    assert stm.count_documents({"thread_id": "chat"}) == 102


def test_message_bytes_grow_linearly(client: MongoClient, saver: Any) -> None:
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


def test_encrypted_serializer(client: MongoClient, db_name: str, saver_factory: Any) -> None:
    saver = saver_factory(serde=EncryptedSerializer(XorCipher()))
    secret = "top-secret-value"
    ids = _chain(saver, "enc", [{"v": secret, "messages": [HumanMessage(secret, id="m1")]}])
    saver.put_writes(config("enc", ids[0]), [("v", secret)], "t1")
    tup = saver.get_tuple(config("enc"))
    assert tup is not None
    assert tup.checkpoint["channel_values"]["v"] == secret
    assert tup.checkpoint["channel_values"]["messages"][0].content == secret
    assert tup.pending_writes == [("t1", "v", secret)]
    db = client[db_name]
    for name in (
        "accord_checkpoint_blobs",
        "accord_checkpoint_writes",
        "short_term_memory",
        "accord_checkpoints",
    ):
        for doc in db[name].find():
            assert secret.encode() not in repr(doc).encode(), (name, doc)
    assert "text" not in db.short_term_memory.find_one()


def test_tenants_are_isolated(client: MongoClient, saver: Any) -> None:
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
    for name in ("accord_checkpoints", "accord_checkpoint_blobs"):
        assert client[saver.db_name][name].count_documents({"tenant_id": {"$nin": ["acme"]}}) == 0


def test_prune_and_delete_for_runs_collect_garbage(client: MongoClient, saver: Any) -> None:
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
    assert db.accord_checkpoints.count_documents({"thread_id": "gc"}) == 1
    assert sorted(d["message_id"] for d in db.short_term_memory.find({"thread_id": "gc"})) == [
        "2",
        "3",
    ]
    assert sorted(d["channel"] for d in db.accord_checkpoint_blobs.find({"thread_id": "gc"})) == [
        "messages",
        "x",
    ]
    tup = saver.get_tuple(config("gc"))
    assert tup is not None and [m.id for m in tup.checkpoint["channel_values"]["messages"]] == [
        "2",
        "3",
    ]


def test_a_saver_pinned_to_a_tenant_lists_only_its_own_threads_pending_collection(
    client: MongoClient, saver: Any, saver_factory: Any
) -> None:
    """Before: a saver built with tenant_id= listed other tenants' (tenant, thread) pairs
    (their thread ids) from pending_collection()."""
    for tenant, thread in (("victim", "secret"), ("acme", "own")):
        saver.put(config(thread, tenant_id=tenant), generate_checkpoint(), generate_metadata(), {})
    # the mark an interrupted prune leaves
    client[saver.db_name][saver.collections.runs].update_many(
        {}, {"$set": {maintenance.COLLECT_PENDING: datetime.now(UTC)}}
    )
    acme = saver_factory(tenant_id="acme")
    assert acme.pending_collection() == [("acme", "own")]
    assert acme.collect_garbage(["own"]) == 1 and acme.pending_collection() == []
    assert saver.pending_collection() == [("victim", "secret")]  # an unpinned saver: all


def test_both_savers_answer_both_conventions(saver: Any) -> None:
    """Every public method has its twin of the other convention on both savers (before:
    collect_garbage, delete_expired and pending_collection were the sync saver's only,
    their a-versions the async saver's only)."""
    names = {
        n
        for cls in (AccordSaver, AsyncAccordSaver)
        for n, v in inspect.getmembers(cls, callable)
        if not n.startswith("_")
    }
    twins = {n for n in names if f"a{n}" in names}
    assert {"collect_garbage", "delete_expired", "pending_collection", "sweep"} <= twins
    for cls in (AccordSaver, AsyncAccordSaver):
        missing = sorted(m for n in twins for m in (n, f"a{n}") if not hasattr(cls, m))
        assert missing == [], (cls.__name__, missing)
    # each answers: the async saver's sync twins here (the fixture drives it through them)
    assert saver.pending_collection() == []
    assert saver.collect_garbage(["nothing"]) == 0
    assert saver.delete_expired([]) == (0, 0)
    if isinstance(saver, AccordSaver):  # the sync saver's async twins

        async def answers() -> tuple[Any, ...]:
            return (
                await saver.apending_collection(),
                await saver.acollect_garbage(["nothing"]),
                await saver.adelete_expired([]),
            )

        assert asyncio.run(answers()) == ([], 0, (0, 0))


def test_copy_thread_copies_messages_and_head(client: MongoClient, saver: Any) -> None:
    ids = _chain(saver, "src", [{"messages": [HumanMessage("hi", id="1")]}])
    saver.copy_thread("src", "dst")
    tup = saver.get_tuple(config("dst"))
    assert tup is not None and tup.checkpoint["channel_values"]["messages"][0].content == "hi"
    # the copy is writable: its head is its latest checkpoint
    cp = generate_checkpoint(channel_values={"v": 1}, channel_versions={"v": "1"})
    saver.put(config("dst", ids[-1]), cp, generate_metadata(step=1), {"v": "1"})


def test_a_copy_stops_when_the_source_is_written_meanwhile_and_resume_finishes_it(
    client: MongoClient, saver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values are copied before checkpoints: a commit on the source in between would
    leave a copied checkpoint without its values (it read as empty state)."""
    ids = _chain(saver, "busy", [{"v": 1}, {"v": 2}])
    writer = AccordSaver(client, db_name=saver.db_name)
    real = maintenance.rekey
    written: list[str] = []

    def rekey(kind: str, doc: Any, thread_id: str) -> Any:
        if kind == "checkpoints" and not written:  # the source commits mid-copy
            cp = generate_checkpoint(channel_values={"v": 3}, channel_versions={"v": "3"})
            cfg = writer.put(config("busy", ids[-1]), cp, generate_metadata(step=2), {"v": "3"})
            written.append(cfg["configurable"]["checkpoint_id"])
        return real(kind, doc, thread_id)

    monkeypatch.setattr(maintenance, "rekey", rekey)
    with pytest.raises(ConcurrentRunError, match="written while it was copied"):
        saver.copy_thread("busy", "copy")
    monkeypatch.undo()
    assert saver.get_tuple(config("copy")) is None  # no checkpoint of it was copied
    saver.copy_thread("busy", "copy", resume=True)
    source = [t.checkpoint for t in saver.list(config("busy"))]
    copied = [t.checkpoint for t in saver.list(config("copy"))]
    assert [c["id"] for c in copied] == [c["id"] for c in source] and len(source) == 3
    assert [c["channel_values"] for c in copied] == [c["channel_values"] for c in source]
    assert copied[0]["channel_values"] == {"v": 3}


def _messages_at(saver: Any, thread: str, cid: str | None = None) -> list[Any]:
    tup = saver.get_tuple(config(thread, cid))
    assert tup is not None
    return [(m.id, m.content) for m in tup.checkpoint["channel_values"]["messages"]]


def test_message_ref_chains_round_trip_through_edits_forks_and_gc(
    client: MongoClient, saver: Any, saver_factory: Any
) -> None:
    """A message channel is stored as segments (the keys appended since the previous
    version) chained down to a snapshot: every checkpoint reassembles exactly, through
    edits and removals (new snapshots), a fork (a new chain), a cold cache, and pruning."""
    blobs = client[saver.db_name].accord_checkpoint_blobs
    msgs: list[Any] = []
    steps = []
    for i in range(300):
        if i == 100:
            msgs = [AIMessage("edited", id="h3") if m.id == "h3" else m for m in msgs]
        if i == 200:
            msgs = [m for m in msgs if m.id != "h7"]
        msgs = [*msgs, HumanMessage(f"m{i}", id=f"h{i}")]
        steps.append({"messages": msgs})
    ids = _chain(saver, "chains", steps)
    expected = [[(m.id, m.content) for m in s["messages"]] for s in steps]
    for i in [*range(0, 300, 7), 299]:
        assert _messages_at(saver, "chains", ids[i]) == expected[i], i

    # each step stored about one key (a segment), plus a page every PAGE steps and a
    # snapshot every ~doubling
    refs = [d for d in blobs.find({"thread_id": "chains", "channel": "messages"})]
    snapshots = [d for d in refs if d["seq"] == 0]
    assert len(snapshots) <= 8, [len(d["refs"]) for d in snapshots]
    assert sum(len(d["refs"]) for d in refs) <= 4 * 300
    assert max(d["seq"] for d in refs) <= 130
    # a reader fetches the snapshot, the pages and its own page window, not the whole chain
    latest = client[saver.db_name].accord_checkpoints.find_one(
        {"thread_id": "chains", "checkpoint_id": ids[-1]}
    )
    batch = ReadBatch(saver.tenant_id, [latest], saver.serde)
    chain_filter = batch.chains_filter()
    assert chain_filter is not None and chain_filter["thread_id"] == "chains"
    ((chain, seq),) = latest["chains"]
    fetched = list(blobs.find(chain_filter))
    assert len(fetched) <= 1 + seq // PAGE + PAGE
    assert len(fetched) < len([d for d in refs if d["chain"] == chain])

    # a fork from step 150 starts its own chain; both branches read back exactly
    old = saver.get_tuple(config("chains", ids[150]))
    assert old is not None
    forked = [*old.checkpoint["channel_values"]["messages"], AIMessage("fork", id="f")]
    cp = generate_checkpoint(
        channel_values={"messages": forked},
        channel_versions={
            "messages": saver.get_next_version(old.checkpoint["channel_versions"]["messages"], None)
        },
    )
    fork_cfg = saver.put(
        old.config, cp, generate_metadata(step=151, source="fork"), cp["channel_versions"]
    )
    assert _messages_at(saver, "chains", fork_cfg["configurable"]["checkpoint_id"]) == [
        *expected[150],
        ("f", "fork"),
    ]
    assert _messages_at(saver, "chains", ids[299]) == expected[299]
    fork_blob = blobs.find_one(
        {"thread_id": "chains", "version": cp["channel_versions"]["messages"]}
    )
    assert fork_blob is not None and fork_blob["seq"] == 0  # a new chain

    # a saver with a cold cache continues the chain of the head it reads
    fresh = saver_factory(setup=False)
    head = fresh.get_tuple(config("chains"))
    assert head is not None
    more = [*head.checkpoint["channel_values"]["messages"], HumanMessage("cold", id="c")]
    version = fresh.get_next_version(head.checkpoint["channel_versions"]["messages"], None)
    cp = generate_checkpoint(
        channel_values={"messages": more}, channel_versions={"messages": version}
    )
    cold = fresh.put(head.config, cp, generate_metadata(step=152), {"messages": version})
    new_blob = blobs.find_one({"thread_id": "chains", "version": version})
    assert (
        new_blob is not None and new_blob["seq"] > 0 and new_blob["refs"] == [new_blob["refs"][0]]
    )
    latest = _messages_at(saver, "chains", cold["configurable"]["checkpoint_id"])
    assert (
        latest[-1] == ("c", "cold")
        and len(latest) == len(head.checkpoint["channel_values"]["messages"]) + 1
    )

    # pruning keeps exactly the chain the remaining checkpoint needs
    saver.prune(["chains"])
    assert _messages_at(fresh, "chains") == latest
    assert _messages_at(saver_factory(setup=False), "chains") == latest
    kept = list(blobs.find({"thread_id": "chains", "channel": "messages"}))
    assert len(kept) == new_blob["seq"] + 1


def test_message_refs_of_the_earlier_layout_still_read(
    client: MongoClient, saver: Any, saver_factory: Any
) -> None:
    """Blobs written before chains (a snapshot, then deltas on it) read back, and the
    next change starts a chain."""
    m = [HumanMessage(f"m{i}", id=f"m{i}") for i in range(3)]
    ids = _chain(saver, "old", [{"messages": m[:2]}, {"messages": m}])
    blobs = client[saver.db_name].accord_checkpoint_blobs
    first, second = sorted(
        blobs.find({"thread_id": "old", "channel": "messages"}), key=lambda d: d["version"]
    )
    blobs.update_one({"_id": first["_id"]}, {"$unset": {"chain": "", "seq": ""}})
    blobs.update_one(
        {"_id": second["_id"]},
        {
            "$unset": {"chain": "", "seq": "", "prev": ""},
            "$set": {"base": first["key"], "base_len": 2},
        },
    )
    client[saver.db_name].accord_checkpoints.update_many(
        {"thread_id": "old"}, {"$unset": {"chains": ""}}
    )
    fresh = saver_factory(setup=False)
    assert [mid for mid, _ in _messages_at(fresh, "old", ids[0])] == ["m0", "m1"]
    head = fresh.get_tuple(config("old"))
    assert head is not None and [x.id for x in head.checkpoint["channel_values"]["messages"]] == [
        "m0",
        "m1",
        "m2",
    ]
    more = [*m, HumanMessage("m3", id="m3")]
    cp = generate_checkpoint(channel_values={"messages": more}, channel_versions={"messages": "9"})
    fresh.put(head.config, cp, generate_metadata(step=2), {"messages": "9"})
    assert [mid for mid, _ in _messages_at(fresh, "old")] == ["m0", "m1", "m2", "m3"]
    assert blobs.find_one({"thread_id": "old", "version": "9"})["seq"] == 0


def test_mongodbsaver_arguments_and_ttl(client: MongoClient, saver_factory: Any) -> None:
    """MongoDBSaver's ``checkpoint_collection_name``, ``writes_collection_name`` and
    ``ttl``: the names are used; a thread not written for ``ttl`` seconds is deleted by
    the sweep (a thread written since, or held by a run, is not)."""
    s = saver_factory(
        checkpoint_collection_name="my_checkpoints", writes_collection_name="my_writes", ttl=3600
    )
    db = client[s.db_name]
    ids = _chain(s, "old", [{"v": 1}, {"v": 2}])
    s.put_writes(config("old", ids[-1]), [("v", 3)], "task")
    assert db.my_checkpoints.count_documents({"thread_id": "old"}) == 2
    assert db.my_writes.count_documents({"thread_id": "old"}) == 1
    assert "accord_checkpoints" not in db.list_collection_names()
    # each commit stamps the thread's expiry ttl seconds ahead
    stamped = db.runs.find_one({"thread_id": "old"})["expire_at"].replace(tzinfo=UTC)
    ahead = (stamped - datetime.now(UTC)).total_seconds()
    assert 3500 < ahead <= 3600, ahead
    # the hour passes for "old" (moved, not waited: "fresh" stays an hour from its write
    # however slow this machine is)
    db.runs.update_one({"thread_id": "old"}, {"$set": {"expire_at": stamped - timedelta(hours=2)}})
    _chain(s, "fresh", [{"v": 1}])  # written just now
    assert s.sweep() == 1
    assert db.my_checkpoints.count_documents({"thread_id": "old"}) == 0
    assert db.accord_checkpoint_blobs.count_documents({"thread_id": "old"}) == 0
    assert s.get_tuple(config("old")) is None
    assert s.get_tuple(config("fresh")) is not None
    assert s.sweep() == 0


def test_a_saver_pinned_to_a_tenant_sweeps_its_tenant_only(
    client: MongoClient, saver_factory: Any
) -> None:
    """It swept every tenant's expired threads, and deleted any tenant's given to it."""
    acme, other = saver_factory(ttl=3600, tenant_id="acme"), saver_factory(ttl=3600, tenant_id="b")
    for s in (acme, other):
        _chain(s, "old", [{"v": 1}])
    db = client[acme.db_name]
    past = datetime.now(UTC) - timedelta(hours=2)
    assert (
        db.runs.update_many({"thread_id": "old"}, {"$set": {"expire_at": past}}).modified_count == 2
    )
    with pytest.raises(InvalidInputError, match="serves tenant 'acme' only"):
        if isinstance(acme, AsyncAccordSaver):  # refused before any I/O
            asyncio.run(acme.adelete_expired([("b", "old")]))
        else:
            acme.delete_expired([("b", "old")])
    assert acme.sweep() == 1
    assert acme.get_tuple(config("old")) is None
    assert other.get_tuple(config("old")) is not None  # tenant b's: its own saver's job
    assert other.sweep() == 1


def _params(fn: Any) -> list[str]:
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    ]


@pytest.mark.parametrize("saver_class", [AccordSaver, AsyncAccordSaver])
def test_mongodbsaver_signatures(saver_class: Any) -> None:
    """A call written for MongoDBSaver (positional or by name) means the same here: its
    constructor's and ``from_conn_string``'s parameters, in its order."""
    assert _params(saver_class.__init__)[:6] == _params(MongoDBSaver.__init__)[:6]
    assert _params(saver_class.from_conn_string)[:5] == _params(MongoDBSaver.from_conn_string)[:5]


def test_from_conn_string_waits_for_an_absent_server_as_connect_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It built a plain client: 30 s (pymongo's default) before an unreachable host was
    reported, whatever ACCORD_SERVER_SELECTION_TIMEOUT said."""
    import socket
    import time

    from accord.errors import DatabaseUnreachable

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("ACCORD_SERVER_SELECTION_TIMEOUT", "1")
    started = time.monotonic()
    absent = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    with pytest.raises(DatabaseUnreachable), AccordSaver.from_conn_string(absent):
        pass
    assert time.monotonic() - started < 10


def test_mongodbsaver_calls_work_unchanged(client: MongoClient, mongo_uri: str) -> None:
    """``AccordSaver(client, "db", "my_checkpoints", "my_writes", ttl)`` and
    ``from_conn_string(uri, "db", checkpoint_collection_name=..., ...)``, as written for
    MongoDBSaver, for both savers: the names and the ttl are used."""
    dbs = ["mdbargs_" + uuid.uuid4().hex[:8] for _ in range(3)]
    try:
        positional = AccordSaver(client, dbs[0], "my_checkpoints", "my_writes", 60)
        positional.setup()
        with AccordSaver.from_conn_string(
            mongo_uri,
            dbs[1],
            checkpoint_collection_name="my_checkpoints",
            writes_collection_name="my_writes",
            ttl=60,
        ) as from_string:
            for s in (positional, from_string):
                assert s.ttl == 60
                ids = _chain(s, "t", [{"v": 1}])
                s.put_writes(config("t", ids[-1]), [("v", 2)], "task")

        async def run_async() -> None:
            async with AsyncAccordSaver.from_conn_string(
                mongo_uri, dbs[2], "my_checkpoints", "my_writes", 60
            ) as a:
                assert a.ttl == 60
                cp = generate_checkpoint(channel_values={"v": 1}, channel_versions={"v": "1"})
                cfg = await a.aput(config("t"), cp, generate_metadata(), {"v": "1"})
                await a.aput_writes(cfg, [("v", 2)], "task")

        asyncio.run(run_async())
        for name in dbs:
            db = client[name]
            assert db.my_checkpoints.count_documents({"thread_id": "t"}) == 1, name
            assert db.my_writes.count_documents({"thread_id": "t"}) == 1, name
            assert "accord_checkpoints" not in db.list_collection_names(), name
            assert "accord_checkpoint_writes" not in db.list_collection_names(), name
    finally:
        for name in dbs:
            client.drop_database(name)
