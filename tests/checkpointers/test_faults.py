"""Faults found by fault and bad-input testing (issue 6), each for both savers.

* a fan-out/fan-in barrier (``add_edge([a, b], "join")``) saved with the value it had
  when LangGraph handed it over, not a later one, under "sync" and "async" durability;
* business writes cannot move a document to another tenant, or remove its tenant;
* business writes cannot target any accord-owned collection of the database, whichever
  saver (or component: long-term memory) owns it;
* concurrent ``setup()`` on a fresh database is idempotent;
* failures reach the caller as accord errors, within the saver's time bound;
* ``list(None)`` over threads that hold an identical message;
* a commit whose reply is lost (the connection closes after the server committed) is
  retried and applied once.
"""

from __future__ import annotations

import operator
import threading
import time
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from accord.checkpointers import CollectionNames, business
from accord.checkpointers.storage import BUSINESS_CHANNEL
from accord.errors import AccordError, DatabaseError, InvalidInputError, TransactionTimeout
from accord.memory.embedders import HashingEmbedder
from accord.memory.synchronous.service import MemoryService
from accord.platform import artifacts, gridfs_layout, runs, undo_log, workflow_log
from accord.platform.synchronous.call_log import CallLog
from accord.platform.synchronous.catalog import Catalog
from accord.platform.synchronous.run_queue import RunQueue
from accord.platform.synchronous.unit_of_work import UnitOfWork
from tests.checkpointers.conftest import config, make_saver
from tests.checkpointers.lossy_proxy import LossyProxy, uri_through


class Fan(TypedDict):
    log: Annotated[list[str], operator.add]


def _fan_graph(stage: bool = True) -> StateGraph:
    """``first -> (a, b) -> join``, and ``join`` fans out to ``(a, b)`` again, twice, then
    ``after``. ``join`` stages a business write, so under "async" durability the put of
    the checkpoint after ``join`` (whose barrier value is LangGraph's live, empty set of
    seen nodes) waits for ``join``'s writes while LangGraph already runs the next ``a``
    and ``b``, which add themselves to that very set."""

    def node(name: str) -> Any:
        def run(state: Fan) -> dict[str, Any]:
            if stage and name == "join":
                business.update_one("fan", {"_id": name}, {"$inc": {"n": 1}}, upsert=True)
            return {"log": [name]}

        return run

    def again(state: Fan) -> list[str]:
        return ["a", "b"] if state["log"].count("join") < 3 else ["after"]

    g = StateGraph(Fan)
    for name in ("first", "a", "b", "join", "after"):
        g.add_node(name, node(name))
    g.add_edge(START, "first")
    g.add_edge("first", "a")
    g.add_edge("first", "b")
    g.add_edge(["a", "b"], "join")
    g.add_conditional_edges("join", again, ["a", "b", "after"])
    return g


