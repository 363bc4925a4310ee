"""BSON values as mongod sees them: type names, comparison order, equality, formatting.

Shared by the query, update and validation code: ``compare_values`` is mongod's
canonical BSON order (MinKey < null < numbers < strings < objects < arrays < binData <
ObjectId < bool < date < timestamp < regex < MaxKey), ``format_value`` prints values as
mongod's error messages do.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
import re
import uuid
from decimal import Decimal
from typing import Any

from bson.binary import Binary
from bson.code import Code
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from accord.platform.embedded.collation import CollatedStr

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "bson_type_name",
    "compare_values",
    "copy_value",
    "format_value",
    "is_number",
    "naive_utc",
    "to_decimal",
    "values_equal",
]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# Value types nothing in the engine changes in place: a copy may share them.
_IMMUTABLE: frozenset[type] = frozenset(
    {str, int, float, bool, type(None), bytes, Binary, Int64, ObjectId, dt.datetime,
     Decimal128, Timestamp, MinKey, MaxKey, uuid.UUID}
)  # fmt: skip


def copy_value(value: Any) -> Any:
    """A copy of a document or value that shares nothing mutable with it.

    Plain dicts and lists (what BSON decodes to) are copied level by level, immutable
    scalars are shared, anything else (``SON``, ``Regex``, ``Code`` with a scope, ...) goes
    through ``copy.deepcopy``. The same result as ``copy.deepcopy`` for a BSON document
    (which holds no cycles and no shared parts worth keeping), ten times faster.
    """
    t = type(value)
    if t is dict:
        return {k: v if type(v) in _IMMUTABLE else copy_value(v) for k, v in value.items()}
    if t is list:
        return [v if type(v) in _IMMUTABLE else copy_value(v) for v in value]
    if t in _IMMUTABLE:
        return value
    return copy.deepcopy(value)


def bson_type_name(value: Any) -> str:
    """The BSON type name mongod uses for ``value`` (``int``, ``long``, ``objectId`` ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Int64):
        return "long"
    if isinstance(value, int):
        return "int" if INT32_MIN <= value <= INT32_MAX else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, Decimal128):
        return "decimal"
    if isinstance(value, Code):  # a str subclass, so before str
        return "javascriptWithScope" if value.scope else "javascript"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict | DBRef):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, bytes | uuid.UUID):
        return "binData"
    if isinstance(value, ObjectId):
        return "objectId"
    if isinstance(value, dt.datetime):
        return "date"
    if isinstance(value, Timestamp):
        return "timestamp"
    if isinstance(value, re.Pattern | Regex):
        return "regex"
    if isinstance(value, MinKey):
        return "minKey"
    if isinstance(value, MaxKey):
        return "maxKey"
    return type(value).__name__


def is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal128) and not isinstance(value, bool)


def to_decimal(value: Any) -> Decimal:
    if isinstance(value, Decimal128):
        return value.to_decimal()
    if isinstance(value, float):
        return Decimal(repr(value)) if math.isfinite(value) else Decimal(str(value))
    return Decimal(int(value))


# Canonical type order of mongod's comparison (bsontypes.h canonicalizeBSONType).
def _type_rank(value: Any) -> int:
    if isinstance(value, MinKey):
        return -1
    if value is None:
        return 5
    if isinstance(value, bool):
        return 40
    if is_number(value):
        return 10
    if isinstance(value, Code):
        return 60
    if isinstance(value, str):
        return 15
    if isinstance(value, dict | DBRef):
        return 20
    if isinstance(value, list | tuple):
        return 25
    if isinstance(value, bytes | uuid.UUID):
        return 30
    if isinstance(value, ObjectId):
        return 35
    if isinstance(value, dt.datetime):
        return 45
    if isinstance(value, Timestamp):
        return 47
    if isinstance(value, re.Pattern | Regex):
        return 50
    if isinstance(value, MaxKey):
        return 127
    return 100


