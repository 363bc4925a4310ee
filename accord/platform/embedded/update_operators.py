"""Operator updates (``$set``, ``$inc``, ``$push`` ...) as mongod's update subsystem applies them.

Each modifier is parsed and validated first (with mongod's codes and messages), then
applied to a copy of the document at every concrete path its positional parts resolve
to, in field-name order as mongod walks its update tree.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import localcontext
from functools import cmp_to_key
from typing import Any

from bson.decimal128 import Decimal128, create_decimal128_context
from bson.int64 import Int64
from bson.timestamp import Timestamp

from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.mongomock_bridge import matches_filter
from accord.platform.embedded.paths import (
    MISSING,
    array_index,
    assign,
    dotted,
    get_path,
    is_array_marker,
    locate,
    locate_creating,
    lookup,
    parse_path,
)
from accord.platform.embedded.positional import (
    check_identifiers,
    expand,
    parse_array_filters,
    resolve_dollar,
)
from accord.platform.embedded.values import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    bson_type_name,
    compare_values,
    copy_value,
    format_value,
    is_number,
    to_decimal,
    values_equal,
)

__all__ = ["apply_operators", "next_timestamp"]


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

    @property
    def plain(self) -> bool:
        """No positional or array-filter part (``$``, ``$[]``, ``$[ident]``) in the path:
        it is its own concrete path."""
        return self.path in _PLAIN or _plain(self.path)


_PLAIN: set[tuple[str, ...]] = set()


def _plain(path: tuple[str, ...]) -> bool:
    if any(part.startswith("$") for part in path):
        return False
    if len(_PLAIN) < 4096:
        _PLAIN.add(path)
    return True


@dataclass
class _Ctx:
    is_insert: bool
    doc_id: Any
    _now: dt.datetime | None = None
    _timestamp: Timestamp | None = None

    def id_text(self) -> str:
        return "no id" if self.doc_id is MISSING else f"_id: {format_value(self.doc_id)}"

    def current(self, kind: str) -> Any:
        """One clock reading per update, shared by all of its $currentDate fields."""
        if kind == "date":
            self._now = self._now or _now_millis()
            return self._now
        self._timestamp = self._timestamp or next_timestamp()
        return self._timestamp


def _arg_text(field_name: str, arg: Any) -> str:
    return f"{field_name}: {format_value(arg)}"


def _integral(value: Any) -> int | None:
    """mongod's parseIntegerElementToLong: ints and whole doubles."""
    if isinstance(value, bool) or not is_number(value):
        return None
    if isinstance(value, int):
        return int(value)
    number = float(to_decimal(value)) if isinstance(value, Decimal128) else value
    return int(number) if math.isfinite(number) and number.is_integer() else None


def _parse_push(field_name: str, arg: Any) -> _Push:
    if not (isinstance(arg, dict) and "$each" in arg):
        return _Push(values=[arg])
    for clause in arg:
        if clause not in ("$each", "$slice", "$sort", "$position"):
            raise EngineError(Code.BadValue, f"Unrecognized clause in $push: {clause}")
    each = arg["$each"]
    if not isinstance(each, list):
        raise EngineError(
            Code.BadValue,
            "The argument to $each in $push must be an array but it was of type: "
            + bson_type_name(each),
        )
    spec = _Push(values=list(each))
    if "$slice" in arg:
        spec.slice = _integral(arg["$slice"])
        if spec.slice is None:
            raise EngineError(
                Code.BadValue,
                "The value for $slice must be an integer value but was given type: "
                + bson_type_name(arg["$slice"]),
            )
    if "$position" in arg:
        spec.position = _integral(arg["$position"])
        if spec.position is None:
            raise EngineError(
                Code.BadValue,
                "The value for $position must be an integer value, not of type: "
                + bson_type_name(arg["$position"]),
            )
    if "$sort" in arg:
        spec.sort = _parse_push_sort(arg["$sort"])
    return spec


def _parse_push_sort(sort: Any) -> Any:
    def direction(value: Any) -> int:
        if is_number(value) and value in (1, -1):
            return int(value)
        raise EngineError(Code.BadValue, "The $sort element value must be either 1 or -1")

    if isinstance(sort, dict):
        if not sort:
            raise EngineError(
                Code.BadValue, "The $sort pattern is empty when it should be a set of fields."
            )
        for name in sort:
            if name == "" or "" in name.split("."):
                raise EngineError(
                    Code.BadValue,
                    f"The $sort field is a dotted field but has an empty part: {name}",
                )
        return {name: direction(value) for name, value in sort.items()}
    if is_number(sort):
        return direction(sort)
    raise EngineError(
        Code.BadValue,
        "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort "
        "embedded fields",
    )