def _barrier_history(saver: Any, thread: str) -> tuple[list[Any], list[Any]]:
    graph = _fan_graph(stage=False).compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": thread}}
    return [
        (s.metadata["step"], sorted(s.values["log"]), s.next)
        for s in reversed(list(graph.get_state_history(cfg)))
    ], [
        (t.metadata["step"], t.checkpoint["channel_values"].get("join:a+b:join"))
        for t in reversed(list(saver.list(cfg)))
    ]


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_fan_in_barrier_is_saved_as_handed_over(
    saver: Any, monkeypatch: pytest.MonkeyPatch, durability: str
) -> None:
    """LangGraph hands ``put`` live objects (the barrier's set of seen nodes) and keeps
    changing them while an "async" save is in flight: the saved checkpoints must equal
    InMemorySaver's, run after run, and the thread must reach ``join``. The writes of
    ``first`` are slowed down (as a loaded database would), so the put waiting for them
    is still waiting when ``a`` and ``b`` add themselves to the barrier. Under "sync"
    durability LangGraph waits for each put: the same history, and no waits to hide it."""
    put_writes = saver.put_writes

    def slow_put_writes(config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        if any(channel == BUSINESS_CHANNEL for channel, _ in writes):
            time.sleep(0.2)
        put_writes(config, writes, task_id, task_path)

    monkeypatch.setattr(saver, "put_writes", slow_put_writes)
    reference = InMemorySaver()
    _fan_graph(stage=False).compile(checkpointer=reference).invoke({"log": []}, config("ref"))
    expected = _barrier_history(reference, "ref")
    for i in range(5):
        thread = f"fan-{i}"
        out = (
            _fan_graph()
            .compile(checkpointer=saver)
            .invoke({"log": []}, config(thread), durability=durability)
        )
        assert sorted(out["log"]) == sorted(["first", *["a", "b", "join"] * 3, "after"])
        assert _barrier_history(saver, thread) == expected, i


def _tenant_node(kind: str) -> Any:
    def node(state: Fan) -> dict[str, Any]:
        if kind == "set":
            business.update_one("docs", {"_id": "x"}, {"$set": {"tenant_id": "acme"}}, upsert=True)
        elif kind == "set-nested":
            business.update_one("docs", {"_id": "x"}, {"$set": {"tenant_id.x": 1}}, upsert=True)
        elif kind == "pipeline":
            business.update_one(
                "docs", {"_id": "x"}, [{"$set": {"tenant_id": "acme"}}], upsert=True
            )
        elif kind == "pipeline-replace":
            business.update_one("docs", {"_id": "x"}, [{"$replaceWith": {"a": 1}}], upsert=True)
        elif kind == "rename":
            business.update_one("docs", {"_id": "x"}, {"$rename": {"tenant_id": "t"}})
        elif kind == "rename-onto":
            business.update_one("docs", {"_id": "x"}, {"$rename": {"other": "tenant_id"}})
        elif kind == "unset":
            business.update_one("docs", {"_id": "x"}, {"$unset": {"tenant_id": ""}})
        elif kind == "set-on-insert":
            business.update_one(
                "docs", {"_id": "y"}, {"$setOnInsert": {"tenant_id": "acme"}}, upsert=True
            )
        elif kind == "replace":
            business.replace_one("docs", {"_id": "x"}, {"tenant_id": "acme", "a": 1}, upsert=True)
        elif kind == "insert":
            business.insert_one("docs", {"_id": "z", "tenant_id": "acme"})
        return {"log": ["done"]}

    return node


TENANT_ESCAPES = [
    "set",
    "set-nested",
    "pipeline",
    "pipeline-replace",
    "rename",
    "rename-onto",
    "unset",
    "set-on-insert",
    "replace",
    "insert",
]


@pytest.mark.parametrize("escape", TENANT_ESCAPES)
def test_business_writes_cannot_leave_their_tenant(
    client: MongoClient, saver: Any, escape: str
) -> None:
    db = client[saver.db_name]
    db.docs.insert_one({"_id": "x", "tenant_id": "default", "other": 1})
    g = StateGraph(Fan)
    g.add_node("n", _tenant_node(escape))
    g.add_edge(START, "n")
    with pytest.raises(InvalidInputError, match="tenant"):
        g.compile(checkpointer=saver).invoke({"log": []}, config(f"t-{escape}"))
    # refused in the node: nothing moved, nothing landed in another tenant or none
    assert list(db.docs.find()) == [{"_id": "x", "tenant_id": "default", "other": 1}]


def test_business_writes_cannot_target_another_components_collections(
    client: MongoClient, mongo_uri: str, db_name: str, kind: str
) -> None:
    """Every accord-owned collection of the database is reserved, whichever component
    (or application) configured its name: a second saver with other names (all six of
    its artifact classes), the long-term memory service's three collections (set up
    after this saver started: it re-reads the catalog), this saver's own collections,
    and the catalog. Each is in the platform's catalog; none may receive a business
    write, and nothing is written to it."""
    other_names = CollectionNames(
        checkpoints="b_checkpoints",
        blobs="b_blobs",
        writes="b_writes",
        messages="b_messages",
        runs="b_runs",
        outbox="b_outbox",
    )
    with (
        make_saver(kind, mongo_uri, db_name) as first,
        make_saver(kind, mongo_uri, db_name, collections=other_names),
    ):
        memory = MemoryService(
            client,
            db_name=db_name,
            embedder=HashingEmbedder(16),
            memory_collection="m_memories",
            history_collection="m_history",
            vectors_collection="m_vectors",
        )
        memory.setup()
        # the collection a MongoDBSaver migration records its progress in
        Catalog(UnitOfWork(client), db_name).setup(
            "checkpointer.migration", {"accord_migrations": artifacts.MIGRATION.name}
        )
        # the recorded calls of durable execution (set up at a run's first recorded call)
        CallLog(UnitOfWork(client), db_name).setup()
        # the queue of runs (set up by Accord.runs(), accord runs, accord worker)
        RunQueue(UnitOfWork(client), db_name).setup()
        # artifacts (set up at the first one stored); the undo log is a default hook's
        first.put_artifact({"configurable": {"thread_id": "setup"}}, b"x")
        cataloged = {d["_id"]: d["artifact"] for d in client[db_name].accord_catalog.find()}
        owned_classes = {c.name for c in artifacts.CLASSES.values() if c.default_collection}
        targets = [
            *other_names.all().values(),
            *CollectionNames().all().values(),
            "m_memories",
            "m_history",
            "m_vectors",
            "accord_migrations",
            "accord_recorded_calls",
            "accord_run_queue",
            artifacts.CATALOG_COLLECTION,
            workflow_log.COLLECTION,
            gridfs_layout.FILES,
            gridfs_layout.CHUNKS,
            undo_log.COLLECTION,
            "accord_keys",
        ]
        # every artifact class that has collections so far is covered (audit records
        # and checkpoint heads have no component writing them yet; applied policies and
        # legal holds are recorded by `accord governance apply`,
        # tests/governance/test_enforcement.py; audit digests by `accord audit digest`,
        # tests/governance/test_audit_digests.py)
        covered = {cataloged.get(t, "catalog") for t in targets}
        # data keys are made by the encryption hook under an encrypting policy
        # (tests/governance/test_encryption.py); their collection is a target all the same
        owned_elsewhere = {
            "audit", "audit_digest", "checkpoint_head", "policy", "hold", "encryption_key",
        }  # fmt: skip
        assert owned_classes - covered <= owned_elsewhere, owned_classes - covered
        for target in targets:
            before = client[db_name][target].count_documents({})

            def node(state: Fan, target: str = target) -> dict[str, Any]:
                business.insert_one(target, {"x": 1})
                return {"log": ["x"]}

            g = StateGraph(Fan)
            g.add_node("n", node)
            g.add_edge(START, "n")
            with pytest.raises(InvalidInputError, match="accord") as info:
                g.compile(checkpointer=first).invoke({"log": []}, config(f"c-{target}"))
            assert repr(target) in str(info.value), str(info.value)
            assert client[db_name][target].count_documents({"x": 1}) == 0, target
            if target not in (CollectionNames().all().values()):
                assert client[db_name][target].count_documents({}) == before, target


def test_concurrent_setup_is_idempotent(client: MongoClient, mongo_uri: str, kind: str) -> None:
    """Savers setting up a fresh database at the same time (NamespaceExists races), on
    their own clients, five fresh databases in a row."""
    for attempt in range(5):
        db_name = f"setup_race_{attempt}_{time.monotonic_ns()}"
        errors: list[BaseException] = []
        savers = [make_saver(kind, mongo_uri, db_name, setup=False) for _ in range(6)]
        opened = [cm.__enter__() for cm in savers]
        barrier = threading.Barrier(len(opened))

        def one(
            saver: Any, barrier: threading.Barrier = barrier, errors: list[Any] = errors
        ) -> None:
            try:
                barrier.wait(10)
                if hasattr(saver, "_on_loop"):
                    saver._on_loop(saver.setup())
                else:
                    saver.setup()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(s,)) for s in opened]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        finally:
            for cm in savers:
                cm.__exit__(None, None, None)
            client.drop_database(db_name)
        assert errors == [], errors


