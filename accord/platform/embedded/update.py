"""MongoDB update semantics as pure functions.

``apply_update`` computes the document an update produces, the way mongod's update
subsystem does: operator updates (``$set``, ``$inc``, ``$push`` ...), replacement
documents and pipeline-style updates, positional paths (``$``, ``$[]``, ``$[ident]``) and
mongod's validation, with its error codes and messages. ``upsert_seed`` builds the
document an upsert starts from.

The module also holds the BSON value helpers (comparison order, type names, shell-style
formatting) that the validator shares.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from functools import cmp_to_key
from typing import Any

from bson.binary import Binary
from bson.code import Code
from bson.dbref import DBRef
from bson.decimal128 import Decimal128, create_decimal128_context
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp
from mongomock import OperationFailure
from mongomock import aggregate as _mm_aggregate  # importing it also registers $expr support
from mongomock import filtering as _mm_filtering

from accord.platform.embedded.errors import EngineError

__all__ = [
    "apply_update",
    "bson_type_name",
    "compare_values",
    "format_value",
    "matches_filter",
    "upsert_seed",
    "values_equal",
]

_MISSING: Any = object()  # a path that leads nowhere (distinct from a stored null)

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_BACKFILL = 1_500_000  # mongod refuses to pad an array by more than this
_IDENT_RE = re.compile(r"[a-z][a-zA-Z0-9]*")
_NO_POSITIONAL_MATCH = "The positional operator did not find the match needed from the query."


# --------------------------------------------------------------------------------------
# BSON value helpers


def bson_type_name(value: Any) -> str:
    """The BSON type name mongod uses for ``value`` (``int``, ``long``, ``objectId`` ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Int64):
        return "long"
    if isinstance(value, int):
        return "int" if _INT32_MIN <= value <= _INT32_MAX else "long"
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


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal128) and not isinstance(value, bool)


def _to_decimal(value: Any) -> Decimal:
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
    if _is_number(value):
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
        return _cmp(_to_decimal(a), _to_decimal(b))
    return _cmp(a, b)


def _naive_utc(value: dt.datetime) -> dt.datetime:
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
        return _cmp(_naive_utc(a), _naive_utc(b))
    if ra == 47:
        return _cmp((a.time, a.inc), (b.time, b.inc))
    if ra == 50:
        return _cmp((a.pattern, str(a.flags)), (b.pattern, str(b.flags)))
    if ra in (15, 60):
        return _cmp(str(a), str(b))
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
        millis = (_naive_utc(value) - epoch) // dt.timedelta(milliseconds=1)
        return f"new Date({millis})"
    if isinstance(value, Timestamp):
        return f"Timestamp({value.time}, {value.inc})"
    if isinstance(value, re.Pattern | Regex):
        return f"/{value.pattern}/"
    if isinstance(value, bytes):
        subtype = value.subtype if isinstance(value, Binary) else 0
        return f"BinData({subtype}, {bytes(value).hex().upper()})"
    return repr(value)


def matches_filter(query: dict, doc: Any) -> bool:
    """Evaluate a query filter against a document with mongomock's matcher.

    Matcher errors (unknown operators, bad arguments) become ``EngineError(2)``.
    """
    try:
        return bool(_mm_filtering.filter_applies(query, doc))
    except OperationFailure as exc:
        raise EngineError(2, str(exc)) from exc
    except NotImplementedError as exc:
        raise EngineError(2, f"not supported by the embedded engine: {exc}") from exc


# --------------------------------------------------------------------------------------
# Paths


def _dotted(path: Sequence[str]) -> str:
    return ".".join(path)


def _array_index(part: str) -> int | None:
    return int(part) if part.isascii() and part.isdigit() else None


def _is_array_marker(part: str) -> bool:
    """``$[]`` or ``$[ident]``."""
    return len(part) >= 3 and part.startswith("$[") and part.endswith("]")


def _parse_path(field_name: str) -> tuple[str, ...]:
    """Split and check an update path the way mongod's field checker does."""
    if field_name == "":
        raise EngineError(56, "An empty update path is not valid.")
    parts = tuple(field_name.split("."))
    if any(p == "" for p in parts):
        raise EngineError(
            56,
            f"The update path '{field_name}' contains an empty field name, which is not allowed.",
        )
    positional = [i for i, p in enumerate(parts) if p == "$"]
    if len(positional) > 1:
        raise EngineError(
            2, f"Too many positional (i.e. '$') elements found in path '{field_name}'"
        )
    if positional and positional[0] == 0:
        raise EngineError(
            2,
            "Cannot have positional (i.e. '$') element in the first position in path "
            f"'{field_name}'",
        )
    if _is_array_marker(parts[0]):
        raise EngineError(
            2,
            "Cannot have array filter identifier (i.e. '$[<id>]') element in the first "
            f"position in path '{field_name}'",
        )
    for part in parts:
        if part.startswith("$") and part != "$" and not _is_array_marker(part):
            raise EngineError(
                52,
                f"The dollar ($) prefixed field '{part}' in '{field_name}' is not valid for storage.",
            )
    return parts


def _lookup(container: Any, key: Any) -> Any:
    if isinstance(container, dict):
        return container.get(key, _MISSING)
    if isinstance(container, list) and isinstance(key, int) and key < len(container):
        return container[key]
    return _MISSING


