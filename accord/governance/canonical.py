"""Canonical bytes for BSON values: RFC 8785 JSON with BSON types tagged explicitly.

An audit record is hashed over a canonical encoding, so that the hash a writer computed
can be computed again by anyone who reads the record back: through pymongo today, from
an export tomorrow. RFC 8785 (the JSON Canonicalization Scheme, the ``rfc8785``
package) fixes the JSON side: object keys sorted by their UTF-16 code units, no
whitespace, strings and numbers in one spelling. BSON has types JSON lacks, and a
value must encode the same before it was stored and after it was read back, so
:func:`to_json` maps each BSON value to a JSON value first, explicitly:

======================  ================================================================
BSON / Python value     JSON value
======================  ================================================================
string, bool, null      itself
int in int32's range    a JSON number
larger int, ``Int64``   ``{"$numberLong": "<decimal>"}``: what BSON stores as int64
                        (pymongo writes an ``int`` outside int32 as int64 and reads
                        every int64 back as ``Int64``, so both sides spell it alike)
double                  a JSON number (RFC 8785's ECMAScript spelling); NaN and
                        ±Infinity as ``{"$numberDouble": "NaN" | "Infinity" | "-Infinity"}``
datetime                ``{"$date": "YYYY-MM-DDTHH:MM:SS.mmmZ"}``: UTC, milliseconds
                        (BSON's precision; a naive datetime, as pymongo returns them,
                        is UTC)
bytes, ``Binary``       ``{"$binary": "<base64>", "$type": "<subtype, 2 hex digits>"}``
``ObjectId``            ``{"$oid": "<24 hex digits>"}``
``Decimal128``          ``{"$numberDecimal": "<string>"}``
``UUID``                as the ``Binary`` of subtype 4 it is stored as
mapping                 an object (keys are strings; order does not matter)
list, tuple             an array
anything else           its canonical MongoDB Extended JSON (``bson.json_util``):
                        ``Timestamp``, ``Regex``, ``MinKey``, ``Code``, ...
======================  ================================================================

What this does not tell apart: an integral double and an integer of the same value
(``1.0`` and ``1``: JSON has one number type, and RFC 8785 writes both as ``1``), and a
document's key order (sorted away). Neither changes what a document means to a query.

Speed: ``rfc8785`` is pure Python (about 5 us per JSON node). A tree without floats
whose keys have no character at or above U+E000 (where UTF-16 order and code-point order
part) has the same RFC 8785 bytes as the standard library's C encoder with sorted keys,
no whitespace and no ASCII escaping (RFC 8785 escapes exactly what it escapes: ``"``,
``\\`` and the control characters, in the same spellings); such trees, nearly every
record, take that path. tests/governance/test_canonical.py checks both paths against
``rfc8785.dumps`` byte for byte on generated values. That is the reference path (``_exact``).

Bulk reads (the compliance export and its verifier, a million records at a time) take a
faster path still, :func:`canonical_read`: ``orjson`` serializes the tree in C (sorted
keys, RFC 8785's string escapes) with the BSON types spelled as above by its ``default``,
for a tree read so that every double is a :class:`Double` (pymongo with
:data:`READ_CODEC`; ``json.loads`` with ``parse_float=Double``): a tree with a double,
an integer outside ±(2^53-1), a type other than the common ones (``ObjectId``,
datetime, ``Int64``, bytes, ``Binary``) or a character at or above U+E000 goes to the
reference path instead, so the bytes are the reference's (the tests check both on
generated values). A plain ``int`` in such a tree is in int32's range: pymongo reads every int64
as ``Int64``, and :func:`canonical` spells a wider ``int`` as ``$numberLong``, so a JSON
line holds none either (a wider plain ``int`` would be spelled as a number here and
fail verification, never pass it).

:func:`canonical` itself (the audit hook hashes about 20 values per transaction with it)
takes that path too: it encodes the value as pymongo would store it and decodes it as a
bulk read reads it (both in C), so the bytes are those of what is stored; a value BSON
cannot carry (a non-string key, an integer beyond int64, a lone surrogate, an unknown
type) goes through :func:`to_json`, which spells it or refuses it. About 1.6x faster on
a checkpoint's documents; ``tests/governance/test_canonical.py`` checks it against the
reference path byte for byte on generated values of every type in the table.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import bson
import orjson
import rfc8785
from bson import Binary, Decimal128, Int64, ObjectId, json_util
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions, TypeDecoder, TypeRegistry
from bson.errors import InvalidDocument

from accord.errors import InvalidInputError

__all__ = ["READ_CODEC", "Double", "canonical", "canonical_read", "digest", "ms", "to_json"]

#: pymongo writes an ``int`` in this range as BSON int32, any other as int64.
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_EXT_JSON = json_util.JSONOptions(
    json_mode=json_util.JSONMode.CANONICAL, uuid_representation=UuidRepresentation.STANDARD
)


def ms(when: datetime) -> datetime:
    """``when`` in UTC, cut to milliseconds: what BSON stores, so what is hashed before
    the write is what is read back."""
    if when.tzinfo is None:  # pymongo's naive datetimes are UTC
        return when.replace(microsecond=when.microsecond // 1000 * 1000, tzinfo=UTC)
    if when.tzinfo is UTC and when.microsecond % 1000 == 0:
        return when  # already what BSON stores
    when = when.astimezone(UTC)
    return when.replace(microsecond=when.microsecond // 1000 * 1000)


def to_json(value: Any) -> Any:
    """``value`` (a BSON value, as written or as pymongo reads it) as a plain JSON value
    (module docstring's table)."""
    return _Converter()(value)


def canonical(value: Any) -> bytes:
    """The RFC 8785 bytes of ``value`` (through :func:`to_json`).

    A value BSON can carry takes the bulk read's path (module docstring, "Speed"): encoded
    as pymongo would store it and decoded as a bulk read reads it back, so the bytes are
    those of what is stored (the point of hashing a value before it is written); any other
    value is converted in Python (:func:`to_json`) and may be refused there."""
    try:
        raw = bson.encode({"v": value}, codec_options=_WRITE_CODEC)
    except _UNENCODABLE:
        return _exact(value)
    return _read_bytes(bson.decode(raw, codec_options=READ_CODEC)["v"])


def _exact(value: Any) -> bytes:
    """:func:`canonical` through :func:`to_json`, node by node (the reference path)."""
    convert = _Converter()
    tree = convert(value)
    if convert.plain:
        return _FAST.encode(tree).encode()
    return rfc8785.dumps(tree)


#: The standard library's encoder, spelled as RFC 8785 for plain trees (module docstring).
_FAST = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"))
#: From this character on, code-point order and UTF-16 order part.
_ORDER_SAFE = "\ue000"


class _Converter:
    """:func:`to_json` in one pass, noting whether the tree is ``plain`` (no float, no key
    with a character >= U+E000: the standard library's encoder spells it as RFC 8785).
    The exact built-in types are tested first: they are nearly every node."""

    __slots__ = ("plain",)

    def __init__(self) -> None:
        self.plain = True

    def __call__(self, value: Any) -> Any:
        kind = type(value)
        if kind is str or kind is bool or value is None:
            return value
        if kind is int:
            return value if _INT32_MIN <= value <= _INT32_MAX else {"$numberLong": str(value)}
        if kind is dict:
            return self._document(value)
        if kind is list or kind is tuple:
            return [self(v) for v in value]
        if kind is datetime:
            return {"$date": _date(value)}
        if kind is ObjectId:
            return {"$oid": str(value)}
        if kind is bytes:
            return {"$binary": base64.b64encode(value).decode(), "$type": "00"}
        return self._other(value)

    def _document(self, value: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, v in value.items():
            if type(key) is not str:
                if not isinstance(key, str):
                    raise InvalidInputError(
                        f"a document's keys must be strings (BSON's are); got {key!r}"
                    )
                key = str(key)
            if not key.isascii() and max(key) >= _ORDER_SAFE:
                self.plain = False
            kind = type(v)  # the leaves inline: one call less per field
            if (
                kind is str
                or kind is bool
                or v is None
                or (kind is int and _INT32_MIN <= v <= _INT32_MAX)
            ):
                out[key] = v
            elif kind is dict:
                out[key] = self._document(v)
            else:
                out[key] = self(v)
        return out

    def _other(self, value: Any) -> Any:
        if isinstance(value, str):  # a str subclass (an enum's value): the string BSON stores
            return str.__str__(value)
        if isinstance(value, Int64) or (
            isinstance(value, int) and not _INT32_MIN <= value <= _INT32_MAX
        ):
            return {"$numberLong": str(int(value))}
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            if math.isnan(value):
                return {"$numberDouble": "NaN"}
            if math.isinf(value):
                return {"$numberDouble": "Infinity" if value > 0 else "-Infinity"}
            self.plain = False
            return float(value)
        if isinstance(value, Mapping):
            return self._document(value)
        if isinstance(value, list | tuple):
            return [self(v) for v in value]
        if isinstance(value, datetime):
            return {"$date": _date(value)}
        if isinstance(value, ObjectId):
            return {"$oid": str(value)}
        if isinstance(value, uuid.UUID):
            value = Binary.from_uuid(value)
        if isinstance(value, Binary):  # before bytes: Binary is a bytes subclass
            data = base64.b64encode(bytes(value)).decode()
            return {"$binary": data, "$type": f"{value.subtype:02x}"}
        if isinstance(value, bytes | bytearray | memoryview):
            return {"$binary": base64.b64encode(bytes(value)).decode(), "$type": "00"}
        if isinstance(value, Decimal128):
            return {"$numberDecimal": str(value)}
        return json.loads(json_util.dumps(value, json_options=_EXT_JSON))


def _date(value: datetime) -> str:
    """``value`` as RFC 3339 UTC text with milliseconds (``2026-12-05T05:06:07.891Z``)."""
    w = ms(value)
    if w.year < 1000:  # strftime's own spelling of a short year
        return w.strftime("%Y-%m-%dT%H:%M:%S.") + f"{w.microsecond // 1000:03d}Z"
    return (
        f"{w.year}-{w.month:02d}-{w.day:02d}T{w.hour:02d}:{w.minute:02d}:{w.second:02d}."
        f"{w.microsecond // 1000:03d}Z"
    )


class Double(float):
    """A double as a bulk read marks it (:data:`READ_CODEC`, ``parse_float``): the value
    itself (a ``float``), which :func:`canonical_read` leaves to the reference path."""

    __slots__ = ()


class _DoubleDecoder(TypeDecoder):
    bson_type = float

    def transform_bson(self, value: Any) -> Double:
        return Double(value)


#: pymongo codec options that decode every BSON double as a :class:`Double` (naive UTC
#: datetimes, as the default options).
READ_CODEC: CodecOptions[dict[str, Any]] = CodecOptions(
    type_registry=TypeRegistry([_DoubleDecoder()])
)
#: How :func:`canonical` encodes a value as pymongo would write it (a ``uuid.UUID`` as the
#: standard binary subtype 4 the table spells).
_WRITE_CODEC: CodecOptions[dict[str, Any]] = CodecOptions(
    uuid_representation=UuidRepresentation.STANDARD
)
#: What ``bson.encode`` raises for a value BSON cannot carry (a non-string key, an int
#: beyond int64, a lone surrogate, a type it does not know, a tree too deep).
_UNENCODABLE = (InvalidDocument, OverflowError, TypeError, ValueError, RecursionError)
_READ_OPTIONS = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | (
        orjson.OPT_PASSTHROUGH_DATETIME
        | orjson.OPT_STRICT_INTEGER
        | orjson.OPT_PASSTHROUGH_DATACLASS
    )
)


class _Other(TypeError):
    """A value :func:`canonical_read`'s ``orjson`` path leaves to the reference path."""


def _spelled(value: Any) -> Any:
    """``orjson``'s ``default``: the BSON types of nearly every record, as :func:`to_json`
    spells them (checked by exact type: a subclass may spell itself otherwise)."""
    kind = type(value)
    if kind is ObjectId:
        return {"$oid": str(value)}
    if kind is datetime:
        if value.tzinfo is None and value.year >= 1000:  # pymongo's (naive UTC): faster
            return {"$date": value.isoformat(timespec="milliseconds") + "Z"}
        return {"$date": _date(value)}
    if kind is Int64:
        return {"$numberLong": str(int(value))}
    if kind is bytes:  # BSON binary of subtype 0, as pymongo reads it
        return {"$binary": base64.b64encode(value).decode(), "$type": "00"}
    if kind is Binary:
        return {"$binary": base64.b64encode(bytes(value)).decode(), "$type": f"{value.subtype:02x}"}
    raise _Other(kind.__name__)


def canonical_read(value: Any) -> bytes:
    """:func:`canonical` of ``value``, faster (module docstring), for a tree as a read
    yields it: every double a :class:`Double`, and no ``uuid.UUID`` or ``Enum`` (a plain
    ``float``, a ``UUID`` or an ``Enum`` would be spelled by ``orjson``, not as
    :func:`canonical` spells it; pymongo with :data:`READ_CODEC` and ``json.loads`` with
    ``parse_float=Double`` yield none)."""
    return _read_bytes(value)


def _read_bytes(value: Any) -> bytes:
    try:
        data = orjson.dumps(value, default=_spelled, option=_READ_OPTIONS)
    except orjson.JSONEncodeError:  # a Double, a wide integer, another type: the exact path
        return _exact(value)
    if not data.isascii() and _BEYOND_ORDER_SAFE.search(data) is not None:  # U+E000 and up
        return _exact(value)
    return data


_BEYOND_ORDER_SAFE = re.compile(b"[\xee-\xff]")


def digest(value: Any) -> str:
    """SHA-256 of :func:`canonical`, in hex."""
    return hashlib.sha256(canonical(value)).hexdigest()
