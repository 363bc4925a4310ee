"""insert / update / delete / find through pymongo, with MongoDB's semantics."""

from __future__ import annotations

import datetime as dt
import re
import time

import pytest
from bson import Decimal128, Int64, ObjectId, Regex
from pymongo import ASCENDING, DESCENDING
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure, WriteError
from pymongo.write_concern import WriteConcern

# -- insert -----------------------------------------------------------------------------------


def test_insert_one_assigns_object_id_first(db) -> None:
    result = db.c.insert_one({"a": 1, "b": {"c": [1, 2]}})
    assert isinstance(result.inserted_id, ObjectId)
    assert result.acknowledged
    doc = db.c.find_one()
    assert doc == {"_id": result.inserted_id, "a": 1, "b": {"c": [1, 2]}}
    assert list(doc) == ["_id", "a", "b"]


def test_insert_moves_explicit_id_first(db) -> None:
    db.c.insert_one({"a": 1, "_id": "x"})
    assert list(db.c.find_one()) == ["_id", "a"]


def test_insert_many_and_types_round_trip(db) -> None:
    when = dt.datetime(2024, 5, 6, 7, 8, 9, 123000)
    docs = [
        {"_id": 1, "int": 1, "long": Int64(2**40), "float": 1.5, "str": "héllo"},
        {"_id": 2, "date": when, "none": None, "bool": True, "dec": Decimal128("1.10")},
        {"_id": 3, "bin": b"\x00\x01", "oid": ObjectId("0123456789abcdef01234567")},
        {"_id": 4, "nested": {"deep": {"er": [1, {"x": [2, 3]}]}}},
    ]
    result = db.c.insert_many(docs)
    assert result.inserted_ids == [1, 2, 3, 4]
    got = {d["_id"]: d for d in db.c.find()}
    assert got[1] == docs[0]
    assert isinstance(got[1]["long"], Int64)
    assert got[2]["date"] == when
    assert got[2]["dec"] == Decimal128("1.10")
    assert got[3]["bin"] == b"\x00\x01"
    assert got[4] == docs[3]


def test_insert_many_ordered_stops_at_first_error(db) -> None:
    db.c.insert_one({"_id": 2})
    with pytest.raises(BulkWriteError) as info:
        db.c.insert_many([{"_id": 1}, {"_id": 2}, {"_id": 3}])
    details = info.value.details
    assert details["nInserted"] == 1
    assert [e["index"] for e in details["writeErrors"]] == [1]
    assert details["writeErrors"][0]["code"] == 11000
    assert sorted(d["_id"] for d in db.c.find()) == [1, 2]


def test_insert_many_unordered_continues_after_errors(db) -> None:
    db.c.insert_one({"_id": 2})
    with pytest.raises(BulkWriteError) as info:
        db.c.insert_many([{"_id": 1}, {"_id": 2}, {"_id": 3}, {"_id": 1}], ordered=False)
    details = info.value.details
    assert details["nInserted"] == 2
    assert sorted(e["index"] for e in details["writeErrors"]) == [1, 3]
    assert sorted(d["_id"] for d in db.c.find()) == [1, 2, 3]


def test_insert_duplicate_id(db) -> None:
    db.c.insert_one({"_id": "k"})
    with pytest.raises(DuplicateKeyError) as info:
        db.c.insert_one({"_id": "k", "other": 1})
    assert info.value.code == 11000
    assert db.c.find_one({"_id": "k"}) == {"_id": "k"}


def test_ids_of_equal_numbers_collide(db) -> None:
    db.c.insert_one({"_id": 1})
    with pytest.raises(DuplicateKeyError):
        db.c.insert_one({"_id": 1.0})
    with pytest.raises(DuplicateKeyError):
        db.c.insert_one({"_id": Int64(1)})


def test_array_id_rejected(db) -> None:
    with pytest.raises(WriteError):
        db.c.insert_one({"_id": [1, 2]})