def _get_path(doc: Any, path: Sequence[str]) -> Any:
    """The value at a literal path (array indexes allowed), or ``_MISSING``."""
    cur = doc
    for part in path:
        if isinstance(cur, list):
            idx = _array_index(part)
            cur = _MISSING if idx is None else _lookup(cur, idx)
        else:
            cur = _lookup(cur, part)
        if cur is _MISSING:
            return _MISSING
    return cur


def _assign(container: Any, key: Any, value: Any) -> None:
    if isinstance(container, dict):
        container[key] = value
        return
    if key < len(container):
        container[key] = value
        return
    if key - len(container) > _MAX_BACKFILL:
        raise EngineError(2, f"can't backfill array to larger than {_MAX_BACKFILL} elements")
    container.extend([None] * (key - len(container)))  # mongod pads the gap with nulls
    container.append(value)


def _not_viable(part: str, parent_name: str, parent: Any) -> EngineError:
    return EngineError(
        28, f"Cannot create field '{part}' in element {{{parent_name}: {format_value(parent)}}}"
    )


def _locate(doc: dict, path: Sequence[str], *, create: bool) -> tuple[Any, Any] | None:
    """Find the container and key that ``path`` ends at.

    With ``create``, missing intermediate fields become subdocuments (mongod's
    path-creating behaviour) and a path through a scalar is a PathNotViable error;
    without it, such paths yield ``None``. List keys are returned as ints.
    """
    cur: Any = doc
    name = ""
    last = len(path) - 1
    for i, part in enumerate(path):
        key: Any
        if isinstance(cur, dict):
            key = part
        elif isinstance(cur, list):
            key = _array_index(part)
            if key is None:
                if create:
                    raise _not_viable(part, name, cur)
                return None
        else:
            if create:
                raise _not_viable(part, name, cur)
            return None
        if i == last:
            return cur, key
        nxt = _lookup(cur, key)
        if nxt is _MISSING:
            if not create:
                return None
            nxt = {}
            _assign(cur, key, nxt)
        cur, name = nxt, part
    raise AssertionError("empty update path")


def _locate_creating(doc: dict, path: Sequence[str]) -> tuple[Any, Any]:
    found = _locate(doc, path, create=True)
    assert found is not None  # creating lookups either find a slot or raise
    return found


# --------------------------------------------------------------------------------------
# Parsed modifiers


@dataclass
class _Push:
    values: list[Any]
    position: int | None = None
    slice: int | None = None
    sort: Any = None  # 1 / -1 or {field: 1 / -1}


@dataclass
class _Mod:
    op: str
    path: tuple[str, ...]
    arg: Any
    dest: tuple[str, ...] | None = None  # $rename's target


@dataclass
class _Ctx:
    is_insert: bool
    doc_id: Any
    _now: dt.datetime | None = None
    _timestamp: Timestamp | None = None

    def id_text(self) -> str:
        return "no id" if self.doc_id is _MISSING else f"_id: {format_value(self.doc_id)}"

    def current(self, kind: str) -> Any:
        """One clock reading per update, shared by all of its $currentDate fields."""
        if kind == "date":
            self._now = self._now or _now_millis()
            return self._now
        self._timestamp = self._timestamp or _next_timestamp()
        return self._timestamp


def _arg_text(field_name: str, arg: Any) -> str:
    return f"{field_name}: {format_value(arg)}"


def _integral(value: Any) -> int | None:
    """mongod's parseIntegerElementToLong: ints and whole doubles."""
    if isinstance(value, bool) or not _is_number(value):
        return None
    if isinstance(value, int):
        return int(value)
    number = float(_to_decimal(value)) if isinstance(value, Decimal128) else value
    return int(number) if math.isfinite(number) and number.is_integer() else None


def _parse_push(field_name: str, arg: Any) -> _Push:
    if not (isinstance(arg, dict) and "$each" in arg):
        return _Push(values=[arg])
    for clause in arg:
        if clause not in ("$each", "$slice", "$sort", "$position"):
            raise EngineError(2, f"Unrecognized clause in $push: {clause}")
    each = arg["$each"]
    if not isinstance(each, list):
        raise EngineError(
            2,
            "The argument to $each in $push must be an array but it was of type: "
            + bson_type_name(each),
        )
    spec = _Push(values=list(each))
    if "$slice" in arg:
        spec.slice = _integral(arg["$slice"])
        if spec.slice is None:
            raise EngineError(
                2,
                "The value for $slice must be an integer value but was given type: "
                + bson_type_name(arg["$slice"]),
            )
    if "$position" in arg:
        spec.position = _integral(arg["$position"])
        if spec.position is None:
            raise EngineError(
                2,
                "The value for $position must be an integer value, not of type: "
                + bson_type_name(arg["$position"]),
            )
    if "$sort" in arg:
        spec.sort = _parse_push_sort(arg["$sort"])
    return spec


def _parse_push_sort(sort: Any) -> Any:
    def direction(value: Any) -> int:
        if _is_number(value) and value in (1, -1):
            return int(value)
        raise EngineError(2, "The $sort element value must be either 1 or -1")

    if isinstance(sort, dict):
        if not sort:
            raise EngineError(2, "The $sort pattern is empty when it should be a set of fields.")
        for name in sort:
            if name == "" or "" in name.split("."):
                raise EngineError(
                    2, f"The $sort field is a dotted field but has an empty part: {name}"
                )
        return {name: direction(value) for name, value in sort.items()}
    if _is_number(sort):
        return direction(sort)
    raise EngineError(
        2,
        "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort "
        "embedded fields",
    )


