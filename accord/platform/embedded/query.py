"""Query-side evaluators: filters, sorting, projection, identity keys and index keys.

mongomock's evaluators do the matching and BSON ordering (they are right for the
operators the platform uses); this module wraps them so their Python exceptions become
MongoDB error replies, and adds what mongomock lacks (canonical keys, index key
extraction).
"""

from __future__ import annotations

import functools
import math
import re
import struct
from collections.abc import Iterable
from typing import Any

import bson
from bson.int64 import Int64
from bson.regex import Regex

from accord.platform.embedded import collation, limits, mongomock_bridge
from accord.platform.embedded.errors import Code, EngineError, bad_value
from accord.platform.embedded.mongomock_bridge import OperationFailure
from accord.platform.embedded.paths import MISSING
from accord.platform.embedded.positional import positional_index
from accord.platform.embedded.values import compare_values

_NORMALISED: dict[int, tuple[Any, dict[str, Any]]] = {}


def _normalise(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with plain equality on scalars and documents as ``$eq`` (so it gets BSON
    equality); arrays and regexes keep their own matching rules."""
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key in ("$and", "$or", "$nor") and isinstance(value, list):
            out[key] = [_normalise(v) if isinstance(v, dict) else v for v in value]
        elif key.startswith("$"):
            out[key] = value
        elif isinstance(value, dict) and value and all(k.startswith("$") for k in value):
            out[key] = {
                op: _normalise(arg)
                if op == "$elemMatch"
                and isinstance(arg, dict)
                and arg
                and not next(iter(arg)).startswith("$")
                else arg
                for op, arg in value.items()
            }
        elif isinstance(value, list | re.Pattern | Regex) or (
            isinstance(value, dict) and any(k.startswith("$") for k in value)
        ):
            out[key] = value
        else:
            out[key] = {"$eq": value}
    return out


def _normalised(spec: dict[str, Any]) -> dict[str, Any]:
    cached = _NORMALISED.get(id(spec))
    if cached is None or cached[0] is not spec:
        if len(_NORMALISED) > 256:
            _NORMALISED.clear()
        cached = (spec, _normalise(spec))
        _NORMALISED[id(spec)] = cached
    return cached[1]


_KNOWN_QUERY_OPS = {
    "$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$and", "$or", "$nor", "$not",
    "$exists", "$type", "$regex", "$options", "$elemMatch", "$size", "$all", "$mod", "$expr",
    "$comment", "$jsonSchema", "$bitsAllSet", "$bitsAnySet", "$bitsAllClear", "$bitsAnyClear",
}  # fmt: skip


def check_filter(spec: Any, *, top: bool = True) -> None:
    """Reject malformed filters up front with mongod's errors (code 2 BadValue)."""
    if not isinstance(spec, dict):
        raise bad_value("the match filter must be an expression in an object")
    for key, value in spec.items():
        if key.startswith("$"):
            if key in ("$and", "$or", "$nor"):
                if not isinstance(value, list) or not value:
                    raise bad_value(f"{key} argument must be a non-empty array")
                for sub in value:
                    check_filter(sub, top=False)
            elif key not in ("$expr", "$comment", "$jsonSchema", "$where", "$text"):
                raise bad_value(f"unknown top level operator: {key}")
        elif isinstance(value, dict) and value and next(iter(value)).startswith("$"):
            for op in value:
                if op not in _KNOWN_QUERY_OPS:
                    raise bad_value(f"unknown operator: {op}")
                if op in ("$in", "$nin", "$all") and not isinstance(value[op], list):
                    raise bad_value(f"{op} needs an array")
                if op == "$elemMatch" and not isinstance(value[op], dict):
                    raise bad_value("$elemMatch needs an Object")


_INTEGERS = (int, Int64)


def _plain_equalities(spec: dict[str, Any], doc: dict[str, Any]) -> bool | None:
    """The answer for a filter of top-level string or integer equalities when the
    document's fields hold values of the same kind (what a fenced update by ``_id``
    sends), without the general evaluator; None when it cannot tell (arrays, other
    types, missing fields, dotted paths, operators: the general evaluator decides)."""
    found = True
    for key, want in spec.items():
        kind = type(want)
        if not key or "." in key or key[0] == "$":
            return None
        have = doc.get(key)
        if kind is str:
            if type(have) is not str:
                return None
        elif kind is int or kind is Int64:
            if type(have) not in _INTEGERS:
                return None
        else:
            return None
        if have != want:
            found = False
    return found


def matches(spec: dict[str, Any], doc: dict[str, Any]) -> bool:
    if not spec:
        return True
    limits.check()  # maxTimeMS, once per document examined
    if collation.current() is not None:
        spec, doc = collation.collate_filter(spec), collation.collate(doc)
    else:
        quick = _plain_equalities(spec, doc)
        if quick is not None:
            return quick
    try:
        return mongomock_bridge.filter_applies(_normalised(spec), doc)
    except EngineError:
        raise
    except OperationFailure as exc:
        raise EngineError(exc.code or Code.BadValue, f"cannot evaluate filter: {exc}") from exc
    except (NotImplementedError, TypeError, ValueError, KeyError) as exc:
        raise bad_value(f"cannot evaluate filter: {exc}") from exc


def sort_value(doc: dict[str, Any], key: str, direction: int) -> Any:
    """The value mongod sorts ``doc`` by: an array sorts by its smallest element
    ascending and its largest descending; a missing field sorts as null."""
    values = [v for v in path_values(doc, key, empty_array_as_null=False) if v is not MISSING]
    raw = mongomock_bridge.resolve_key(key, doc)
    if isinstance(raw, list) and not raw:
        return _EMPTY_ARRAY
    if not values:
        return None
    values = [collation.collate(v) for v in values]
    if len(values) == 1:
        return values[0]
    key_fn = functools.cmp_to_key(compare_values)
    return min(values, key=key_fn) if direction > 0 else max(values, key=key_fn)


class _EmptyArray:
    """An empty array sorts before null in mongod."""


_EMPTY_ARRAY = _EmptyArray()


def _compare_sort_values(a: Any, b: Any) -> int:
    if a is _EMPTY_ARRAY or b is _EMPTY_ARRAY:
        return (b is _EMPTY_ARRAY) - (a is _EMPTY_ARRAY) if a is not b else 0
    return compare_values(a, b)


def _native_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "str"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return None if isinstance(value, float) and math.isnan(value) else "number"
    return None


def sort_docs(docs: list[dict[str, Any]], spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Stable multi-key sort in BSON order; the last key is applied first."""
    limits.check()
    for key, direction in reversed(list(spec.items())):
        if isinstance(direction, dict):
            raise bad_value(f"unsupported sort specification for {key!r}: {direction}")
        if direction not in (1, -1):
            raise bad_value(f"bad sort specification: {key!r} must be 1 or -1")
        if key == "$natural":
            if direction < 0:
                docs = list(reversed(docs))
            continue
        keyed = [(sort_value(d, key, direction), d) for d in docs]
        kinds = {_native_kind(v) for v, _ in keyed}
        if len(kinds) == 1 and None not in kinds:
            # One native type (all strings, or all non-bool numbers): Python's order is BSON's.
            keyed.sort(key=lambda pair: pair[0], reverse=direction < 0)
        else:
            cmp = functools.cmp_to_key(_compare_sort_values)
            keyed.sort(key=lambda pair: cmp(pair[0]), reverse=direction < 0)
        docs = [d for _, d in keyed]
    return docs


def project(
    doc: dict[str, Any], projection: dict[str, Any] | None, filt: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Apply a find projection (inclusion/exclusion, positional ``a.$``, ``$slice``,
    ``$elemMatch``, computed fields); ``filt`` is the query, for the positional form."""
    if not projection:
        return doc
    if _top_level_exclusion(projection):
        # The common case (leave out a few top-level fields) without mongomock's copying
        # of every field: 10x faster. The result shares values with ``doc``.
        return {k: v for k, v in doc.items() if k not in projection}
    positional = [k for k in projection if k.endswith(".$")]
    if positional:
        if len(positional) > 1:
            raise bad_value("Cannot specify more than one positional projection per query.")
        path = positional[0][:-2]
        index = positional_index(doc, tuple(path.split(".")), filt)
        rest = {k: v for k, v in projection.items() if k != positional[0]}
        out = project(doc, {**rest, path: 1})
        holder: Any = out
        parts = path.split(".")
        for part in parts[:-1]:
            holder = holder.get(part, {}) if isinstance(holder, dict) else {}
        if isinstance(holder, dict) and isinstance(holder.get(parts[-1]), list):
            array = holder[parts[-1]]
            holder[parts[-1]] = array[index : index + 1]
        return out
    if any(_is_expression(v) for v in projection.values()):
        # MongoDB 4.4+ find projections may compute fields: evaluate as a $project stage.
        try:
            return mongomock_bridge.project_stage(doc, projection)
        except (OperationFailure, NotImplementedError, KeyError, TypeError, ValueError) as exc:
            raise bad_value(f"invalid projection: {exc}") from exc
    fields = {}
    for key, value in projection.items():
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, float | int):
            value = int(value != 0)
        elif isinstance(value, dict) and set(value) <= {"$slice", "$elemMatch"}:
            pass
        else:
            raise bad_value(f"unsupported projection value for {key!r}: {value!r}")
        fields[key] = value
    try:
        out = mongomock_bridge.copy_only_fields(doc, fields)
        if "_id" in out and next(iter(out)) != "_id":
            out = {"_id": out.pop("_id"), **out}  # mongod keeps _id first
        return out
    except ValueError as exc:
        raise EngineError(
            Code.Location31254, f"Cannot mix inclusion and exclusion in projection: {exc}"
        ) from exc
    except (OperationFailure, NotImplementedError) as exc:
        raise bad_value(str(exc)) from exc


def _top_level_exclusion(projection: dict[str, Any]) -> bool:
    """Whether ``projection`` only excludes top-level fields (``{a: 0, b: false}``)."""
    for key, value in projection.items():
        if "." in key or key.startswith("$") or not key:
            return False
        if isinstance(value, bool):
            if value:
                return False
        elif not isinstance(value, int | float) or value != 0:
            return False
    return True


def _is_expression(value: Any) -> bool:
    if isinstance(value, str):
        return True
    if isinstance(value, dict):
        return not set(value) <= {"$slice", "$elemMatch"}
    return False


def canonical(value: Any) -> Any:
    """Normalise values that MongoDB treats as equal keys (1 == 1.0 == Int64(1))."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return Int64(int(value))
    if isinstance(value, int):
        return Int64(value) if -(2**63) <= value < 2**63 else float(value)
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def value_key(value: Any) -> bytes:
    """Hashable encoding of a value under MongoDB equality (for lookup maps)."""
    return bson.encode({"": canonical(value)})


def is_plain_equality(value: Any) -> bool:
    """True for filter values that match by plain equality on scalars/documents."""
    if value is None or isinstance(value, list | re.Pattern | Regex):
        return False
    if isinstance(value, dict):
        return not any(k.startswith("$") for k in value)
    return True


def is_plain_in(value: Any) -> bool:
    """True for ``{"$in": [plain values]}``, which a lookup map answers by union."""
    return (
        isinstance(value, dict)
        and len(value) == 1
        and isinstance(value.get("$in"), list)
        and all(is_plain_equality(v) for v in value["$in"])
    )


def id_key(value: Any) -> bytes:
    """The storage key of a document's ``_id``."""
    if type(value) is str:
        try:
            text = value.encode()
        except UnicodeEncodeError:
            pass  # (lone surrogates) bson.encode below raises its own error for them
        else:
            # {"": value} as BSON, built directly: the common string _id.
            n = len(text) + 1
            return _STRING_KEY_HEAD.pack(n + 11, 2, 0, n) + text + b"\x00\x00"
    return bson.encode({"": canonical(value)})


_STRING_KEY_HEAD = struct.Struct("<iBBi")


def path_values(doc: Any, path: str, *, empty_array_as_null: bool = True) -> list[Any]:
    """Values at a dotted path, expanding arrays as a multikey index does.

    An empty array is one ``null`` key for an index; ``distinct`` wants nothing for it.
    """
    current: list[Any] = [doc]
    for part in path.split("."):
        nxt: list[Any] = []
        for value in current:
            if isinstance(value, dict):
                nxt.append(value.get(part, MISSING))
            elif isinstance(value, list):
                if part.isdigit() and int(part) < len(value):
                    nxt.append(value[int(part)])
                else:
                    nxt.extend(v.get(part, MISSING) for v in value if isinstance(v, dict))
            else:
                nxt.append(MISSING)
        current = nxt
    out: list[Any] = []
    for value in current:
        if isinstance(value, list):
            out.extend(value if value or not empty_array_as_null else [None])
        else:
            out.append(value)
    return out


def key_value(doc: dict[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """The ``keyValue`` mongod reports in a duplicate-key error."""
    out: dict[str, Any] = {}
    for f in fields:
        vals = path_values(doc, f)
        out[f] = None if not vals or vals[0] is MISSING else vals[0]
    return out
