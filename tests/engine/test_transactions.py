"""Multi-document transactions and retryable writes through pymongo sessions."""

from __future__ import annotations

import threading
import time

import pytest
from bson import Int64
from pymongo import MongoClient
from pymongo.errors import DuplicateKeyError, OperationFailure
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from tests.engine.helpers import recording_client

SNAPSHOT = ReadConcern("snapshot")


def test_commit_makes_all_writes_visible(client: MongoClient, db) -> None:
    db.a.insert_one({"_id": 0})
    db.b.insert_one({"_id": 0, "v": 0})
    with client.start_session() as s:
        s.start_transaction()
        db.a.insert_one({"_id": 1}, session=s)
        db.b.update_one({"_id": 0}, {"$set": {"v": 1}}, session=s)
        db.a.delete_one({"_id": 0}, session=s)
        s.commit_transaction()
    assert [d["_id"] for d in db.a.find()] == [1]
    assert db.b.find_one({"_id": 0})["v"] == 1


def test_read_your_own_writes(client: MongoClient, db) -> None:
    db.c.insert_many([{"_id": 1, "v": 1}, {"_id": 2, "v": 2}])
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 3, "v": 3}, session=s)
        db.c.update_one({"_id": 1}, {"$set": {"v": 10}}, session=s)
        db.c.delete_one({"_id": 2}, session=s)
        assert db.c.find_one({"_id": 3}, session=s) == {"_id": 3, "v": 3}
        assert db.c.find_one({"_id": 1}, session=s)["v"] == 10
        assert db.c.find_one({"_id": 2}, session=s) is None
        assert sorted(d["_id"] for d in db.c.find({}, session=s)) == [1, 3]
        assert db.c.count_documents({}, session=s) == 2
        assert sorted(db.c.distinct("v", session=s)) == [3, 10]
        total = list(db.c.aggregate([{"$group": {"_id": None, "t": {"$sum": "$v"}}}], session=s))
        assert total[0]["t"] == 13
        after = db.c.find_one_and_update(
            {"_id": 3}, {"$inc": {"v": 1}}, session=s, return_document=True
        )
        assert after["v"] == 4
        s.commit_transaction()
    assert sorted((d["_id"], d["v"]) for d in db.c.find()) == [(1, 10), (3, 4)]


def test_a_document_written_several_times_commits_its_last_version(client: MongoClient, db) -> None:
    """Each write of a document in a transaction replaces the staged version (the write
    path hands the commit the BSON it already encoded for its size check): the commit
    stores the last one, whichever write produced it."""
    with client.start_session() as s:
        s.start_transaction()
        db.w.insert_one({"_id": 1, "v": "inserted"}, session=s)
        db.w.update_one({"_id": 1}, {"$set": {"v": "updated"}}, session=s)
        db.w.insert_one({"_id": 2, "v": "inserted"}, session=s)
        db.w.delete_one({"_id": 2}, session=s)
        db.w.insert_one({"_id": 3, "v": "inserted"}, session=s)
        db.w.delete_one({"_id": 3}, session=s)
        db.w.insert_one({"_id": 3, "v": "inserted again"}, session=s)
        db.w.find_one_and_replace({"_id": 3}, {"v": "replaced"}, session=s)
        db.w.update_one({"_id": 4}, {"$setOnInsert": {"v": "upserted"}}, upsert=True, session=s)
        db.w.update_one({"_id": 4}, {"$set": {"v": "then set"}}, session=s)
        s.commit_transaction()
    assert list(db.w.find().sort("_id", 1)) == [
        {"_id": 1, "v": "updated"},
        {"_id": 3, "v": "replaced"},
        {"_id": 4, "v": "then set"},
    ]


def test_no_dirty_reads(client: MongoClient, db) -> None:
    db.c.insert_many([{"_id": 1, "v": 1}, {"_id": 2, "v": 2}])
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 3}, session=s)
        db.c.update_one({"_id": 1}, {"$set": {"v": 100}}, session=s)
        db.c.delete_one({"_id": 2}, session=s)
        # Another session (and plain reads) see none of it until the commit.
        assert db.c.find_one({"_id": 3}) is None
        assert db.c.find_one({"_id": 1})["v"] == 1
        assert db.c.find_one({"_id": 2}) is not None
        assert db.c.count_documents({}) == 2
        with client.start_session() as other:
            other.start_transaction()
            assert db.c.find_one({"_id": 1}, session=other)["v"] == 1
            assert db.c.count_documents({}, session=other) == 2
            other.commit_transaction()
        s.commit_transaction()
    assert db.c.find_one({"_id": 1})["v"] == 100
    assert sorted(d["_id"] for d in db.c.find()) == [1, 3]