def _parse_add_to_set(arg: Any) -> list[Any]:
    if isinstance(arg, dict) and arg and next(iter(arg)) == "$each":
        each = arg["$each"]
        if not isinstance(each, list):
            raise EngineError(
                14,
                "The argument to $each in $addToSet must be an array but it was of type "
                + bson_type_name(each),
            )
        if len(arg) > 1:
            raise EngineError(
                2, f"Found unexpected fields after $each in $addToSet: {format_value(arg)}"
            )
        return list(each)
    return [arg]


def _parse_current_date(field_name: str, arg: Any) -> str:
    if isinstance(arg, bool):
        return "date"
    if isinstance(arg, dict):
        for key in arg:
            if key != "$type":
                raise EngineError(2, f"Unrecognized $currentDate option: {key}")
        if arg.get("$type") in ("date", "timestamp"):
            return str(arg["$type"])
        raise EngineError(
            2,
            "The '$type' string field is required to be 'date' or 'timestamp': "
            "{$currentDate: {field : {$type: 'date'}}}",
        )
    raise EngineError(
        2,
        f"{_arg_text(field_name, arg)} is not valid type for $currentDate. Please use a "
        "boolean ('true') or a $type expression ({$type: 'timestamp/date'}).",
    )


def _parse_bit(arg: Any) -> list[tuple[str, int]]:
    if not isinstance(arg, dict):
        raise EngineError(
            2,
            f"The $bit modifier is not compatible with a {bson_type_name(arg)}. You must pass "
            "in an embedded document: {$bit: {field: {and/or/xor: #}}",
        )
    if not arg:
        raise EngineError(
            2,
            "You must pass in at least one bitwise operation. The format is: "
            "{$bit: {field: {and/or/xor: #}}",
        )
    ops = []
    for name, operand in arg.items():
        if name not in ("and", "or", "xor"):
            raise EngineError(
                2,
                "The $bit modifier only supports 'and', 'or', and 'xor', not "
                f"'{name}' which is unknown.",
            )
        if isinstance(operand, bool) or not isinstance(operand, int):
            raise EngineError(
                2,
                "The $bit modifier field must be an Integer(32/64 bit); a "
                f"'{bson_type_name(operand)}' is not supported here",
            )
        ops.append((name, operand))
    return ops


def _parse_mod(op: str, field_name: str, arg: Any) -> _Mod:
    """Validate one ``op: {field: arg}`` entry (mongod's leaf-node init)."""
    path = _parse_path(field_name)
    if op in ("$inc", "$mul") and not _is_number(arg):
        verb = "increment" if op == "$inc" else "multiply"
        raise EngineError(
            14, f"Cannot {verb} with non-numeric argument: {{{_arg_text(field_name, arg)}}}"
        )
    if op == "$push":
        arg = _parse_push(field_name, arg)
    elif op == "$addToSet":
        arg = _parse_add_to_set(arg)
    elif op == "$currentDate":
        arg = _parse_current_date(field_name, arg)
    elif op == "$bit":
        arg = _parse_bit(arg)
    elif op == "$pop":
        if not _is_number(arg):
            raise EngineError(9, f"Expected a number in: {_arg_text(field_name, arg)}")
        value = _integral(arg)
        if value not in (1, -1):
            found = value if value is not None else format_value(arg)
            raise EngineError(9, f"$pop expects 1 or -1, found: {found}")
        arg = value
    elif op == "$pullAll" and not isinstance(arg, list):
        raise EngineError(
            2, f"$pullAll requires an array argument but was given a {bson_type_name(arg)}"
        )
    elif op == "$rename":
        return _parse_rename(field_name, path, arg)
    return _Mod(op, path, arg)


def _parse_rename(field_name: str, path: tuple[str, ...], arg: Any) -> _Mod:
    if not isinstance(arg, str):
        raise EngineError(
            2, f"The 'to' field for $rename must be a string: {_arg_text(field_name, arg)}"
        )
    dest = _parse_path(arg)
    if dest == path:
        raise EngineError(
            2, f"The source and target field for $rename must differ: {_arg_text(field_name, arg)}"
        )
    n = min(len(dest), len(path))
    if dest[:n] == path[:n]:
        raise EngineError(
            2,
            "The source and target field for $rename must not be on the same path: "
            + _arg_text(field_name, arg),
        )
    if "$" in path or any(_is_array_marker(p) for p in path):
        raise EngineError(2, f"The source field for $rename may not be dynamic: {field_name}")
    if "$" in dest or any(_is_array_marker(p) for p in dest):
        raise EngineError(2, f"The destination field for $rename may not be dynamic: {arg}")
    return _Mod("$rename", path, arg, dest=dest)


def _register(registered: list[tuple[str, ...]], path: tuple[str, ...]) -> None:
    """Reject two modifiers on the same path or on a path and its prefix."""
    for other in registered:
        n = min(len(other), len(path))
        if other[:n] == path[:n]:
            raise EngineError(
                40,
                f"Updating the path '{_dotted(path)}' would create a conflict at "
                f"'{_dotted(path[:n])}'",
            )
    registered.append(path)


def _parse_operator_update(update: dict) -> list[_Mod]:
    mods: list[_Mod] = []
    registered: list[tuple[str, ...]] = []
    for op, fields in update.items():
        if op not in _APPLIERS:
            raise EngineError(
                9,
                f"Unknown modifier: {op}. Expected a valid update modifier or pipeline-style "
                "update specified as an array",
            )
        if not isinstance(fields, dict):
            raise EngineError(
                9,
                f"Modifiers operate on fields but we found type {bson_type_name(fields)} "
                f"instead. For example: {{$mod: {{<field>: ...}}}} not {{{op}: "
                f"{format_value(fields)}}}",
            )
        for field_name, arg in fields.items():
            mod = _parse_mod(op, field_name, arg)
            _register(registered, mod.path)
            if mod.dest is not None:
                _register(registered, mod.dest)
            mods.append(mod)
    return mods


