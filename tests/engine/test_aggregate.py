"""Aggregation stages the platform relies on."""

from __future__ import annotations

import datetime as dt

import pytest
from pymongo.errors import OperationFailure


@pytest.fixture()
def sales(db):
    db.sales.insert_many(
        [
            {
                "_id": 1,
                "item": "apple",
                "qty": 5,
                "price": 2.0,
                "tags": ["fruit", "red"],
                "store": "A",
            },
            {"_id": 2, "item": "pear", "qty": 2, "price": 3.0, "tags": ["fruit"], "store": "B"},
            {"_id": 3, "item": "apple", "qty": 7, "price": 2.0, "tags": [], "store": "B"},
            {"_id": 4, "item": "kale", "qty": 1, "price": 4.5, "store": "A"},
            {
                "_id": 5,
                "item": "pear",
                "qty": 10,
                "price": 2.5,
                "tags": ["fruit", "green"],
                "store": "A",
            },
        ]
    )
    return db.sales


def test_match_sort_skip_limit(sales) -> None:
    out = list(
        sales.aggregate(
            [
                {"$match": {"qty": {"$gte": 2}}},
                {"$sort": {"qty": -1}},
                {"$skip": 1},
                {"$limit": 2},
            ]
        )
    )
    assert [d["_id"] for d in out] == [3, 1]


def test_match_later_in_pipeline_and_expr(sales) -> None:
    out = list(
        sales.aggregate(
            [
                {"$addFields": {"total": {"$multiply": ["$qty", "$price"]}}},
                {"$match": {"$expr": {"$gt": ["$total", 10]}}},
                {"$sort": {"_id": 1}},
            ]
        )
    )
    assert [(d["_id"], d["total"]) for d in out] == [(3, 14.0), (5, 25.0)]


def test_project_inclusion_exclusion_and_expressions(sales) -> None:
    out = list(
        sales.aggregate(
            [
                {"$match": {"_id": 1}},
                {
                    "$project": {
                        "_id": 0,
                        "item": 1,
                        "total": {"$multiply": ["$qty", "$price"]},
                        "upper": {"$toUpper": "$item"},
                        "n_tags": {"$size": "$tags"},
                    }
                },
            ]
        )
    )
    assert out == [{"item": "apple", "total": 10.0, "upper": "APPLE", "n_tags": 2}]
    out = list(sales.aggregate([{"$match": {"_id": 4}}, {"$project": {"price": 0, "store": 0}}]))
    assert out == [{"_id": 4, "item": "kale", "qty": 1}]


def test_add_fields_set_and_unset(sales) -> None:
    out = list(
        sales.aggregate(
            [
                {"$match": {"_id": 2}},
                {"$addFields": {"double": {"$multiply": ["$qty", 2]}, "meta.src": "x"}},
                {"$set": {"cheap": {"$lt": ["$price", 3.5]}}},
                {"$unset": ["tags", "store"]},
                {"$unset": "price"},
            ]
        )
    )
    assert out == [
        {"_id": 2, "item": "pear", "qty": 2, "double": 4, "meta": {"src": "x"}, "cheap": True}
    ]


def test_group_accumulators(sales) -> None:
    out = list(
        sales.aggregate(
            [
                {"$sort": {"_id": 1}},
                {
                    "$group": {
                        "_id": "$item",
                        "n": {"$sum": 1},
                        "qty": {"$sum": "$qty"},
                        "avg_price": {"$avg": "$price"},
                        "max_qty": {"$max": "$qty"},
                        "min_qty": {"$min": "$qty"},
                        "ids": {"$push": "$_id"},
                        "stores": {"$addToSet": "$store"},
                        "first": {"$first": "$_id"},
                        "last": {"$last": "$_id"},
                    }
                },
                {"$sort": {"_id": 1}},
            ]
        )
    )
    by_item = {d["_id"]: d for d in out}
    assert list(by_item) == ["apple", "kale", "pear"]
    apple = by_item["apple"]
    assert apple["n"] == 2 and apple["qty"] == 12 and apple["avg_price"] == 2.0
    assert apple["max_qty"] == 7 and apple["min_qty"] == 5
    assert apple["ids"] == [1, 3]
    assert sorted(apple["stores"]) == ["A", "B"]
    assert (apple["first"], apple["last"]) == (1, 3)
    assert by_item["pear"]["avg_price"] == 2.75


