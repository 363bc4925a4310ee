"""The one module that touches mongomock: its evaluators, behind public functions.

mongomock's filter matcher, aggregation stages and expression parser are reused by the
engine (DESIGN: "use mongomock's evaluators where they are right"). They are reached
through mongomock's private names, so this module is the only place that may use them
(a test keeps it so), and pyproject pins the mongomock versions it was tested with.
Every other engine module calls the functions below.

It also patches mongomock's gaps, each checked by an engine test through pymongo:

- BSON comparison order across numeric types (incl. Decimal128), used by ``$lt``/``$gt``,
  sorting and ``$min``/``$max``;
- ``$in``/``$nin`` as a set of BSON sort keys (one hash probe per value, where mongomock
  scanned the whole list per value), ``$eq``/``$ne`` by BSON equality (``1 != true``,
  ``1 == Decimal128("1")``, field order counts), see ``bsonkey``;
- ``$mod``, ``$size`` on non-arrays, ``$type`` aliases ("null", "regex", "timestamp", the
  numeric codes, int vs long by value);
- expressions: ``$getField``/``$setField``/``$unsetField`` (field names with ``$`` or
  dots), ``$type``, ``$add`` with a date, the ``$$NOW``/``$$CLUSTER_TIME`` variables,
  ``$min``/``$max`` accumulators over mixed types.

The patches are installed when this module is first imported.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import numbers
import operator
import random
import re
from collections.abc import Callable
from typing import Any

from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.regex import Regex
from bson.timestamp import Timestamp
from mongomock import OperationFailure, filtering
from mongomock import aggregate as mm_aggregate
from mongomock import collection as mm_collection
from sentinels import NOTHING

from accord.platform.embedded import arithmetic
from accord.platform.embedded.bsonkey import InSet, sort_key
from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.limits import compile_pattern, regex_search
from accord.platform.embedded.values import bson_type_name, compare_values

_PATCHED = False


def _mod(doc_val: Any, spec: Any) -> bool:
    if not isinstance(spec, list) or len(spec) != 2:
        raise OperationFailure("malformed mod, needs to be an array of [divisor, remainder]")
    divisor, remainder = spec
    for what, value in (("divisor", divisor), ("remainder", remainder)):
        # mongod coerces both to a 64-bit integer: NaN, infinities and numbers past it
        # are refused (int() of them raised OverflowError / ValueError here).
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise OperationFailure(f"malformed mod, {what} not a number")
        if isinstance(value, float) and (
            not math.isfinite(value) or not -(2.0**63) <= value < 2.0**63
        ):
            raise OperationFailure(
                f"malformed mod, {what} value is invalid :: caused by :: "
                f"Unable to coerce NaN/Inf or out-of-range value to integral type: {value}"
            )
    if isinstance(doc_val, bool) or not isinstance(doc_val, int | float):
        return False
    if isinstance(doc_val, float) and not math.isfinite(doc_val):
        return False
    if int(divisor) == 0:
        raise OperationFailure("divisor cannot be 0")
    return int(math.fmod(int(doc_val), int(divisor))) == int(remainder)


def _size(doc_val: Any, search_val: Any) -> bool:
    return isinstance(doc_val, list) and len(doc_val) == search_val


def _bson_compare(op: Any, a: Any, b: Any, can_compare_types: bool = True) -> bool:
    if not can_compare_types and _rank(a) != _rank(b):
        return False  # $lt/$gt only compare values of the same canonical type
    return bool(op(compare_values(a, b), 0))


def _rank(value: Any) -> int:
    # Numbers of every type share one rank; everything else is ranked by type name.
    if (
        isinstance(value, numbers.Number)
        and not isinstance(value, bool)
        or type(value).__name__ == "Decimal128"
    ):
        return 10
    if value is None:
        return 5
    return hash(type(value).__name__)


def _extreme(values: Any, sign: int) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    key = functools.cmp_to_key(compare_values)
    return max(present, key=key) if sign > 0 else min(present, key=key)


def _field_argument(parser: Any, operator: str, spec: Any) -> tuple[str, Any]:
    """The field name and input object of ``$getField``/``$setField``/``$unsetField``."""
    if operator == "$getField" and not (isinstance(spec, dict) and "field" in spec):
        spec = {"field": spec}  # the short form: {$getField: <field name>}
    if not isinstance(spec, dict) or "field" not in spec:
        raise OperationFailure(f"{operator} requires 'field' to be specified")
    allowed = {"field", "input", "value"} if operator == "$setField" else {"field", "input"}
    unknown = set(spec) - allowed
    if unknown:
        raise OperationFailure(f"{operator} found an unknown argument: {sorted(unknown)[0]}")
    field = spec["field"]
    if isinstance(field, str) and field.startswith("$"):
        raise OperationFailure(
            f"{operator} requires 'field' to evaluate to a constant, but got a non-constant "
            "argument (use {$literal: ...} for a name that starts with '$')"
        )
    name = parser.parse(field)
    if not isinstance(name, str):
        raise OperationFailure(
            f"{operator} requires 'field' to evaluate to type String, but got "
            f"{bson_type_name(name)}"
        )
    if operator != "$getField" and "input" not in spec:
        raise OperationFailure(f"{operator} requires 'input' to be specified")
    try:
        value = parser.parse(spec.get("input", "$$CURRENT"))
    except KeyError:
        value = None  # a missing input behaves as null
    return name, value


def _get_field(parser: Any, spec: Any) -> Any:
    name, value = _field_argument(parser, "$getField", spec)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise OperationFailure(
            f"$getField requires 'input' to evaluate to type Object, but got {bson_type_name(value)}"
        )
    if name not in value:
        raise KeyError(name)  # missing, as mongomock represents it
    return value[name]


def _set_field(parser: Any, spec: Any, *, remove: bool = False) -> Any:
    operator = "$unsetField" if remove else "$setField"
    name, value = _field_argument(parser, operator, spec)
    if not remove and "value" not in spec:
        raise OperationFailure("$setField requires 'value' to be specified")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise OperationFailure(
            f"{operator} requires 'input' to evaluate to type Object, but got "
            f"{bson_type_name(value)}"
        )
    out = dict(value)
    if not remove and spec["value"] != "$$REMOVE":
        try:
            out[name] = parser.parse(spec["value"])
            return out
        except KeyError:
            pass  # a missing value removes the field, as $$REMOVE does
    out.pop(name, None)
    return out


_SYSTEM_VARIABLES = {"ROOT", "CURRENT", "REMOVE", "NOW", "CLUSTER_TIME", "DESCEND", "PRUNE", "KEEP"}
_COMPARE: dict[str, Callable[[int, int], bool]] = {
    "$eq": operator.eq, "$ne": operator.ne, "$gt": operator.gt,
    "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le,
}  # fmt: skip
_RANDOM = random.Random()


def _rand(parser: Any, spec: Any) -> float:
    if spec != {}:
        raise OperationFailure("$rand does not currently accept arguments")
    return _RANDOM.random()


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_CONVERSIONS = {"$toInt", "$toLong", "$convert"}
_ROUNDING = {"$floor", "$ceil", "$trunc"}


def _non_finite(parser: Any, arg: Any) -> bool:
    """Whether a rounding operator's argument evaluates to NaN or an infinity."""
    value = arg[0] if isinstance(arg, list) and len(arg) == 1 else arg
    try:
        value = parser.parse(value)
    except Exception:  # noqa: BLE001 (the operator itself reports it)
        return False
    return isinstance(value, float) and not math.isfinite(value)


