"""Queries answered through index lookups return exactly what a collection scan returns.

The embedded engine answers equality and ``$in`` filters on indexed fields (and on
``_id``) from lookup maps; these tests pin that such queries agree with the same query
on an unindexed twin collection, inside and outside transactions, across updates that
move documents between keys. Against a real MongoDB they check the same contract.
"""

from __future__ import annotations

import random

from pymongo import MongoClient


def _ids(cursor) -> list:  # type: ignore[no-untyped-def]
    return sorted(d["_id"] for d in cursor)


def test_indexed_and_unindexed_queries_agree(db) -> None:
    rng = random.Random(5)
    db.indexed.create_index([("t", 1), ("k", 1)])
    db.indexed.create_index("tags")
    docs = [
        {"_id": i, "t": f"t{i % 7}", "k": i % 3, "tags": [f"g{i % 4}", f"g{i % 5}"], "n": i}
        for i in range(300)
    ]
    db.indexed.insert_many(docs)
    db.plain.insert_many(docs)
    for _ in range(60):
        i = rng.randrange(300)
        change = {"$set": {"t": f"t{rng.randrange(9)}", "k": rng.randrange(4)}}
        db.indexed.update_one({"_id": i}, change)
        db.plain.update_one({"_id": i}, change)
    queries = [
        {"t": "t3"},
        {"t": "t3", "k": 1},
        {"t": {"$in": ["t1", "t8", "nope"]}},
        {"tags": "g2"},
        {"tags": {"$in": ["g0", "g4"]}, "k": 2},
        {"_id": {"$in": [5, 6, 7, 999]}},
        {"_id": 42, "t": {"$ne": "zzz"}},
        {"t": "t3", "n": {"$gt": 100}},
    ]
    for q in queries:
        assert _ids(db.indexed.find(q)) == _ids(db.plain.find(q)), q


def test_lookup_respects_snapshots_and_own_writes(client: MongoClient, db) -> None:
    db.c.create_index("status")
    db.c.insert_many([{"_id": i, "status": "pending"} for i in range(10)])
    with client.start_session() as s:
        s.start_transaction()
        assert len(list(db.c.find({"status": "pending"}, session=s))) == 10  # snapshot taken
        db.c.update_one({"_id": 0}, {"$set": {"status": "done"}})  # committed outside
        # The snapshot still sees document 0 as pending, and not as done.
        assert _ids(db.c.find({"status": "pending"}, session=s)) == list(range(10))
        assert _ids(db.c.find({"status": "done"}, session=s)) == []
        db.c.update_one({"_id": 1}, {"$set": {"status": "mine"}}, session=s)
        db.c.insert_one({"_id": 100, "status": "mine"}, session=s)
        assert _ids(db.c.find({"status": "mine"}, session=s)) == [1, 100]
        assert _ids(db.c.find({"status": {"$in": ["mine", "done"]}}, session=s)) == [1, 100]
        s.abort_transaction()
    assert _ids(db.c.find({"status": "done"})) == [0]
    assert _ids(db.c.find({"status": "mine"})) == []
    assert _ids(db.c.find({"status": "pending"})) == list(range(1, 10))