def test_large_document_round_trip(db) -> None:
    payload = "x" * (4 * 1024 * 1024)
    db.c.insert_one({"_id": 1, "payload": payload})
    assert db.c.find_one({"_id": 1})["payload"] == payload


# -- find -------------------------------------------------------------------------------------


@pytest.fixture()
def people(db):
    db.people.insert_many(
        [
            {"_id": 1, "name": "ann", "age": 31, "tags": ["a", "b"], "addr": {"city": "Oslo"}},
            {"_id": 2, "name": "bob", "age": 25, "tags": ["b"], "addr": {"city": "Rome"}},
            {"_id": 3, "name": "cid", "age": 40, "tags": [], "addr": {"city": "Oslo"}},
            {"_id": 4, "name": "dee", "age": 25, "nick": None},
            {"_id": 5, "name": "Eve", "age": 52.5, "scores": [{"s": 3}, {"s": 9}]},
        ]
    )
    return db.people


def _ids(cursor) -> list:
    return [d["_id"] for d in cursor]


def test_find_filters(people) -> None:
    assert _ids(people.find({"age": 25}).sort("_id")) == [2, 4]
    assert _ids(people.find({"age": {"$gt": 30}}).sort("_id")) == [1, 3, 5]
    assert _ids(people.find({"age": {"$gte": 25, "$lt": 35}}).sort("_id")) == [1, 2, 4]
    assert _ids(people.find({"name": {"$in": ["ann", "dee", "zed"]}}).sort("_id")) == [1, 4]
    assert _ids(people.find({"name": {"$nin": ["ann", "dee"]}}).sort("_id")) == [2, 3, 5]
    assert _ids(people.find({"age": {"$ne": 25}}).sort("_id")) == [1, 3, 5]
    assert _ids(people.find({"addr.city": "Oslo"}).sort("_id")) == [1, 3]
    assert _ids(people.find({"tags": "b"}).sort("_id")) == [1, 2]  # array contains
    assert _ids(people.find({"tags": ["b"]})) == [2]  # exact array
    assert _ids(people.find({"tags": {"$all": ["a", "b"]}})) == [1]
    assert _ids(people.find({"tags": {"$size": 0}})) == [3]
    assert _ids(people.find({"scores.s": 9})) == [5]
    assert _ids(people.find({"scores": {"$elemMatch": {"s": {"$gt": 5}}}})) == [5]
    assert _ids(people.find({"$or": [{"age": 40}, {"name": "bob"}]}).sort("_id")) == [2, 3]
    assert _ids(people.find({"$and": [{"age": 25}, {"name": "dee"}]})) == [4]
    assert _ids(people.find({"$nor": [{"age": 25}, {"age": 31}]}).sort("_id")) == [3, 5]
    assert _ids(people.find({"age": {"$not": {"$gt": 30}}}).sort("_id")) == [2, 4]
    assert _ids(people.find({"$expr": {"$gt": ["$age", 35]}}).sort("_id")) == [3, 5]
    assert _ids(people.find({"age": {"$mod": [5, 0]}}).sort("_id")) == [2, 3, 4]


def test_find_exists_null_and_type(people) -> None:
    assert _ids(people.find({"nick": None}).sort("_id")) == [1, 2, 3, 4, 5]  # null or missing
    assert _ids(people.find({"nick": {"$exists": True}})) == [4]
    assert _ids(people.find({"tags": {"$exists": False}}).sort("_id")) == [4, 5]
    assert _ids(people.find({"age": {"$type": "double"}})) == [5]
    assert len(_ids(people.find({"age": {"$type": "number"}}))) == 5
    assert _ids(people.find({"nick": {"$type": "null"}})) == [4]


