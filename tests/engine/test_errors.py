"""MongoDB error codes, code names and labels as pymongo surfaces them."""

from __future__ import annotations

import pytest
from pymongo import MongoClient
from pymongo.errors import (
    BulkWriteError,
    DuplicateKeyError,
    OperationFailure,
    WriteError,
)


def test_duplicate_key_11000_on_id(db) -> None:
    db.c.insert_one({"_id": "a"})
    with pytest.raises(DuplicateKeyError) as info:
        db.c.insert_one({"_id": "a"})
    err = info.value
    assert err.code == 11000
    assert err.details["keyPattern"] == {"_id": 1}
    assert err.details["keyValue"] == {"_id": "a"}
    assert "E11000 duplicate key error" in err.details["errmsg"]


def test_duplicate_key_11000_on_secondary_index_upsert(db) -> None:
    db.c.create_index("name", unique=True)
    db.c.insert_one({"name": "x", "n": 1})
    with pytest.raises(DuplicateKeyError) as info:
        db.c.update_one({"n": 2}, {"$set": {"name": "x"}}, upsert=True)
    assert info.value.details["keyPattern"] == {"name": 1}
    assert info.value.details["keyValue"] == {"name": "x"}


def test_duplicate_key_in_insert_many_reports_details(db) -> None:
    db.c.create_index([("a", 1), ("b", 1)], unique=True)
    with pytest.raises(BulkWriteError) as info:
        db.c.insert_many([{"a": 1, "b": 2}, {"a": 1, "b": 2}])
    (err,) = info.value.details["writeErrors"]
    assert err["code"] == 11000
    assert err["index"] == 1
    assert err["keyPattern"] == {"a": 1, "b": 1}
    assert err["keyValue"] == {"a": 1, "b": 2}


def test_write_conflict_112_with_transient_label(client: MongoClient, db) -> None:
    db.acct.insert_one({"_id": 1, "bal": 100})
    s1 = client.start_session()
    s2 = client.start_session()
    try:
        s1.start_transaction()
        s2.start_transaction()
        db.acct.update_one({"_id": 1}, {"$inc": {"bal": -10}}, session=s1)
        with pytest.raises(OperationFailure) as info:
            db.acct.update_one({"_id": 1}, {"$inc": {"bal": -20}}, session=s2)
        err = info.value
        assert err.code == 112
        assert err.details["codeName"] == "WriteConflict"
        assert err.has_error_label("TransientTransactionError")
        s1.commit_transaction()
        # The loser's transaction was aborted by the conflict.
        with pytest.raises(OperationFailure):
            s2.commit_transaction()
    finally:
        s1.end_session()
        s2.end_session()
    assert db.acct.find_one({"_id": 1})["bal"] == 90


def test_command_not_found_59(db) -> None:
    with pytest.raises(OperationFailure) as info:
        db.command("noSuchCommand")
    assert info.value.code == 59
    assert info.value.details["codeName"] == "CommandNotFound"
    assert info.value.details["ok"] == 0


def test_bad_value_2_for_unknown_query_operator(db) -> None:
    db.c.insert_one({"a": 1})
    with pytest.raises(OperationFailure) as info:
        db.c.find_one({"a": {"$foo": 1}})
    assert info.value.code == 2
    assert info.value.details["codeName"] == "BadValue"
    with pytest.raises(OperationFailure) as info:
        db.c.count_documents({"a": {"$foo": 1}})
    assert info.value.code == 2


def test_document_validation_failure_121(db) -> None:
    db.create_collection(
        "v", validator={"$jsonSchema": {"bsonType": "object", "required": ["must"]}}
    )
    with pytest.raises(WriteError) as info:
        db.v.insert_one({"other": 1})
    assert info.value.code == 121
    with pytest.raises(BulkWriteError) as bulk:
        db.v.insert_many([{"must": 1}, {"other": 1}])
    assert bulk.value.details["writeErrors"][0]["code"] == 121
    assert db.v.count_documents({}) == 1


def test_namespace_errors(db) -> None:
    with pytest.raises(OperationFailure) as info:
        db.command("collMod", "nope")
    assert info.value.code == 26  # NamespaceNotFound


def test_transaction_only_errors(client: MongoClient, db) -> None:
    # Outside any transaction mongod refuses the command (the code depends on the version).
    with pytest.raises(OperationFailure):
        client.admin.command("commitTransaction")
    with pytest.raises(OperationFailure):
        client.admin.command("abortTransaction")


def test_errors_do_not_break_the_connection(client: MongoClient, db) -> None:
    for _ in range(20):
        with pytest.raises(OperationFailure):
            db.command("noSuchCommand")
        with pytest.raises(OperationFailure):
            db.c.find_one({"a": {"$foo": 1}})
    db.c.insert_one({"ok": True})
    assert db.c.find_one({}, {"_id": 0}) == {"ok": True}
