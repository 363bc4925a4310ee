"""Sizes and resources, as mongod enforces them (a review of 2026-12: "sizes and
resources"): documents over 16 MB in every write path, results over 16 MB, strings an
expression makes, the number of statements in one write command. After each refusal the
server answers, nothing was written and the data read back as before.
"""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

MIB = 1024 * 1024
LIMIT = 16 * MIB


def _write_error(reply: dict[str, Any]) -> dict[str, Any]:
    (error,) = reply["writeErrors"]
    return error


def test_writes_over_16mb_get_mongods_error_for_each_path(client: MongoClient, db) -> None:
    db.c.insert_one({"_id": 1, "s": "x" * (LIMIT - 40)})  # just under: stored
    over = "y" * LIMIT
    # insert: fixDocumentForInsert's BadValue (before: 10334 "BSONObj size: 16777238 is
    # invalid. Size must be between 0 and 16793600(16MB)", below the size it named)
    error = _write_error(db.command("insert", "c", documents=[{"_id": 2, "s": over}]))
    assert error["code"] == 2
    assert error["errmsg"] == (
        f"object to insert too large. size in bytes: {LIMIT + 22}, max size: {LIMIT}"
    )
    # update ($set growth, replacement): UpdateStage's
    for u in ({"$set": {"t": "z" * 100}}, {"s": over}):
        reply = db.command("update", "c", updates=[{"q": {"_id": 1}, "u": u}])
        error = _write_error(reply)
        assert error["code"] == 10334
        assert error["errmsg"] == f"Resulting document after update is larger than {LIMIT}"
    # upsert: UpsertStage's 17420
    reply = db.command(
        "update", "c", updates=[{"q": {"_id": 3}, "u": {"$set": {"s": over}}, "upsert": True}]
    )
    error = _write_error(reply)
    assert (error["code"], error["errmsg"]) == (17420, f"Document to upsert is larger than {LIMIT}")
    with pytest.raises(OperationFailure) as info:
        db.command("findAndModify", "c", query={"_id": 4}, update={"s": over}, upsert=True)
    assert info.value.code == 17420
    # nothing half-written, the data intact, the server answers
    assert sorted(d["_id"] for d in db.c.find({}, {"_id": 1})) == [1]
    assert len(db.c.find_one({"_id": 1})["s"]) == LIMIT - 40
    assert client.admin.command("ping")["ok"] == 1


@pytest.mark.parametrize(
    "pipeline",
    [
        [{"$group": {"_id": None, "all": {"$push": "$s"}}}],
        [{"$project": {"a": "$s", "b": "$s", "c": "$s", "d": "$s"}}],
        [{"$facet": {"all": [{"$match": {}}]}}],
    ],
    ids=["group-push", "project", "facet"],
)
def test_a_result_document_over_16mb_is_refused(client: MongoClient, db, pipeline) -> None:
    # 4 documents of 5 MB; each pipeline makes one result of 20 MB. Before: the engine
    # sent it (a reply over maxBsonObjectSize that pymongo happened to decode).
    db.c.insert_many([{"_id": i, "s": "a" * (5 * MIB)} for i in range(4)])
    with pytest.raises(OperationFailure) as info:
        list(db.c.aggregate(pipeline))
    assert info.value.code == 10334
    assert "is invalid. Size must be between 0 and 16793600(16MB)" in str(info.value)
    assert client.admin.command("ping")["ok"] == 1
    assert db.c.count_documents({}) == 4


