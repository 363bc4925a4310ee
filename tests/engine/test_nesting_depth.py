"""Documents nested deeper than mongod stores are refused, with mongod's errors (issue 22,
item 9).

mongod stores documents nested up to ``BSONDepth::getMaxDepthForUserStorage()`` levels:
its ``maxBSONDepth`` (200 by default) less 20 it keeps for documents that wrap stored ones
(oplog entries), so 180. An insert past it fails with 15 ``Overflow`` "cannot insert
document because it exceeds 180 levels of nesting"; an update, a replacement or an upsert
that would store one, with "Document exceeds maximum nesting depth of 180". Top-level
fields are level 1; arrays count as levels; an empty document or array adds none.
Through pymongo, so these run against a real MongoDB too.
"""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.errors import BulkWriteError, OperationFailure, WriteError

LIMIT = 180
INSERT_MESSAGE = f"cannot insert document because it exceeds {LIMIT} levels of nesting"
UPDATE_MESSAGE = f"Document exceeds maximum nesting depth of {LIMIT}"


def nested(levels: int, leaf: Any = 1) -> Any:
    """A value whose deepest element is ``levels`` levels below the field holding it."""
    value = leaf
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def depth_of(doc: dict[str, Any]) -> int:
    """The level of the deepest element (top-level fields are level 1)."""

    def walk(value: Any, level: int) -> int:  # ``value`` is an element at ``level``
        if isinstance(value, dict | list) and value:
            items = value.values() if isinstance(value, dict) else value
            return max(walk(v, level + 1) for v in items)
        return level

    return max((walk(v, 1) for v in doc.values()), default=0)


def test_the_helpers_count_levels_as_mongod_does() -> None:
    assert depth_of({"a": 1}) == 1
    assert depth_of({"a": {"b": 1}}) == 2
    assert depth_of({"a": nested(LIMIT)}) == LIMIT
    assert depth_of({"a": [[1]]}) == 3


def test_a_document_at_the_limit_is_stored(db: Any) -> None:
    doc = {"_id": 1, "a": nested(LIMIT)}
    db.c.insert_one(doc)
    assert db.c.find_one({"_id": 1}) == doc
    # An empty document or array at the deepest level adds no level.
    db.c.insert_one({"_id": 2, "a": nested(LIMIT, {})})
    db.c.insert_one({"_id": 3, "a": nested(LIMIT, [])})
    assert db.c.count_documents({}) == 3


@pytest.mark.parametrize(
    "value",
    [nested(LIMIT + 1), nested(LIMIT, {"b": 1}), nested(LIMIT, [1]), nested(LIMIT, [[]])],
    ids=["documents", "a document at the bottom", "an array at the bottom", "arrays"],
)
def test_an_insert_one_level_too_deep_is_refused(db: Any, value: Any) -> None:
    with pytest.raises(WriteError) as info:
        db.c.insert_one({"_id": 1, "a": value})
    assert info.value.code == 15
    assert INSERT_MESSAGE in str(info.value)
    assert db.c.count_documents({}) == 0


def test_an_unordered_batch_stores_the_others(db: Any) -> None:
    docs = [{"_id": 1}, {"_id": 2, "a": nested(LIMIT + 1)}, {"_id": 3}]
    with pytest.raises(BulkWriteError) as info:
        db.c.insert_many(docs, ordered=False)
    errors = info.value.details["writeErrors"]
    assert [(e["index"], e["code"]) for e in errors] == [(1, 15)]
    assert sorted(d["_id"] for d in db.c.find()) == [1, 3]


@pytest.mark.parametrize(
    "write",
    [
        lambda c: c.update_one({"_id": 1}, {"$set": {"a": nested(LIMIT + 1)}}),
        lambda c: c.update_one({"_id": 1}, {"$set": {"a.b": nested(LIMIT)}}),
        lambda c: c.update_one({"_id": 1}, {"$push": {"list": nested(LIMIT)}}),
        lambda c: c.replace_one({"_id": 1}, {"a": nested(LIMIT + 1)}),
        lambda c: c.update_one({"_id": 9}, {"$set": {"a": nested(LIMIT + 1)}}, upsert=True),
        lambda c: c.find_one_and_update({"_id": 1}, {"$set": {"a": nested(LIMIT + 1)}}),
    ],
    ids=["$set", "$set below a field", "$push", "replacement", "upsert", "findAndModify"],
)
def test_an_update_that_would_store_one_level_too_deep_is_refused(db: Any, write: Any) -> None:
    db.c.insert_one({"_id": 1, "a": {"b": 0}, "list": []})
    with pytest.raises(OperationFailure) as info:
        write(db.c)
    assert info.value.code == 15
    assert UPDATE_MESSAGE in str(info.value)
    assert list(db.c.find()) == [{"_id": 1, "a": {"b": 0}, "list": []}]


def test_an_update_to_the_limit_is_stored(db: Any) -> None:
    db.c.insert_one({"_id": 1, "a": {"b": 0}})
    db.c.update_one({"_id": 1}, {"$set": {"a.b": nested(LIMIT - 1)}})
    assert depth_of(db.c.find_one({"_id": 1})) == LIMIT