def _parse_add_to_set(arg: Any) -> list[Any]:
    if isinstance(arg, dict) and arg and next(iter(arg)) == "$each":
        each = arg["$each"]
        if not isinstance(each, list):
            raise EngineError(
                Code.TypeMismatch,
                "The argument to $each in $addToSet must be an array but it was of type "
                + bson_type_name(each),
            )
        if len(arg) > 1:
            raise EngineError(
                Code.BadValue,
                f"Found unexpected fields after $each in $addToSet: {format_value(arg)}",
            )
        return list(each)
    return [arg]


def _parse_current_date(field_name: str, arg: Any) -> str:
    if isinstance(arg, bool):
        return "date"
    if isinstance(arg, dict):
        for key in arg:
            if key != "$type":
                raise EngineError(Code.BadValue, f"Unrecognized $currentDate option: {key}")
        if arg.get("$type") in ("date", "timestamp"):
            return str(arg["$type"])
        raise EngineError(
            Code.BadValue,
            "The '$type' string field is required to be 'date' or 'timestamp': "
            "{$currentDate: {field : {$type: 'date'}}}",
        )
    raise EngineError(
        Code.BadValue,
        f"{_arg_text(field_name, arg)} is not valid type for $currentDate. Please use a "
        "boolean ('true') or a $type expression ({$type: 'timestamp/date'}).",
    )


def _parse_bit(arg: Any) -> list[tuple[str, int]]:
    if not isinstance(arg, dict):
        raise EngineError(
            Code.BadValue,
            f"The $bit modifier is not compatible with a {bson_type_name(arg)}. You must pass "
            "in an embedded document: {$bit: {field: {and/or/xor: #}}",
        )
    if not arg:
        raise EngineError(
            Code.BadValue,
            "You must pass in at least one bitwise operation. The format is: "
            "{$bit: {field: {and/or/xor: #}}",
        )
    ops = []
    for name, operand in arg.items():
        if name not in ("and", "or", "xor"):
            raise EngineError(
                Code.BadValue,
                "The $bit modifier only supports 'and', 'or', and 'xor', not "
                f"'{name}' which is unknown.",
            )
        if isinstance(operand, bool) or not isinstance(operand, int):
            raise EngineError(
                Code.BadValue,
                "The $bit modifier field must be an Integer(32/64 bit); a "
                f"'{bson_type_name(operand)}' is not supported here",
            )
        ops.append((name, operand))
    return ops


# Modifiers whose argument needs no parsing (any value is valid).
_UNCHECKED_ARGS = frozenset({"$set", "$setOnInsert", "$unset", "$min", "$max"})