def _mod_divisor_is_zero(parser: Any, arg: Any) -> bool:
    if not isinstance(arg, list) or len(arg) != 2:
        return False
    try:
        divisor = parser.parse(arg[1])
    except Exception:  # noqa: BLE001 (the operator itself reports it)
        return False
    if isinstance(divisor, Decimal128):
        return bool(divisor.to_decimal() == 0)
    return isinstance(divisor, int | float) and not isinstance(divisor, bool) and divisor == 0


def _arithmetic_failure(name: str | None, exc: ArithmeticError) -> OperationFailure:
    """An expression's Python arithmetic error as the error mongod reports (never an
    internal error)."""
    if isinstance(exc, ZeroDivisionError):
        if name == "$mod":
            return OperationFailure("can't $mod by zero", code=16610)
        if name == "$log":
            return OperationFailure(
                "$log's base must be a positive number not equal to 1", code=28759
            )
        if name == "$divide":
            return OperationFailure("can't $divide by zero", code=Code.BadValue)
    if name in _CONVERSIONS:
        return OperationFailure(
            f"Failed to convert the value in {name} with no onError value: {exc}",
            code=Code.ConversionFailure,
        )
    return OperationFailure(f"{name or 'expression'} failed: {exc}", code=Code.BadValue)


# mongod's RCString::create: no expression value may be a string of 16 MB or more.
_MAX_STRING_BYTES = 16 * 1024 * 1024