def test_find_regex(people) -> None:
    assert _ids(people.find({"name": {"$regex": "^[ab]"}}).sort("_id")) == [1, 2]
    assert _ids(people.find({"name": {"$regex": "^e", "$options": "i"}})) == [5]
    assert _ids(people.find({"name": re.compile("^E")})) == [5]
    assert _ids(people.find({"name": Regex("^c")})) == [3]


def test_find_numbers_compare_across_types(db) -> None:
    db.c.insert_many([{"_id": 1, "n": 1}, {"_id": 2, "n": 1.0}, {"_id": 3, "n": Int64(1)}])
    assert _ids(db.c.find({"n": 1}).sort("_id")) == [1, 2, 3]
    db.c.insert_one({"_id": 4, "n": Decimal128("1")})
    # Range comparisons order Decimal128 among the other numbers. (Plain equality between
    # Decimal128 and int/double is a documented limit of the embedded engine.)
    assert _ids(db.c.find({"n": {"$lt": 1.5}}).sort("_id")) == [1, 2, 3, 4]
    assert _ids(db.c.find({"n": {"$gt": Decimal128("0.5")}}).sort("_id")) == [1, 2, 3, 4]


def test_find_dates(db) -> None:
    base = dt.datetime(2024, 1, 1)
    db.c.insert_many([{"_id": i, "t": base + dt.timedelta(days=i)} for i in range(5)])
    assert _ids(db.c.find({"t": {"$gte": base + dt.timedelta(days=3)}}).sort("_id")) == [3, 4]


def test_find_unknown_operator_is_bad_value(people) -> None:
    with pytest.raises(OperationFailure) as info:
        people.find_one({"age": {"$foo": 1}})
    assert info.value.code == 2
    with pytest.raises(OperationFailure) as info:
        list(people.find({"$foo": [{"a": 1}]}))
    assert info.value.code == 2


def test_find_projection(people) -> None:
    assert people.find_one({"_id": 1}, {"name": 1}) == {"_id": 1, "name": "ann"}
    assert people.find_one({"_id": 1}, {"name": 1, "_id": 0}) == {"name": "ann"}
    assert people.find_one({"_id": 1}, {"tags": 0, "addr": 0, "age": 0}) == {
        "_id": 1,
        "name": "ann",
    }
    assert people.find_one({"_id": 1}, {"addr.city": 1, "_id": 0}) == {"addr": {"city": "Oslo"}}
    assert people.find_one({"_id": 1}, ["name", "age"]) == {"_id": 1, "name": "ann", "age": 31}
    assert people.find_one({"_id": 5}, {"scores.s": 1, "_id": 0}) == {
        "scores": [{"s": 3}, {"s": 9}]
    }
    assert people.find_one({"_id": 2}, {"missing": 1}) == {"_id": 2}


def test_find_projection_slice_and_elem_match(people) -> None:
    doc = people.find_one({"_id": 1}, {"tags": {"$slice": 1}, "name": 1})
    assert doc == {"_id": 1, "name": "ann", "tags": ["a"]}
    doc = people.find_one({"_id": 5}, {"scores": {"$elemMatch": {"s": 9}}})
    assert doc == {"_id": 5, "scores": [{"s": 9}]}


def test_find_projection_cannot_mix_inclusion_and_exclusion(people) -> None:
    with pytest.raises(OperationFailure) as info:
        people.find_one({}, {"name": 1, "age": 0})
    assert info.value.code == 31254


def test_find_projection_expression(people) -> None:
    doc = people.find_one({"_id": 2}, {"_id": 0, "name": 1, "older": {"$add": ["$age", 1]}})
    assert doc == {"name": "bob", "older": 26}