def _parse_mod(op: str, field_name: str, arg: Any) -> _Mod:
    """Validate one ``op: {field: arg}`` entry (mongod's leaf-node init)."""
    path = parse_path(field_name)
    if op in _UNCHECKED_ARGS:
        return _Mod(op, path, arg)
    if op in ("$inc", "$mul") and not is_number(arg):
        verb = "increment" if op == "$inc" else "multiply"
        raise EngineError(
            Code.TypeMismatch,
            f"Cannot {verb} with non-numeric argument: {{{_arg_text(field_name, arg)}}}",
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
        if not is_number(arg):
            raise EngineError(
                Code.FailedToParse, f"Expected a number in: {_arg_text(field_name, arg)}"
            )
        value = _integral(arg)
        if value not in (1, -1):
            found = value if value is not None else format_value(arg)
            raise EngineError(Code.FailedToParse, f"$pop expects 1 or -1, found: {found}")
        arg = value
    elif op == "$pullAll" and not isinstance(arg, list):
        raise EngineError(
            Code.BadValue,
            f"$pullAll requires an array argument but was given a {bson_type_name(arg)}",
        )
    elif op == "$rename":
        return _parse_rename(field_name, path, arg)
    return _Mod(op, path, arg)


def _parse_rename(field_name: str, path: tuple[str, ...], arg: Any) -> _Mod:
    if not isinstance(arg, str):
        raise EngineError(
            Code.BadValue,
            f"The 'to' field for $rename must be a string: {_arg_text(field_name, arg)}",
        )
    dest = parse_path(arg)
    if dest == path:
        raise EngineError(
            Code.BadValue,
            f"The source and target field for $rename must differ: {_arg_text(field_name, arg)}",
        )
    n = min(len(dest), len(path))
    if dest[:n] == path[:n]:
        raise EngineError(
            Code.BadValue,
            "The source and target field for $rename must not be on the same path: "
            + _arg_text(field_name, arg),
        )
    if "$" in path or any(is_array_marker(p) for p in path):
        raise EngineError(
            Code.BadValue, f"The source field for $rename may not be dynamic: {field_name}"
        )
    if "$" in dest or any(is_array_marker(p) for p in dest):
        raise EngineError(
            Code.BadValue, f"The destination field for $rename may not be dynamic: {arg}"
        )
    return _Mod("$rename", path, arg, dest=dest)


class _Registry:
    """The paths an update's modifiers target, refusing two on the same path or on a
    path and its prefix (mongod's ConflictingUpdateOperators); O(depth) per path."""

    def __init__(self) -> None:
        self.paths: set[tuple[str, ...]] = set()
        # Every prefix of a registered path, the path itself included.
        self.prefixes: set[tuple[str, ...]] = set()

    def add(self, path: tuple[str, ...]) -> None:
        # Registered paths never prefix each other, so at most one of them conflicts
        # with ``path`` at a shorter prefix, and any longer one conflicts at ``path``.
        if path in self.prefixes:
            self._conflict(path, path)
        if len(path) == 1:  # a top-level field: it is its only prefix
            self.paths.add(path)
            self.prefixes.add(path)
            return
        for n in range(1, len(path)):
            if path[:n] in self.paths:
                self._conflict(path, path[:n])
        self.paths.add(path)
        for n in range(1, len(path) + 1):
            self.prefixes.add(path[:n])

    @staticmethod
    def _conflict(path: tuple[str, ...], at: tuple[str, ...]) -> None:
        raise EngineError(
            Code.ConflictingUpdateOperators,
            f"Updating the path '{dotted(path)}' would create a conflict at '{dotted(at)}'",
        )


def _parse_operator_update(update: dict) -> list[_Mod]:
    mods: list[_Mod] = []
    registered = _Registry()
    for op, fields in update.items():
        if op not in _APPLIERS:
            raise EngineError(
                Code.FailedToParse,
                f"Unknown modifier: {op}. Expected a valid update modifier or pipeline-style "
                "update specified as an array",
            )
        if not isinstance(fields, dict):
            raise EngineError(
                Code.FailedToParse,
                f"Modifiers operate on fields but we found type {bson_type_name(fields)} "
                f"instead. For example: {{$mod: {{<field>: ...}}}} not {{{op}: "
                f"{format_value(fields)}}}",
            )
        for field_name, arg in fields.items():
            mod = _parse_mod(op, field_name, arg)
            registered.add(mod.path)
            if mod.dest is not None:
                registered.add(mod.dest)
            mods.append(mod)
    return mods


# --------------------------------------------------------------------------------------
# Positional paths


def _apply_set(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    if mod.op == "$setOnInsert" and not ctx.is_insert:
        return
    if len(path) == 1:  # a top-level field: no path to walk or create
        container: Any = doc
        key: Any = path[0]
        current = doc.get(key, MISSING)
    else:
        container, key = locate_creating(doc, path)
        current = lookup(container, key)
    # mongod treats setting an equal value as a no-op, so 1 stays an int under {$set: 1.0}
    if current is not MISSING and values_equal(current, mod.arg):
        return
    assign(container, key, copy_value(mod.arg))


def _apply_unset(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    found = locate(doc, path, create=False)
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
            return Decimal128(context.create_decimal(fn(to_decimal(current), to_decimal(operand))))
    if isinstance(current, float) or isinstance(operand, float):
        return float(fn(float(current), float(operand)))
    result = fn(int(current), int(operand))
    if not INT64_MIN <= result <= INT64_MAX:
        raise EngineError(
            Code.BadValue,
            f"Failed to apply {op} operations to current value ((NumberLong){int(current)}) "
            f"for document {{{ctx.id_text()}}}",
        )
    # int32 arithmetic that overflows widens to long, as it does in mongod
    if (
        isinstance(current, Int64)
        or isinstance(operand, Int64)
        or not (INT32_MIN <= result <= INT32_MAX)
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
    container, key = locate_creating(doc, path)
    current = lookup(container, key)
    if current is MISSING:
        assign(container, key, mod.arg if mod.op == "$inc" else _zero_like(mod.arg))
        return
    if not is_number(current):
        raise EngineError(
            Code.TypeMismatch,
            f"Cannot apply {mod.op} to a value of non-numeric type. {{{ctx.id_text()}}} has "
            f"the field '{path[-1]}' of non-numeric type {bson_type_name(current)}",
        )
    assign(container, key, _arith(mod.op, current, mod.arg, ctx))


def _apply_compare(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    container, key = locate_creating(doc, path)
    current = lookup(container, key)
    wanted = -1 if mod.op == "$min" else 1
    if current is MISSING or compare_values(mod.arg, current) == wanted:
        assign(container, key, copy_value(mod.arg))


def _apply_current_date(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    container, key = locate_creating(doc, path)
    assign(container, key, ctx.current(mod.arg))


def _apply_bit(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    container, key = locate_creating(doc, path)
    current = lookup(container, key)
    value = 0 if current is MISSING else current
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineError(
            Code.BadValue,
            f"Cannot apply $bit to a value of non-integral type.{{{ctx.id_text()}}} has the "
            f"field {path[-1]} of non-integer type {bson_type_name(value)}",
        )
    wide = isinstance(value, Int64) or any(isinstance(o, Int64) for _, o in mod.arg)
    result = int(value)
    for name, operand in mod.arg:
        result = {"and": result & operand, "or": result | operand, "xor": result ^ operand}[name]
    assign(container, key, Int64(result) if wide else result)


def _existing(doc: dict, path: tuple[str, ...]) -> tuple[Any, Any, Any] | None:
    """Container, key and value at ``path`` when the value exists, else ``None``."""
    found = locate(doc, path, create=False)
    if found is None:
        return None
    container, key = found
    current = lookup(container, key)
    return None if current is MISSING else (container, key, current)


def _array_slot(doc: dict, path: tuple[str, ...]) -> tuple[Any, Any, Any]:
    """Container, key and value (possibly ``MISSING``) at ``path``, creating the way."""
    container, key = locate_creating(doc, path)
    return container, key, lookup(container, key)


def _sort_key(elem: Any, name: str) -> Any:
    value = get_path(elem, name.split(".")) if isinstance(elem, dict) else MISSING
    return None if value is MISSING else value


def _apply_push(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    container, key, current = _array_slot(doc, path)
    if current is MISSING:
        current = []
        assign(container, key, current)
    elif not isinstance(current, list):
        raise EngineError(
            Code.BadValue,
            f"The field '{dotted(path)}' must be an array but is of type "
            f"{bson_type_name(current)} in document {{{ctx.id_text()}}}",
        )
    spec: _Push = mod.arg
    values = copy_value(spec.values)
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
    if current is MISSING:
        current = []
        assign(container, key, current)
    elif not isinstance(current, list):
        raise EngineError(
            Code.BadValue,
            f"Cannot apply $addToSet to non-array field. Field named '{path[-1]}' has "
            f"non-array type {bson_type_name(current)}",
        )
    for value in mod.arg:
        if not any(values_equal(value, existing) for existing in current):
            current.append(copy_value(value))


def _apply_pop(doc: dict, path: tuple[str, ...], mod: _Mod, ctx: _Ctx) -> None:
    target = _existing(doc, path)
    if target is None:
        return
    _, _, current = target
    if not isinstance(current, list):
        raise EngineError(
            Code.TypeMismatch,
            f"Path '{dotted(path)}' contains an element of non-array type "
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
        raise EngineError(Code.BadValue, f"Cannot apply {mod.op} to a non-array value")
    if mod.op == "$pull":
        matcher = _pull_matcher(mod.arg)
    else:
        values = mod.arg

        def matcher(elem: Any) -> bool:
            return any(values_equal(elem, v) for v in values)

    kept = [elem for elem in current if not matcher(elem)]
    if len(kept) != len(current):
        assign(container, key, kept)


def _traverse_error(part: str, path: tuple[str, ...], name: str, value: Any) -> EngineError:
    return EngineError(
        Code.PathNotViable,
        f"cannot use the part ({part} of {dotted(path)}) to traverse the element "
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
            key = array_index(part)
            if key is None:
                raise _traverse_error(part, path, name, cur)
            array_field = array_field or name
        else:
            raise _traverse_error(part, path, name, cur)
        if lookup(cur, key) is MISSING:
            return  # renaming a missing field is a no-op
        if i < len(path) - 1:
            cur, name = lookup(cur, key), part
    if array_field is not None:
        raise EngineError(
            Code.BadValue,
            f"The source field cannot be an array element, '{dotted(path)}' in doc with "
            f"{ctx.id_text()} has an array field called '{array_field}'",
        )
    node: Any = doc
    for part in mod.dest[:-1]:
        node = lookup(node, part) if isinstance(node, dict) else MISSING
        if isinstance(node, list):
            raise EngineError(
                Code.BadValue,
                f"The destination field cannot be an array element, '{dotted(mod.dest)}' in "
                f"doc with {ctx.id_text()} has an array field called '{part}'",
            )
    value = cur.pop(key)
    container, dest_key = locate_creating(doc, mod.dest)
    assign(container, dest_key, value)


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


_ts_lock = threading.Lock()
_ts_last = [0, 0]


def next_timestamp() -> Timestamp:
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
            raise EngineError(
                Code.ConflictingUpdateOperators, f"Update created a conflict at '{dotted(a)}'"
            )


def apply_operators(
    doc: dict,
    update: dict,
    array_filters: list[dict] | None,
    query: dict | None,
    is_insert: bool,
) -> dict:
    """Apply an operator update document to a copy of ``doc`` and return the copy.

    ``query`` resolves the positional ``$``; ``array_filters`` binds ``$[ident]``;
    ``$setOnInsert`` applies only when ``is_insert``.
    """
    mods = _parse_operator_update(update)
    filters = parse_array_filters(array_filters)
    # Plain paths (no ``$``, ``$[]``, ``$[ident]``) are their own concrete paths, and the
    # parser already refused conflicts among them: nothing to resolve or re-check.
    plain = all(m.plain for m in mods)
    if filters or not plain:
        check_identifiers([m.path for m in mods], filters, update)
    ctx = _Ctx(is_insert=is_insert, doc_id=doc.get("_id", MISSING))
    planned: list[tuple[tuple[str, ...], _Mod, tuple[str, ...]]] = []
    if plain:
        planned = [
            (mod.dest or mod.path, mod, mod.path)
            for mod in mods
            if is_insert or mod.op != "$setOnInsert"
        ]
    else:
        # Positions are resolved against the original document, as mongod applies the
        # whole update tree in a single pass over it.
        dollar_cache: dict[tuple[str, ...], int] = {}
        all_paths: list[tuple[str, ...]] = []
        for mod in mods:
            if mod.op == "$setOnInsert" and not is_insert:
                continue
            resolved = resolve_dollar(mod.path, doc, query, dollar_cache)
            for concrete in expand(doc, resolved, filters):
                planned.append((mod.dest or concrete, mod, concrete))
                all_paths.append(concrete)
                if mod.dest is not None:
                    all_paths.append(mod.dest)
        if len(all_paths) > 1:
            _check_runtime_conflicts(all_paths)
    # mongod walks its update tree in field-name order, so new fields appear sorted.
    planned.sort(key=lambda item: item[0])
    result = copy_value(doc)
    for _, mod, concrete in planned:
        _APPLIERS[mod.op](result, concrete, mod, ctx)
    _check_id_kept(doc, result, planned)
    return result


def _check_id_kept(
    original: dict, result: dict, planned: list[tuple[tuple[str, ...], _Mod, tuple[str, ...]]]
) -> None:
    if "_id" not in original:
        return
    if "_id" in result and (
        result["_id"] is original["_id"] or values_equal(original["_id"], result["_id"])
    ):
        result["_id"] = original["_id"]  # an equal value (1 vs 1.0) is not a change
        return
    for _, mod, concrete in planned:
        if mod.op == "$rename" and concrete[0] == "_id":
            raise EngineError(
                Code.ImmutableField,
                f"Unsetting the path '{dotted(concrete)}' using $rename would modify the "
                "immutable field '_id'",
            )
        target = mod.dest if mod.dest is not None else concrete
        if target[0] == "_id":
            raise EngineError(
                Code.ImmutableField,
                f"Performing an update on the path '{dotted(target)}' would modify the "
                "immutable field '_id'",
            )
    raise EngineError(
        Code.ImmutableField,
        "Performing an update on the path '_id' would modify the immutable field '_id'",
    )