# --------------------------------------------------------------------------------------
# Positional paths


def _filter_identifiers(flt: dict) -> set[str]:
    names: set[str] = set()
    for key, value in flt.items():
        if key in ("$and", "$or", "$nor") and isinstance(value, list):
            for sub in value:
                if isinstance(sub, dict):
                    names |= _filter_identifiers(sub)
        elif not key.startswith("$"):
            names.add(key.split(".", 1)[0])
    return names


def _parse_array_filters(array_filters: list[dict] | None) -> dict[str, dict]:
    filters: dict[str, dict] = {}
    for flt in array_filters or []:
        if not isinstance(flt, dict):
            raise EngineError(
                14, f"Each array filter must be an object, found {bson_type_name(flt)}"
            )
        names = sorted(_filter_identifiers(flt))
        if not names:
            raise EngineError(
                9, "Cannot use an expression without a top-level field name in arrayFilters"
            )
        if len(names) > 1:
            raise EngineError(
                9,
                "Error parsing array filter :: caused by :: Expected a single top-level field "
                f"name, found '{names[0]}' and '{names[1]}'",
            )
        ident = names[0]
        if not _IDENT_RE.fullmatch(ident):
            raise EngineError(
                2,
                "Error parsing array filter :: caused by :: The top-level field name must be an "
                f"alphanumeric string beginning with a lowercase letter, found '{ident}'",
            )
        if ident in filters:
            raise EngineError(
                9, f"Found multiple array filters with the same top-level field name {ident}"
            )
        filters[ident] = flt
    return filters


def _check_identifiers(mods: list[_Mod], filters: dict[str, dict], update: dict) -> None:
    used: set[str] = set()
    for mod in mods:
        for part in mod.path:
            if _is_array_marker(part) and part != "$[]":
                ident = part[2:-1]
                if ident not in filters:
                    raise EngineError(
                        2,
                        f"No array filter found for identifier '{ident}' in path "
                        f"'{_dotted(mod.path)}'",
                    )
                used.add(ident)
    for ident in filters:
        if ident not in used:
            raise EngineError(
                9,
                f"The array filter for identifier '{ident}' was not used in the update "
                f"{format_value(update)}",
            )


def _query_conditions(query: dict, doc: dict) -> list[tuple[str, Any]]:
    """The query's field conditions: top level, inside ``$and`` and inside the first
    ``$or`` branch that matches ``doc`` (the branch mongod would record a position for)."""
    conditions: list[tuple[str, Any]] = []
    for key, value in query.items():
        if key == "$and" and isinstance(value, list):
            for sub in value:
                if isinstance(sub, dict):
                    conditions += _query_conditions(sub, doc)
        elif key == "$or" and isinstance(value, list):
            for sub in value:
                if isinstance(sub, dict) and matches_filter(sub, doc):
                    conditions += _query_conditions(sub, doc)
                    break
        elif not key.startswith("$"):
            conditions.append((key, value))
    return conditions