def test_find_sort_skip_limit(people) -> None:
    assert _ids(people.find().sort([("age", DESCENDING), ("_id", ASCENDING)])) == [5, 3, 1, 2, 4]
    assert _ids(people.find().sort([("age", ASCENDING), ("_id", DESCENDING)])) == [4, 2, 1, 3, 5]
    assert _ids(people.find().sort([("age", 1), ("_id", 1)]).skip(1).limit(2)) == [4, 1]
    assert _ids(people.find().sort("_id").skip(4)) == [5]
    assert _ids(people.find().sort("_id").skip(10)) == []
    assert _ids(people.find().sort("_id").limit(-2)) == [1, 2]
    assert _ids(people.find().sort([("addr.city", -1), ("_id", 1)])) == [2, 1, 3, 4, 5]


def test_sort_follows_bson_type_order(db) -> None:
    values = ["b", 2, None, 1.5, "a", {"x": 1}, True, dt.datetime(2020, 1, 1)]
    db.c.insert_many([{"_id": i, "v": v} for i, v in enumerate(values)])
    got = [d["v"] for d in db.c.find({}, {"_id": 0}).sort("v", 1)]
    assert got == [None, 1.5, 2, "a", "b", {"x": 1}, True, dt.datetime(2020, 1, 1)]
    got = [d["v"] for d in db.c.find({}, {"_id": 0}).sort("v", -1)]
    assert got == [dt.datetime(2020, 1, 1), True, {"x": 1}, "b", "a", 2, 1.5, None]


def test_find_batch_size_and_limit(db) -> None:
    db.c.insert_many([{"_id": i} for i in range(50)])
    assert _ids(db.c.find().sort("_id").batch_size(7)) == list(range(50))
    assert _ids(db.c.find().sort("_id").batch_size(7).limit(10)) == list(range(10))
    assert _ids(db.c.find().sort("_id").batch_size(100).limit(3)) == [0, 1, 2]


def test_find_on_missing_collection(db) -> None:
    assert list(db.nothing.find()) == []
    assert db.nothing.find_one() is None


# -- update -------------------------------------------------------------------------------------


def test_update_one_set_unset_inc(db) -> None:
    db.c.insert_one({"_id": 1, "a": 1, "b": 2, "n": 10})
    result = db.c.update_one(
        {"_id": 1},
        {"$set": {"a": 5, "x.y.z": "deep"}, "$unset": {"b": ""}, "$inc": {"n": -3, "m": 2}},
    )
    assert (result.matched_count, result.modified_count) == (1, 1)
    assert result.upserted_id is None
    assert db.c.find_one() == {"_id": 1, "a": 5, "n": 7, "x": {"y": {"z": "deep"}}, "m": 2}


def test_update_no_match(db) -> None:
    db.c.insert_one({"_id": 1})
    result = db.c.update_one({"_id": 2}, {"$set": {"a": 1}})
    assert (result.matched_count, result.modified_count, result.upserted_id) == (0, 0, None)
    assert db.c.count_documents({}) == 1


def test_noop_update_is_not_counted_as_modified(db) -> None:
    db.c.insert_one({"_id": 1, "a": 1})
    result = db.c.update_one({"_id": 1}, {"$set": {"a": 1}})
    assert (result.matched_count, result.modified_count) == (1, 0)


def test_update_arithmetic_and_comparison_operators(db) -> None:
    db.c.insert_one({"_id": 1, "p": 3, "lo": 5, "hi": 5, "f": 1.5})
    db.c.update_one(
        {"_id": 1}, {"$mul": {"p": 4, "f": 2, "new": 3}, "$min": {"lo": 2}, "$max": {"hi": 9}}
    )
    doc = db.c.find_one()
    assert doc == {"_id": 1, "p": 12, "lo": 2, "hi": 9, "f": 3.0, "new": 0}
    db.c.update_one({"_id": 1}, {"$min": {"lo": 7}, "$max": {"hi": 1}})
    assert db.c.find_one()["lo"] == 2 and db.c.find_one()["hi"] == 9