def _check_string(value: str) -> str:
    """Refuse a string an expression made that mongod could not hold (16493), before the
    next one doubles it: ``$concat`` in a chain of ``$let``s took the engine to 737 MB
    from a 2 KB command, and on to gigabytes one doubling at a time."""
    if len(value) * 4 < _MAX_STRING_BYTES:  # fast path: 4 bytes per code point at most
        return value
    size = len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if size >= _MAX_STRING_BYTES:
        raise OperationFailure("Tried to create string longer than 16MB", code=Code.Location16493)
    return value


def _in_bson_range(name: str | None, value: Any) -> Any:
    """An expression's integer result that BSON cannot hold: for a conversion mongod's
    ConversionFailure, otherwise the double mongod's long arithmetic overflows to; a
    string result of 16 MB or more, mongod's 16493."""
    if type(value) is str:
        return _check_string(value)
    if type(value) is not int and type(value) is not Int64:
        return value
    low, high = (-(2**31), 2**31 - 1) if name == "$toInt" else (_INT64_MIN, _INT64_MAX)
    if low <= value <= high:
        return value
    if name in _CONVERSIONS:
        raise OperationFailure(
            f"Failed to convert the value in {name} with no onError value: Out of range",
            code=Code.ConversionFailure,
        )
    return float(value)


def _bounded_regex(doc_val: Any, rx: Any) -> bool:
    """mongomock's ``$regex`` test, with each match bounded in time (see ``limits``)."""
    if not isinstance(rx, str | re.Pattern | Regex):
        return False
    values = doc_val if isinstance(doc_val, list) else [doc_val]
    return any(regex_search(rx, v) for v in values if isinstance(v, str))


def _regex_match(parser: Any, spec: Any) -> bool:
    """``$regexMatch`` (input, regex, options), bounded in time like ``$regex``."""
    if not isinstance(spec, dict) or "input" not in spec or "regex" not in spec:
        raise OperationFailure("$regexMatch needs an object with 'input' and 'regex'")
    unknown = set(spec) - {"input", "regex", "options"}
    if unknown:
        raise OperationFailure(f"$regexMatch found an unknown argument: {sorted(unknown)[0]}")
    try:
        text = parser.parse(spec["input"])
        rx = parser.parse(spec["regex"])
    except KeyError:
        return False
    if text is None or rx is None:
        return False
    if not isinstance(text, str):
        raise OperationFailure("$regexMatch needs 'input' to be of type string")
    options = spec.get("options", "")
    if not isinstance(options, str) or set(options) - set("imxs"):
        raise OperationFailure(f"$regexMatch invalid flag in regex options: {options!r}")
    flags = 0
    for option in options:
        flags |= getattr(re, option.upper())
    if isinstance(rx, str):
        return regex_search(compile_pattern(rx, flags), text)
    if isinstance(rx, re.Pattern | Regex):
        own = rx.flags if isinstance(rx.flags, int) else 0
        if options and own:
            raise OperationFailure(
                "$regexMatch: regex option(s) specified in both 'regex' and 'option' fields"
            )
        return regex_search(compile_pattern(rx.pattern, own | flags), text)
    raise OperationFailure("$regexMatch needs 'regex' to be of type string or regex")


