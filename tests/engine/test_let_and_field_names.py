"""``let`` variables, ``$getField``/``$setField``/``$unsetField``, and the MongoDB 5.0+ rules
for field names with ``$`` and dots, through pymongo."""

from __future__ import annotations

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure, WriteError


@pytest.fixture()
def coll(db):
    c = db["let"]
    c.insert_many([{"_id": 1, "name": "a", "n": 1}, {"_id": 2, "name": "b", "n": 2}, {"_id": 3}])
    return c


def test_find_filter_and_projection_use_let(coll) -> None:
    found = list(
        coll.find(
            {"$expr": {"$eq": ["$name", "$$who"]}},
            {"_id": 1, "greeting": "$$hello"},
            let={"who": "b", "hello": {"$concat": ["hi ", "there"]}},
        )
    )
    assert found == [{"_id": 2, "greeting": "hi there"}]


def test_a_let_value_is_data_outside_expr(coll) -> None:
    coll.insert_one({"_id": 4, "name": "$$who"})
    assert [d["_id"] for d in coll.find({"name": "$$who"}, let={"who": "a"})] == [4]


def test_aggregate_uses_let_in_match_and_stages(coll) -> None:
    out = list(
        coll.aggregate(
            [
                {"$match": {"$expr": {"$gte": ["$n", "$$min"]}}},
                {"$project": {"_id": 1, "scaled": {"$multiply": ["$n", "$$factor"]}}},
            ],
            let={"min": 2, "factor": 10},
        )
    )
    assert out == [{"_id": 2, "scaled": 20}]


def test_lookup_pipeline_sees_outer_and_own_variables(db, coll) -> None:
    db["other"].insert_many([{"_id": 10, "ref": 1, "k": 5}, {"_id": 11, "ref": 1, "k": 6}])
    out = list(
        coll.aggregate(
            [
                {"$match": {"_id": 1}},
                {
                    "$lookup": {
                        "from": "other",
                        "let": {"id": "$_id"},
                        "pipeline": [
                            {
                                "$match": {
                                    "$expr": {
                                        "$and": [
                                            {"$eq": ["$ref", "$$id"]},
                                            {"$eq": ["$k", "$$wanted"]},
                                        ]
                                    }
                                }
                            }
                        ],
                        "as": "hits",
                    }
                },
            ],
            let={"wanted": 6},
        )
    )
    assert [h["_id"] for h in out[0]["hits"]] == [11]


def test_update_delete_and_find_and_modify_use_let(coll) -> None:
    result = coll.update_many(
        {"$expr": {"$eq": ["$name", "$$target"]}},
        [{"$set": {"n": {"$add": ["$n", "$$step"]}}}],
        let={"target": "a", "step": 100},
    )
    assert result.modified_count == 1
    assert coll.find_one({"_id": 1})["n"] == 101
    doc = coll.find_one_and_update(
        {"$expr": {"$eq": ["$_id", "$$id"]}},
        {"$set": {"seen": True}},
        let={"id": 2},
        return_document=True,
    )
    assert doc == {"_id": 2, "name": "b", "n": 2, "seen": True}
    # A missing field compares below any value: document 3 has no name and is not deleted.
    deleted = coll.delete_many({"$expr": {"$eq": ["$name", "$$gone"]}}, let={"gone": "b"})
    assert deleted.deleted_count == 1
    assert sorted(d["_id"] for d in coll.find()) == [1, 3]


def test_bad_let_names_are_refused(coll) -> None:
    for name in ("Upper", "1x", "ROOT", "a-b"):
        with pytest.raises(OperationFailure):
            coll.find_one({}, let={name: 1})


def test_expr_comparisons_follow_bson_order(coll) -> None:
    coll.insert_many([{"_id": 5, "v": True}, {"_id": 6, "v": 1}, {"_id": 7, "v": None}])
    # true and 1 are different values (Python's == would say equal).
    assert [d["_id"] for d in coll.find({"$expr": {"$eq": ["$v", 1]}})] == [6]
    # missing < null < numbers: only documents with a field, and only non-null ones.
    assert sorted(d["_id"] for d in coll.find({"$expr": {"$gt": ["$v", None]}})) == [5, 6]
    assert [d["_id"] for d in coll.find({"$expr": {"$lt": ["$v", None]}, "_id": {"$gte": 5}})] == []


def test_set_field_and_get_field_with_dollar_and_dotted_names(coll) -> None:
    coll.update_one(
        {"_id": 1},
        [
            {
                "$replaceWith": {
                    "$setField": {"field": {"$literal": "$price"}, "value": 9, "input": "$$ROOT"}
                }
            }
        ],
    )
    coll.update_one(
        {"_id": 1}, [{"$set": {"sub": {"$setField": {"field": "a.b", "value": 1, "input": {}}}}}]
    )
    assert coll.find_one({"_id": 1}) == {
        "_id": 1,
        "name": "a",
        "n": 1,
        "$price": 9,
        "sub": {"a.b": 1},
    }
    out = list(
        coll.aggregate(
            [
                {"$match": {"_id": 1}},
                {
                    "$project": {
                        "_id": 0,
                        "price": {"$getField": {"$literal": "$price"}},
                        "ab": {"$getField": {"field": "a.b", "input": "$sub"}},
                        "without": {"$unsetField": {"field": "n", "input": {"n": 1, "m": 2}}},
                    }
                },
            ]
        )
    )
    assert out == [{"price": 9, "ab": 1, "without": {"m": 2}}]


def test_set_field_removes_with_remove_and_rejects_non_constant_names(coll) -> None:
    coll.update_one(
        {"_id": 1},
        [
            {
                "$replaceWith": {
                    "$setField": {"field": "name", "value": "$$REMOVE", "input": "$$ROOT"}
                }
            }
        ],
    )
    assert coll.find_one({"_id": 1}) == {"_id": 1, "n": 1}
    with pytest.raises(OperationFailure):
        list(coll.aggregate([{"$project": {"x": {"$getField": "$name"}}}]))


def test_dollar_and_dotted_field_names_are_stored(db) -> None:
    c = db["names"]
    c.insert_one({"_id": 1, "$a": 1, "b.c": 2, "d": {"$e": 3, "f.g": 4}, "ref": {"$db": "x"}})
    assert c.find_one({"_id": 1}) == {
        "_id": 1, "$a": 1, "b.c": 2, "d": {"$e": 3, "f.g": 4}, "ref": {"$db": "x"}
    }  # fmt: skip
    c.replace_one({"_id": 1}, {"x": {"$y": 1}})
    assert c.find_one({"_id": 1}) == {"_id": 1, "x": {"$y": 1}}


def test_dollar_names_inside_id_are_refused(db) -> None:
    with pytest.raises(WriteError) as info:
        db["names"].insert_one({"_id": {"$a": 1}})
    assert info.value.code == 52
    db["names"].insert_one({"_id": {"a.b": 1}})  # dots are fine there


def test_update_operators_still_refuse_dollar_paths(db, client: MongoClient) -> None:
    db["names"].insert_one({"_id": 1})
    with pytest.raises(WriteError) as info:
        db["names"].update_one({"_id": 1}, {"$set": {"$a": 1}})
    assert info.value.code == 52