def _cmp(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


def _is_nan(value: Any) -> bool:
    if isinstance(value, Decimal128):
        return value.to_decimal().is_nan()
    return isinstance(value, float) and math.isnan(value)


def _cmp_numbers(a: Any, b: Any) -> int:
    a_nan, b_nan = _is_nan(a), _is_nan(b)
    if a_nan or b_nan:  # mongod orders NaN below every other number
        return _cmp(not a_nan, not b_nan)
    if isinstance(a, Decimal128) or isinstance(b, Decimal128):
        return _cmp(to_decimal(a), to_decimal(b))
    return _cmp(a, b)


def naive_utc(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is None:
        return value
    return value.astimezone(dt.UTC).replace(tzinfo=None)


def _bin_key(value: Any) -> tuple[int, int, bytes]:
    if isinstance(value, uuid.UUID):
        return (16, 4, value.bytes)
    subtype = value.subtype if isinstance(value, Binary) else 0
    return (len(value), subtype, bytes(value))


def compare_values(a: Any, b: Any, *, ignore_field_order: bool = False) -> int:
    """Compare two BSON values in mongod's sort order; returns -1, 0 or 1.

    Types are ordered first (MinKey < null < numbers < strings < objects < arrays <
    binData < ObjectId < bool < date < timestamp < regex < MaxKey); numbers of different
    types compare by value. Objects compare field by field, names included, so field
    order matters unless ``ignore_field_order`` (the order ``$jsonSchema``'s ``enum`` and
    ``uniqueItems`` use).
    """
    ra, rb = _type_rank(a), _type_rank(b)
    if ra != rb:
        return _cmp(ra, rb)
    if ra == 10:
        return _cmp_numbers(a, b)
    if ra in (-1, 5, 127):
        return 0
    if ra == 20:
        da = a.as_doc() if isinstance(a, DBRef) else a
        db = b.as_doc() if isinstance(b, DBRef) else b
        ia, ib = list(da.items()), list(db.items())
        if ignore_field_order:
            ia.sort(key=lambda kv: kv[0])
            ib.sort(key=lambda kv: kv[0])
        for (ka, va), (kb, vb) in zip(ia, ib, strict=False):
            c = _cmp(_type_rank(va), _type_rank(vb)) or _cmp(ka, kb)
            c = c or compare_values(va, vb, ignore_field_order=ignore_field_order)
            if c:
                return c
        return _cmp(len(ia), len(ib))
    if ra == 25:
        for va, vb in zip(a, b, strict=False):
            c = compare_values(va, vb, ignore_field_order=ignore_field_order)
            if c:
                return c
        return _cmp(len(a), len(b))
    if ra == 30:
        return _cmp(_bin_key(a), _bin_key(b))
    if ra == 35:
        return _cmp(a.binary, b.binary)
    if ra == 45:
        return _cmp(naive_utc(a), naive_utc(b))
    if ra == 47:
        return _cmp((a.time, a.inc), (b.time, b.inc))
    if ra == 50:
        return _cmp((a.pattern, str(a.flags)), (b.pattern, str(b.flags)))
    if ra in (15, 60):
        # A CollatedStr (a command's collation is active) compares by its collation key.
        ka = a.collation_key if isinstance(a, CollatedStr) else str(a)
        kb = b.collation_key if isinstance(b, CollatedStr) else str(b)
        return _cmp(ka, kb)
    try:
        return _cmp(a, b)
    except TypeError:
        return _cmp(repr(a), repr(b))


def values_equal(a: Any, b: Any, *, ignore_field_order: bool = False) -> bool:
    """BSON equality: ``1 == 1.0``, ``True != 1``, ``{a, b} != {b, a}`` (unless told)."""
    return compare_values(a, b, ignore_field_order=ignore_field_order) == 0


def format_value(value: Any) -> str:
    """Render a value the way mongod's error messages print BSON (``{ a: 1, b: "x" }``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.1f}" if value.is_integer() else repr(value)
    if isinstance(value, Decimal128):
        return f'NumberDecimal("{value}")'
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        if not value:
            return "[]"
        return "[ " + ", ".join(format_value(v) for v in value) + " ]"
    if isinstance(value, ObjectId):
        return f"ObjectId('{value}')"
    if isinstance(value, dt.datetime):
        epoch = dt.datetime(1970, 1, 1)
        millis = (naive_utc(value) - epoch) // dt.timedelta(milliseconds=1)
        return f"new Date({millis})"
    if isinstance(value, Timestamp):
        return f"Timestamp({value.time}, {value.inc})"
    if isinstance(value, re.Pattern | Regex):
        return f"/{value.pattern}/"
    if isinstance(value, Binary) and value.subtype == 4 and len(value) == 16:
        return f'UUID("{uuid.UUID(bytes=bytes(value))}")'
    if isinstance(value, bytes):
        subtype = value.subtype if isinstance(value, Binary) else 0
        return f"BinData({subtype}, {bytes(value).hex().upper()})"
    return repr(value)