def test_update_rename_and_current_date(db) -> None:
    db.c.insert_one({"_id": 1, "old": "v", "keep": 1})
    before = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(seconds=5)
    db.c.update_one({"_id": 1}, {"$rename": {"old": "new"}, "$currentDate": {"at": True}})
    doc = db.c.find_one()
    assert "old" not in doc and doc["new"] == "v" and doc["keep"] == 1
    assert isinstance(doc["at"], dt.datetime) and doc["at"] >= before


def test_update_array_operators(db) -> None:
    db.c.insert_one({"_id": 1, "a": [3, 1], "s": ["x"], "p": [1, 2, 3, 2, 4], "q": [1, 2, 3]})
    db.c.update_one({"_id": 1}, {"$push": {"a": 2}})
    db.c.update_one({"_id": 1}, {"$push": {"a": {"$each": [9, 0], "$sort": 1, "$slice": -4}}})
    assert db.c.find_one()["a"] == [1, 2, 3, 9]
    db.c.update_one({"_id": 1}, {"$push": {"a": {"$each": [7], "$position": 0}}})
    assert db.c.find_one()["a"] == [7, 1, 2, 3, 9]
    db.c.update_one({"_id": 1}, {"$addToSet": {"s": "x"}})
    db.c.update_one({"_id": 1}, {"$addToSet": {"s": {"$each": ["y", "x", "z"]}}})
    assert db.c.find_one()["s"] == ["x", "y", "z"]
    db.c.update_one({"_id": 1}, {"$pull": {"p": 2}})
    assert db.c.find_one()["p"] == [1, 3, 4]
    db.c.update_one({"_id": 1}, {"$pull": {"p": {"$gte": 3}}})
    assert db.c.find_one()["p"] == [1]
    db.c.update_one({"_id": 1}, {"$pullAll": {"q": [1, 3]}})
    assert db.c.find_one()["q"] == [2]
    db.c.update_one({"_id": 1}, {"$pop": {"a": 1}})
    assert db.c.find_one()["a"] == [7, 1, 2, 3]
    db.c.update_one({"_id": 1}, {"$pop": {"a": -1}})
    assert db.c.find_one()["a"] == [1, 2, 3]
    db.c.update_one({"_id": 1}, {"$push": {"fresh": "v"}})
    assert db.c.find_one()["fresh"] == ["v"]


def test_update_pull_documents_by_condition(db) -> None:
    db.c.insert_one(
        {"_id": 1, "items": [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 3, "v": "a"}]}
    )
    db.c.update_one({"_id": 1}, {"$pull": {"items": {"v": "a"}}})
    assert db.c.find_one()["items"] == [{"k": 2, "v": "b"}]


def test_update_positional_operators(db) -> None:
    db.c.insert_one({"_id": 1, "items": [{"k": 1, "n": 0}, {"k": 2, "n": 0}, {"k": 3, "n": 0}]})
    db.c.update_one({"_id": 1, "items.k": 2}, {"$set": {"items.$.n": 5}})
    assert [i["n"] for i in db.c.find_one()["items"]] == [0, 5, 0]
    db.c.update_one({"_id": 1}, {"$inc": {"items.$[].n": 1}})
    assert [i["n"] for i in db.c.find_one()["items"]] == [1, 6, 1]
    db.c.update_one({"_id": 1}, {"$set": {"items.0.n": 100}})
    assert [i["n"] for i in db.c.find_one()["items"]] == [100, 6, 1]


def test_update_array_filters(db) -> None:
    db.c.insert_one({"_id": 1, "grades": [{"score": 40}, {"score": 80}, {"score": 95}]})
    result = db.c.update_one(
        {"_id": 1},
        {"$set": {"grades.$[g].pass": True}},
        array_filters=[{"g.score": {"$gte": 50}}],
    )
    assert result.modified_count == 1
    assert db.c.find_one()["grades"] == [
        {"score": 40},
        {"score": 80, "pass": True},
        {"score": 95, "pass": True},
    ]
    db.c.insert_one({"_id": 2, "nums": [1, 5, 10]})
    db.c.update_many({"_id": 2}, {"$mul": {"nums.$[big]": 2}}, array_filters=[{"big": {"$gt": 4}}])
    assert db.c.find_one({"_id": 2})["nums"] == [1, 10, 20]


