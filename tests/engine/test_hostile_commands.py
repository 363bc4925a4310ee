"""Hostile commands sent through pymongo: each must get a clear error (never an internal
error, code 1), leave no half-applied write behind, and read nothing of another session.

Each case was found by attacking the engine as a hostile client: before its fix it
answered ``internal error: ...`` (ZeroDivisionError, OverflowError, ValueError,
AttributeError, TypeError), committed part of a failed statement, or let one session
page through another session's cursor (a transaction's uncommitted writes included).
"""

from __future__ import annotations

from typing import Any

import pytest
from bson import Int64
from pymongo import MongoClient
from pymongo.errors import OperationFailure

INTERNAL_ERROR = 1


def refused(db: Any, command: dict, **kwargs: Any) -> OperationFailure:
    """The error ``command`` gets; the engine stays up."""
    with pytest.raises(OperationFailure) as info:
        db.command(command, **kwargs)
    assert info.value.code != INTERNAL_ERROR, info.value.details
    assert "internal error" not in str(info.value)
    db.client.admin.command("ping")
    return info.value


# -- transactions ----------------------------------------------------------------------------


def _deep_expression(depth: int) -> Any:
    expr: Any = 1
    for _ in range(depth):
        expr = {"$add": [expr, 0]}
    return expr


@pytest.mark.embedded_only  # the depth at which mongod refuses an expression differs
def test_a_statement_failing_midway_aborts_its_transaction(client: MongoClient, db) -> None:
    """A multi-update whose third document fails (an expression too deep to evaluate) had
    already updated two: the error left the transaction open and its commit made those two
    updates durable. As in mongod, the failed statement aborts the transaction."""
    db.c.insert_many([{"_id": i, "a": i} for i in range(3)])
    expr = {"$cond": [{"$eq": ["$_id", 2]}, _deep_expression(400), "$a"]}
    with client.start_session() as session:
        session.start_transaction()
        with pytest.raises(OperationFailure) as info:
            db.c.update_many({}, [{"$set": {"z": expr}}], session=session)
        assert info.value.code != INTERNAL_ERROR
        with pytest.raises(OperationFailure) as commit:
            session.commit_transaction()
        assert commit.value.code == 251  # NoSuchTransaction: it was aborted
    assert list(db.c.find({"z": {"$exists": True}})) == []


# -- cursors belong to their session ----------------------------------------------------------


def test_get_more_in_another_session_isrefused(client: MongoClient, db) -> None:
    db.c.insert_many([{"_id": i} for i in range(5)])
    with client.start_session() as owner, client.start_session() as other:
        reply = db.command("find", "c", batchSize=1, session=owner)
        cursor_id = reply["cursor"]["id"]
        error = refused(db, {"getMore": cursor_id, "collection": "c"}, session=other)
        assert error.code == 50738
        # The owner still reads it.
        more = db.command({"getMore": cursor_id, "collection": "c"}, session=owner)
        assert [d["_id"] for d in more["cursor"]["nextBatch"]] == [1, 2, 3, 4]


def test_a_transactions_cursor_is_not_read_by_another_session(client: MongoClient, db) -> None:
    """A transaction's cursor sees its uncommitted writes: another session must not page
    through it."""
    db.c.insert_many([{"_id": i} for i in range(3)])
    with client.start_session() as owner, client.start_session() as other:
        owner.start_transaction()
        db.c.insert_one({"_id": "uncommitted"}, session=owner)
        reply = db.command("find", "c", batchSize=1, session=owner)
        cursor_id = reply["cursor"]["id"]
        error = refused(db, {"getMore": cursor_id, "collection": "c"}, session=other)
        assert error.code == 50738
        owner.abort_transaction()
    assert db.c.count_documents({}) == 3


@pytest.mark.parametrize("bad", ["x", 1.5, None, {"id": 1}])
def test_kill_cursors_with_ids_that_are_not_integers_isrefused(db, bad: Any) -> None:
    db.c.insert_one({"_id": 1})
    error = refused(db, {"killCursors": "c", "cursors": [bad]})
    assert error.code == 14  # TypeMismatch


# -- arithmetic in expressions and filters ---------------------------------------------------

BIG = Int64(2**63 - 1)


@pytest.mark.parametrize(
    "expression",
    [
        {"$divide": [1, 0]},
        {"$abs": Int64(-(2**63))},
        {"$log": [10, 1]},
        {"$toInt": "999999999999999999999"},
        {"$toInt": float("inf")},
    ],
    ids=["divide-by-zero", "abs-long-min", "log-base-1", "toInt-huge", "toInt-inf"],
)
def test_arithmetic_errors_in_expressions_are_clear_errors(db, expression: dict) -> None:
    db.c.insert_one({"_id": 1})
    refused(db, {"aggregate": "c", "pipeline": [{"$project": {"x": expression}}], "cursor": {}})
    refused(db, {"find": "c", "filter": {"$expr": {"$eq": [expression, 1]}}})
    refused(db, {"find": "c", "filter": {}, "let": {"v": expression}})
    with pytest.raises(OperationFailure) as info:
        db.c.update_one({"_id": 1}, [{"$set": {"x": expression}}])
    assert info.value.code != INTERNAL_ERROR
    assert db.c.find_one({"_id": 1}) == {"_id": 1}