def test_snapshot_isolation(client: MongoClient, db) -> None:
    db.c.insert_many([{"_id": 1, "v": 1}, {"_id": 2, "v": 1}])
    with client.start_session() as s:
        s.start_transaction(read_concern=SNAPSHOT)
        assert db.c.find_one({"_id": 1}, session=s)["v"] == 1  # establishes the snapshot
        # Commits by others after the snapshot stay invisible to the transaction.
        db.c.update_many({}, {"$set": {"v": 2}})
        db.c.insert_one({"_id": 3, "v": 2})
        db.c.delete_one({"_id": 2})
        assert [d["v"] for d in db.c.find({}, session=s).sort("_id")] == [1, 1]
        assert db.c.count_documents({}, session=s) == 2
        assert db.c.find_one({"_id": 3}, session=s) is None
        s.commit_transaction()
    assert sorted((d["_id"], d["v"]) for d in db.c.find()) == [(1, 2), (3, 2)]


def test_snapshot_is_consistent_across_collections(client: MongoClient, db) -> None:
    db.a.insert_one({"_id": 1, "v": 0})
    db.b.insert_one({"_id": 1, "v": 0})
    with client.start_session() as s:
        s.start_transaction(read_concern=SNAPSHOT)
        assert db.a.find_one(session=s)["v"] == 0
        with client.start_session() as w:
            w.start_transaction()
            db.a.update_one({"_id": 1}, {"$set": {"v": 1}}, session=w)
            db.b.update_one({"_id": 1}, {"$set": {"v": 1}}, session=w)
            w.commit_transaction()
        assert db.b.find_one(session=s)["v"] == 0  # not a mix of before and after
        s.commit_transaction()


def test_abort_discards_everything(client: MongoClient, db) -> None:
    db.c.insert_many([{"_id": 1, "v": 1}, {"_id": 2, "v": 2}])
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 3}, session=s)
        db.c.update_one({"_id": 1}, {"$set": {"v": 100}}, session=s)
        db.c.delete_one({"_id": 2}, session=s)
        db.other.insert_one({"x": 1}, session=s)
        s.abort_transaction()
    assert sorted((d["_id"], d["v"]) for d in db.c.find()) == [(1, 1), (2, 2)]
    assert db.other.count_documents({}) == 0


def test_ending_session_aborts_open_transaction(client: MongoClient, db) -> None:
    db.c.insert_one({"_id": 1, "v": 1})
    s = client.start_session()
    s.start_transaction()
    db.c.update_one({"_id": 1}, {"$set": {"v": 2}}, session=s)
    s.end_session()  # pymongo aborts the transaction
    assert db.c.find_one({"_id": 1})["v"] == 1
    db.c.update_one({"_id": 1}, {"$set": {"v": 3}})  # and the document is free again
    assert db.c.find_one({"_id": 1})["v"] == 3


def test_context_manager_aborts_on_exception(client: MongoClient, db) -> None:
    with client.start_session() as s, pytest.raises(RuntimeError), s.start_transaction():
        db.c.insert_one({"_id": 1}, session=s)
        raise RuntimeError("boom")
    assert db.c.count_documents({}) == 0


def test_collection_created_in_aborted_transaction_does_not_exist(client: MongoClient, db) -> None:
    db.keep.insert_one({"_id": 1})
    with client.start_session() as s:
        s.start_transaction()
        db.fresh.insert_one({"_id": 1}, session=s)
        s.abort_transaction()
    assert "fresh" not in db.list_collection_names()
    with client.start_session() as s:
        s.start_transaction()
        db.fresh.insert_one({"_id": 1}, session=s)
        s.commit_transaction()
    assert "fresh" in db.list_collection_names()
    assert db.fresh.count_documents({}) == 1


def test_explicit_create_in_aborted_transaction_is_rolled_back(client: MongoClient, db) -> None:
    db.keep.insert_one({"_id": 1})
    with client.start_session() as s:
        s.start_transaction()
        db.command("create", "made", session=s)
        db.made.create_index("a", session=s)
        db.made.insert_one({"a": 1}, session=s)
        s.abort_transaction()
    assert "made" not in db.list_collection_names()
    with client.start_session() as s:
        s.start_transaction()
        db.command("create", "made", session=s)
        db.made.create_index("a", session=s)
        s.commit_transaction()
    assert [i["name"] for i in db.made.list_indexes()] == ["_id_", "a_1"]


