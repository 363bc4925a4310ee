"""Collation, read-only views, and the $out / $merge stages, through pymongo."""

from __future__ import annotations

import pytest
from pymongo import ASCENDING
from pymongo.collation import Collation
from pymongo.errors import DuplicateKeyError, OperationFailure

CI = Collation(locale="en_US", strength=2)  # case-insensitive
BASE = Collation(locale="en", strength=1)  # case- and accent-insensitive


@pytest.fixture()
def words(db):
    c = db["words"]
    c.insert_many(
        [
            {"_id": 1, "w": "ping"},
            {"_id": 2, "w": "PING"},
            {"_id": 3, "w": "pïng"},
            {"_id": 4, "w": "apple"},
            {"_id": 5, "w": "Banana"},
            {"_id": 6, "w": 7},
        ]
    )
    return c


def ids(cursor) -> list:
    return [d["_id"] for d in cursor]


def test_equality_follows_strength(words) -> None:
    assert ids(words.find({"w": "Ping"})) == []
    assert ids(words.find({"w": "Ping"}, collation=CI)) == [1, 2]
    assert ids(words.find({"w": "Ping"}, collation=BASE)) == [1, 2, 3]
    assert ids(words.find({"w": {"$in": ["APPLE", "x"]}}, collation=CI)) == [4]
    assert words.count_documents({"w": {"$ne": "ping"}}, collation=CI) == 4


def test_sort_and_ranges_use_the_locale_order(words) -> None:
    # Binary order puts "Banana" before "apple"; English puts it after.
    assert ids(words.find({"_id": {"$in": [4, 5]}}).sort("w", ASCENDING)) == [5, 4]
    assert ids(words.find({"_id": {"$in": [4, 5]}}, collation=CI).sort("w", ASCENDING)) == [4, 5]
    assert ids(words.find({"w": {"$gt": "b"}, "_id": {"$lt": 6}}, collation=CI).sort("_id", 1)) == [
        1, 2, 3, 5,
    ]  # fmt: skip


def test_regex_ignores_the_collation(words) -> None:
    assert ids(words.find({"w": {"$regex": "^p"}}, collation=CI)) == [1, 3]


def test_writes_and_distinct_use_the_collation(words) -> None:
    assert (
        words.update_many({"w": "PING"}, {"$set": {"hit": True}}, collation=CI).modified_count == 2
    )
    assert words.delete_one({"w": "BANANA"}, collation=CI).deleted_count == 1
    assert sorted(map(str, words.distinct("w", collation=BASE))) in (
        ["7", "apple", "ping"],
        ["7", "apple", "PING"],
    )
    doc = words.find_one_and_update({"w": "APPLE"}, {"$set": {"n": 1}}, collation=CI)
    assert doc["_id"] == 4


def test_a_unique_index_with_a_collation_refuses_case_variants(db) -> None:
    c = db["users"]
    c.create_index("name", unique=True, collation=CI)
    c.insert_one({"name": "Ada"})
    with pytest.raises(DuplicateKeyError):
        c.insert_one({"name": "ADA"})
    c.insert_one({"name": "Bob"})
    spec = next(i for i in c.list_indexes() if i["name"] == "name_1")
    assert spec["collation"]["locale"] == "en_US" and spec["collation"]["strength"] == 2