def test_update_many(db) -> None:
    db.c.insert_many([{"_id": i, "g": i % 3, "v": 0} for i in range(9)])
    result = db.c.update_many({"g": 1}, {"$inc": {"v": 1}})
    assert (result.matched_count, result.modified_count) == (3, 3)
    assert sorted(d["_id"] for d in db.c.find({"v": 1})) == [1, 4, 7]
    result = db.c.update_many({"g": {"$in": [0, 1]}}, {"$set": {"v": 1}})
    assert (result.matched_count, result.modified_count) == (6, 3)
    result = db.c.update_many({"g": 99}, {"$set": {"v": 1}})
    assert (result.matched_count, result.modified_count) == (0, 0)


def test_upsert_inserts_from_filter_equalities(db) -> None:
    result = db.c.update_one(
        {"name": "x", "n": {"$gt": 5}, "meta.kind": "k"},
        {"$set": {"v": 1}, "$setOnInsert": {"created": True}},
        upsert=True,
    )
    assert result.matched_count == 0 and result.modified_count == 0
    assert isinstance(result.upserted_id, ObjectId)
    doc = db.c.find_one({"_id": result.upserted_id})
    assert doc == {
        "_id": result.upserted_id,
        "name": "x",
        "meta": {"kind": "k"},
        "v": 1,
        "created": True,
    }
    again = db.c.update_one(
        {"name": "x"}, {"$set": {"v": 2}, "$setOnInsert": {"created": False}}, upsert=True
    )
    assert again.upserted_id is None and again.matched_count == 1
    assert db.c.find_one({"name": "x"})["created"] is True
    assert db.c.count_documents({}) == 1


def test_upsert_with_id_in_filter(db) -> None:
    result = db.c.update_one({"_id": "me"}, {"$inc": {"n": 1}}, upsert=True)
    assert result.upserted_id == "me"
    db.c.update_one({"_id": "me"}, {"$inc": {"n": 1}}, upsert=True)
    assert db.c.find_one() == {"_id": "me", "n": 2}


def test_upsert_many(db) -> None:
    result = db.c.update_many({"k": 1}, {"$set": {"v": 1}}, upsert=True)
    assert result.upserted_id is not None
    assert db.c.find_one({"k": 1}, {"_id": 0}) == {"k": 1, "v": 1}


def test_replace_one(db) -> None:
    db.c.insert_one({"_id": 1, "a": 1, "b": 2})
    result = db.c.replace_one({"_id": 1}, {"c": 3})
    assert (result.matched_count, result.modified_count) == (1, 1)
    assert db.c.find_one() == {"_id": 1, "c": 3}
    result = db.c.replace_one({"_id": 2}, {"c": 4}, upsert=True)
    assert result.upserted_id == 2
    assert db.c.find_one({"_id": 2}) == {"_id": 2, "c": 4}
    result = db.c.replace_one({"c": 5}, {"c": 5, "d": 1}, upsert=True)
    assert isinstance(result.upserted_id, ObjectId)
    assert db.c.find_one({"c": 5}, {"_id": 0}) == {"c": 5, "d": 1}


def test_pipeline_update(db) -> None:
    db.c.insert_many([{"_id": 1, "a": 1, "b": 2, "tmp": 0}, {"_id": 2, "a": 10, "b": 20, "tmp": 0}])
    result = db.c.update_many(
        {}, [{"$set": {"total": {"$add": ["$a", "$b"]}, "kind": "sum"}}, {"$unset": "tmp"}]
    )
    assert result.modified_count == 2
    assert list(db.c.find().sort("_id")) == [
        {"_id": 1, "a": 1, "b": 2, "total": 3, "kind": "sum"},
        {"_id": 2, "a": 10, "b": 20, "total": 30, "kind": "sum"},
    ]
    db.c.update_one({"_id": 1}, [{"$set": {"a": "$b"}}, {"$project": {"a": 1}}])
    assert db.c.find_one({"_id": 1}) == {"_id": 1, "a": 2}


