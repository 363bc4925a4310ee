"""createIndexes / listIndexes / dropIndexes and what the indexes enforce."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.errors import DuplicateKeyError, OperationFailure


def _index(coll, name: str) -> dict:
    return next(i for i in coll.list_indexes() if i["name"] == name)


def test_create_list_and_names(db) -> None:
    assert db.c.create_index("a") == "a_1"
    assert db.c.create_index([("a", ASCENDING), ("b", DESCENDING)]) == "a_1_b_-1"
    assert db.c.create_index("z", name="custom") == "custom"
    indexes = list(db.c.list_indexes())
    assert [i["name"] for i in indexes] == ["_id_", "a_1", "a_1_b_-1", "custom"]
    assert dict(indexes[0]["key"]) == {"_id": 1}
    assert list(dict(indexes[2]["key"]).items()) == [("a", 1), ("b", -1)]
    assert all(i["v"] == 2 for i in indexes)
    info = db.c.index_information()
    assert info["custom"]["key"] == [("z", 1)]


def test_create_indexes_command_reply(db) -> None:
    reply = db.command("createIndexes", "fresh", indexes=[{"key": {"a": 1}, "name": "a_1"}])
    assert reply["ok"] == 1.0
    assert reply["numIndexesBefore"] == 1
    assert reply["numIndexesAfter"] == 2
    assert reply["createdCollectionAutomatically"] is True
    assert "fresh" in db.list_collection_names()
    again = db.command("createIndexes", "fresh", indexes=[{"key": {"a": 1}, "name": "a_1"}])
    assert again["numIndexesBefore"] == again["numIndexesAfter"] == 2


def test_create_many_indexes(db) -> None:
    names = db.c.create_indexes(
        [
            IndexModel("a"),
            IndexModel([("b", 1), ("c", 1)], unique=True),
            IndexModel("d", sparse=True),
        ]
    )
    assert names == ["a_1", "b_1_c_1", "d_1"]
    assert _index(db.c, "b_1_c_1")["unique"] is True
    assert _index(db.c, "d_1")["sparse"] is True


def test_list_indexes_missing_collection(db) -> None:
    assert list(db.nothing.list_indexes()) == []
    with pytest.raises(OperationFailure) as info:
        db.command("listIndexes", "nothing")
    assert info.value.code == 26


def test_unique_index_rejects_duplicates(db) -> None:
    db.users.create_index("email", unique=True)
    assert _index(db.users, "email_1")["unique"] is True
    db.users.insert_one({"_id": 1, "email": "a@x"})
    with pytest.raises(DuplicateKeyError) as info:
        db.users.insert_one({"_id": 2, "email": "a@x"})
    assert info.value.code == 11000
    assert info.value.details["keyPattern"] == {"email": 1}
    assert info.value.details["keyValue"] == {"email": "a@x"}
    assert db.users.count_documents({}) == 1


def test_unique_index_on_update(db) -> None:
    db.users.create_index("email", unique=True)
    db.users.insert_many([{"_id": 1, "email": "a"}, {"_id": 2, "email": "b"}])
    with pytest.raises(DuplicateKeyError):
        db.users.update_one({"_id": 2}, {"$set": {"email": "a"}})
    db.users.update_one({"_id": 1}, {"$set": {"email": "a", "other": 1}})  # same value: fine
    db.users.update_one({"_id": 1}, {"$set": {"email": "c"}})
    db.users.update_one({"_id": 2}, {"$set": {"email": "a"}})  # "a" was freed
    assert {d["_id"]: d["email"] for d in db.users.find()} == {1: "c", 2: "a"}


def test_unique_value_free_after_delete(db) -> None:
    db.users.create_index("email", unique=True)
    db.users.insert_one({"_id": 1, "email": "a"})
    db.users.delete_one({"_id": 1})
    db.users.insert_one({"_id": 2, "email": "a"})
    assert db.users.count_documents({"email": "a"}) == 1


def test_unique_index_treats_missing_as_null(db) -> None:
    db.c.create_index("k", unique=True)
    db.c.insert_one({"_id": 1})
    with pytest.raises(DuplicateKeyError) as info:
        db.c.insert_one({"_id": 2})
    assert info.value.details["keyValue"] == {"k": None}
    with pytest.raises(DuplicateKeyError):
        db.c.insert_one({"_id": 3, "k": None})


def test_unique_index_numbers_compare_by_value(db) -> None:
    db.c.create_index("k", unique=True)
    db.c.insert_one({"k": 1})
    with pytest.raises(DuplicateKeyError):
        db.c.insert_one({"k": 1.0})


def test_unique_sparse_index_allows_many_missing(db) -> None:
    db.c.create_index("k", unique=True, sparse=True)
    db.c.insert_many([{"_id": 1}, {"_id": 2}, {"_id": 3, "k": 1}])
    with pytest.raises(DuplicateKeyError):
        db.c.insert_one({"_id": 4, "k": 1})
    assert db.c.count_documents({}) == 3


def test_unique_compound_index(db) -> None:
    db.c.create_index([("tenant", 1), ("name", 1)], unique=True)
    db.c.insert_many(
        [
            {"tenant": "t1", "name": "a"},
            {"tenant": "t1", "name": "b"},
            {"tenant": "t2", "name": "a"},
        ]
    )
    with pytest.raises(DuplicateKeyError) as info:
        db.c.insert_one({"tenant": "t1", "name": "a"})
    assert info.value.details["keyPattern"] == {"tenant": 1, "name": 1}
    assert info.value.details["keyValue"] == {"tenant": "t1", "name": "a"}


def test_unique_partial_index(db) -> None:
    db.c.create_index("slot", unique=True, partialFilterExpression={"active": True})
    spec = _index(db.c, "slot_1")
    assert spec["partialFilterExpression"] == {"active": True}
    db.c.insert_many(
        [{"slot": 1, "active": True}, {"slot": 1, "active": False}, {"slot": 1, "active": False}]
    )
    with pytest.raises(DuplicateKeyError):
        db.c.insert_one({"slot": 1, "active": True})
    # Leaving the filter frees the value.
    db.c.update_one({"active": True}, {"$set": {"active": False}})
    db.c.insert_one({"slot": 1, "active": True})
    assert db.c.count_documents({"slot": 1}) == 4


def test_unique_multikey_index(db) -> None:
    db.c.create_index("tags", unique=True)
    db.c.insert_one({"_id": 1, "tags": ["a", "b", "b"]})  # repeats within one document are fine
    with pytest.raises(DuplicateKeyError):
        db.c.insert_one({"_id": 2, "tags": ["c", "b"]})
    db.c.insert_one({"_id": 3, "tags": ["c"]})


def test_unique_index_build_fails_on_existing_duplicates(db) -> None:
    db.c.insert_many([{"k": 1}, {"k": 1}])
    with pytest.raises(OperationFailure) as info:
        db.c.create_index("k", unique=True)
    assert info.value.code == 11000
    assert [i["name"] for i in db.c.list_indexes()] == ["_id_"]
    db.c.insert_one({"k": 1})  # no half-built index left behind


def test_index_conflicts(db) -> None:
    db.c.create_index("a", name="idx")
    with pytest.raises(OperationFailure) as info:
        db.c.create_index("b", name="idx")
    assert info.value.code == 86  # IndexKeySpecsConflict
    with pytest.raises(OperationFailure) as info:
        db.c.create_index("a", name="other")
    assert info.value.code == 85  # IndexOptionsConflict
    assert db.c.create_index("a", name="idx") == "idx"  # identical: a no-op


def test_drop_indexes(db) -> None:
    db.c.create_index("a")
    db.c.create_index("b")
    db.c.create_index([("c", 1), ("d", -1)])
    db.c.drop_index("a_1")
    db.c.drop_index([("c", 1), ("d", -1)])
    assert [i["name"] for i in db.c.list_indexes()] == ["_id_", "b_1"]
    reply = db.command("dropIndexes", "c", index="*")
    assert reply["nIndexesWas"] == 2
    assert [i["name"] for i in db.c.list_indexes()] == ["_id_"]
    with pytest.raises(OperationFailure) as info:
        db.c.drop_index("nope_1")
    assert info.value.code == 27
    with pytest.raises(OperationFailure) as info:
        db.c.drop_index("_id_")
    assert info.value.code == 72


def test_dropped_unique_index_stops_enforcing(db) -> None:
    db.c.create_index("k", unique=True)
    db.c.insert_one({"k": 1})
    db.c.drop_index("k_1")
    db.c.insert_one({"k": 1})
    assert db.c.count_documents({"k": 1}) == 2


def test_ttl_index_spec(db) -> None:
    db.c.create_index("at", expireAfterSeconds=3600)
    assert _index(db.c, "at_1")["expireAfterSeconds"] == 3600
    with pytest.raises(OperationFailure):
        db.c.create_index([("a", 1), ("b", 1)], expireAfterSeconds=10)


def test_coll_mod_changes_ttl(db) -> None:
    db.c.create_index("at", expireAfterSeconds=3600)
    reply = db.command("collMod", "c", index={"keyPattern": {"at": 1}, "expireAfterSeconds": 60})
    assert reply["expireAfterSeconds_old"] == 3600
    assert reply["expireAfterSeconds_new"] == 60
    assert _index(db.c, "at_1")["expireAfterSeconds"] == 60


@pytest.mark.embedded_only
def test_ttl_index_expires_documents(db) -> None:
    """The embedded engine in conftest runs its TTL monitor every second (mongod: 60 s)."""
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    db.c.create_index("at", expireAfterSeconds=0)
    db.c.insert_many(
        [
            {"_id": "old", "at": now - dt.timedelta(hours=1)},
            {
                "_id": "old_in_array",
                "at": [now + dt.timedelta(days=1), now - dt.timedelta(hours=1)],
            },
            {"_id": "future", "at": now + dt.timedelta(days=1)},
            {"_id": "not_a_date", "at": "2000-01-01"},
            {"_id": "no_field"},
        ]
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = sorted(d["_id"] for d in db.c.find())
        if left == ["future", "no_field", "not_a_date"]:
            break
        time.sleep(0.2)
    assert sorted(d["_id"] for d in db.c.find()) == ["future", "no_field", "not_a_date"]