@pytest.mark.embedded_only
def test_a_unique_index_with_a_collation_still_refuses_after_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Start-up rebuilds the duplicate check with the index's collation (it used the
    binary keys, so "ADA" was accepted next to "Ada" after a restart)."""
    from pymongo import MongoClient

    from accord.platform.embedded import EmbeddedServer

    server = EmbeddedServer(tmp_path / "db", port=0, sync=False).start()
    client: MongoClient = MongoClient(server.uri)
    client.t.users.create_index("name", unique=True, collation=CI)
    client.t.users.insert_one({"name": "Ada"})
    client.close()
    server.stop()
    server = EmbeddedServer(tmp_path / "db", port=0, sync=False).start()
    client = MongoClient(server.uri)
    try:
        with pytest.raises(DuplicateKeyError):
            client.t.users.insert_one({"name": "ADA"})
        client.t.users.insert_one({"name": "Bob"})
    finally:
        client.close()
        server.stop()


def test_a_collection_default_collation_applies_to_its_queries(db) -> None:
    c = db.create_collection("ci", collation=CI)
    c.insert_many([{"w": "x"}, {"w": "X"}])
    assert c.count_documents({"w": "x"}) == 2
    assert c.count_documents({"w": "x"}, collation=Collation(locale="simple")) == 1


@pytest.mark.parametrize(
    "collation",
    [
        {"locale": "fr"},
        {"locale": "en", "strength": 4},
        {"locale": "en", "numericOrdering": True},
        {"locale": "en", "caseFirst": "upper"},
        {"strength": 2},
    ],
)
def test_unsupported_collations_are_refused(words, collation: dict) -> None:
    with pytest.raises(OperationFailure):
        words.find_one({}, collation=collation)


# -- views ------------------------------------------------------------------------------


def test_a_view_reads_through_its_pipeline(db, words) -> None:
    db.create_collection(
        "strings", viewOn="words", pipeline=[{"$match": {"w": {"$type": "string"}}}]
    )
    db.create_collection(
        "upper", viewOn="strings", pipeline=[{"$project": {"u": {"$toUpper": "$w"}}}]
    )
    view = db["upper"]
    assert view.count_documents({}) == 5
    assert view.estimated_document_count() == 5
    assert ids(view.find({"u": "PING"}).sort("_id", 1)) == [1, 2]
    assert list(view.aggregate([{"$group": {"_id": None, "n": {"$sum": 1}}}])) == [
        {"_id": None, "n": 5}
    ]
    words.insert_one({"_id": 8, "w": "new"})  # a view always shows current data
    assert view.count_documents({}) == 6
    info = {c["name"]: c for c in db.list_collections()}
    assert info["upper"]["type"] == "view"
    assert info["upper"]["options"] == {
        "viewOn": "strings",
        "pipeline": [{"$project": {"u": {"$toUpper": "$w"}}}],
    }


def test_a_view_is_read_only(db, words) -> None:
    db.create_collection("v", viewOn="words", pipeline=[])
    view = db["v"]
    for write in (
        lambda: view.insert_one({"x": 1}),
        lambda: view.update_one({}, {"$set": {"x": 1}}),
        lambda: view.delete_many({}),
        lambda: view.create_index("w"),
        lambda: view.find_one_and_delete({}),
    ):
        with pytest.raises(OperationFailure) as info:
            write()
        assert info.value.code == 166
    view.drop()
    assert "v" not in db.list_collection_names()


def test_view_cycles_and_writing_stages_are_refused(db) -> None:
    db.create_collection("a", viewOn="b", pipeline=[])
    with pytest.raises(OperationFailure):
        db.create_collection("b", viewOn="a", pipeline=[])
    with pytest.raises(OperationFailure):
        db.create_collection("c", viewOn="x", pipeline=[{"$out": "y"}])


# -- $out / $merge ----------------------------------------------------------------------


def test_out_replaces_the_target_and_keeps_its_indexes(db, words) -> None:
    target = db["strings_out"]
    target.insert_one({"_id": 99, "stale": True})
    target.create_index("w", unique=True)
    result = list(
        words.aggregate([{"$match": {"w": {"$type": "string"}}}, {"$out": "strings_out"}])
    )
    assert result == []
    assert sorted(d["_id"] for d in target.find()) == [1, 2, 3, 4, 5]
    assert "w_1" in target.index_information()


def test_out_that_violates_the_target_index_leaves_it_unchanged(db) -> None:
    db["src"].insert_many([{"_id": 1, "k": 1}, {"_id": 2, "k": 1}])
    db["dst"].insert_one({"_id": 0, "k": 0})
    db["dst"].create_index("k", unique=True)
    with pytest.raises(OperationFailure) as info:
        list(db["src"].aggregate([{"$out": "dst"}]))
    assert info.value.code == 11000
    assert list(db["dst"].find()) == [{"_id": 0, "k": 0}]


def test_a_failed_out_leaves_no_target_behind(db) -> None:
    # mongod writes $out to a temporary collection and renames it at the end; before
    # 2026-12-07 the engine left the target it had created, empty.
    db["src"].insert_many([{"_id": 1, "k": 1}, {"_id": 2, "k": 1}])
    pipeline = [{"$project": {"_id": "$k"}}, {"$out": "fresh"}]
    with pytest.raises(OperationFailure) as info:
        list(db["src"].aggregate(pipeline))
    assert info.value.code == 11000
    assert "fresh" not in db.list_collection_names()
    list(db["src"].aggregate([{"$out": "fresh"}]))  # and the name is free for the next
    assert db["fresh"].count_documents({}) == 2


def test_merge_modes(db) -> None:
    db["src"].insert_many([{"_id": 1, "a": 10}, {"_id": 2, "a": 20}])
    db["dst"].insert_many([{"_id": 1, "a": 1, "b": 1}])
    list(db["src"].aggregate([{"$merge": {"into": "dst"}}]))  # merge + insert
    assert list(db["dst"].find().sort("_id", 1)) == [
        {"_id": 1, "a": 10, "b": 1},
        {"_id": 2, "a": 20},
    ]
    list(db["src"].aggregate([{"$merge": {"into": "dst", "whenMatched": "replace"}}]))
    assert db["dst"].find_one({"_id": 1}) == {"_id": 1, "a": 10}
    pipeline = [{"$set": {"a": {"$add": ["$a", "$$new.a"]}}}]
    list(db["src"].aggregate([{"$merge": {"into": "dst", "whenMatched": pipeline}}]))
    assert db["dst"].find_one({"_id": 2}) == {"_id": 2, "a": 40}
    list(db["src"].aggregate([{"$merge": {"into": "dst", "whenMatched": "keepExisting"}}]))
    assert db["dst"].find_one({"_id": 2}) == {"_id": 2, "a": 40}


def test_merge_failures_are_atomic(db) -> None:
    db["src"].insert_many([{"_id": 1}, {"_id": 2}])
    db["dst"].insert_one({"_id": 2, "old": True})
    with pytest.raises(OperationFailure) as info:
        list(db["src"].aggregate([{"$merge": {"into": "dst", "whenMatched": "fail"}}]))
    assert info.value.code == 11000 and "keyPattern" in info.value.details
    with pytest.raises(OperationFailure) as info:
        list(db["src"].aggregate([{"$merge": {"into": "dst", "whenNotMatched": "fail"}}]))
    assert info.value.code == 13113
    assert list(db["dst"].find()) == [{"_id": 2, "old": True}]


def test_merge_on_other_fields_needs_a_unique_index(db) -> None:
    db["src"].insert_one({"k": 1, "v": 2})
    with pytest.raises(OperationFailure):
        list(db["src"].aggregate([{"$merge": {"into": "dst", "on": "k"}}]))
    db["dst"].create_index("k", unique=True)
    db["dst"].insert_one({"k": 1, "v": 1})
    list(db["src"].aggregate([{"$project": {"_id": 0}}, {"$merge": {"into": "dst", "on": "k"}}]))
    assert db["dst"].find_one({"k": 1}, {"_id": 0}) == {"k": 1, "v": 2}


def test_out_must_be_last_and_not_in_a_transaction(client, db) -> None:
    db["src"].insert_one({"_id": 1})
    with pytest.raises(OperationFailure):
        list(db["src"].aggregate([{"$out": "x"}, {"$match": {}}]))
    with client.start_session() as session, session.start_transaction():
        with pytest.raises(OperationFailure):
            list(db["src"].aggregate([{"$out": "x"}], session=session))
        session.abort_transaction()


# -- collection layouts, validate, returnKey --------------------------------------------------


def test_clustered_collections_report_their_index(db) -> None:
    db.create_collection("cl", clusteredIndex={"key": {"_id": 1}, "unique": True, "name": "by id"})
    db["cl"].insert_one({"_id": 1})
    (index,) = list(db["cl"].list_indexes())
    assert index["name"] == "by id" and index["clustered"] is True and index["unique"] is True
    (info,) = list(db.list_collections(filter={"name": "cl"}))
    assert info["options"]["clusteredIndex"]["name"] == "by id" and "idIndex" not in info
    with pytest.raises(OperationFailure):
        db.create_collection("cl2", clusteredIndex={"key": {"a": 1}, "unique": True})


def test_time_series_collections_need_their_time_field(db) -> None:
    import datetime as dt

    c = db.create_collection(
        "ts", timeseries={"timeField": "t", "metaField": "m", "granularity": "minutes"}
    )
    c.insert_one({"t": dt.datetime(2024, 1, 1), "m": {"sensor": 1}, "v": 2})
    with pytest.raises(OperationFailure):
        c.insert_one({"m": 1, "v": 3})  # no time field
    (info,) = list(db.list_collections(filter={"name": "ts"}))
    assert info["type"] == "timeseries"
    assert info["options"]["timeseries"]["bucketMaxSpanSeconds"] == 86400
    for bad in (
        {"metaField": "m"},
        {"timeField": "t", "granularity": "days"},
        {"timeField": "t", "bucketMaxSpanSeconds": 10, "bucketRoundingSeconds": 20},
    ):
        with pytest.raises(OperationFailure):
            db.create_collection("bad_ts", timeseries=bad)


def test_collection_expiry_keys_on_the_time_field(db) -> None:
    db.create_collection("exp", timeseries={"timeField": "t"}, expireAfterSeconds=60)
    assert [i["key"] for i in db["exp"].list_indexes()][-1] == {"t": 1}
    with pytest.raises(OperationFailure):
        db.create_collection("plain_exp", expireAfterSeconds=60)


def test_validate_checks_documents_and_indexes(db) -> None:
    c = db["val"]
    c.create_index("a", unique=True)
    c.insert_many([{"a": i} for i in range(5)])
    result = db.validate_collection("val")
    assert result["valid"] is True and result["nrecords"] == 5
    assert result["keysPerIndex"]["a_1"] == 5
    with pytest.raises(OperationFailure):
        db.validate_collection("missing")


def test_return_key_and_show_record_id(db) -> None:
    c = db["rk"]
    c.insert_many([{"_id": i, "x": i * 10} for i in range(3)])
    keys = list(c.find({}, sort=[("_id", 1)], return_key=True))
    assert keys == [{"_id": 0}, {"_id": 1}, {"_id": 2}]
    assert list(c.find({"x": 10}, return_key=True)) == [{}]  # a collection scan has no key
    shown = list(c.find({"_id": 1}, show_record_id=True))
    assert shown[0]["x"] == 10 and "$recordId" in shown[0]
