"""BSON order as Python order: sort keys for index entries, in-memory sorts and ``$in`` sets.

``sort_key(v)`` maps a BSON value to a tuple whose Python ordering is mongod's comparison
order (``update.compare_values``) and whose equality is BSON equality: numbers of every
type compare by value (``1 == 1.0 == Int64(1) == Decimal128("1")``, with equal hashes),
types are ranked as mongod canonicalises them, documents compare element by element
(type, then name, then value), arrays element by element. Tuples of plain Python values
compare in C, which is what makes ordered indexes (``sortedcontainers``) and sorts fast;
a property test pins ``sort_key`` to ``compare_values``.

Also here: ``TOP`` (above every key, for open index bounds), type brackets, and ``InSet``,
the O(1)-per-value ``$in`` test.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import uuid
from decimal import Decimal
from typing import Any

from bson.binary import Binary
from bson.code import Code
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from accord.platform.embedded.collation import CollatedStr
from accord.platform.embedded.limits import regex_search

# mongod's canonical type ranks (bsontypes.h canonicalizeBSONType).
MINKEY, NULL, NUMBER, STRING, OBJECT, ARRAY, BINDATA = -1, 5, 10, 15, 20, 25, 30
OBJECTID, BOOL, DATE, TIMESTAMP, REGEX, CODE, MAXKEY, OTHER = 35, 40, 45, 47, 50, 60, 127, 100

NULL_KEY: tuple[Any, ...] = (NULL,)
_NAN_KEY: tuple[Any, ...] = (NUMBER, 0)
_EPOCH = dt.datetime(1970, 1, 1)
_MS = dt.timedelta(milliseconds=1)


def _date_millis(value: dt.datetime) -> int:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return (value - _EPOCH) // _MS


# Keys of strings seen so far, shared: index entries of a low-cardinality field (a tenant,
# a namespace, a status) then hold one key object per value instead of one per document.
# Bounded: once full, new strings just get their own key.
_STRING_KEYS: dict[str, tuple[Any, ...]] = {}
_STRING_KEYS_MAX = 1 << 16


def sort_key(value: Any) -> tuple[Any, ...]:
    """The comparable, hashable key of ``value`` in BSON order (see the module docstring)."""
    t = type(value)
    # Exact-type fast paths for the common cases; subclasses fall through to isinstance.
    if t is str:
        key = _STRING_KEYS.get(value)
        if key is None:
            key = (STRING, value)
            if len(_STRING_KEYS) < _STRING_KEYS_MAX:
                _STRING_KEYS[value] = key
        return key
    if t is int:
        return (NUMBER, 1, value)
    if t is ObjectId:
        return (OBJECTID, value.binary)
    if value is None:
        return NULL_KEY
    if t is float:
        return _NAN_KEY if value != value else (NUMBER, 1, value)
    if t is bool:
        return (BOOL, value)
    if t is dt.datetime:
        return (DATE, _date_millis(value))
    if t is dict:
        return (OBJECT, tuple(_element(k, v) for k, v in value.items()))
    if t is list:
        return (ARRAY, tuple(sort_key(v) for v in value))
    return _slow_key(value)


def _element(name: str, value: Any) -> tuple[Any, ...]:
    # An embedded document's element compares by type, then name, then value.
    k = sort_key(value)
    return (k[0], name, k)


def _slow_key(value: Any) -> tuple[Any, ...]:
    if isinstance(value, bool):
        return (BOOL, bool(value))
    if isinstance(value, Code):  # a str subclass: before str
        return (CODE, str(value))
    if isinstance(value, CollatedStr):  # a command's collation is active: its key decides
        return (STRING, value.collation_key)
    if isinstance(value, str):
        return (STRING, str(value))
    if isinstance(value, int):
        return (NUMBER, 1, int(value))
    if isinstance(value, float):
        return _NAN_KEY if math.isnan(value) else (NUMBER, 1, float(value))
    if isinstance(value, Decimal128):
        d = value.to_decimal()
        return _NAN_KEY if d.is_nan() else (NUMBER, 1, d)
    if isinstance(value, Decimal):
        return _NAN_KEY if value.is_nan() else (NUMBER, 1, value)
    if isinstance(value, DBRef):
        return sort_key(value.as_doc())
    if isinstance(value, dict):
        return (OBJECT, tuple(_element(k, v) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (ARRAY, tuple(sort_key(v) for v in value))
    if isinstance(value, uuid.UUID):
        return (BINDATA, 16, 4, value.bytes)
    if isinstance(value, bytes):
        subtype = value.subtype if isinstance(value, Binary) else 0
        return (BINDATA, len(value), subtype, bytes(value))
    if isinstance(value, ObjectId):
        return (OBJECTID, value.binary)
    if isinstance(value, dt.datetime):
        return (DATE, _date_millis(value))
    if isinstance(value, DatetimeMS):
        return (DATE, int(value))
    if isinstance(value, Timestamp):
        return (TIMESTAMP, value.time, value.inc)
    if isinstance(value, re.Pattern):
        return (REGEX, value.pattern, str(Regex.from_native(value).flags))
    if isinstance(value, Regex):
        return (REGEX, value.pattern, str(value.flags))
    if isinstance(value, MinKey):
        return (MINKEY,)
    if isinstance(value, MaxKey):
        return (MAXKEY,)
    return (OTHER, type(value).__name__, repr(value))


def bracket(key: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The keys just below and just above every key of ``key``'s type (type bracketing:
    ``$gt: 5`` only matches numbers)."""
    rank = key[0]
    return (rank - 0.5,), (rank + 0.5,)


# A key above every sort key (ranks are at most 127): a probe ``(*prefix, TOP)`` sorts after
# every entry that starts with ``prefix``, compared in C like any other tuple.
TOP: tuple[Any, ...] = (1000,)

_RE_TYPES = (re.Pattern, Regex)


class InSet:
    """``{field: {$in: values}}`` as a set of sort keys: one hash probe per document value
    instead of mongomock's scan of the whole list per value (quadratic for large lists)."""

    __slots__ = ("keys", "regexes", "has_null")

    def __init__(self, values: list[Any]) -> None:
        self.keys: set[tuple[Any, ...]] = set()
        self.regexes: list[re.Pattern[str]] = []
        self.has_null = False
        for v in values:
            if isinstance(v, _RE_TYPES):
                self.regexes.append(v.try_compile() if isinstance(v, Regex) else v)
            else:
                if v is None:
                    self.has_null = True
                self.keys.add(sort_key(v))

    def contains(self, doc_value: Any, *, missing: bool) -> bool:
        """Whether a document's value (or, for an array, any element of it or the array
        itself) equals one of the values or matches one of the regexes."""
        if missing:
            return self.has_null
        keys = self.keys
        if isinstance(doc_value, list):
            if sort_key(doc_value) in keys:
                return True
            candidates: list[Any] = doc_value
        else:
            candidates = [doc_value]
        for v in candidates:
            if sort_key(v) in keys:
                return True
            if self.regexes and isinstance(v, str):
                for rx in self.regexes:
                    if regex_search(rx, v):  # bounded: see limits
                        return True
        return False
