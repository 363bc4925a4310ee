"""A fast yes/no for the common ``$jsonSchema`` validators: a schema compiled once into
nested closures that only say whether a document passes.

:func:`accord.platform.embedded.validation.validate_document` walks a schema and builds
mongod's detailed ``errInfo`` for every document it checks; almost every document
passes, so that detail is wasted work on the hot path (accord's audit records are
validated on every insert, about 27 schema nodes each). :func:`compiled` returns a
checker for a validator made only of the keywords below, else None; a document the
checker passes is valid, and one it fails goes through the detailed walk, which raises
the error. The checker's rules are the walk's, keyword for keyword (type-specific
keywords constrain values of their type only), so both always agree.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any

from bson import DBRef, Int64, ObjectId
from bson.code import Code as JavaScript

from accord.platform.embedded.limits import regex_search
from accord.platform.embedded.validation import BSON_TYPES, JSON_TYPES, count_of, is_number
from accord.platform.embedded.values import compare_values, values_equal

__all__ = ["compiled", "pattern_check"]

Check = Callable[[Any], bool]

#: What the checker understands; any other keyword leaves the schema to the walk.
_SUPPORTED = frozenset({
    "bsonType", "type", "description", "title", "required", "properties", "items",
    "minItems", "maxItems", "minLength", "maxLength", "pattern", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "enum", "additionalProperties",
})  # fmt: skip

_cache: dict[int, tuple[Any, Check | None]] = {}
#: Exact Python types that surely pass a type name (a value of another type, a subclass
#: or an int, goes through the engine's own test).
_SURE: dict[str, tuple[type, ...]] = {
    "string": (str,), "object": (dict,), "array": (list,), "date": (dt.datetime,),
    "objectId": (ObjectId,), "bool": (bool,), "boolean": (bool,), "null": (type(None),),
    "double": (float,), "long": (Int64,),
}  # fmt: skip
#: A pattern without groups and with at most one quantifier cannot backtrack
#: catastrophically, and without escapes or nested sets it means the same to ``re`` as to
#: the ``regex`` package: it runs on the standard library's ``re`` (else on the engine's
#: bounded regex).
_QUANTIFIERS = re.compile(r"[*+?{]")


class _Unsupported(Exception):
    """A keyword (or a form of one) the checker leaves to the detailed walk."""


def compiled(validator: dict[str, Any]) -> Check | None:
    """A yes/no checker for ``validator`` (a collection validator), or None when it is
    not a lone ``$jsonSchema`` of supported keywords. Cached per validator object."""
    hit = _cache.get(id(validator))
    if hit is not None and hit[0] is validator:
        return hit[1]
    check: Check | None = None
    if list(validator) == ["$jsonSchema"] and isinstance(validator["$jsonSchema"], dict):
        try:
            check = _schema(validator["$jsonSchema"])
        except _Unsupported:
            check = None
    if len(_cache) > 256:
        _cache.clear()
    _cache[id(validator)] = (validator, check)
    return check


def _schema(schema: dict[str, Any]) -> Check:
    if not set(schema) <= _SUPPORTED:
        raise _Unsupported
    if schema.get("additionalProperties", True) is not True:
        raise _Unsupported
    if "items" in schema and not isinstance(schema["items"], dict):
        raise _Unsupported
    types: list[tuple[frozenset[type], list[Check]]] = []
    for keyword, table in (("bsonType", BSON_TYPES), ("type", JSON_TYPES)):
        if keyword in schema:
            spec = schema[keyword]
            names = [spec] if isinstance(spec, str) else list(spec)
            sure = {t for name in names for t in _SURE.get(name, ())}
            if keyword == "bsonType" and {"int", "long"} <= set(names):
                sure |= {int, Int64}  # an int is int32 or else long: either passes
            types.append((frozenset(sure), [table[name] for name in names]))
    bounds = [
        (schema[bound], bool(schema.get(exclusive, False)), sign, _plain_number(schema[bound]))
        for bound, exclusive, sign in (("minimum", "exclusiveMinimum", 1), ("maximum", "exclusiveMaximum", -1))
        if bound in schema
    ]  # fmt: skip
    counts = {k: count_of(schema, k) for k in ("minLength", "maxLength", "minItems", "maxItems") if k in schema}  # fmt: skip
    min_len, max_len = counts.get("minLength"), counts.get("maxLength")
    min_items, max_items = counts.get("minItems"), counts.get("maxItems")
    pattern = pattern_check(schema["pattern"]) if "pattern" in schema else None
    item = _schema(schema["items"]) if "items" in schema else None
    required = list(schema.get("required", ()))
    props = [(name, _schema(sub)) for name, sub in schema.get("properties", {}).items()]
    options = schema.get("enum")
    # an enum of strings asked about a string: a set lookup (the same equality)
    strings = (
        frozenset(options)
        if isinstance(options, list) and all(type(o) is str for o in options)
        else None
    )

    def check(value: Any) -> bool:
        kind = type(value)
        for sure, tests in types:
            if kind not in sure and not any(t(value) for t in tests):
                return False
        if kind is str:
            if min_len is not None and len(value) < min_len:
                return False
            if max_len is not None and len(value) > max_len:
                return False
            if pattern is not None and not pattern(value):
                return False
        elif kind is dict:
            for name in required:
                if name not in value:
                    return False
            for name, sub in props:
                if name in value and not sub(value[name]):
                    return False
        elif is_number(value):
            for limit, strict, sign, plain in bounds:
                if plain and kind is int:  # two plain numbers, neither NaN: as Python compares
                    c = ((value > limit) - (value < limit)) * sign
                else:
                    c = compare_values(value, limit) * sign  # > 0: on the allowed side
                if c < 0 or (c == 0 and strict):
                    return False
        elif isinstance(value, str) and not isinstance(value, JavaScript):
            if min_len is not None and len(value) < min_len:
                return False
            if max_len is not None and len(value) > max_len:
                return False
            if pattern is not None and not pattern(value):
                return False
        elif isinstance(value, list | tuple):
            if min_items is not None and len(value) < min_items:
                return False
            if max_items is not None and len(value) > max_items:
                return False
            if item is not None and not all(item(x) for x in value):
                return False
        elif isinstance(value, dict | DBRef):
            doc = value.as_doc() if isinstance(value, DBRef) else value
            for name in required:
                if name not in doc:
                    return False
            for name, sub in props:
                if name in doc and not sub(doc[name]):
                    return False
        if options is not None:
            if strings is not None and kind is str:
                return value in strings
            return any(values_equal(value, o, ignore_field_order=True) for o in options)
        return True

    return check


def _plain_number(limit: Any) -> bool:
    """A bound Python compares with an ``int`` as mongod does: an int or a float, not NaN."""
    return type(limit) is int or (type(limit) is float and limit == limit)


def pattern_check(pattern: Any) -> Check:
    """Whether a string matches ``pattern`` somewhere (the engine's semantics)."""
    simple = (  # no group, escape or nested set (POSIX classes are the regex package's)
        isinstance(pattern, str) and not any(c in pattern for c in ("(", "\\", "[[", "[:"))
    )
    if simple and len(_QUANTIFIERS.findall(pattern)) <= 1:
        try:
            compiled_re = re.compile(pattern)
        except re.error:
            pass
        else:
            return lambda v: compiled_re.search(v) is not None
    return lambda v: regex_search(pattern, v)