def test_oversized_metadata_is_an_accord_error(saver: Any, client: MongoClient) -> None:
    """20 MB of run metadata: a clear accord error (not a raw ClientBulkWriteException),
    nothing written."""
    cp = generate_checkpoint(channel_values={"v": 1}, channel_versions={"v": "1"})
    meta = generate_metadata(note="x" * (20 * 1024 * 1024))
    with pytest.raises(AccordError) as info:
        saver.put(config("big-meta"), cp, meta, {"v": "1"})
    assert not isinstance(info.value, PyMongoError)
    assert "16 MiB" in str(info.value), str(info.value)
    assert client[saver.db_name].accord_checkpoints.count_documents({"thread_id": "big-meta"}) == 0


def test_a_blocked_write_is_bounded_and_an_accord_error(
    client: MongoClient, mongo_uri: str, db_name: str, kind: str
) -> None:
    """Another transaction holds the thread's registry document: the saver retries the
    write conflict until its ``timeout``, then raises TransactionTimeout (an accord
    error), not after minutes, not a raw OperationFailure."""
    with make_saver(kind, mongo_uri, db_name, timeout=2.0) as saver:
        saver.put(
            config("held"),
            generate_checkpoint(),
            generate_metadata(),
            {},
        )
        session = client.start_session()
        session.start_transaction()
        client[db_name].runs.update_one(
            {"_id": runs.run_doc_id("default", "held")}, {"$set": {"x": 1}}, session=session
        )
        try:
            started = time.monotonic()
            cp = generate_checkpoint(channel_values={"v": 1}, channel_versions={"v": "1"})
            with pytest.raises(TransactionTimeout) as info:
                saver.put(config("held"), cp, generate_metadata(), {"v": "1"})
            assert time.monotonic() - started < 15
            assert "retry" in str(info.value)
        finally:
            session.abort_transaction()
            session.end_session()


