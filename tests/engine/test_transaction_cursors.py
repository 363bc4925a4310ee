"""A cursor is read only in the transaction that opened it (mongod's 50739, 50740, 50741).

A transaction's cursor reads the transaction's snapshot and its uncommitted writes, so
mongod serves its ``getMore`` only in that transaction: not outside it, not after it ended,
not in the session's next transaction; and a cursor opened outside a transaction is not
read inside one. Until 2026-12-07 the engine checked only the session (50736-50738) and a
transaction's cursor kept reading the ended transaction's snapshot. pymongo's ordinary use
(a cursor iterated inside its ``start_transaction()`` block, or outside transactions) must
keep working, with real ``getMore`` round trips.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bson import Int64
from pymongo import InsertOne, MongoClient
from pymongo.errors import OperationFailure

from tests.engine.helpers import CommandRecorder, recording_client

NOT_IN_A_TRANSACTION = 50739
WITHOUT_A_TXN_NUMBER = 50740
IN_ANOTHER_TRANSACTION = 50741


@pytest.fixture()
def recorded(mongo_uri: str) -> Iterator[tuple[MongoClient, CommandRecorder]]:
    """A client of its own (fresh server sessions) that records the commands it sends."""
    client, recorder = recording_client(mongo_uri)
    try:
        yield client, recorder
    finally:
        client.close()


def _ids(docs: Any) -> list[int]:
    return [d["_id"] for d in docs]


def _refused(db: Any, command: dict, session: Any) -> OperationFailure:
    with pytest.raises(OperationFailure) as info:
        db.command(command, session=session)
    return info.value


# -- pymongo's ordinary use keeps working -----------------------------------------------------


def test_a_cursor_iterated_inside_its_transaction_reads_every_batch(recorded, db) -> None:
    client, recorder = recorded
    coll = client[db.name].c
    coll.insert_many([{"_id": i} for i in range(7)])
    with client.start_session() as session, session.start_transaction():
        coll.insert_one({"_id": 7}, session=session)  # uncommitted: the cursor sees it
        recorder.clear()
        assert _ids(coll.find({}, batch_size=2, session=session).sort("_id", 1)) == list(range(8))
        get_mores = recorder.started_commands("getMore")
        assert len(get_mores) >= 3
        assert all(cmd.get("autocommit") is False and "txnNumber" in cmd for cmd in get_mores)
    assert coll.count_documents({}) == 8


def test_a_cursor_iterated_outside_transactions_reads_every_batch(recorded, db) -> None:
    client, recorder = recorded
    coll = client[db.name].c
    coll.insert_many([{"_id": i} for i in range(7)])
    recorder.clear()
    assert _ids(coll.find({}, batch_size=2).sort("_id", 1)) == list(range(7))
    with client.start_session() as session:
        with session.start_transaction():  # an earlier transaction of the session
            coll.find_one({}, session=session)
        cursor = coll.find({}, batch_size=3, session=session).sort("_id", 1)
        assert _ids(cursor) == list(range(7))
    get_mores = recorder.started_commands("getMore")
    assert len(get_mores) >= 3 + 2
    assert not any("txnNumber" in cmd for cmd in get_mores)


def test_a_client_bulk_writes_results_page_in_and_out_of_transactions(recorded, db) -> None:
    """A client ``bulkWrite``'s result cursor: in a transaction it is the transaction's;
    as a retryable write (``txnNumber`` without ``autocommit``) it is no transaction's,
    and its ``getMore`` (sent without a ``txnNumber``) reads it."""
    client, recorder = recorded
    ns = f"{db.name}.b"
    models = [InsertOne({"x": i}, namespace=ns) for i in range(250)]
    with client.start_session() as session:
        with session.start_transaction():
            in_txn = client.bulk_write(models, verbose_results=True, session=session)
        assert all("txnNumber" in cmd for cmd in recorder.started_commands("getMore"))
        recorder.clear()
        retryable = client.bulk_write(
            [InsertOne({"x": i}, namespace=ns) for i in range(250)],
            verbose_results=True, session=session,
        )  # fmt: skip
    assert len(in_txn.insert_results) == len(retryable.insert_results) == 250
    (sent,) = recorder.started_commands("bulkWrite")
    assert "txnNumber" in sent and "autocommit" not in sent
    assert not any("txnNumber" in cmd for cmd in recorder.started_commands("getMore"))
    assert client[db.name].b.count_documents({}) == 500


# -- refused as mongod refuses them ----------------------------------------------------------


def test_a_transactions_cursor_is_refused_after_its_commit(recorded, db) -> None:
    """The cursor would go on reading the committed transaction's snapshot: mongod refuses
    the ``getMore`` pymongo then sends (the session's lsid, no txnNumber) with 50740."""
    client, recorder = recorded
    coll = client[db.name].c
    coll.insert_many([{"_id": i} for i in range(5)])
    with client.start_session() as session:
        with session.start_transaction():
            cursor = coll.find({}, batch_size=2, session=session).sort("_id", 1)
            assert next(cursor)["_id"] == 0
            cursor_id = cursor.cursor_id
            number = recorder.started_commands("find")[-1]["txnNumber"]
        with pytest.raises(OperationFailure) as info:
            list(cursor)
        assert info.value.code == WITHOUT_A_TXN_NUMBER
        assert f"created in transaction {number}, without a txnNumber" in str(info.value)
        # mongod does not kill it when the transaction ends: killCursors still works.
        reply = client[db.name].command("killCursors", "c", cursors=[Int64(cursor_id)])
        assert reply["ok"] == 1


def test_a_transactions_cursor_is_refused_after_its_abort(recorded, db) -> None:
    client, _ = recorded
    coll = client[db.name].c
    coll.insert_many([{"_id": i} for i in range(5)])
    with client.start_session() as session:
        session.start_transaction()
        coll.insert_one({"_id": "aborted"}, session=session)
        cursor = coll.find({}, batch_size=2, session=session).sort("_id", 1)
        next(cursor)
        session.abort_transaction()
        with pytest.raises(OperationFailure) as info:
            list(cursor)  # would page through the aborted insert
        assert info.value.code == WITHOUT_A_TXN_NUMBER
    assert coll.count_documents({"_id": "aborted"}) == 0


def test_a_transactions_cursor_is_refused_in_the_next_transaction(recorded, db) -> None:
    client, recorder = recorded
    coll = client[db.name].c
    coll.insert_many([{"_id": i} for i in range(5)])
    with client.start_session() as session:
        with session.start_transaction():
            cursor = coll.find({}, batch_size=2, session=session).sort("_id", 1)
            next(cursor)
            first = recorder.started_commands("find")[-1]["txnNumber"]
        session.start_transaction()
        coll.find_one({}, session=session)  # the next transaction has started
        with pytest.raises(OperationFailure) as info:
            list(cursor)
        assert info.value.code == IN_ANOTHER_TRANSACTION
        assert f"created in transaction {first}, in transaction {first + 1}" in str(info.value)
        session.abort_transaction()


def test_a_cursor_opened_outside_a_transaction_is_refused_inside_one(recorded, db) -> None:
    client, _ = recorded
    coll = client[db.name].c
    coll.insert_many([{"_id": i} for i in range(5)])
    with client.start_session() as session:
        cursor = coll.find({}, batch_size=2, session=session).sort("_id", 1)
        next(cursor)
        session.start_transaction()
        coll.find_one({}, session=session)
        with pytest.raises(OperationFailure) as info:
            list(cursor)
        assert info.value.code == NOT_IN_A_TRANSACTION
        assert "which was not created in a transaction, in transaction" in str(info.value)
        session.abort_transaction()


def test_a_refused_get_more_leaves_the_cursor_to_its_transaction(recorded, db) -> None:
    """Raw commands: while the transaction is open, a ``getMore`` from its session without
    the txnNumber is refused (50740), and the cursor still pages in the transaction."""
    client, _ = recorded
    rdb = client[db.name]
    rdb.c.insert_many([{"_id": i} for i in range(4)])
    txn = {"txnNumber": Int64(100), "autocommit": False}
    with client.start_session(causal_consistency=False) as session:
        opened = rdb.command(
            {"find": "c", "sort": {"_id": 1}, "batchSize": 1, "startTransaction": True, **txn},
            session=session,
        )
        cursor_id = opened["cursor"]["id"]
        get_more = {"getMore": cursor_id, "collection": "c", "batchSize": 1}
        error = _refused(rdb, dict(get_more), session)
        assert error.code == WITHOUT_A_TXN_NUMBER
        assert (error.details or {}).get("errmsg") == (
            f"Cannot run getMore on cursor {cursor_id}, which was created in transaction 100, "
            "without a txnNumber"
        )
        more = rdb.command({**get_more, **txn}, session=session)
        assert _ids(more["cursor"]["nextBatch"]) == [1]
        client.admin.command({"commitTransaction": 1, **txn}, session=session)


# -- a transaction's cursors outlive its end, as in mongod -----------------------------------


@pytest.mark.parametrize("end", ["commitTransaction", "abortTransaction"])
def test_a_transactions_cursor_is_not_killed_when_the_transaction_ends(recorded, db, end) -> None:
    """mongod's commit and abort (TransactionParticipant's ``_finishCommitTransaction``,
    ``_abortActiveTransaction``, ``_abortTransactionOnSession``, in
    src/mongo/db/transaction/transaction_participant.cpp) never touch the CursorManager: the
    cursor stays until ``killCursors``, its session's end or the cursor timeout; its
    ``getMore`` is refused (50740) and leaves it. Its own test
    jstests/core/txns/kill_transaction_cursors_after_commit.js kills one after the commit."""
    client, _ = recorded
    rdb = client[db.name]
    rdb.c.insert_many([{"_id": i} for i in range(4)])
    txn = {"txnNumber": Int64(7), "autocommit": False}
    with client.start_session(causal_consistency=False) as session:
        opened = rdb.command(
            {"find": "c", "batchSize": 1, "startTransaction": True, **txn}, session=session
        )
        cursor_id = opened["cursor"]["id"]
        client.admin.command({end: 1, **txn}, session=session)
        get_more = {"getMore": cursor_id, "collection": "c"}
        assert _refused(rdb, get_more, session).code == WITHOUT_A_TXN_NUMBER
        assert _refused(rdb, get_more, session).code == WITHOUT_A_TXN_NUMBER  # still there
        reply = rdb.command("killCursors", "c", cursors=[Int64(cursor_id)])
        assert reply["cursorsKilled"] == [cursor_id]
        assert reply["cursorsNotFound"] == []