def _is_operator_doc(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(k.startswith("$") for k in value)


def _elem_match_applies(inner: Any, elem: Any) -> bool:
    if not isinstance(inner, dict):
        raise EngineError(2, "$elemMatch needs an Object")
    if _is_operator_doc(inner) and not set(inner) <= {"$and", "$or", "$nor", "$expr"}:
        return matches_filter({"v": inner}, {"v": elem})
    return isinstance(elem, dict) and matches_filter(inner, elem)


def _element_satisfies(elem: Any, rest: str, cond: Any) -> bool:
    """Does one array element satisfy a query condition on ``<array>[.rest]``?"""
    if rest:
        return matches_filter({"v." + rest: cond}, {"v": elem})
    if _is_operator_doc(cond) and "$elemMatch" in cond:
        others = {k: v for k, v in cond.items() if k != "$elemMatch"}
        return _elem_match_applies(cond["$elemMatch"], elem) and (
            not others or matches_filter({"v": others}, {"v": elem})
        )
    return matches_filter({"v": cond}, {"v": elem})


def _positional_index(doc: dict, prefix: tuple[str, ...], query: dict | None) -> int:
    """The index the ``$`` operator stands for: the first element of the array at
    ``prefix`` that the query's conditions on that array matched."""
    array = _get_path(doc, prefix)
    if not isinstance(array, list) or not query:
        raise EngineError(2, _NO_POSITIONAL_MATCH)
    prefix_text = _dotted(prefix)
    relevant = []
    for key, cond in _query_conditions(query, doc):
        if key == prefix_text:
            relevant.append(("", cond))
        elif key.startswith(prefix_text + "."):
            relevant.append((key[len(prefix_text) + 1 :], cond))
    if not relevant:
        raise EngineError(2, _NO_POSITIONAL_MATCH)
    matches = [[_element_satisfies(e, rest, cond) for e in array] for rest, cond in relevant]
    for i in range(len(array)):
        if all(m[i] for m in matches):
            return i
    for m in matches:  # conditions met by different elements: mongod keeps one of them
        if any(m):
            return m.index(True)
    raise EngineError(2, _NO_POSITIONAL_MATCH)


def _expand(doc: dict, path: tuple[str, ...], filters: dict[str, dict]) -> list[tuple[str, ...]]:
    """Expand ``$[]`` / ``$[ident]`` into the concrete paths they select in ``doc``."""
    if not any(_is_array_marker(p) for p in path):
        return [path]
    out: list[tuple[str, ...]] = []

    def walk(node: Any, i: int, taken: tuple[str, ...]) -> None:
        rest = path[i:]
        if not any(_is_array_marker(p) for p in rest):
            out.append(taken + rest)
            return
        part = path[i]
        if not _is_array_marker(part):
            if isinstance(node, list):
                idx = _array_index(part)
                child = _MISSING if idx is None else _lookup(node, idx)
            else:
                child = _lookup(node, part)
            walk(child, i + 1, taken + (part,))
            return
        if node is _MISSING:
            raise EngineError(
                2,
                f"The path '{_dotted(taken)}' must exist in the document in order to apply "
                "array updates.",
            )
        if not isinstance(node, list):
            raise EngineError(
                2,
                f"Cannot apply array updates to non-array element {taken[-1]}: "
                f"{format_value(node)}",
            )
        ident = part[2:-1]
        for idx, elem in enumerate(node):
            if not ident or matches_filter(filters[ident], {ident: elem}):
                walk(elem, i + 1, taken + (str(idx),))

    walk(doc, 0, ())
    return out


def _resolve_dollar(
    path: tuple[str, ...], doc: dict, query: dict | None, cache: dict[tuple[str, ...], int]
) -> tuple[str, ...]:
    if "$" not in path:
        return path
    at = path.index("$")
    prefix = path[:at]
    if any(_is_array_marker(p) for p in prefix):
        raise EngineError(2, _NO_POSITIONAL_MATCH)
    if prefix not in cache:
        cache[prefix] = _positional_index(doc, prefix, query)
    return prefix + (str(cache[prefix]),) + path[at + 1 :]


# --------------------------------------------------------------------------------------
# Appliers: each applies one modifier at one concrete path of the working document


def _apply_set(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    if mod.op == "$setOnInsert" and not ctx.is_insert:
        return
    container, key = _locate_creating(doc, path)
    current = _lookup(container, key)
    # mongod treats setting an equal value as a no-op, so 1 stays an int under {$set: 1.0}
    if current is not _MISSING and values_equal(current, mod.arg):
        return
    _assign(container, key, copy.deepcopy(mod.arg))


def _apply_unset(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    found = _locate(doc, path, create=False)
    if found is None:
        return
    container, key = found
    if isinstance(container, dict):
        container.pop(key, None)
    elif key < len(container):
        container[key] = None  # array elements are nulled, not removed


def _arith(op: str, current: Any, operand: Any, ctx: _Ctx) -> Any:
    fn: Callable[[Any, Any], Any] = (lambda a, b: a + b) if op == "$inc" else (lambda a, b: a * b)
    if isinstance(current, Decimal128) or isinstance(operand, Decimal128):
        with localcontext(create_decimal128_context()) as context:
            return Decimal128(
                context.create_decimal(fn(_to_decimal(current), _to_decimal(operand)))
            )
    if isinstance(current, float) or isinstance(operand, float):
        return float(fn(float(current), float(operand)))
    result = fn(int(current), int(operand))
    if not _INT64_MIN <= result <= _INT64_MAX:
        raise EngineError(
            2,
            f"Failed to apply {op} operations to current value ((NumberLong){int(current)}) "
            f"for document {{{ctx.id_text()}}}",
        )
    # int32 arithmetic that overflows widens to long, as it does in mongod
    if (
        isinstance(current, Int64)
        or isinstance(operand, Int64)
        or not (_INT32_MIN <= result <= _INT32_MAX)
    ):
        return Int64(result)
    return result


def _zero_like(value: Any) -> Any:
    if isinstance(value, Decimal128):
        return Decimal128("0")
    if isinstance(value, float):
        return 0.0
    return Int64(0) if isinstance(value, Int64) else 0


def _apply_arith(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    container, key = _locate_creating(doc, path)
    current = _lookup(container, key)
    if current is _MISSING:
        _assign(container, key, mod.arg if mod.op == "$inc" else _zero_like(mod.arg))
        return
    if not _is_number(current):
        raise EngineError(
            14,
            f"Cannot apply {mod.op} to a value of non-numeric type. {{{ctx.id_text()}}} has "
            f"the field '{path[-1]}' of non-numeric type {bson_type_name(current)}",
        )
    _assign(container, key, _arith(mod.op, current, mod.arg, ctx))


def _apply_compare(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    container, key = _locate_creating(doc, path)
    current = _lookup(container, key)
    wanted = -1 if mod.op == "$min" else 1
    if current is _MISSING or compare_values(mod.arg, current) == wanted:
        _assign(container, key, copy.deepcopy(mod.arg))


def _apply_current_date(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    container, key = _locate_creating(doc, path)
    _assign(container, key, ctx.current(mod.arg))


def _apply_bit(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    container, key = _locate_creating(doc, path)
    current = _lookup(container, key)
    value = 0 if current is _MISSING else current
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineError(
            2,
            f"Cannot apply $bit to a value of non-integral type.{{{ctx.id_text()}}} has the "
            f"field {path[-1]} of non-integer type {bson_type_name(value)}",
        )
    wide = isinstance(value, Int64) or any(isinstance(o, Int64) for _, o in mod.arg)
    result = int(value)
    for name, operand in mod.arg:
        result = {"and": result & operand, "or": result | operand, "xor": result ^ operand}[name]
    _assign(container, key, Int64(result) if wide else result)


def _existing(doc: dict, path: tuple[str, ...]) -> tuple[Any, Any, Any] | None:
    """Container, key and value at ``path`` when the value exists, else ``None``."""
    found = _locate(doc, path, create=False)
    if found is None:
        return None
    container, key = found
    current = _lookup(container, key)
    return None if current is _MISSING else (container, key, current)


def _array_slot(doc: dict, path: tuple[str, ...]) -> tuple[Any, Any, Any]:
    """Container, key and value (possibly ``_MISSING``) at ``path``, creating the way."""
    container, key = _locate_creating(doc, path)
    return container, key, _lookup(container, key)


def _sort_key(elem: Any, name: str) -> Any:
    value = _get_path(elem, name.split(".")) if isinstance(elem, dict) else _MISSING
    return None if value is _MISSING else value


def _apply_push(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    container, key, current = _array_slot(doc, path)
    if current is _MISSING:
        current = []
        _assign(container, key, current)
    elif not isinstance(current, list):
        raise EngineError(
            2,
            f"The field '{_dotted(path)}' must be an array but is of type "
            f"{bson_type_name(current)} in document {{{ctx.id_text()}}}",
        )
    spec: _Push = mod.arg
    values = copy.deepcopy(spec.values)
    size, pos = len(current), spec.position
    if pos is None or pos > size:
        current.extend(values)
    elif pos >= 0:
        current[pos:pos] = values
    elif -pos < size:
        current[size + pos : size + pos] = values
    else:
        current[0:0] = values
    if isinstance(spec.sort, dict):
        pattern: dict[str, int] = spec.sort

        def by_pattern(a: Any, b: Any) -> int:
            for name, direction in pattern.items():
                c = compare_values(_sort_key(a, name), _sort_key(b, name))
                if c:
                    return c * direction
            return 0

        current.sort(key=cmp_to_key(by_pattern))
    elif spec.sort is not None:
        direction = spec.sort
        current.sort(key=cmp_to_key(lambda a, b: compare_values(a, b) * direction))
    if spec.slice is not None:
        if spec.slice >= 0:
            del current[spec.slice :]
        else:
            del current[: max(0, len(current) + spec.slice)]


def _apply_add_to_set(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    container, key, current = _array_slot(doc, path)
    if current is _MISSING:
        current = []
        _assign(container, key, current)
    elif not isinstance(current, list):
        raise EngineError(
            2,
            f"Cannot apply $addToSet to non-array field. Field named '{path[-1]}' has "
            f"non-array type {bson_type_name(current)}",
        )
    for value in mod.arg:
        if not any(values_equal(value, existing) for existing in current):
            current.append(copy.deepcopy(value))


def _apply_pop(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    target = _existing(doc, path)
    if target is None:
        return
    _, _, current = target
    if not isinstance(current, list):
        raise EngineError(
            14,
            f"Path '{_dotted(path)}' contains an element of non-array type "
            f"'{bson_type_name(current)}'",
        )
    if current:
        current.pop(0 if mod.arg == -1 else -1)


_LOGICAL = {"$and", "$or", "$nor", "$expr", "$where", "$comment", "$text"}


def _pull_matcher(cond: Any) -> Callable[[Any], bool]:
    """mongod's three $pull matchers: a condition on the element itself
    (``{$gte: 6}``), a query on document elements (``{score: 8}``), or equality."""
    first = next(iter(cond), "") if isinstance(cond, dict) else ""
    if first.startswith("$") and first not in _LOGICAL:
        return lambda elem: matches_filter({"v": cond}, {"v": elem})
    if isinstance(cond, dict):
        return lambda elem: isinstance(elem, dict) and matches_filter(cond, elem)
    return lambda elem: values_equal(elem, cond)


def _apply_pull(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    target = _existing(doc, path)
    if target is None:
        return
    container, key, current = target
    if not isinstance(current, list):
        raise EngineError(2, f"Cannot apply {mod.op} to a non-array value")
    if mod.op == "$pull":
        matcher = _pull_matcher(mod.arg)
    else:
        values = mod.arg

        def matcher(elem: Any) -> bool:
            return any(values_equal(elem, v) for v in values)

    kept = [elem for elem in current if not matcher(elem)]
    if len(kept) != len(current):
        _assign(container, key, kept)


def _traverse_error(part: str, path: tuple[str, ...], name: str, value: Any) -> EngineError:
    return EngineError(
        28,
        f"cannot use the part ({part} of {_dotted(path)}) to traverse the element "
        f"({{{name}: {format_value(value)}}})",
    )


def _apply_rename(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    assert mod.dest is not None
    cur: Any = doc
    name = ""
    array_field = None
    for i, part in enumerate(path):
        if isinstance(cur, dict):
            key: Any = part
        elif isinstance(cur, list):
            key = _array_index(part)
            if key is None:
                raise _traverse_error(part, path, name, cur)
            array_field = array_field or name
        else:
            raise _traverse_error(part, path, name, cur)
        if _lookup(cur, key) is _MISSING:
            return  # renaming a missing field is a no-op
        if i < len(path) - 1:
            cur, name = _lookup(cur, key), part
    if array_field is not None:
        raise EngineError(
            2,
            f"The source field cannot be an array element, '{_dotted(path)}' in doc with "
            f"{ctx.id_text()} has an array field called '{array_field}'",
        )
    node: Any = doc
    for part in mod.dest[:-1]:
        node = _lookup(node, part) if isinstance(node, dict) else _MISSING
        if isinstance(node, list):
            raise EngineError(
                2,
                f"The destination field cannot be an array element, '{_dotted(mod.dest)}' in "
                f"doc with {ctx.id_text()} has an array field called '{part}'",
            )
    value = cur.pop(key)
    container, dest_key = _locate_creating(doc, mod.dest)
    _assign(container, dest_key, value)


_Applier = Callable[[dict, tuple[str, ...], _Mod, _Ctx], None]

_APPLIERS: dict[str, _Applier] = {
    "$set": _apply_set,
    "$setOnInsert": _apply_set,
    "$unset": _apply_unset,
    "$inc": _apply_arith,
    "$mul": _apply_arith,
    "$min": _apply_compare,
    "$max": _apply_compare,
    "$currentDate": _apply_current_date,
    "$bit": _apply_bit,
    "$push": _apply_push,
    "$addToSet": _apply_add_to_set,
    "$pop": _apply_pop,
    "$pull": _apply_pull,
    "$pullAll": _apply_pull,
    "$rename": _apply_rename,
}


# --------------------------------------------------------------------------------------
# Update styles

_ts_lock = threading.Lock()
_ts_last = [0, 0]


def _next_timestamp() -> Timestamp:
    """A Timestamp that increases across calls, like mongod's cluster time."""
    with _ts_lock:
        now = int(time.time())
        if now == _ts_last[0]:
            _ts_last[1] += 1
        else:
            _ts_last[0], _ts_last[1] = now, 1
        return Timestamp(_ts_last[0], _ts_last[1])


def _now_millis() -> dt.datetime:
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)  # BSON dates hold millis


def _check_runtime_conflicts(paths: list[tuple[str, ...]]) -> None:
    # A sorted list puts every path right before the paths it prefixes.
    ordered = sorted(paths)
    for a, b in itertools.pairwise(ordered):
        if b[: len(a)] == a:
            raise EngineError(40, f"Update created a conflict at '{_dotted(a)}'")


def _apply_operators(
    doc: dict,
    update: dict,
    array_filters: list[dict] | None,
    query: dict | None,
    is_insert: bool,
) -> dict:
    mods = _parse_operator_update(update)
    filters = _parse_array_filters(array_filters)
    _check_identifiers(mods, filters, update)
    ctx = _Ctx(is_insert=is_insert, doc_id=doc.get("_id", _MISSING))
    # Positions are resolved against the original document, as mongod applies the whole
    # update tree in a single pass over it.
    dollar_cache: dict[tuple[str, ...], int] = {}
    planned: list[tuple[tuple[str, ...], _Mod, tuple[str, ...]]] = []
    all_paths: list[tuple[str, ...]] = []
    for mod in mods:
        if mod.op == "$setOnInsert" and not is_insert:
            continue
        resolved = _resolve_dollar(mod.path, doc, query, dollar_cache)
        for concrete in _expand(doc, resolved, filters):
            planned.append((mod.dest or concrete, mod, concrete))
            all_paths.append(concrete)
            if mod.dest is not None:
                all_paths.append(mod.dest)
    if len(all_paths) > 1:
        _check_runtime_conflicts(all_paths)
    # mongod walks its update tree in field-name order, so new fields appear sorted.
    planned.sort(key=lambda item: item[0])
    result = copy.deepcopy(doc)
    for _, mod, concrete in planned:
        _APPLIERS[mod.op](result, concrete, mod, ctx)
    _check_id_kept(doc, result, planned)
    return result


def _check_id_kept(
    original: dict, result: dict, planned: list[tuple[tuple[str, ...], _Mod, tuple[str, ...]]]
) -> None:
    if "_id" not in original:
        return
    if "_id" in result and values_equal(original["_id"], result["_id"]):
        result["_id"] = original["_id"]  # an equal value (1 vs 1.0) is not a change
        return
    for _, mod, concrete in planned:
        if mod.op == "$rename" and concrete[0] == "_id":
            raise EngineError(
                66,
                f"Unsetting the path '{_dotted(concrete)}' using $rename would modify the "
                "immutable field '_id'",
            )
        target = mod.dest if mod.dest is not None else concrete
        if target[0] == "_id":
            raise EngineError(
                66,
                f"Performing an update on the path '{_dotted(target)}' would modify the "
                "immutable field '_id'",
            )
    raise EngineError(
        66, "Performing an update on the path '_id' would modify the immutable field '_id'"
    )


def _check_replacement_id(original: dict, result: dict) -> dict:
    """Keep the original ``_id``: restore it when the new document lacks one, refuse a
    different one."""
    if "_id" not in original:
        return result
    if "_id" not in result:
        return {"_id": copy.deepcopy(original["_id"]), **result}
    if not values_equal(original["_id"], result["_id"]):
        raise EngineError(
            66,
            "After applying the update, the (immutable) field '_id' was found to have been "
            f"altered to _id: {format_value(result['_id'])}",
        )
    return result


def _apply_replacement(doc: dict, replacement: dict) -> dict:
    for key in replacement:
        if key.startswith("$"):
            raise EngineError(
                52,
                f"The dollar ($) prefixed field '{key}' in '{key}' is not allowed in the context "
                "of an update's replacement document. Consider using an aggregation pipeline "
                "with $replaceWith.",
            )
    return _check_replacement_id(doc, copy.deepcopy(replacement))


_UPDATE_STAGES = ("$addFields", "$set", "$project", "$unset", "$replaceRoot", "$replaceWith")


def _run_stage(name: str, spec: Any, doc: dict) -> dict:
    handlers = _mm_aggregate._PIPELINE_HANDLERS
    if name == "$unset":
        fields = [spec] if isinstance(spec, str) else spec
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            raise EngineError(31002, "$unset specification must be a string or an array")
        if not fields:
            raise EngineError(
                31119, "$unset specification must be a string or an array with at least one field"
            )
        name, spec = "$project", dict.fromkeys(fields, 0)
    elif name == "$replaceWith":
        name, spec = "$replaceRoot", {"newRoot": spec}
    if name in ("$set", "$addFields", "$project", "$replaceRoot") and (
        not isinstance(spec, dict) or not spec
    ):
        raise EngineError(
            2, f"Invalid {name} :: caused by :: specification must be a non-empty object"
        )
    handler = handlers[name]
    assert handler is not None  # every stage in _UPDATE_STAGES maps to a mongomock handler
    try:
        out = handler([copy.deepcopy(doc)], None, spec)
    except OperationFailure as exc:
        raise EngineError(exc.code or 2, str(exc)) from exc
    except NotImplementedError as exc:
        raise EngineError(2, f"{name} is not supported by the embedded engine: {exc}") from exc
    if not out or not isinstance(out[0], dict):
        raise EngineError(2, f"{name} did not produce a document")
    return dict(out[0])


def _apply_pipeline(doc: dict, pipeline: list) -> dict:
    current = copy.deepcopy(doc)
    for stage in pipeline:
        if not isinstance(stage, dict) or len(stage) != 1:
            raise EngineError(
                40323, "A pipeline stage specification object must contain exactly one field."
            )
        name, spec = next(iter(stage.items()))
        if name not in _UPDATE_STAGES:
            if name in _mm_aggregate._PIPELINE_HANDLERS:
                raise EngineError(72, f"{name} is not allowed to be used within an update")
            raise EngineError(40324, f"Unrecognized pipeline stage name: '{name}'")
        current = _run_stage(name, spec, current)
    return _check_replacement_id(doc, current)


def apply_update(
    doc: dict,
    update: dict | list,
    *,
    array_filters: list[dict] | None = None,
    query: dict | None = None,
    is_insert: bool = False,
) -> dict:
    """Apply a MongoDB update to ``doc`` and return the new document.

    ``doc`` is never modified. ``update`` is an operator document (``{$set: ...}``), a
    replacement document (no ``$`` keys) or an aggregation pipeline (a list of
    ``$set``/``$addFields``/``$unset``/``$project``/``$replaceRoot``/``$replaceWith``
    stages). ``query`` is the update's filter, needed to resolve the positional ``$``;
    ``array_filters`` binds the ``$[ident]`` identifiers. For an upsert that inserts,
    pass ``upsert_seed(query)`` as ``doc`` and ``is_insert=True`` (``$setOnInsert``
    only applies then).

    Raises ``EngineError`` with mongod's code and message for invalid updates (9 unknown
    modifier, 40 conflicting paths, 14 type mismatch, 28 path not viable, 66 ``_id``
    change, ...).
    """
    if isinstance(update, list):
        if array_filters:
            raise EngineError(72, "arrayFilters may not be specified for pipeline-style updates")
        return _apply_pipeline(doc, update)
    if not isinstance(update, dict):
        raise EngineError(14, "Update argument must be either an object or an array")
    if update and next(iter(update)).startswith("$"):
        return _apply_operators(doc, update, array_filters, query, is_insert)
    return _apply_replacement(doc, update)


# --------------------------------------------------------------------------------------
# Upserts


def _equality_value(value: Any) -> Any:
    """The value a query condition pins a field to, or ``_MISSING``."""
    if _is_operator_doc(value):
        return value.get("$eq", _MISSING)
    if isinstance(value, re.Pattern | Regex):
        return _MISSING
    return value


def upsert_seed(query: dict) -> dict:
    """The document an upsert inserts before its update applies.

    Takes the query's equality conditions (``{a: 1}``, ``{a: {$eq: 1}}``, also inside a
    top-level ``$and``); dotted keys become nested subdocuments. Other operators,
    ``$or``/``$nor`` and regex matches contribute nothing. ``_id`` comes first.
    Two conditions on the same or overlapping paths are error 54 as in mongod.
    """
    seed: dict = {}
    seen: list[tuple[str, ...]] = []

    def add(key: str, value: Any) -> None:
        path = tuple(key.split("."))
        for other in seen:
            n = min(len(other), len(path))
            if other[:n] == path[:n]:
                detail = (
                    f"path '{key}' is matched twice"
                    if other == path
                    else f"both paths '{key}' and '{_dotted(other)}' are matched"
                )
                raise EngineError(54, f"cannot infer query fields to set, {detail}")
        seen.append(path)
        node = seed
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = copy.deepcopy(value)

    def visit(q: dict) -> None:
        for key, value in q.items():
            if key == "$and" and isinstance(value, list):
                for sub in value:
                    if isinstance(sub, dict):
                        visit(sub)
            elif not key.startswith("$"):
                pinned = _equality_value(value)
                if pinned is not _MISSING:
                    add(key, pinned)

    visit(query)
    if "_id" in seed:
        seed = {"_id": seed.pop("_id"), **seed}
    return seed