_FIELD_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "$regexMatch": _regex_match,
    "$rand": _rand,
    "$getField": _get_field,
    "$setField": _set_field,
    "$unsetField": lambda parser, spec: _set_field(parser, spec, remove=True),
}


def _now() -> dt.datetime:
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


# $in lists compiled to sets, keyed by the list object (filters are evaluated under the
# engine lock, one query at a time; the entry holds the list so its id stays unique).
_IN_SETS: dict[int, tuple[Any, InSet]] = {}


def _fast_in(doc_val: Any, search_val: Any) -> bool:
    """mongomock's ``$in``/``$nin`` test with one hash probe per value instead of a scan
    of the whole list (which made large ``$in`` filters quadratic)."""
    if not isinstance(search_val, list | tuple):
        raise OperationFailure("$in needs an array")
    cached = _IN_SETS.get(id(search_val))
    if cached is None or cached[0] is not search_val:
        if len(_IN_SETS) > 256:
            _IN_SETS.clear()
        cached = (search_val, InSet(list(search_val)))
        _IN_SETS[id(search_val)] = cached
    return cached[1].contains(doc_val, missing=doc_val is filtering.NOTHING)


def _bson_eq(doc_val: Any, search_val: Any) -> bool:
    """BSON equality for ``$eq``/``$ne``: ``1 == 1.0 == Decimal128("1")``, but ``1 != true``
    and ``{a, b} != {b, a}`` (mongomock used Python's ``==``, which says otherwise)."""
    if doc_val is filtering.NOTHING:
        return search_val is None
    wanted = sort_key(search_val)
    if sort_key(doc_val) == wanted:
        return True
    return (
        isinstance(doc_val, list)
        and isinstance(search_val, list)
        and any(sort_key(v) == wanted for v in doc_val)
    )


