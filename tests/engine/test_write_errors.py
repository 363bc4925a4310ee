"""Write errors in big batches, in transactions, and on command cursors."""

from __future__ import annotations

import pytest
from pymongo import InsertOne, MongoClient
from pymongo.errors import (
    BulkWriteError,
    ClientBulkWriteException,
    DuplicateKeyError,
    OperationFailure,
)


def test_verbose_client_bulk_write_pages_its_results_through_get_more(
    client: MongoClient, db
) -> None:
    ns = f"{db.name}.c"
    result = client.bulk_write(
        [InsertOne({"i": i}, namespace=ns) for i in range(250)], verbose_results=True
    )
    assert result.inserted_count == 250
    assert len(result.insert_results) == 250
    assert db.c.count_documents({}) == 250


def test_duplicate_inside_a_large_batch_with_a_unique_index(db) -> None:
    db.c.create_index([("t", 1), ("i", 1)], unique=True)
    docs = [{"t": "x", "i": i} for i in range(3000)] + [{"t": "x", "i": 7}] + [{"t": "x", "i": -1}]
    with pytest.raises(BulkWriteError) as info:
        db.c.insert_many(docs)
    (error,) = info.value.details["writeErrors"]
    assert error["index"] == 3000 and error["code"] == 11000
    assert error["keyValue"] == {"t": "x", "i": 7}
    assert db.c.count_documents({}) == 3000, "an ordered batch stops at the failing document"


def test_a_key_freed_earlier_in_the_same_transaction_can_be_reused(client: MongoClient, db) -> None:
    db.c.create_index("k", unique=True)
    db.c.insert_one({"_id": "a", "k": "x"})
    with client.start_session() as s, s.start_transaction():
        db.c.update_one({"_id": "a"}, {"$set": {"k": "y"}}, session=s)
        db.c.insert_one({"_id": "b", "k": "x"}, session=s)
        db.c.update_one({"_id": "b"}, {"$set": {"k": "z"}}, session=s)
        db.c.insert_one({"_id": "c", "k": "x"}, session=s)
    assert sorted((d["_id"], d["k"]) for d in db.c.find()) == [("a", "y"), ("b", "z"), ("c", "x")]
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": "d", "k": "w"}, session=s)
        with pytest.raises(DuplicateKeyError):
            db.c.insert_one({"_id": "e", "k": "w"}, session=s)  # claimed by d, same txn
        s.abort_transaction()
    assert db.c.count_documents({}) == 3, "the failed transaction left nothing"


def test_write_error_in_a_transaction_aborts_it(client: MongoClient, db) -> None:
    db.c.insert_one({"_id": 1})
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 2}, session=s)
        with pytest.raises(DuplicateKeyError):
            db.c.insert_one({"_id": 1}, session=s)
        with pytest.raises(OperationFailure) as info:
            db.c.insert_one({"_id": 3}, session=s)
        assert info.value.code == 251  # NoSuchTransaction: the error aborted it
        assert info.value.has_error_label("TransientTransactionError")
    assert db.c.count_documents({}) == 1


def test_write_error_in_a_transactional_client_bulk_write(client: MongoClient, db) -> None:
    ns = f"{db.name}.c"
    db.c.insert_one({"_id": 1})
    with client.start_session() as s:
        s.start_transaction()
        with pytest.raises(ClientBulkWriteException) as info:
            client.bulk_write(
                [InsertOne({"_id": 2}, namespace=ns), InsertOne({"_id": 1}, namespace=ns)],
                session=s,
            )
        errors = info.value.write_errors or []
        cause = info.value.error
        codes = [e["code"] for e in errors] + (
            [cause.code] if isinstance(cause, OperationFailure) else []
        )
        assert 11000 in codes
        with pytest.raises(OperationFailure):
            s.commit_transaction()
    assert db.c.count_documents({}) == 1