def test_unique_violation_aborts_the_whole_transaction(client: MongoClient, db) -> None:
    db.c.create_index("k", unique=True)
    db.c.insert_one({"_id": 1, "k": "taken"})
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 2, "k": "fresh"}, session=s)
        db.other.insert_one({"_id": 1}, session=s)
        db.c.update_one({"_id": 1}, {"$set": {"touched": True}}, session=s)
        with pytest.raises(DuplicateKeyError) as info:
            db.c.insert_one({"_id": 3, "k": "taken"}, session=s)
        assert info.value.details["keyValue"] == {"k": "taken"}
        with pytest.raises(OperationFailure) as commit:
            s.commit_transaction()
        assert commit.value.code == 251  # NoSuchTransaction: it was aborted
    assert list(db.c.find()) == [{"_id": 1, "k": "taken"}]
    assert db.other.count_documents({}) == 0


def test_unique_index_between_concurrent_transactions(client: MongoClient, db) -> None:
    db.c.create_index("k", unique=True)
    s1, s2 = client.start_session(), client.start_session()
    try:
        s1.start_transaction()
        s2.start_transaction()
        db.c.insert_one({"_id": 1, "k": "x"}, session=s1)
        with pytest.raises(OperationFailure) as info:
            db.c.insert_one({"_id": 2, "k": "x"}, session=s2)
        # mongod reports this as a WriteConflict (the key is held by an open transaction).
        assert info.value.code in (112, 11000)
        s1.commit_transaction()
    finally:
        s1.end_session()
        s2.end_session()
    assert db.c.count_documents({"k": "x"}) == 1


def test_write_conflict_between_transactions(client: MongoClient, db) -> None:
    db.c.insert_one({"_id": 1, "v": 0})
    s1, s2 = client.start_session(), client.start_session()
    try:
        s1.start_transaction()
        s2.start_transaction()
        db.c.update_one({"_id": 1}, {"$inc": {"v": 1}}, session=s1)
        started = time.monotonic()
        with pytest.raises(OperationFailure) as info:
            db.c.update_one({"_id": 1}, {"$inc": {"v": 10}}, session=s2)
        assert time.monotonic() - started < 5  # immediately, not after a lock wait
        assert info.value.code == 112
        assert info.value.has_error_label("TransientTransactionError")
        s1.commit_transaction()
    finally:
        s1.end_session()
        s2.end_session()
    assert db.c.find_one()["v"] == 1


def test_write_conflict_with_commit_after_snapshot(client: MongoClient, db) -> None:
    db.c.insert_one({"_id": 1, "v": 0})
    with client.start_session() as s:
        s.start_transaction(read_concern=SNAPSHOT)
        assert db.c.find_one({"_id": 1}, session=s)["v"] == 0
        db.c.update_one({"_id": 1}, {"$set": {"v": 5}})  # committed after the snapshot
        with pytest.raises(OperationFailure) as info:
            db.c.update_one({"_id": 1}, {"$inc": {"v": 1}}, session=s)
        assert info.value.code == 112
        assert info.value.has_error_label("TransientTransactionError")
    assert db.c.find_one()["v"] == 5


def test_with_transaction_retries_write_conflicts(client: MongoClient, db) -> None:
    db.c.insert_one({"_id": 1, "v": 0})
    attempts = []

    def callback(session) -> None:
        attempts.append(1)
        doc = db.c.find_one({"_id": 1}, session=session)
        if len(attempts) == 1:
            db.c.update_one({"_id": 1}, {"$inc": {"v": 100}})  # a concurrent commit
        db.c.update_one({"_id": 1}, {"$set": {"v": doc["v"] + 1}}, session=session)

    with client.start_session() as s:
        s.with_transaction(callback, read_concern=SNAPSHOT)
    assert len(attempts) == 2
    assert db.c.find_one()["v"] == 101


def test_autocommit_write_waits_for_transaction(client: MongoClient, db) -> None:
    db.c.insert_one({"_id": 1, "v": 0})
    done = threading.Event()
    errors: list[BaseException] = []

    def outside() -> None:
        try:
            db.c.update_one({"_id": 1}, {"$inc": {"v": 10}})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            done.set()

    with client.start_session() as s:
        s.start_transaction()
        db.c.update_one({"_id": 1}, {"$inc": {"v": 1}}, session=s)
        t = threading.Thread(target=outside)
        t.start()
        time.sleep(0.5)
        s.commit_transaction()
    assert done.wait(20)
    t.join()
    assert not errors
    assert db.c.find_one()["v"] == 11


def test_commit_is_idempotent(client: MongoClient, db) -> None:
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 1}, session=s)
        s.commit_transaction()
        s.commit_transaction()  # pymongo re-sends commitTransaction: must succeed
    assert db.c.count_documents({}) == 1