def test_a_getmore_reaching_a_result_over_16mb_fails_and_kills_the_cursor(db) -> None:
    db.c.insert_many([{"_id": i, "s": "a" * (3 * MIB)} for i in range(2)])
    pipeline = [
        {"$sort": {"_id": 1}},
        {"$project": {"s": {"$cond": [{"$eq": ["$_id", 0]}, "small", "$s"]}, "t": "$s"}},
        {"$project": {"s": 1, "t": 1, "u": "$s", "v": "$t", "w": "$t", "x": "$t"}},
    ]
    reply = db.command("aggregate", "c", pipeline=pipeline, cursor={"batchSize": 1})
    cursor_id = reply["cursor"]["id"]
    assert len(reply["cursor"]["firstBatch"]) == 1 and cursor_id
    with pytest.raises(OperationFailure) as info:
        db.command("getMore", cursor_id, collection="c")
    assert info.value.code == 10334
    with pytest.raises(OperationFailure) as info:
        db.command("getMore", cursor_id, collection="c")
    assert info.value.code == 43  # CursorNotFound: mongod kills a failed cursor


def test_an_expression_cannot_make_a_string_of_16mb(client: MongoClient, db) -> None:
    # $concat doubling a 1 KB string through a chain of $let: 2 KB of command; before
    # the fix 18 doublings (256 MB) took the engine to 737 MB; mongod's RCString refuses
    # a string of 16 MB (16493) at the 14th.
    levels = 16
    expr: Any = {"$eq": [f"$$x{levels}", ""]}
    for i in range(levels, 0, -1):
        concat = {"$concat": [f"$$x{i - 1}", f"$$x{i - 1}"]}
        expr = {"$let": {"vars": {f"x{i}": concat}, "in": expr}}
    expr = {"$let": {"vars": {"x0": "x" * 1024}, "in": expr}}
    with pytest.raises(OperationFailure) as info:
        list(db.c.aggregate([{"$documents": [{}]}, {"$project": {"a": expr}}]))
    assert info.value.code == 16493
    assert "Tried to create string longer than 16MB" in str(info.value)
    # just under 16 MB is a value like any other
    (doc,) = db.c.aggregate(
        [{"$documents": [{}]}, {"$project": {"n": {"$eq": [{"$concat": ["x" * MIB] * 15}, ""]}}}]
    )
    assert doc["n"] is False
    assert client.admin.command("ping")["ok"] == 1


@pytest.mark.parametrize(
    ("command", "field", "statement"),
    [
        ("insert", "documents", None),
        ("update", "updates", {"q": {"_id": -1}, "u": {"$set": {"a": 1}}}),
        ("delete", "deletes", {"q": {"_id": -1}, "limit": 1}),
    ],
)
def test_a_write_command_carries_1_to_100000_statements(
    db, command: str, field: str, statement: Any
) -> None:
    # Before: an empty batch was n: 0 and a raw batch of 150,000 inserts was applied,
    # where mongod answers 16 InvalidLength (drivers split at maxWriteBatchSize).
    with pytest.raises(OperationFailure) as info:
        db.command(command, "c", **{field: []})
    assert info.value.code == 16
    assert str(info.value).startswith(
        "Write batch sizes must be between 1 and 100000. Got 0 operations."
    )
    many = [{"_id": i} if statement is None else statement for i in range(100_001)]
    with pytest.raises(OperationFailure) as info:
        db.command(command, "c", **{field: many})
    assert info.value.code == 16
    assert "Got 100001 operations." in str(info.value)
    assert db.c.count_documents({}) == 0


def test_bulk_write_carries_1_to_100000_operations(client: MongoClient, db) -> None:
    with pytest.raises(OperationFailure) as info:
        client.admin.command("bulkWrite", ops=[], nsInfo=[{"ns": f"{db.name}.c"}])
    assert info.value.code == 16


def test_distinct_values_over_16mb_are_refused(client: MongoClient, db) -> None:
    # mongod caps the values distinct gathers (17217); before, the engine built a reply
    # of 20 MB.
    db.c.insert_many([{"_id": i, "s": f"{i}" + "a" * (5 * MIB)} for i in range(4)])
    with pytest.raises(OperationFailure) as info:
        db.c.distinct("s")
    assert info.value.code == 17217
    assert "distinct too big, 16mb cap" in str(info.value)
    assert len(db.c.distinct("s", {"_id": {"$lt": 3}})) == 3  # 15 MB: served
    assert client.admin.command("ping")["ok"] == 1