def test_pipeline_upsert(db) -> None:
    result = db.c.update_one({"_id": 9}, [{"$set": {"x": {"$literal": 1}}}], upsert=True)
    assert result.upserted_id == 9
    assert db.c.find_one({"_id": 9}) == {"_id": 9, "x": 1}


def test_update_cannot_change_id(db) -> None:
    db.c.insert_one({"_id": 1, "a": 1})
    with pytest.raises(WriteError) as info:
        db.c.update_one({"_id": 1}, {"$set": {"_id": 2}})
    assert info.value.code == 66
    with pytest.raises(WriteError) as info:
        db.c.replace_one({"_id": 1}, {"_id": 3, "a": 2})
    assert info.value.code == 66
    assert db.c.find_one() == {"_id": 1, "a": 1}


def test_update_conflicting_operators(db) -> None:
    db.c.insert_one({"_id": 1, "a": 1})
    with pytest.raises(WriteError) as info:
        db.c.update_one({"_id": 1}, {"$set": {"a": 2}, "$inc": {"a": 1}})
    assert info.value.code == 40


def test_update_inc_non_numeric_is_type_mismatch(db) -> None:
    db.c.insert_one({"_id": 1, "a": "text"})
    with pytest.raises(WriteError) as info:
        db.c.update_one({"_id": 1}, {"$inc": {"a": 1}})
    assert info.value.code == 14
    assert db.c.find_one() == {"_id": 1, "a": "text"}


def test_update_unknown_operator_fails(db) -> None:
    db.c.insert_one({"_id": 1})
    with pytest.raises(WriteError) as info:
        db.c.update_one({"_id": 1}, {"$frobnicate": {"a": 1}})
    assert info.value.code == 9


def test_update_many_error_leaves_earlier_documents_updated(db) -> None:
    # Not transactional: an update_many that fails half-way keeps what it already wrote.
    db.c.insert_many([{"_id": 1, "a": 1}, {"_id": 2, "a": "x"}])
    with pytest.raises(WriteError):
        db.c.update_many({}, {"$inc": {"a": 1}})
    assert db.c.find_one({"_id": 1}) == {"_id": 1, "a": 2}
    assert db.c.find_one({"_id": 2}) == {"_id": 2, "a": "x"}


# -- delete -------------------------------------------------------------------------------------


def test_delete_one_and_many(db) -> None:
    db.c.insert_many([{"_id": i, "g": i % 2} for i in range(10)])
    assert db.c.delete_one({"g": 0}).deleted_count == 1
    assert db.c.count_documents({"g": 0}) == 4
    assert db.c.delete_many({"g": 1}).deleted_count == 5
    assert db.c.delete_many({"g": 1}).deleted_count == 0
    assert db.c.count_documents({}) == 4
    assert db.c.delete_many({}).deleted_count == 4
    assert db.c.count_documents({}) == 0
    assert "c" in db.list_collection_names()  # deleting documents keeps the collection


def test_delete_on_missing_collection(db) -> None:
    assert db.nothing.delete_many({"a": 1}).deleted_count == 0


def test_delete_with_bad_filter(db) -> None:
    db.c.insert_one({"a": 1})
    with pytest.raises(OperationFailure) as info:
        db.c.delete_many({"a": {"$foo": 1}})
    assert info.value.code == 2
    assert db.c.count_documents({}) == 1


def test_deleted_id_can_be_reinserted(db) -> None:
    db.c.insert_one({"_id": 1, "v": 1})
    db.c.delete_one({"_id": 1})
    db.c.insert_one({"_id": 1, "v": 2})
    assert db.c.find_one() == {"_id": 1, "v": 2}