def test_many_transactions_on_one_session(client: MongoClient, db) -> None:
    with client.start_session() as s:
        for i in range(20):
            s.start_transaction()
            db.c.insert_one({"_id": i}, session=s)
            if i % 2:
                s.abort_transaction()
            else:
                s.commit_transaction()
    assert sorted(d["_id"] for d in db.c.find()) == list(range(0, 20, 2))


def test_transaction_with_majority_write_concern(client: MongoClient, db) -> None:
    with client.start_session() as s:
        s.start_transaction(write_concern=WriteConcern("majority"), read_concern=SNAPSHOT)
        db.c.insert_one({"_id": 1}, session=s)
        s.commit_transaction()
    assert db.c.count_documents({}) == 1


@pytest.mark.parametrize("command", ["count", "listCollections", "listIndexes", "drop"])
def test_commands_not_allowed_in_transactions(client: MongoClient, db, command: str) -> None:
    db.c.insert_one({"_id": 1})
    with client.start_session() as s:
        s.start_transaction()
        db.c.find_one(session=s)
        args = {} if command == "listCollections" else {"value": "c"}
        with pytest.raises(OperationFailure) as info:
            db.command(command, session=s, **args)
        assert info.value.code == 263  # OperationNotSupportedInTransaction
    assert db.c.count_documents({}) == 1


# -- retryable writes -------------------------------------------------------------------------


def test_retryable_writes_are_sent_with_txn_number(mongo_uri: str) -> None:
    c, recorder = recording_client(mongo_uri, retryWrites=True)
    coll = c.get_database(f"t_retry_{id(recorder)}")["c"]
    try:
        coll.insert_one({"_id": 1})
        coll.update_one({"_id": 1}, {"$set": {"v": 1}})
        coll.find_one_and_update({"_id": 1}, {"$inc": {"v": 1}})
        coll.delete_one({"_id": 1})
        for name in ("insert", "update", "findAndModify", "delete"):
            (cmd,) = recorder.started_commands(name)
            assert "txnNumber" in cmd and "lsid" in cmd, name
        assert coll.count_documents({}) == 0
    finally:
        c.drop_database(coll.database.name)
        c.close()


def test_retried_write_is_applied_once(mongo_uri: str, db) -> None:
    """Re-send the same raw write with the same lsid + txnNumber, as a driver retry does.

    pymongo gives no way to force a retry, but ``db.command(..., session=s)`` sends the
    session's lsid and keeps a ``txnNumber`` we put in the command. A client of its own
    gives a fresh server session, so our txnNumbers do not collide with pymongo's.
    """
    db.c.insert_one({"_id": 1, "n": 0})
    own = MongoClient(mongo_uri)
    db = own[db.name]
    with own.start_session() as s:
        cmd = {
            "update": "c",
            "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}],
            "txnNumber": Int64(1),
        }
        first = db.command(dict(cmd), session=s)
        again = db.command(dict(cmd), session=s)
        assert first["n"] == 1 and first["nModified"] == 1
        assert again["n"] == 1 and again["nModified"] == 1
        assert db.c.find_one({"_id": 1})["n"] == 1
        ins = {"insert": "c", "documents": [{"_id": 2}], "txnNumber": Int64(2)}
        assert db.command(dict(ins), session=s)["n"] == 1
        assert db.command(dict(ins), session=s)["n"] == 1  # no duplicate-key error
        assert "writeErrors" not in db.command(dict(ins), session=s)
        # A new txnNumber is a new write.
        cmd["txnNumber"] = Int64(3)
        db.command(dict(cmd), session=s)
        assert db.c.find_one({"_id": 1})["n"] == 2
        # An older txnNumber than the newest is refused.
        cmd["txnNumber"] = Int64(1)
        with pytest.raises(OperationFailure) as info:
            db.command(dict(cmd), session=s)
        assert info.value.code == 225  # TransactionTooOld
    assert db.c.find_one({"_id": 1})["n"] == 2
    assert db.c.count_documents({}) == 2
    own.close()


def test_retried_find_and_modify_is_applied_once(mongo_uri: str, db) -> None:
    db.c.insert_one({"_id": 1, "n": 0})
    own = MongoClient(mongo_uri)
    db = own[db.name]
    with own.start_session() as s:
        cmd = {
            "findAndModify": "c",
            "query": {"_id": 1},
            "update": {"$inc": {"n": 1}},
            "new": True,
            "txnNumber": Int64(7),
        }
        first = db.command(dict(cmd), session=s)
        again = db.command(dict(cmd), session=s)
        assert first["value"]["n"] == 1
        assert again["value"]["n"] == 1
    assert db.c.find_one({"_id": 1})["n"] == 1
    own.close()