def test_group_null_id_and_compound_id(sales) -> None:
    (total,) = list(sales.aggregate([{"$group": {"_id": None, "qty": {"$sum": "$qty"}}}]))
    assert total == {"_id": None, "qty": 25}
    out = list(
        sales.aggregate(
            [
                {"$group": {"_id": {"store": "$store", "item": "$item"}, "qty": {"$sum": "$qty"}}},
                {"$sort": {"_id.store": 1, "_id.item": 1}},
            ]
        )
    )
    assert [(d["_id"]["store"], d["_id"]["item"], d["qty"]) for d in out] == [
        ("A", "apple", 5),
        ("A", "kale", 1),
        ("A", "pear", 10),
        ("B", "apple", 7),
        ("B", "pear", 2),
    ]


def test_group_accumulators_over_mixed_types(db) -> None:
    db.g.insert_many([{"v": 1}, {"v": "x"}, {"v": 2.5}, {}])
    (out,) = list(
        db.g.aggregate(
            [
                {
                    "$group": {
                        "_id": None,
                        "sum": {"$sum": "$v"},  # non-numbers are ignored
                        "avg": {"$avg": "$v"},
                        "max": {"$max": "$v"},  # BSON order: strings sort after numbers
                        "min": {"$min": "$v"},  # missing values are ignored
                    }
                }
            ]
        )
    )
    assert out == {"_id": None, "sum": 3.5, "avg": 1.75, "max": "x", "min": 1}


DAY = dt.datetime(2024, 1, 1)


@pytest.fixture()
def events(db):
    db.e.insert_many(
        [{"_id": 1, "v": "s", "at": DAY}, {"_id": 2, "v": 7, "at": DAY}, {"_id": 3, "at": DAY}]
    )
    return db.e


def _project(coll, spec: dict) -> list[dict]:
    return list(coll.aggregate([{"$project": spec}, {"$sort": {"_id": 1}}]))


def test_expression_type_if_null_cond(events) -> None:
    out = _project(
        events,
        {
            "type": {"$type": "$v"},
            "or_default": {"$ifNull": ["$v", "none"]},
            "is_str": {"$cond": [{"$eq": [{"$type": "$v"}, "string"]}, True, False]},
        },
    )
    assert [d["type"] for d in out] == ["string", "int", "missing"]
    assert [d["or_default"] for d in out] == ["s", 7, "none"]
    assert [d["is_str"] for d in out] == [True, False, False]


def test_expression_date_arithmetic(events) -> None:
    out = _project(events, {"later": {"$add": ["$at", 60_000]}})
    assert [d["later"] for d in out] == [DAY + dt.timedelta(minutes=1)] * 3


def test_expression_now_variable(events) -> None:
    out = _project(events, {"past": {"$lt": ["$at", "$$NOW"]}})
    assert [d["past"] for d in out] == [True, True, True]
    assert events.count_documents({"$expr": {"$lt": ["$at", "$$NOW"]}}) == 3


def test_count_stage(sales) -> None:
    assert list(sales.aggregate([{"$match": {"store": "A"}}, {"$count": "n"}])) == [{"n": 3}]
    # $count over no documents produces no document at all.
    assert list(sales.aggregate([{"$match": {"store": "Z"}}, {"$count": "n"}])) == []


def test_unwind(sales) -> None:
    out = list(sales.aggregate([{"$unwind": "$tags"}, {"$sort": {"_id": 1, "tags": 1}}]))
    assert [(d["_id"], d["tags"]) for d in out] == [
        (1, "fruit"),
        (1, "red"),
        (2, "fruit"),
        (5, "fruit"),
        (5, "green"),
    ]