def test_an_unreachable_database_is_an_accord_error_within_the_bound(kind: str) -> None:
    uri = "mongodb://127.0.0.1:9/?directConnection=true&serverSelectionTimeoutMS=60000"
    with make_saver(kind, uri, "nowhere", setup=False, timeout=1.0) as saver:
        started = time.monotonic()
        with pytest.raises(DatabaseError) as info:
            saver.get_tuple(config("t"))
        assert time.monotonic() - started < 10
        assert "reachable" in str(info.value)
        with pytest.raises(DatabaseError):
            saver.put(config("t"), generate_checkpoint(), generate_metadata(), {})
        assert time.monotonic() - started < 20


def test_list_all_threads_with_identical_messages(saver: Any) -> None:
    same = HumanMessage("hello", id="same-id")
    for thread in ("one", "two"):
        cp = generate_checkpoint(
            channel_values={"messages": [same]}, channel_versions={"messages": "1"}
        )
        saver.put(config(thread), cp, generate_metadata(), {"messages": "1"})
    tuples = list(saver.list(None))
    assert len(tuples) == 2
    for tup in tuples:
        assert tup.checkpoint["channel_values"]["messages"] == [same]


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_a_commit_whose_reply_is_lost_is_applied_once(
    client: MongoClient, mongo_uri: str, db_name: str, kind: str, durability: str
) -> None:
    """The server commits a step's transaction but the connection closes before its reply
    reaches the saver (``UnknownTransactionCommitResult``): the commit is retried, and the
    step (checkpoint, messages, business writes) exists once, neither lost nor doubled."""
    port = int(mongo_uri.split(":")[2].split("/")[0])
    proxy = LossyProxy(port, drop="commitTransaction", times=3).start()
    try:
        with make_saver(kind, uri_through(proxy), db_name) as saver:

            def node(state: Fan) -> dict[str, Any]:
                business.update_one("counts", {"_id": "c"}, {"$inc": {"n": 1}}, upsert=True)
                business.insert_one("once", {"_id": f"step-{len(state['log'])}"})
                return {"log": ["x"]}

            g = StateGraph(Fan)
            g.add_node("n", node)
            g.add_edge(START, "n")
            graph = g.compile(checkpointer=saver)
            for i in range(3):
                out = graph.invoke({"log": [f"in{i}"]}, config("lost"), durability=durability)
            assert proxy.dropped == 3
            assert out["log"] == ["in0", "x", "in1", "x", "in2", "x"]
            db = client[db_name]
            assert db.counts.find_one({"_id": "c"})["n"] == 3
            assert sorted(d["_id"] for d in db.once.find()) == ["step-1", "step-3", "step-5"]
            history = list(graph.get_state_history(config("lost")))
            assert (
                len(history) == 9
                and len({s.config["configurable"]["checkpoint_id"] for s in history}) == 9
            )
    finally:
        proxy.close()


def test_a_commit_whose_reply_never_comes_is_reported_as_unknown(
    client: MongoClient, mongo_uri: str, db_name: str, kind: str
) -> None:
    """Every commit's reply lost until the bound: the server may well have applied it,
    so the error must not say that nothing was committed (it said so before)."""
    with make_saver(kind, mongo_uri, db_name):
        pass  # set up directly
    port = int(mongo_uri.split(":")[2].split("/")[0])
    proxy = LossyProxy(port, drop="commitTransaction", times=10**6).start()
    try:
        with (
            pytest.raises(TransactionTimeout, match="is unknown") as lost,
            make_saver(kind, uri_through(proxy), db_name, timeout=3) as saver,
        ):
            saver.put(config("t"), generate_checkpoint(), generate_metadata(), {})
        assert "Nothing of it was committed" not in str(lost.value)
        assert proxy.dropped >= 1
    finally:
        proxy.close()