# -- write concerns and large batches ----------------------------------------------------------


def test_write_concerns(db) -> None:
    majority = db.get_collection("c", write_concern=WriteConcern("majority", j=True, wtimeout=5000))
    assert majority.insert_one({"_id": 1}).acknowledged
    assert majority.update_one({"_id": 1}, {"$set": {"v": 1}}).modified_count == 1
    assert db.c.find_one() == {"_id": 1, "v": 1}


def test_unacknowledged_writes_are_applied(db) -> None:
    """w=0 writes go out as OP_MSG with moreToCome: no reply, but they are applied."""
    fire_and_forget = db.get_collection("c", write_concern=WriteConcern(w=0))
    result = fire_and_forget.insert_many([{"_id": i} for i in range(100)])
    assert not result.acknowledged
    fire_and_forget.update_many({}, {"$set": {"seen": True}})
    fire_and_forget.delete_one({"_id": 0})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if db.c.count_documents({"seen": True}) == 99:
            break
        time.sleep(0.05)
    assert db.c.count_documents({"seen": True}) == 99


def test_batches_larger_than_one_message(db) -> None:
    """pymongo splits a 60 MB insert_many into several 48 MB messages; replies over 16 MB
    are split into several batches by the server."""
    blob = "x" * (1024 * 1024)
    result = db.c.insert_many([{"_id": i, "blob": blob} for i in range(60)])
    assert len(result.inserted_ids) == 60
    seen = 0
    for doc in db.c.find().sort("_id", 1):
        assert doc["_id"] == seen and len(doc["blob"]) == len(blob)
        seen += 1
    assert seen == 60
    total = list(db.c.aggregate([{"$group": {"_id": None, "n": {"$sum": 1}}}]))
    assert total == [{"_id": None, "n": 60}]


def test_rename_collection(client, db) -> None:
    db.src.insert_many([{"_id": 1}, {"_id": 2}])
    db.src.create_index("x")
    db.src.rename("dst")
    assert "src" not in db.list_collection_names()
    assert db.dst.count_documents({}) == 2
    assert [i["name"] for i in db.dst.list_indexes()] == ["_id_", "x_1"]
    db.other.insert_one({"_id": 9})
    with pytest.raises(OperationFailure) as info:
        db.dst.rename("other")
    assert info.value.code == 48
    db.dst.rename("other", dropTarget=True)
    assert sorted(d["_id"] for d in db.other.find()) == [1, 2]


# -- array semantics in queries, sorts and projections --------------------------------------------


@pytest.fixture()
def arrays(db):
    db.arr.insert_many([{"_id": 1, "a": [5, 1, 9]}, {"_id": 2, "a": [3]}, {"_id": 3, "a": 4}])
    return db.arr


def test_sort_on_array_field_uses_min_ascending_and_max_descending(arrays) -> None:
    assert _ids(arrays.find().sort("a", 1)) == [1, 2, 3]  # keys 1, 3, 4
    assert _ids(arrays.find().sort("a", -1)) == [1, 3, 2]  # keys 9, 4, 3


def test_array_query_operators(arrays) -> None:
    assert _ids(arrays.find({"a": {"$size": 1}})) == [2]  # a scalar is not a 1-element array
    assert _ids(arrays.find({"a": {"$gt": 8}})) == [1]  # any element
    assert _ids(arrays.find({"a": {"$elemMatch": {"$gt": 4, "$lt": 6}}})) == [1]
    assert _ids(arrays.find({"a.0": 5})) == [1]
    assert _ids(arrays.find({"a": {"$type": "array"}}).sort("_id")) == [1, 2]
    assert _ids(arrays.find({"a.1": {"$exists": True}})) == [1]


def test_positional_projection(arrays) -> None:
    assert arrays.find_one({"a": 9}, {"a.$": 1}) == {"_id": 1, "a": [9]}
