"""findAndModify through find_one_and_update / _replace / _delete."""

from __future__ import annotations

import pytest
from bson import ObjectId
from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError, OperationFailure


@pytest.fixture()
def jobs(db):
    db.jobs.insert_many(
        [
            {"_id": 1, "state": "new", "prio": 2, "n": 0},
            {"_id": 2, "state": "new", "prio": 5, "n": 0},
            {"_id": 3, "state": "done", "prio": 9, "n": 0},
        ]
    )
    return db.jobs


def test_update_returns_before_by_default(jobs) -> None:
    before = jobs.find_one_and_update({"_id": 1}, {"$inc": {"n": 1}})
    assert before == {"_id": 1, "state": "new", "prio": 2, "n": 0}
    assert jobs.find_one({"_id": 1})["n"] == 1


def test_update_return_document_after(jobs) -> None:
    after = jobs.find_one_and_update(
        {"_id": 1}, {"$inc": {"n": 5}}, return_document=ReturnDocument.AFTER
    )
    assert after == {"_id": 1, "state": "new", "prio": 2, "n": 5}


def test_update_sort_picks_the_document(jobs) -> None:
    claimed = jobs.find_one_and_update(
        {"state": "new"},
        {"$set": {"state": "running"}},
        sort=[("prio", -1)],
        return_document=ReturnDocument.AFTER,
    )
    assert claimed["_id"] == 2 and claimed["state"] == "running"
    claimed = jobs.find_one_and_update(
        {"state": "new"}, {"$set": {"state": "running"}}, sort=[("prio", -1)]
    )
    assert claimed["_id"] == 1 and claimed["state"] == "new"
    assert jobs.find_one_and_update({"state": "new"}, {"$set": {"state": "x"}}) is None


def test_update_projection(jobs) -> None:
    doc = jobs.find_one_and_update(
        {"_id": 2},
        {"$set": {"state": "running"}},
        projection={"state": 1, "_id": 0},
        return_document=ReturnDocument.AFTER,
    )
    assert doc == {"state": "running"}
    doc = jobs.find_one_and_update({"_id": 2}, {"$inc": {"n": 1}}, projection={"prio": 0})
    assert doc == {"_id": 2, "state": "running", "n": 0}


def test_update_upsert(jobs) -> None:
    doc = jobs.find_one_and_update(
        {"_id": 10},
        {"$set": {"state": "new"}, "$setOnInsert": {"prio": 1}},
        upsert=True,
        return_document=ReturnDocument.AFTER,
    )
    assert doc == {"_id": 10, "state": "new", "prio": 1}
    # With the default (BEFORE) an upsert returns None: there was no document before.
    doc = jobs.find_one_and_update({"_id": 11}, {"$set": {"state": "new"}}, upsert=True)
    assert doc is None
    assert jobs.find_one({"_id": 11}) == {"_id": 11, "state": "new"}
    doc = jobs.find_one_and_update(
        {"state": "brand"}, {"$set": {"p": 1}}, upsert=True, return_document=ReturnDocument.AFTER
    )
    assert isinstance(doc["_id"], ObjectId) and doc["state"] == "brand" and doc["p"] == 1


def test_update_with_pipeline_and_array_filters(jobs) -> None:
    doc = jobs.find_one_and_update(
        {"_id": 1},
        [{"$set": {"score": {"$multiply": ["$prio", 10]}}}],
        return_document=ReturnDocument.AFTER,
    )
    assert doc["score"] == 20
    jobs.insert_one({"_id": 20, "xs": [1, 5, 9]})
    doc = jobs.find_one_and_update(
        {"_id": 20},
        {"$set": {"xs.$[x]": 0}},
        array_filters=[{"x": {"$gt": 4}}],
        return_document=ReturnDocument.AFTER,
    )
    assert doc["xs"] == [1, 0, 0]


def test_replace(jobs) -> None:
    before = jobs.find_one_and_replace({"_id": 3}, {"state": "archived"})
    assert before["state"] == "done"
    assert jobs.find_one({"_id": 3}) == {"_id": 3, "state": "archived"}
    after = jobs.find_one_and_replace(
        {"_id": 3}, {"state": "gone"}, return_document=ReturnDocument.AFTER
    )
    assert after == {"_id": 3, "state": "gone"}
    up = jobs.find_one_and_replace(
        {"_id": 30}, {"state": "new"}, upsert=True, return_document=ReturnDocument.AFTER
    )
    assert up == {"_id": 30, "state": "new"}
    assert jobs.find_one_and_replace({"_id": 99}, {"x": 1}) is None
    assert jobs.find_one({"_id": 99}) is None


def test_delete(jobs) -> None:
    doc = jobs.find_one_and_delete({"state": "new"}, sort=[("prio", 1)])
    assert doc["_id"] == 1
    assert jobs.find_one({"_id": 1}) is None
    doc = jobs.find_one_and_delete({"state": "new"}, projection={"_id": 1})
    assert doc == {"_id": 2}
    assert jobs.find_one_and_delete({"state": "new"}) is None
    assert jobs.count_documents({}) == 1


def test_raw_command_last_error_object(jobs, db) -> None:
    reply = db.command(
        "findAndModify", "jobs", query={"_id": 1}, update={"$set": {"n": 7}}, new=True
    )
    assert reply["value"]["n"] == 7
    assert reply["lastErrorObject"]["n"] == 1
    assert reply["lastErrorObject"]["updatedExisting"] is True
    reply = db.command(
        "findAndModify", "jobs", query={"_id": 50}, update={"$set": {"n": 1}}, upsert=True, new=True
    )
    assert reply["lastErrorObject"]["updatedExisting"] is False
    assert reply["lastErrorObject"]["upserted"] == 50
    assert reply["value"] == {"_id": 50, "n": 1}
    reply = db.command("findAndModify", "jobs", query={"_id": 1}, remove=True)
    assert reply["value"]["_id"] == 1
    assert reply["lastErrorObject"]["n"] == 1


def test_duplicate_key_error(jobs) -> None:
    jobs.create_index("state", unique=True, partialFilterExpression={"state": "running"})
    jobs.find_one_and_update({"_id": 1}, {"$set": {"state": "running"}})
    with pytest.raises(DuplicateKeyError) as info:
        jobs.find_one_and_update({"_id": 2}, {"$set": {"state": "running"}})
    assert info.value.code == 11000
    assert jobs.find_one({"_id": 2})["state"] == "new"


def test_cannot_modify_id(jobs) -> None:
    with pytest.raises(OperationFailure) as info:
        jobs.find_one_and_update({"_id": 1}, {"$set": {"_id": 100}})
    assert info.value.code == 66