def _apply() -> None:
    """Install the fixes into mongomock (idempotent)."""
    global _PATCHED
    if _PATCHED:
        return
    _PATCHED = True
    filtering.bson_compare = _bson_compare
    ops = filtering._filterer_inst._operator_map
    ops["$mod"] = filtering._not_nothing_and(filtering._list_expand(_mod))
    # $in/$nin by hash probe, $eq/$ne by BSON equality (bsonkey), not Python's ==.
    filtering._in_op = _fast_in
    ops["$in"] = _fast_in
    ops["$eq"] = filtering._list_expand(_bson_eq)
    ops["$ne"] = filtering._list_expand(lambda dv, sv: not _bson_eq(dv, sv), negative=True)
    ops["$size"] = _size
    # Every user regex runs bounded (limits.regex_search), never on Python's re unbounded.
    filtering._regex = _bounded_regex
    ops["$regex"] = filtering._not_nothing_and(_bounded_regex)
    for name, fn in filtering.SORTING_OPERATOR_MAP.items():
        ops[name] = filtering._not_nothing_and(
            filtering._list_expand(filtering._compare_objects(fn))
        )

    types = filtering.TYPE_MAP
    types["null"] = lambda v: v is None
    types["regex"] = lambda v: isinstance(v, re.Pattern | Regex)
    types["timestamp"] = lambda v: isinstance(v, Timestamp)
    types["int"] = lambda v: (
        isinstance(v, int) and not isinstance(v, bool | Int64) and -(2**31) <= v < 2**31
    )
    types["long"] = lambda v: (
        isinstance(v, Int64)
        or (isinstance(v, int) and not isinstance(v, bool) and not -(2**31) <= v < 2**31)
    )
    types["binData"] = lambda v: isinstance(v, bytes | Binary)
    codes = {1: "double", 2: "string", 3: "object", 4: "array", 5: "binData", 7: "objectId", 8: "bool",
             9: "date", 10: "null", 11: "regex", 16: "int", 17: "timestamp", 18: "long", 19: "decimal"}  # fmt: skip
    for code, name in codes.items():
        types[code] = types[name]  # type: ignore[index]

    grouping = mm_aggregate._GROUPING_OPERATOR_MAP
    grouping["$min"] = lambda values: _extreme(values, -1)
    grouping["$max"] = lambda values: _extreme(values, 1)
    original_sum = grouping["$sum"]
    grouping["$sum"] = lambda values: _in_bson_range("$sum", original_sum(values))

    mm_aggregate.type_operators.append("$type")
    parser = mm_aggregate._Parser
    original_type = parser._handle_type_operator
    original_arith = parser._handle_arithmetic_operator
    original_basic = parser._parse_basic_expression

    def handle_type(self: Any, operator: str, values: Any) -> Any:
        if operator == "$type":
            arg = values[0] if isinstance(values, list) and len(values) == 1 else values
            try:
                return bson_type_name(self.parse(arg))
            except KeyError:
                return "missing"
        return original_type(self, operator, values)

    def handle_arith(self: Any, operator: str, values: Any) -> Any:
        if operator == "$add":
            # parsed once: handing ``values`` on parsed them again, at every level of a
            # nested $add (2^depth evaluations: depth 17 froze the engine for 30 s)
            values = values if isinstance(values, list) else [values]
            return arithmetic.add([self._parse_or_none(v) for v in values])
        if operator == "$multiply":
            if not isinstance(values, list):
                values = [values]
            return arithmetic.multiply([self._parse_or_none(v) for v in values])
        if operator in arithmetic.UNARY:
            if operator == "$trunc" and isinstance(values, list) and len(values) == 2:
                return original_arith(self, operator, values)  # $trunc to a place
            (arg,) = arithmetic.arguments(operator, values, 1)
            return arithmetic.unary(operator, self._parse_or_none(arg))
        if operator in arithmetic.BINARY:
            a, b = arithmetic.arguments(operator, values, 2)
            return arithmetic.binary(operator, self._parse_or_none(a), self._parse_or_none(b))
        return original_arith(self, operator, values)

    def parse_or_none(self: Any, expression: Any) -> Any:
        """An operand's value; None for a missing field (arithmetic gives null)."""
        try:
            return self.parse(expression)
        except KeyError:
            return None

    def basic(self: Any, expression: Any) -> Any:
        if expression in ("$$NOW", "$$CLUSTER_TIME"):
            return _now() if expression == "$$NOW" else Timestamp(int(_now().timestamp()), 1)
        if isinstance(expression, str) and expression.startswith("$$"):
            name = expression[2:].split(".", 1)[0]
            if name not in _SYSTEM_VARIABLES and name not in self._user_vars:
                raise OperationFailure(
                    f"Use of undefined variable: {name}", code=Code.Location17276
                )
        return original_basic(self, expression)

    original_parse = parser.parse

    def parse(self: Any, expression: Any) -> Any:
        name = None
        if isinstance(expression, dict) and len(expression) == 1:
            ((name, arg),) = expression.items()
            if name in _FIELD_OPERATORS:
                return _FIELD_OPERATORS[name](self, arg)
            if name in _ROUNDING and _non_finite(self, arg):
                return self.parse(arg)  # mongod rounds NaN and infinities to themselves
        try:
            result = original_parse(self, expression)
        except ArithmeticError as exc:  # ZeroDivisionError, OverflowError
            raise _arithmetic_failure(name, exc) from exc
        except ValueError as exc:
            if name != "$mod":
                raise
            # math.fmod's "math domain error": a zero divisor (mongod's 16610) or an
            # infinite dividend (NaN in mongod's fmod).
            if _mod_divisor_is_zero(self, arg):
                raise OperationFailure("can't $mod by zero", code=16610) from exc
            return math.nan
        return _in_bson_range(name, result)

    def handle_comparison(self: Any, operator: str, values: Any) -> Any:
        # BSON order with a missing operand below null (mongomock uses Python's == and
        # raises on a missing field).
        if not isinstance(values, list) or len(values) != 2:
            count = len(values) if isinstance(values, list) else 1
            raise OperationFailure(
                f"Expression {operator} takes exactly 2 arguments. {count} were passed in."
            )
        a, b = (self._parse_or_nothing(v) for v in values)
        if a is NOTHING or b is NOTHING:
            c = (a is not NOTHING) - (b is not NOTHING)
        else:
            c = compare_values(a, b)
        return c if operator == "$cmp" else _COMPARE[operator](c, 0)

    parser.parse = parse  # type: ignore[method-assign]
    parser._handle_comparison_operator = handle_comparison  # type: ignore[method-assign]
    parser._handle_type_operator = handle_type  # type: ignore[method-assign]
    parser._handle_arithmetic_operator = handle_arith  # type: ignore[method-assign]
    parser._parse_or_none = parse_or_none  # type: ignore[attr-defined]
    parser._parse_basic_expression = basic  # type: ignore[method-assign]


