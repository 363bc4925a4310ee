"""The query planner: which index serves a query (``explain``), and that every plan
returns exactly what a collection scan returns.

The plan assertions read ``explain`` output, so they are embedded-only (a real mongod
may rank plans differently); the result-equality properties run anywhere.
"""

from __future__ import annotations

import random
import re
from typing import Any

import pytest
from bson.max_key import MaxKey
from bson.min_key import MinKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import ASCENDING, DESCENDING, MongoClient
from pymongo.errors import OperationFailure

from accord.platform.embedded import planner
from accord.platform.embedded.bsonkey import sort_key
from accord.platform.embedded.engine import Collection

embedded_only = pytest.mark.embedded_only


def _stage(plan: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The first stage called ``name`` in a winning plan tree."""
    if plan.get("stage") == name:
        return plan
    for child in [plan.get("inputStage")] + list(plan.get("inputStages", [])):
        if isinstance(child, dict):
            found = _stage(child, name)
            if found is not None:
                return found
    return None


def _explain(cursor) -> tuple[dict[str, Any], dict[str, Any]]:  # type: ignore[no-untyped-def]
    out = cursor.explain()
    return out["queryPlanner"]["winningPlan"], out["executionStats"]


@pytest.fixture()
def checkpoints(db):  # type: ignore[no-untyped-def]
    coll = db.checkpoints
    coll.create_index(
        [("thread_id", ASCENDING), ("checkpoint_ns", ASCENDING), ("checkpoint_id", DESCENDING)],
        name="thread_ns_checkpoint",
        unique=True,
    )
    coll.create_index("key", name="key")
    coll.insert_many(
        [
            {
                "thread_id": f"t{i % 20}",
                "checkpoint_ns": "",
                "checkpoint_id": f"{i:06d}",
                "key": i,
                "n": i % 7,
            }
            for i in range(2000)
        ]
    )
    return coll


@embedded_only
def test_latest_in_group_reads_one_key(checkpoints) -> None:  # type: ignore[no-untyped-def]
    cursor = (
        checkpoints.find({"thread_id": "t3", "checkpoint_ns": ""})
        .sort("checkpoint_id", -1)
        .limit(1)
    )
    plan, stats = _explain(cursor)
    ixscan = _stage(plan, "IXSCAN")
    assert ixscan is not None and ixscan["indexName"] == "thread_ns_checkpoint"
    assert _stage(plan, "SORT") is None  # the index provides the order
    assert stats["totalKeysExamined"] == 1 and stats["nReturned"] == 1
    assert next(cursor.clone())["checkpoint_id"] == "001983"


@embedded_only
def test_backward_scan_for_the_opposite_order(checkpoints) -> None:  # type: ignore[no-untyped-def]
    cursor = (
        checkpoints.find({"thread_id": "t3", "checkpoint_ns": ""}).sort("checkpoint_id", 1).limit(2)
    )
    plan, stats = _explain(cursor)
    assert _stage(plan, "IXSCAN")["direction"] == "backward"  # type: ignore[index]
    assert stats["totalKeysExamined"] == 2
    assert [d["checkpoint_id"] for d in cursor.clone()] == ["000003", "000023"]


@embedded_only
def test_every_direction_combination_walks_the_index(db) -> None:  # type: ignore[no-untyped-def]
    db.c.create_index([("a", 1), ("b", -1)])
    db.c.insert_many([{"a": i % 3, "b": i % 7, "n": i} for i in range(60)])
    plan, _ = _explain(db.c.find().sort([("a", -1), ("b", 1)]))
    assert _stage(plan, "IXSCAN")["direction"] == "backward"  # type: ignore[index]
    for da in (1, -1):
        for db_ in (1, -1):
            cursor = db.c.find().sort([("a", da), ("b", db_)])
            plan, stats = _explain(cursor.clone())
            assert _stage(plan, "SORT") is None, (da, db_)
            assert stats["totalKeysExamined"] == 60
            got = [(d["a"], d["b"]) for d in cursor]
            assert got == sorted(got, key=lambda ab: (da * ab[0], db_ * ab[1])), (da, db_)
    limited = db.c.find({"a": 1}).sort("b", 1).limit(2)
    plan, stats = _explain(limited.clone())
    assert _stage(plan, "SORT") is None and stats["totalKeysExamined"] == 2
    assert [d["b"] for d in limited] == [0, 0]


@embedded_only
def test_in_is_a_set_of_point_ranges(checkpoints) -> None:  # type: ignore[no-untyped-def]
    keys = list(range(0, 2000, 5))
    plan, stats = _explain(checkpoints.find({"key": {"$in": keys}}))
    assert _stage(plan, "IXSCAN")["indexName"] == "key"  # type: ignore[index]
    assert stats["totalKeysExamined"] == len(keys) == stats["nReturned"]


@embedded_only
def test_ranges_and_compound_prefix(checkpoints) -> None:  # type: ignore[no-untyped-def]
    plan, stats = _explain(checkpoints.find({"key": {"$gte": 100, "$lt": 150}}))
    assert _stage(plan, "IXSCAN")["indexName"] == "key"  # type: ignore[index]
    assert stats["totalKeysExamined"] == 50 == stats["nReturned"]
    cursor = checkpoints.find(
        {"thread_id": "t1", "checkpoint_ns": "", "checkpoint_id": {"$gt": "001900"}}
    )
    plan, stats = _explain(cursor)
    assert _stage(plan, "IXSCAN")["indexName"] == "thread_ns_checkpoint"  # type: ignore[index]
    assert stats["totalKeysExamined"] == stats["nReturned"] == 5


@embedded_only
def test_or_is_a_union_of_index_plans(checkpoints) -> None:  # type: ignore[no-untyped-def]
    q = {"$or": [{"key": 7}, {"thread_id": "t5", "checkpoint_ns": "", "checkpoint_id": "001985"}]}
    plan, stats = _explain(checkpoints.find(q))
    or_stage = _stage(plan, "OR")
    assert or_stage is not None and len(or_stage["inputStages"]) == 2
    assert stats["totalKeysExamined"] == 2
    assert sorted(d["key"] for d in checkpoints.find(q)) == [7, 1985]


@embedded_only
def test_unindexed_or_clause_scans(checkpoints) -> None:  # type: ignore[no-untyped-def]
    plan, _ = _explain(checkpoints.find({"$or": [{"key": 7}, {"n": 3}]}))
    assert _stage(plan, "COLLSCAN") is not None


@embedded_only
def test_hint_forces_an_index(checkpoints) -> None:  # type: ignore[no-untyped-def]
    plan, _ = _explain(checkpoints.find({"n": 3}).hint("key"))
    assert _stage(plan, "IXSCAN")["indexName"] == "key"  # type: ignore[index]
    assert checkpoints.count_documents({"n": 3}, hint="key") == checkpoints.count_documents(
        {"n": 3}
    )
    with pytest.raises(OperationFailure):
        list(checkpoints.find({"n": 3}).hint("nope"))


@embedded_only
def test_selective_filter_beats_a_sort_only_index(db) -> None:  # type: ignore[no-untyped-def]
    db.c.create_index("ts")
    db.c.create_index("owner")
    db.c.insert_many([{"owner": i % 500, "ts": i} for i in range(5000)])
    plan, stats = _explain(db.c.find({"owner": 7}).sort("ts", -1).limit(3))
    assert _stage(plan, "IXSCAN")["indexName"] == "owner_1"  # type: ignore[index]
    assert stats["totalKeysExamined"] == 10


@embedded_only
def test_aggregate_leading_match_sort_limit_use_the_index(checkpoints) -> None:  # type: ignore[no-untyped-def]
    pipeline = [
        {"$match": {"thread_id": "t3", "checkpoint_ns": ""}},
        {"$sort": {"checkpoint_id": -1}},
        {"$limit": 2},
        {"$project": {"_id": 0, "checkpoint_id": 1}},
    ]
    assert list(checkpoints.aggregate(pipeline)) == [
        {"checkpoint_id": "001983"},
        {"checkpoint_id": "001963"},
    ]
    out = checkpoints.database.command(
        "explain",
        {"aggregate": "checkpoints", "pipeline": pipeline, "cursor": {}},
        verbosity="executionStats",
    )
    assert out["executionStats"]["totalKeysExamined"] == 2


@embedded_only
def test_index_serves_snapshots_and_own_writes(client: MongoClient, db) -> None:  # type: ignore[no-untyped-def]
    db.c.create_index([("g", 1), ("v", -1)])
    db.c.insert_many([{"_id": i, "g": i % 2, "v": i} for i in range(10)])
    with client.start_session() as s:
        s.start_transaction()
        assert db.c.find_one({"g": 0}, sort=[("v", -1)], session=s)["_id"] == 8
        db.c.update_one({"_id": 8}, {"$set": {"v": -1}})  # committed after the snapshot
        db.c.insert_one({"_id": 100, "g": 0, "v": 100})
        assert db.c.find_one({"g": 0}, sort=[("v", -1)], session=s)["_id"] == 8
        db.c.insert_one({"_id": 50, "g": 0, "v": 50}, session=s)
        db.c.update_one({"_id": 6}, {"$set": {"v": 60}}, session=s)
        got = [d["_id"] for d in db.c.find({"g": 0}, session=s).sort("v", -1).limit(3)]
        assert got == [6, 50, 8]
        s.abort_transaction()
    assert [d["_id"] for d in db.c.find({"g": 0}).sort("v", -1).limit(3)] == [100, 6, 4]


# -- every plan returns what a collection scan returns ---------------------------------------

FIELD_VALUES = st.one_of(
    st.integers(-2, 4),
    st.sampled_from([1.5, "x", "y", "", None, True, [1, 3], [], {"x": 1}, [{"x": 2}, {"x": 1}]]),
)
DOC = st.fixed_dictionaries(
    {"b": st.integers(0, 3), "c": st.sampled_from(["p", "q", "r"])},
    optional={"a": FIELD_VALUES, "d": st.integers(0, 5)},
)
SCALAR = st.one_of(st.integers(-2, 4), st.sampled_from([1.5, "x", "", None, True]))


def _cond() -> st.SearchStrategy[Any]:
    return st.one_of(
        SCALAR,
        SCALAR.map(lambda v: {"$eq": v}),
        st.lists(SCALAR, max_size=4).map(lambda vs: {"$in": vs}),
        st.tuples(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), SCALAR).map(
            lambda t: {t[0]: t[1]}
        ),
        st.tuples(st.integers(-1, 2), st.integers(1, 4)).map(lambda t: {"$gt": t[0], "$lt": t[1]}),
        SCALAR.map(lambda v: {"$ne": v}),
        st.booleans().map(lambda b: {"$exists": b}),
    )


CLAUSE = st.dictionaries(st.sampled_from(["a", "b", "c", "d", "a.x", "_id"]), _cond(), max_size=3)
FILTER = st.one_of(
    CLAUSE,
    st.tuples(CLAUSE, st.lists(CLAUSE, min_size=1, max_size=3)).map(
        lambda t: {**t[0], "$or": t[1]}
    ),
)
SORT = st.one_of(
    st.none(),
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d", "_id"]), st.sampled_from([1, -1])),
        min_size=1, max_size=2, unique_by=lambda t: t[0],
    ),
)  # fmt: skip


def _setup(db, docs: list[dict]) -> None:  # type: ignore[no-untyped-def]
    db.drop_collection("indexed")
    db.drop_collection("plain")
    db.indexed.create_index("a")
    db.indexed.create_index([("b", 1), ("c", -1)])
    db.indexed.create_index([("c", 1), ("a", 1), ("d", -1)])
    db.indexed.create_index("d", sparse=True, name="d_sparse")
    db.indexed.create_index("a.x")
    db.indexed.create_index([("b", -1)], partialFilterExpression={"c": "p"}, name="b_partial")
    with_ids = [{"_id": i, **d} for i, d in enumerate(docs)]
    if with_ids:
        db.indexed.insert_many(with_ids)
        db.plain.insert_many(with_ids)


def _keyed(doc: dict, sort: list[tuple[str, int]]) -> tuple:
    return tuple(sort_key(doc.get(f)) for f, _ in sort)


def _compare(db, filt: dict, sort, limit: int, session=None) -> None:  # type: ignore[no-untyped-def]
    def run(coll):  # type: ignore[no-untyped-def]
        cursor = coll.find(filt, session=session)
        if sort:
            cursor = cursor.sort(sort)
        if limit:
            cursor = cursor.limit(limit)
        return list(cursor)

    got, want = run(db.indexed), run(db.plain)
    if not sort:
        if limit:  # any `limit` of the matches will do
            everything = {d["_id"] for d in db.plain.find(filt, session=session)}
            assert {d["_id"] for d in got} <= everything, filt
            assert len(got) == len(want) == min(limit, len(everything)), filt
            return
        assert sorted(d["_id"] for d in got) == sorted(d["_id"] for d in want), filt
        return
    # Ties may come in any order: compare the sort keys in order, and the ids as sets
    # when nothing was cut off by the limit.
    assert [_sort_value(d, sort) for d in got] == [_sort_value(d, sort) for d in want], (filt, sort)
    if not limit or len(want) < limit:
        assert sorted(d["_id"] for d in got) == sorted(d["_id"] for d in want), (filt, sort)


def _sort_value(doc: dict, sort: list[tuple[str, int]]) -> list:
    from accord.platform.embedded import query

    return [repr(query.sort_value(doc, f, d)) for f, d in sort]


def test_null_on_a_dotted_path_through_a_scalar_agrees_with_a_scan(db) -> None:  # type: ignore[no-untyped-def]
    """``{a: 0}`` keys ``a.x`` as null in an index, but the matcher decides whether it
    matches ``{"a.x": null}``: a null point is never answered by the index alone (found
    by the property below)."""
    docs = [{"_id": 0, "a": 0}, {"_id": 1, "a": {"y": 1}}, {"_id": 2}, {"_id": 3, "a": "s"}]
    db.indexed.create_index("a.x")
    db.indexed.insert_many(docs)
    db.plain.insert_many(docs)
    for filt in ({"a.x": None}, {"a.x": {"$in": [None, 1]}}, {"a.x": {"$eq": None}}):
        got = sorted(d["_id"] for d in db.indexed.find(filt))
        assert got == sorted(d["_id"] for d in db.plain.find(filt)), filt


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(DOC, max_size=25),
    st.lists(st.tuples(FILTER, SORT, st.integers(0, 3)), min_size=1, max_size=6),
)
def test_every_plan_returns_what_a_scan_returns(db, docs, queries) -> None:  # type: ignore[no-untyped-def]
    _setup(db, docs)
    for filt, sort, limit in queries:
        _compare(db, filt, sort, limit)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(DOC, min_size=1, max_size=20),
    st.lists(DOC, max_size=4),
    st.lists(st.tuples(FILTER, SORT, st.integers(0, 3)), min_size=1, max_size=4),
    st.randoms(use_true_random=False),
)
def test_plans_agree_inside_transactions_across_versions(
    client, db, docs, mine, queries, rng
) -> None:  # type: ignore[no-untyped-def]
    """Snapshot reads see old versions while newer ones are committed outside, and see
    the transaction's own inserts and updates, through every index."""
    _setup(db, docs)
    with client.start_session() as s:
        s.start_transaction()
        for coll in (db.indexed, db.plain):
            coll.find_one({}, session=s)  # take the snapshot
        odd = [i for i in range(len(docs)) if i % 2]
        for _ in range(3 if odd else 0):  # committed after the snapshot: must stay invisible
            i = rng.choice(odd)
            change = {"$set": {"a": rng.choice([0, 3, "x", [2, 9]]), "b": rng.randrange(4)}}
            db.indexed.update_one({"_id": i}, change)
            db.plain.update_one({"_id": i}, change)
        for j, doc in enumerate(mine):
            for coll in (db.indexed, db.plain):
                coll.insert_one({"_id": 1000 + j, **doc}, session=s)
        even = [i for i in range(len(docs)) if i % 2 == 0]  # the transaction writes these
        i = rng.choice(even)
        for coll in (db.indexed, db.plain):
            coll.update_one({"_id": i}, {"$set": {"c": "q", "d": 4, "a": 2}}, session=s)
            if len(even) > 1:
                coll.delete_one({"_id": next(j for j in even if j != i)}, session=s)
        for filt, sort, limit in queries:
            _compare(db, filt, sort, limit, session=s)
        s.abort_transaction()


def test_large_in_agrees_with_scan(db) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(3)
    db.indexed.create_index("k")
    docs = [
        {"_id": i, "k": rng.randrange(3000), "tags": [rng.randrange(50) for _ in range(3)]}
        for i in range(3000)
    ]
    db.indexed.insert_many(docs)
    db.plain.insert_many(docs)
    wanted = rng.sample(range(4000), 400)
    for q in ({"k": {"$in": wanted}}, {"tags": {"$in": wanted[:20]}}, {"k": {"$nin": wanted}}):
        got = sorted(d["_id"] for d in db.indexed.find(q))
        assert got == sorted(d["_id"] for d in db.plain.find(q))


_SCALARS = [-2, -1, 0, 1, 2, 3, 4, 1.5, "x", "y", "", None, True]
_FIELD_VALUES = _SCALARS + [[1, 3], [], {"x": 1}, [{"x": 2}, {"x": 1}]]


def _random_doc(rng: random.Random) -> dict:
    doc: dict = {"b": rng.randrange(4), "c": rng.choice("pqr")}
    if rng.random() < 0.8:
        doc["a"] = rng.choice(_FIELD_VALUES)
    if rng.random() < 0.6:
        doc["d"] = rng.randrange(6)
    return doc


def _random_cond(rng: random.Random) -> Any:
    kind = rng.randrange(7)
    v = rng.choice(_SCALARS)
    if kind == 0:
        return v
    if kind == 1:
        return {"$in": rng.sample(_SCALARS, rng.randrange(1, 5))}
    if kind == 2:
        return {rng.choice(["$gt", "$gte", "$lt", "$lte"]): v}
    if kind == 3:
        return {"$gt": rng.randrange(-1, 3), "$lt": rng.randrange(1, 5)}
    if kind == 4:
        return {"$ne": v}
    if kind == 5:
        return {"$exists": rng.random() < 0.5}
    return {"$eq": v}


def _random_clause(rng: random.Random) -> dict:
    fields = rng.sample(["a", "b", "c", "d", "a.x", "_id"], rng.randrange(1, 4))
    return {f: _random_cond(rng) for f in fields}


@embedded_only
def test_random_queries_use_indexes_and_agree(db) -> None:  # type: ignore[no-untyped-def]
    """Deterministic companion of the property tests: the generated queries really do
    go through index and $or plans (not only collection scans), and agree with scans."""
    rng = random.Random(11)
    _setup(db, [_random_doc(rng) for _ in range(60)])
    stages: dict[str, int] = {}
    for _ in range(200):
        filt = _random_clause(rng)
        if rng.random() < 0.3:
            filt["$or"] = [_random_clause(rng) for _ in range(rng.randrange(1, 4))]
        sort = None
        if rng.random() < 0.5:
            fields = rng.sample(["a", "b", "c", "d", "_id"], rng.randrange(1, 3))
            sort = [(f, rng.choice([1, -1])) for f in fields]
        limit = rng.randrange(4)
        _compare(db, filt, sort, limit)
        cursor = db.indexed.find(filt)
        if sort:
            cursor = cursor.sort(sort)
        plan = cursor.explain()["queryPlanner"]["winningPlan"]
        for name in ("IXSCAN", "OR", "COLLSCAN", "IDHACK"):
            if _stage(plan, name) is not None:
                stages[name] = stages.get(name, 0) + 1
    assert stages.get("IXSCAN", 0) >= 40, stages
    assert stages.get("OR", 0) >= 3, stages


ID_VALUES = st.one_of(
    SCALAR,
    st.lists(SCALAR, max_size=2),
    st.dictionaries(st.sampled_from(["x", "$eq", "$in", "$gt"]), SCALAR, max_size=2),
    st.just(MinKey()),
    st.just(MaxKey()),
    st.just(re.compile("^a")),
)


@settings(max_examples=300, deadline=None)
@given(
    id_value=ID_VALUES,
    others=st.dictionaries(st.sampled_from(["a", "b", "$comment", "$and"]), SCALAR, max_size=2),
    id_first=st.booleans(),
)
def test_the_id_lookup_shortcut_plans_what_the_general_planner_plans(
    id_value: Any, others: dict[str, Any], id_first: bool
) -> None:
    """A filter with a plain ``_id`` equality is planned without building its
    conjunction; the plan must be the general planner's (which sees the same conditions
    through a ``$and``, where the shortcut does not apply)."""
    others = {k: ([{"a": v}] if k == "$and" else v) for k, v in others.items()}
    filt = {"_id": id_value, **others} if id_first else {**others, "_id": id_value}
    coll = Collection("db.c", {})
    try:
        general = planner.plan(coll, planner.Query({"$and": [filt]}))
    except Exception as exc:  # an invalid filter fails either way
        with pytest.raises(type(exc)):
            planner.plan(coll, planner.Query(filt))
        return
    got = planner.plan(coll, planner.Query(filt))
    assert (got.kind, got.ids, got.exact, got.keys) == (
        general.kind, general.ids, general.exact, general.keys,
    )  # fmt: skip


def test_explain_of_a_collection_that_does_not_exist_or_of_a_view(db) -> None:  # type: ignore[no-untyped-def]
    """Both were an InternalError (an assertion in the plan's description)."""
    plan, stats = _explain(db.no_such_collection.find({"a": 1}))
    assert plan["stage"] == "EOF" and stats["nReturned"] == 0
    db.create_collection("source")
    db.source.insert_one({"a": 1})
    db.command({"create": "a_view", "viewOn": "source", "pipeline": []})
    assert "queryPlanner" in db.a_view.find({"a": 1}).explain()
