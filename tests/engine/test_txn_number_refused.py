"""A ``txnNumber`` only a transaction or a retryable write uses (mongod's 50768, 50889, 72).

Without ``autocommit`` a ``txnNumber`` makes a write retryable; on any other command mongod
refuses it before running anything (``validateSessionOptions``, in
src/mongo/db/transaction_validation.cpp): 50768 ``NotARetryableWriteCommand``. Until
2026-12-07 the engine ran such a command with the ``txnNumber`` ignored, so a ``find`` a
caller believed was in its transaction read outside it. A command that needs no
authentication refuses any ``txnNumber`` (50889) and one without an lsid is 72
(``initializeOperationSessionInfo``, src/mongo/db/initialize_operation_session_info.cpp).
pymongo's retryable writes (``txnNumber``, no ``autocommit``) and transactions must keep
working.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bson import Int64
from pymongo import DeleteOne, InsertOne, MongoClient, ReturnDocument, UpdateOne
from pymongo.errors import OperationFailure

from tests.engine.helpers import CommandRecorder, recording_client
from tests.engine.test_wire_fuzz import exchange, op_msg

NOT_A_RETRYABLE_WRITE = 50768
NO_TXN_NUMBER_FOR_THIS_COMMAND = 50889
INVALID_OPTIONS = 72


@pytest.fixture()
def recorded(mongo_uri: str) -> Iterator[tuple[MongoClient, CommandRecorder]]:
    """A client of its own (fresh server sessions) that records the commands it sends."""
    client, recorder = recording_client(mongo_uri, retryWrites=True)
    try:
        yield client, recorder
    finally:
        client.close()


def _refused(db: Any, command: dict, session: Any) -> OperationFailure:
    with pytest.raises(OperationFailure) as info:
        db.command(command, session=session)
    return info.value


def _expected_errmsg(name: str) -> str:
    return (
        "txnNumber may only be provided for multi-document transactions and retryable write "
        f"commands. autocommit:false was not provided, and {name} is not a retryable write "
        "command."
    )


# -- refused as mongod refuses them ----------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        {"find": "c", "filter": {}},
        {"aggregate": "c", "pipeline": [], "cursor": {}},
        {"count": "c"},
        {"distinct": "c", "key": "x"},
        {"listCollections": 1},
        {"listIndexes": "c"},
        {"killCursors": "c", "cursors": []},
        {"create": "created_by_a_refused_command"},
        {"drop": "c"},
        {"createIndexes": "c", "indexes": [{"key": {"x": 1}, "name": "x_1"}]},
        {"explain": {"find": "c"}},
        {"dbStats": 1},
    ],
    ids=lambda command: next(iter(command)),
)
def test_a_txn_number_without_autocommit_is_refused_on_a_command_that_is_no_retryable_write(
    recorded, db, command: dict
) -> None:
    client, _ = recorded
    rdb = client[db.name]
    rdb.c.insert_many([{"_id": i, "x": i} for i in range(3)])
    name = next(iter(command))
    with client.start_session() as session:
        error = _refused(rdb, {**command, "txnNumber": Int64(1)}, session)
    assert error.code == NOT_A_RETRYABLE_WRITE
    details = error.details or {}
    assert details.get("codeName") == "NotARetryableWriteCommand"
    assert details.get("errmsg") == _expected_errmsg(name)
    # Nothing of the command ran.
    assert "created_by_a_refused_command" not in rdb.list_collection_names()
    assert rdb.c.count_documents({}) == 3
    assert "x_1" not in rdb.c.index_information()


def test_a_find_pymongo_believed_in_a_transaction_does_not_read_outside_it(recorded, db) -> None:
    """The case the refusal is for: a ``find`` that carries the session's transaction number
    but lost its ``autocommit`` would read committed data, not the transaction's."""
    client, _ = recorded
    rdb = client[db.name]
    with client.start_session() as session:
        rdb.command(
            {"insert": "c", "documents": [{"_id": 1}], "txnNumber": Int64(5),
             "autocommit": False, "startTransaction": True},
            session=session,
        )  # fmt: skip
        error = _refused(rdb, {"find": "c", "txnNumber": Int64(5)}, session)
        assert error.code == NOT_A_RETRYABLE_WRITE
        assert "find is not a retryable write command" in str(error)
        # The transaction is still open and still sees its insert.
        seen = rdb.command(
            {"find": "c", "txnNumber": Int64(5), "autocommit": False}, session=session
        )
        assert [d["_id"] for d in seen["cursor"]["firstBatch"]] == [1]
        client.admin.command(
            {"commitTransaction": 1, "txnNumber": Int64(5), "autocommit": False},
            session=session,
        )
    assert rdb.c.count_documents({}) == 1


def test_a_get_more_with_a_txn_number_is_refused_and_leaves_its_cursor(recorded, db) -> None:
    client, _ = recorded
    rdb = client[db.name]
    rdb.c.insert_many([{"_id": i} for i in range(4)])
    with client.start_session() as session:
        opened = rdb.command({"find": "c", "sort": {"_id": 1}, "batchSize": 1}, session=session)
        cursor_id = opened["cursor"]["id"]
        get_more = {"getMore": cursor_id, "collection": "c", "batchSize": 1}
        error = _refused(rdb, {**get_more, "txnNumber": Int64(3)}, session)
        assert error.code == NOT_A_RETRYABLE_WRITE
        assert (error.details or {}).get("errmsg") == _expected_errmsg("getMore")
        more = rdb.command(get_more, session=session)
        assert [d["_id"] for d in more["cursor"]["nextBatch"]] == [1]


