"""The storage journal (accord/platform/embedded/storage.py): a group of commits is one row
of ``journal``; ``compact`` moves rows into the tables later, in order.

What must hold whatever the journal holds when the process stops: every acknowledged
commit is loaded at the next start, in commit order (a later write of a document wins, a
deleted document stays deleted, a dropped or renamed collection does not come back), and
a compaction that fails half-way loses nothing.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import bson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient

from accord.platform.embedded import EmbeddedServer
from accord.platform.embedded.storage import JOURNAL_MAX_BYTES, CommitBatch, Storage

pytestmark = pytest.mark.embedded_only

NS = "db.c"


def _doc(key: int, **fields: object) -> tuple[str, bytes, bytes]:
    return (NS, b"k%d" % key, bson.encode({"_id": key, **fields}))


def _journal_rows(dbpath: Path) -> int:
    with sqlite3.connect(dbpath / Storage.FILENAME) as conn:
        return int(conn.execute("SELECT count(*) FROM journal").fetchone()[0])


def _documents(storage: Storage) -> dict[bytes, dict]:
    return {key: bson.decode(data) for ns, key, data in storage.load_documents() if ns == NS}


def _create_collection(storage: Storage, ts: int) -> None:
    """The collection, in the tables already (its catalog change compacted)."""
    storage.apply([CommitBatch(ts=ts, catalog=[("save", NS, {"options": {}, "indexes": []})])])
    assert storage.compact() == 1


def test_commits_are_journaled_and_loaded_after_a_stop_without_compaction(
    tmp_path: Path,
) -> None:
    storage = Storage(tmp_path)
    _create_collection(storage, 1)
    storage.apply([CommitBatch(ts=2, puts=[_doc(1, n=1), _doc(2, n=1)])])
    storage.apply(
        [
            CommitBatch(ts=3, puts=[_doc(1, n=2)]),  # a later write of the same document
            CommitBatch(ts=4, deletes=[(NS, b"k2")]),
            CommitBatch(ts=5, puts=[_doc(3, n=1)], txn_records=[(b"lsid", 7, {"kind": "retry"})]),
        ]
    )
    assert _journal_rows(tmp_path) == 2  # one row per group, not yet in the tables
    storage.close()  # as a killed process leaves it: the journal not compacted

    reopened = Storage(tmp_path)
    assert _journal_rows(tmp_path) == 0  # the start compacts what was left
    assert reopened.last_ts == 5
    docs = _documents(reopened)
    assert docs == {b"k1": {"_id": 1, "n": 2}, b"k3": {"_id": 3, "n": 1}}
    assert list(docs) == [b"k1", b"k3"]  # natural (insertion) order kept
    assert [(lsid, n) for lsid, n, _ in reopened.load_txn_records()] == [(b"lsid", 7)]
    reopened.close()


def test_a_dropped_or_renamed_collection_does_not_come_back_from_the_journal(
    tmp_path: Path,
) -> None:
    storage = Storage(tmp_path)
    _create_collection(storage, 1)
    storage.apply([CommitBatch(ts=2, puts=[_doc(1)])])  # journaled
    # Catalog changes are journaled too, in order with the commits around them.
    storage.apply([CommitBatch(ts=3, catalog=[("rename", NS, "db.renamed")])])
    storage.apply([CommitBatch(ts=4, puts=[("db.renamed", b"k2", bson.encode({"_id": 2}))])])
    storage.apply([CommitBatch(ts=5, catalog=[("drop", "db.renamed", None)])])
    storage.close()

    reopened = Storage(tmp_path)
    assert list(reopened.load_documents()) == []
    assert list(reopened.load_collections()) == []
    reopened.close()


def test_a_large_group_goes_to_the_tables_after_the_journal_rows_before_it(
    tmp_path: Path,
) -> None:
    storage = Storage(tmp_path)
    _create_collection(storage, 1)
    storage.apply([CommitBatch(ts=2, puts=[_doc(1, n=1), _doc(2, n=1)])])
    big = _doc(1, n=2, pad="x" * (JOURNAL_MAX_BYTES + 1))
    storage.apply([CommitBatch(ts=3, puts=[big])])
    assert _journal_rows(tmp_path) == 0  # its own commit moved the row before it first
    storage.apply([CommitBatch(ts=4, puts=[_doc(2, n=2)])])
    storage.close()

    reopened = Storage(tmp_path)
    docs = _documents(reopened)
    assert docs[b"k1"]["n"] == 2 and docs[b"k2"]["n"] == 2
    assert reopened.last_ts == 4
    reopened.close()


def test_a_compaction_moves_a_bounded_number_of_bytes(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    _create_collection(storage, 1)
    pad = "x" * (JOURNAL_MAX_BYTES // 3 - 1000)  # three rows fit, a fourth does not
    for ts in range(2, 8):
        storage.apply([CommitBatch(ts=ts, puts=[_doc(ts, pad=pad)])])
    assert storage.compact() == 3  # three rows fit the byte bound, not all six
    assert storage.compact() == 3
    assert storage.compact() == 0
    one = _doc(9, pad="x" * (JOURNAL_MAX_BYTES - 1000))
    storage.apply([CommitBatch(ts=9, puts=[one]), CommitBatch(ts=10, puts=[_doc(10)])])
    assert storage.compact(max_bytes=10) == 1  # the first row always moves
    assert len(_documents(storage)) == 8
    storage.close()


def test_a_compaction_that_fails_half_way_loses_nothing(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    _create_collection(storage, 1)
    for ts in range(2, 12):
        storage.apply([CommitBatch(ts=ts, puts=[_doc(ts, n=ts, pad="x" * 3000)])])
    # A full disk (the storage's test seam): moving the rows needs pages it cannot have.
    storage.limit_pages(storage.page_count())
    with pytest.raises(sqlite3.OperationalError, match="full"):
        storage.compact()
    storage.limit_pages(None)
    assert _journal_rows(tmp_path) == 10  # rolled back whole: every row still there
    storage.close()

    reopened = Storage(tmp_path)
    assert sorted(doc["n"] for doc in _documents(reopened).values()) == list(range(2, 12))
    assert reopened.last_ts == 11
    reopened.close()


def test_compaction_in_slices_keeps_the_order(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    _create_collection(storage, 1)
    for ts in range(2, 40):
        storage.apply([CommitBatch(ts=ts, puts=[_doc(1, n=ts)])])  # the same document
    moved = [storage.compact(rows=5) for _ in range(10)]
    assert moved == [5, 5, 5, 5, 5, 5, 5, 3, 0, 0]
    assert _documents(storage) == {b"k1": {"_id": 1, "n": 39}}
    storage.close()
    reopened = Storage(tmp_path)
    assert reopened.last_ts == 39
    reopened.close()


def test_a_clean_shutdown_leaves_everything_in_the_tables(tmp_path: Path) -> None:
    with EmbeddedServer(tmp_path, port=0, sync=False) as server:
        client: MongoClient = MongoClient(server.uri)
        for i in range(50):
            client.db.c.insert_one({"_id": i})  # 50 commits, journaled
        client.close()
    # Read without the engine (whose start would compact): the tables hold every commit.
    with sqlite3.connect(tmp_path / Storage.FILENAME) as conn:
        assert conn.execute("SELECT count(*) FROM journal").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM documents WHERE ns = 'db.c'").fetchone()[0] == 50
    with EmbeddedServer(tmp_path, port=0, sync=False) as server:
        client = MongoClient(server.uri)
        assert client.db.c.count_documents({}) == 50
        client.close()


# -- what a compaction leaves in the tables, whatever the commits ----------------------------

_NAMESPACES = ("db.a", "db.b")
_KEYS = (b"k1", b"k2", b"k3")
_LSIDS = (b"s1", b"s2")

_catalog_ops = st.one_of(
    st.tuples(st.just("save"), st.sampled_from(_NAMESPACES), st.just({"options": {}})),
    st.tuples(st.just("drop"), st.sampled_from(_NAMESPACES), st.none()),
    st.tuples(st.just("rename"), st.sampled_from(_NAMESPACES), st.sampled_from(_NAMESPACES)),
)
_batches = st.lists(
    st.tuples(
        st.lists(_catalog_ops, max_size=1),
        st.lists(st.tuples(st.sampled_from(_NAMESPACES), st.sampled_from(_KEYS)), max_size=2),
        st.lists(
            st.tuples(st.sampled_from(_NAMESPACES), st.sampled_from(_KEYS), st.integers(0, 9)),
            max_size=3,
        ),
        st.lists(st.tuples(st.sampled_from(_LSIDS), st.integers(1, 99)), max_size=2),
    ),
    min_size=1,
    max_size=30,
)


def _in_order(raw: list) -> tuple[dict, set, dict, list]:  # type: ignore[type-arg]
    """The tables after applying every batch's rows one by one, in order: the reference;
    and the batches as the engine can make them (a rename onto a namespace in use, which
    the engine refuses, left out)."""
    documents: dict[tuple[str, bytes], int] = {}
    collections: set[str] = set()
    sessions: dict[bytes, int] = {}
    valid = []
    for catalog, deletes, puts, records in raw:
        catalog = [
            (op, a, b)
            for op, a, b in catalog
            if op != "rename"
            or (a != b and b not in collections and all(k[0] != b for k in documents))
        ]
        valid.append((catalog, deletes, puts, records))
        for op, a, b in catalog:
            if op == "save":
                collections.add(a)
            elif op == "drop":
                collections.discard(a)
                documents = {k: v for k, v in documents.items() if k[0] != a}
            elif op == "rename":
                collections = {b if ns == a else ns for ns in collections}
                documents = {((b if k[0] == a else k[0]), k[1]): v for k, v in documents.items()}
        for key in deletes:
            documents.pop(key, None)
        for ns, key, n in puts:
            documents[(ns, key)] = n
        for lsid, number in records:
            sessions[lsid] = number
    return documents, collections, sessions, valid


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=_batches, slice_rows=st.integers(1, 8))
def test_compacted_tables_equal_the_commits_applied_one_by_one(
    tmp_path_factory: pytest.TempPathFactory,
    raw: list,
    slice_rows: int,  # type: ignore[type-arg]
) -> None:
    *expected, batches = _in_order(raw)
    dbpath = tmp_path_factory.mktemp("compact")
    storage = Storage(dbpath, sync=False)
    for ts, (catalog, deletes, puts, records) in enumerate(batches, start=1):
        storage.apply([
            CommitBatch(
                ts=ts,
                catalog=list(catalog),
                deletes=list(deletes),
                puts=[(ns, key, bson.encode({"n": n})) for ns, key, n in puts],
                txn_records=[(lsid, number, {"ok": 1, "n": number}) for lsid, number in records],
            )
        ])  # fmt: skip
    while storage.compact(rows=slice_rows):
        pass
    documents = {(ns, key): bson.decode(data)["n"] for ns, key, data in storage.load_documents()}
    collections = {ns for ns, _ in storage.load_collections()}
    sessions = {lsid: reply["n"] for lsid, _, reply in storage.load_txn_records()}
    storage.close()
    assert [documents, collections, sessions] == expected