def test_to_int_out_of_range_is_a_conversion_failure(db) -> None:
    db.c.insert_one({"_id": 1})
    pipeline = [{"$project": {"x": {"$toInt": "3000000000"}}}]
    error = refused(db, {"aggregate": "c", "pipeline": pipeline, "cursor": {}})
    assert error.code == 241  # ConversionFailure


def test_long_arithmetic_that_overflows_becomes_a_double(db) -> None:
    """mongod's long overflow in $multiply, $subtract and $sum gives a double, and a double
    past its range an infinity ($exp, $pow); here the Python int past 64 bits could not be
    encoded (internal error), in an update too."""
    db.c.insert_many([{"_id": 1, "big": BIG}, {"_id": 2, "big": BIG}])
    projected = db.c.aggregate(
        [
            {"$match": {"_id": 1}},
            {
                "$project": {
                    "mul": {"$multiply": ["$big", 2]},
                    "sub": {"$subtract": [Int64(-(2**63)), 1]},
                    "exp": {"$exp": 100000},
                    "pow": {"$pow": [10, 100000]},
                }
            },
        ]
    ).next()
    inf = float("inf")
    assert projected == {"_id": 1, "mul": 2.0**64, "sub": -(2.0**63), "exp": inf, "pow": inf}
    summed = db.c.aggregate([{"$group": {"_id": None, "s": {"$sum": "$big"}}}]).next()
    assert summed == {"_id": None, "s": 2.0 * (2**63 - 1)}
    db.c.update_one({"_id": 1}, [{"$set": {"z": {"$multiply": ["$big", 4]}}}])
    assert db.c.find_one({"_id": 1})["z"] == 4.0 * (2**63 - 1)


@pytest.mark.parametrize("divisor", [float("inf"), float("-inf"), float("nan"), 1e300])
def test_mod_with_a_divisor_no_integer_holds_isrefused(db, divisor: float) -> None:
    db.c.insert_one({"_id": 1, "a": 4})
    error = refused(db, {"find": "c", "filter": {"a": {"$mod": [divisor, 0]}}})
    assert error.code == 2  # BadValue, as mongod
    refused(db, {"find": "c", "filter": {"a": {"$mod": [2, divisor]}}})


def test_mod_skips_stored_infinities(db) -> None:
    db.c.insert_many([{"_id": 1, "a": float("inf")}, {"_id": 2, "a": 4}])
    assert [d["_id"] for d in db.c.find({"a": {"$mod": [2, 0]}})] == [2]


# -- stage arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["$limit", "$skip"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1.5])
def test_limit_and_skip_must_be_integers(db, stage: str, value: float) -> None:
    db.c.insert_one({"_id": 1})
    refused(db, {"aggregate": "c", "pipeline": [{stage: value}], "cursor": {}})


@pytest.mark.parametrize(
    "stage",
    [
        {"$documents": [1]},
        {"$documents": [None]},
        {"$documents": [[1]]},
        {"$lookup": {"from": "c", "let": 5, "pipeline": [], "as": "x"}},
        {"$lookup": {"from": "c", "localField": 5, "foreignField": "a", "as": "x"}},
        {"$lookup": {"from": "c", "localField": "a", "foreignField": {}, "as": "x"}},
        {"$unwind": {"path": "$arr", "includeArrayIndex": 5}},
        {"$unwind": {"path": "$arr", "includeArrayIndex": "$i"}},
        {"$unwind": {"path": "$arr", "preserveNullAndEmptyArrays": "yes"}},
        {"$unwind": {"path": "$arr", "bogus": 1}},
        {"$merge": {"into": "out", "whenMatched": [{"$set": {"z": 1}}], "let": 5}},
    ],
    ids=lambda stage: repr(stage)[:60],
)
def test_stage_arguments_of_the_wrong_type_arerefused(db, stage: dict) -> None:
    db.c.insert_one({"_id": 1, "a": 1, "arr": [1, 2]})
    refused(db, {"aggregate": "c", "pipeline": [stage], "cursor": {}})
    assert db.c.find_one({"_id": 1}) == {"_id": 1, "a": 1, "arr": [1, 2]}


@pytest.mark.parametrize("target_db", ["local", "config", "admin"])
def test_out_and_merge_to_internal_databases_arerefused(
    client: MongoClient, db, target_db: str
) -> None:
    db.c.insert_one({"_id": 1})
    out = {"$out": {"db": target_db, "coll": "hostile_out"}}
    error = refused(db, {"aggregate": "c", "pipeline": [out], "cursor": {}})
    assert error.code == 31321
    merge = {"$merge": {"into": {"db": target_db, "coll": "hostile_out"}}}
    error = refused(db, {"aggregate": "c", "pipeline": [merge], "cursor": {}})
    assert error.code == 31320
    assert "hostile_out" not in client[target_db].list_collection_names()