def test_unwind_preserve_and_index(sales) -> None:
    out = list(
        sales.aggregate(
            [
                {
                    "$unwind": {
                        "path": "$tags",
                        "includeArrayIndex": "i",
                        "preserveNullAndEmptyArrays": True,
                    }
                },
                {"$sort": {"_id": 1, "i": 1}},
            ]
        )
    )
    assert [(d["_id"], d.get("tags"), d["i"]) for d in out] == [
        (1, "fruit", 0),
        (1, "red", 1),
        (2, "fruit", 0),
        (3, None, None),
        (4, None, None),
        (5, "fruit", 0),
        (5, "green", 1),
    ]


def test_lookup_local_foreign(db) -> None:
    db.users.insert_many([{"_id": "u1", "name": "ann"}, {"_id": "u2", "name": "bob"}])
    db.orders.insert_many(
        [
            {"_id": 1, "user": "u1", "amount": 5},
            {"_id": 2, "user": "u1", "amount": 7},
            {"_id": 3, "user": "u3", "amount": 1},
        ]
    )
    out = list(
        db.users.aggregate(
            [
                {
                    "$lookup": {
                        "from": "orders",
                        "localField": "_id",
                        "foreignField": "user",
                        "as": "orders",
                    }
                },
                {"$sort": {"_id": 1}},
            ]
        )
    )
    assert [(d["_id"], sorted(o["_id"] for o in d["orders"])) for d in out] == [
        ("u1", [1, 2]),
        ("u2", []),
    ]
    out = list(
        db.orders.aggregate(
            [
                {
                    "$lookup": {
                        "from": "users",
                        "localField": "user",
                        "foreignField": "_id",
                        "as": "u",
                    }
                },
                {"$project": {"names": "$u.name"}},
                {"$sort": {"_id": 1}},
            ]
        )
    )
    assert [d["names"] for d in out] == [["ann"], ["ann"], []]


def test_lookup_local_array_matches_any_element(db) -> None:
    db.tags.insert_many([{"_id": "t1", "label": "one"}, {"_id": "t2", "label": "two"}])
    db.posts.insert_one({"_id": 1, "tag_ids": ["t1", "t2", "t9"]})
    (post,) = list(
        db.posts.aggregate(
            [
                {
                    "$lookup": {
                        "from": "tags",
                        "localField": "tag_ids",
                        "foreignField": "_id",
                        "as": "tags",
                    }
                }
            ]
        )
    )
    assert sorted(t["label"] for t in post["tags"]) == ["one", "two"]


def test_lookup_pipeline_with_let(db) -> None:
    db.users.insert_many([{"_id": "u1", "min": 6}, {"_id": "u2", "min": 0}])
    db.orders.insert_many(
        [
            {"_id": 1, "user": "u1", "amount": 5},
            {"_id": 2, "user": "u1", "amount": 7},
            {"_id": 3, "user": "u2", "amount": 1},
        ]
    )
    out = list(
        db.users.aggregate(
            [
                {
                    "$lookup": {
                        "from": "orders",
                        "let": {"uid": "$_id", "min": "$min"},
                        "pipeline": [
                            {
                                "$match": {
                                    "$expr": {
                                        "$and": [
                                            {"$eq": ["$user", "$$uid"]},
                                            {"$gte": ["$amount", "$$min"]},
                                        ]
                                    }
                                }
                            },
                            {"$project": {"_id": 0, "amount": 1}},
                        ],
                        "as": "big",
                    }
                },
                {"$sort": {"_id": 1}},
            ]
        )
    )
    assert [(d["_id"], d["big"]) for d in out] == [("u1", [{"amount": 7}]), ("u2", [{"amount": 1}])]