@pytest.mark.parametrize("name", ["commitTransaction", "abortTransaction"])
def test_ending_a_transaction_without_autocommit_is_refused_with_mongods_message(
    recorded, db, name: str
) -> None:
    client, _ = recorded
    with client.start_session() as session:
        error = _refused(client.admin, {name: 1, "txnNumber": Int64(1)}, session)
    assert error.code == NOT_A_RETRYABLE_WRITE
    assert (error.details or {}).get("errmsg") == _expected_errmsg(name)


def test_a_txn_number_on_a_command_that_needs_no_authentication_is_50889(recorded) -> None:
    client, _ = recorded
    with client.start_session() as session:
        error = _refused(client.admin, {"ping": 1, "txnNumber": Int64(1)}, session)
    assert error.code == NO_TXN_NUMBER_FOR_THIS_COMMAND
    assert (error.details or {}).get("codeName") == "Location50889"
    assert (error.details or {}).get("errmsg") == (
        "It is illegal to provide a txnNumber for this command"
    )


def test_a_txn_number_without_an_lsid_is_72(client: MongoClient, db) -> None:
    """Raw OP_MSG: pymongo always sends an lsid. Also a write's (before 2026-12-07: 50768)."""
    client.admin.command("ping")
    address = client.address
    assert address is not None
    for command in ({"find": "c"}, {"insert": "c", "documents": [{"_id": 1}]}):
        raw = {**command, "txnNumber": Int64(1), "$db": db.name}
        (reply,) = exchange(address, op_msg(raw)).replies
        assert reply["code"] == INVALID_OPTIONS, reply
        assert reply["errmsg"] == "Transaction number requires a session ID to also be specified"
    assert db.c.count_documents({}) == 0


# -- retryable writes and transactions keep working ------------------------------------------


def test_pymongos_retryable_writes_carry_a_txn_number_and_still_work(recorded, db) -> None:
    client, recorder = recorded
    coll = client[db.name].c
    ns = f"{db.name}.c"
    coll.insert_one({"_id": 1, "n": 0})
    coll.update_one({"_id": 1}, {"$inc": {"n": 1}})
    coll.bulk_write([InsertOne({"_id": 2}), UpdateOne({"_id": 2}, {"$set": {"n": 5}})])
    found = coll.find_one_and_update(
        {"_id": 1}, {"$inc": {"n": 1}}, return_document=ReturnDocument.AFTER
    )
    assert found == {"_id": 1, "n": 2}
    client.bulk_write([InsertOne({"_id": 3}, namespace=ns), DeleteOne({"_id": 2}, namespace=ns)])
    coll.delete_one({"_id": 3})
    for name in ("insert", "update", "findAndModify", "bulkWrite", "delete"):
        sent = recorder.started_commands(name)
        assert sent, name
        assert all("txnNumber" in cmd and "autocommit" not in cmd for cmd in sent), name
    assert not recorder.failed_events
    assert list(coll.find().sort("_id", 1)) == [{"_id": 1, "n": 2}]


def test_a_retried_lowercase_findandmodify_is_applied_once(recorded, db) -> None:
    """mongod's ``findandmodify`` alias is a retryable write too."""
    client, _ = recorded
    rdb = client[db.name]
    rdb.c.insert_one({"_id": 1, "n": 0})
    cmd = {"findandmodify": "c", "query": {"_id": 1}, "update": {"$inc": {"n": 1}},
           "new": True, "txnNumber": Int64(9)}  # fmt: skip
    with client.start_session() as session:
        first = rdb.command(dict(cmd), session=session)
        again = rdb.command(dict(cmd), session=session)
    assert first["value"] == again["value"] == {"_id": 1, "n": 1}
    assert rdb.c.find_one({"_id": 1}) == {"_id": 1, "n": 1}
    # Without a txnNumber it is a plain write (before 2026-12-07 it ran as a read: the
    # reply showed the update, which was then thrown away).
    del cmd["txnNumber"]
    assert rdb.command(cmd)["value"] == {"_id": 1, "n": 2}
    assert rdb.c.find_one({"_id": 1}) == {"_id": 1, "n": 2}


def test_reads_and_writes_in_a_transaction_still_work(recorded, db) -> None:
    client, recorder = recorded
    coll = client[db.name].c
    coll.insert_many([{"_id": i} for i in range(5)])
    with client.start_session() as session, session.start_transaction():
        coll.insert_one({"_id": 5}, session=session)
        assert coll.count_documents({}, session=session) == 6
        assert sorted(coll.distinct("_id", session=session)) == list(range(6))
        assert [d["_id"] for d in coll.find({}, batch_size=2, session=session).sort("_id")] == (
            list(range(6))
        )
    assert coll.count_documents({}) == 6
    assert all(cmd.get("autocommit") is False for cmd in recorder.started_commands("getMore"))