_apply()

__all__ = [
    "OperationFailure",
    "copy_only_fields",
    "evaluate_expression",
    "filter_applies",
    "matches_filter",
    "pipeline_stage",
    "project_stage",
    "resolve_key",
]

# A mongomock Stage handler: (documents, database, stage spec) -> documents.
StageFn = Callable[[list[dict[str, Any]], Any, Any], list[dict[str, Any]]]


def filter_applies(spec: dict[str, Any], doc: Any) -> bool:
    """mongomock's filter matcher (raises mongomock's errors for bad filters)."""
    return bool(filtering.filter_applies(spec, doc))


def matches_filter(spec: dict[str, Any], doc: Any) -> bool:
    """Evaluate a query filter against a document; matcher errors become BadValue."""
    try:
        return bool(filtering.filter_applies(spec, doc))
    except OperationFailure as exc:
        raise EngineError(Code.BadValue, str(exc)) from exc
    except NotImplementedError as exc:
        raise EngineError(Code.BadValue, f"not supported by the embedded engine: {exc}") from exc


def resolve_key(key: str, doc: Any) -> Any:
    """The value at a dotted path as mongomock's matcher sees it."""
    return filtering.resolve_key(key, doc)


def pipeline_stage(name: str) -> StageFn | None:
    """mongomock's handler for an aggregation stage, or None if it has none."""
    handler: StageFn | None = mm_aggregate._PIPELINE_HANDLERS.get(name)
    return handler


def evaluate_expression(
    expression: Any, doc: dict[str, Any], variables: dict[str, Any] | None = None
) -> Any:
    """Evaluate an aggregation expression against ``doc`` with ``$$name`` variables."""
    return mm_aggregate._Parser(doc, user_vars=variables).parse(expression)


def project_stage(doc: dict[str, Any], projection: dict[str, Any]) -> dict[str, Any]:
    """A ``$project`` stage applied to one document."""
    out: dict[str, Any] = mm_aggregate._handle_project_stage([doc], None, projection)[0]
    return out


_PROJECTOR = object.__new__(mm_collection.Collection)


def copy_only_fields(doc: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """mongomock's find projection (inclusion/exclusion, ``$slice``, ``$elemMatch``)."""
    out: dict[str, Any] = _PROJECTOR._copy_only_fields(doc, fields, dict)  # type: ignore[attr-defined]
    return out
