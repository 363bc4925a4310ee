"""Arithmetic expressions answer as mongod does: its result types, its infinities, its
error codes (before 2026-12-07 a string operand of ``$multiply`` was an internal error
with a traceback in the engine's log, ``$exp: [1]`` was refused, ``$exp: 1000`` failed,
``$ceil: 1.5`` was an int and ``$add: [true, 1]`` was 2)."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest
from bson import Decimal128, Int64
from pymongo.errors import OperationFailure


def _value(db, expr: Any, doc: dict[str, Any] | None = None) -> Any:
    (out,) = db.c.aggregate([{"$documents": [doc or {}]}, {"$project": {"_id": 0, "v": expr}}])
    return out.get("v", "missing")


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ({"$exp": [0]}, 1.0),
        ({"$exp": 1000}, math.inf),
        ({"$ceil": 1.5}, 2.0),
        ({"$floor": [-1.5]}, -2.0),
        ({"$trunc": 7}, 7),
        ({"$abs": -3}, 3),
        ({"$sqrt": 16}, 4.0),
        ({"$ln": 1}, 0.0),
        ({"$log10": 1000}, 3.0),
        ({"$log": [8, 2]}, 3.0),
        ({"$pow": [2, 10]}, 1024),
        ({"$pow": [2, -1]}, 0.5),
        ({"$pow": [10, 400]}, math.inf),
        ({"$mod": [-7, 3]}, -1),
        ({"$mod": [7.5, 2]}, 1.5),
        ({"$divide": [7, 2]}, 3.5),
        ({"$multiply": [2, 3, 4]}, 24),
        ({"$multiply": [Int64(2**62), 4]}, float(2**64)),
        ({"$subtract": [10, 4.5]}, 5.5),
        ({"$add": [1, 2.5]}, 3.5),
        ({"$add": [1, "$missing"]}, None),
        ({"$multiply": [None, "a"]}, None),
        ({"$divide": ["$missing", "a"]}, None),
        ({"$sqrt": None}, None),
    ],
)
def test_results(db, expr: Any, expected: Any) -> None:
    value = _value(db, expr)
    assert value == expected and type(value) is type(expected)


def test_decimal_operands_give_decimals(db) -> None:
    assert _value(db, {"$add": [Decimal128("1.1"), 2]}) == Decimal128("3.1")
    assert _value(db, {"$multiply": [Decimal128("1.25"), Decimal128("2")]}) == Decimal128("2.50")
    assert _value(db, {"$divide": [Decimal128("1"), 4]}) == Decimal128("0.25")
    assert _value(db, {"$abs": Decimal128("-2.5")}) == Decimal128("2.5")


def test_dates(db) -> None:
    t = dt.datetime(2026, 12, 7, 12, 0, 0)
    assert _value(db, {"$add": [t, 1000]}) == t + dt.timedelta(seconds=1)
    assert _value(db, {"$subtract": [t, 1000]}) == t - dt.timedelta(seconds=1)
    later = t + dt.timedelta(minutes=1)
    assert _value(db, {"$subtract": ["$b", "$a"]}, {"a": t, "b": later}) == 60_000


@pytest.mark.parametrize(
    ("expr", "code", "message"),
    [
        ({"$multiply": ["a", 2]}, 14, "$multiply only supports numeric types, not string"),
        ({"$multiply": [True, 2]}, 14, "$multiply only supports numeric types, not bool"),
        ({"$add": [True, 1]}, 14, "$add only supports numeric or date types, not bool"),
        ({"$divide": ["a", 2]}, 14, "$divide only supports numeric types, not string and int"),
        ({"$divide": [1, 0]}, 2, "can't $divide by zero"),
        ({"$mod": ["a", 2]}, 16611, "$mod only supports numeric types, not string and int"),
        ({"$mod": [1, 0]}, 16610, "can't $mod by zero"),
        ({"$pow": ["a", 2]}, 28762, "$pow's base must be numeric, not string"),
        ({"$pow": [2, "a"]}, 28763, "$pow's exponent must be numeric, not string"),
        ({"$pow": [0, -1]}, 28764, "$pow cannot take a base of 0 and a negative exponent"),
        ({"$abs": "a"}, 28765, "$abs only supports numeric types, not string"),
        ({"$exp": [[1]]}, 28765, "$exp only supports numeric types, not array"),
        ({"$sqrt": -1}, 28714, "$sqrt's argument must be greater than or equal to 0"),
        ({"$ln": 0}, 28766, "$ln's argument must be a positive number, but is 0"),
        ({"$log10": -1}, 28761, "$log10's argument must be a positive number, but is -1"),
        ({"$log": [8, 1]}, 28759, "$log's base must be a positive number not equal to 1"),
        ({"$exp": [1, 2]}, 16020, "Expression $exp takes exactly 1 arguments. 2 were passed in."),
        ({"$mod": [1]}, 16020, "Expression $mod takes exactly 2 arguments. 1 were passed in."),
        ({"$subtract": [1, "$t"]}, 14, "cant $subtract a date from a int"),
    ],
)
def test_errors(client, db, expr: Any, code: int, message: str) -> None:
    with pytest.raises(OperationFailure) as info:
        _value(db, expr, {"t": dt.datetime(2026, 12, 7)})
    assert info.value.code == code
    assert message in str(info.value)
    assert client.admin.command("ping")["ok"] == 1


def test_a_long_product_becomes_a_double_as_it_overflows(client, db) -> None:
    # 20,000 factors of 2**62: as one Python integer 1.6 s of the engine's CPU (100,000: 70 s)
    factors = [Int64(2**62)] * 20_000
    assert _value(db, {"$multiply": factors}) == math.inf
    assert _value(db, {"$multiply": [Int64(2**62), 4, 0.5]}) == float(2**63)
    assert client.admin.command("ping")["ok"] == 1