def test_lookup_uncorrelated_pipeline(db) -> None:
    db.a.insert_many([{"_id": 1}, {"_id": 2}])
    db.b.insert_many([{"_id": 10, "v": 1}, {"_id": 11, "v": 2}])
    out = list(
        db.a.aggregate(
            [
                {"$lookup": {"from": "b", "pipeline": [{"$match": {"v": 2}}], "as": "bs"}},
                {"$sort": {"_id": 1}},
            ]
        )
    )
    assert out == [{"_id": 1, "bs": [{"_id": 11, "v": 2}]}, {"_id": 2, "bs": [{"_id": 11, "v": 2}]}]


def test_lookup_local_foreign_with_pipeline(db) -> None:
    db.a.insert_many([{"_id": 1, "k": "x"}, {"_id": 2, "k": "y"}])
    db.b.insert_many(
        [
            {"_id": 10, "k": "x", "v": 1},
            {"_id": 11, "k": "x", "v": 2},
            {"_id": 12, "k": "y", "v": 3},
        ]
    )
    out = list(
        db.a.aggregate(
            [
                {
                    "$lookup": {
                        "from": "b",
                        "localField": "k",
                        "foreignField": "k",
                        "pipeline": [
                            {"$match": {"v": {"$gte": 2}}},
                            {"$project": {"_id": 0, "v": 1}},
                        ],
                        "as": "bs",
                    }
                },
                {"$sort": {"_id": 1}},
            ]
        )
    )
    assert [d["bs"] for d in out] == [[{"v": 2}], [{"v": 3}]]


def test_facet(sales) -> None:
    (out,) = list(
        sales.aggregate(
            [
                {"$match": {"qty": {"$gt": 1}}},
                {
                    "$facet": {
                        "count": [{"$count": "n"}],
                        "top": [{"$sort": {"qty": -1}}, {"$limit": 2}, {"$project": {"_id": 1}}],
                        "by_store": [
                            {"$group": {"_id": "$store", "n": {"$sum": 1}}},
                            {"$sort": {"_id": 1}},
                        ],
                    }
                },
            ]
        )
    )
    assert out == {
        "count": [{"n": 4}],
        "top": [{"_id": 5}, {"_id": 3}],
        "by_store": [{"_id": "A", "n": 2}, {"_id": "B", "n": 2}],
    }


def test_replace_root_and_sort_by_nested(db) -> None:
    db.c.insert_many([{"_id": 1, "inner": {"k": 2}}, {"_id": 2, "inner": {"k": 1}}])
    out = list(db.c.aggregate([{"$replaceRoot": {"newRoot": "$inner"}}, {"$sort": {"k": 1}}]))
    assert out == [{"k": 1}, {"k": 2}]


def test_aggregate_on_missing_collection(db) -> None:
    assert list(db.nothing.aggregate([{"$match": {}}])) == []
    assert list(db.nothing.aggregate([{"$count": "n"}])) == []


def test_unknown_stage_is_an_error(sales) -> None:
    with pytest.raises(OperationFailure) as info:
        list(sales.aggregate([{"$noSuchStage": {}}]))
    assert info.value.code == 40324


def test_bad_match_in_pipeline_is_bad_value(sales) -> None:
    with pytest.raises(OperationFailure) as info:
        list(sales.aggregate([{"$match": {"qty": {"$foo": 1}}}]))
    assert info.value.code == 2


def test_aggregate_raw_command_with_cursor_batch(sales, db, client) -> None:
    with client.start_session() as session:
        reply = db.command(
            "aggregate",
            "sales",
            pipeline=[{"$sort": {"_id": 1}}],
            cursor={"batchSize": 2},
            session=session,
        )
        cursor_id = reply["cursor"]["id"]
        assert [d["_id"] for d in reply["cursor"]["firstBatch"]] == [1, 2]
        assert cursor_id != 0
        more = db.command("getMore", cursor_id, collection="sales", batchSize=2, session=session)
        assert [d["_id"] for d in more["cursor"]["nextBatch"]] == [3, 4]
        killed = db.command("killCursors", "sales", cursors=[cursor_id], session=session)
        assert killed["cursorsKilled"] == [cursor_id]
