"""Canonical encoding of BSON values (accord/governance/canonical.py): each BSON type is
tagged explicitly, the bytes are RFC 8785's, and a document hashes the same before it is
written and after pymongo reads it back from the server."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from enum import Enum

import bson
import pytest
import rfc8785
from bson import Binary, Decimal128, Int64, ObjectId, Regex, Timestamp
from hypothesis import given
from hypothesis import strategies as st
from pymongo import MongoClient

from accord.errors import InvalidInputError
from accord.governance.canonical import (
    READ_CODEC,
    Double,
    canonical,
    canonical_read,
    digest,
    ms,
    to_json,
)

OID = ObjectId("64b7f0c2a1b2c3d4e5f60718")
WHEN = datetime(2026, 12, 5, 5, 6, 7, 891234, tzinfo=UTC)


def test_each_bson_type_has_one_explicit_spelling() -> None:
    assert to_json(OID) == {"$oid": "64b7f0c2a1b2c3d4e5f60718"}
    assert to_json(WHEN) == {"$date": "2026-12-05T05:06:07.891Z"}
    assert to_json(WHEN.replace(tzinfo=None)) == {"$date": "2026-12-05T05:06:07.891Z"}
    plus_two = WHEN.astimezone(timezone(timedelta(hours=2)))
    assert to_json(plus_two) == to_json(WHEN)  # an instant, whatever its zone
    assert to_json(b"\x00\xff") == {"$binary": "AP8=", "$type": "00"}
    assert to_json(Binary(b"\x01", 5)) == {"$binary": "AQ==", "$type": "05"}
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert to_json(u) == {"$binary": "EjRWeBI0VngSNFZ4EjRWeA==", "$type": "04"}
    assert to_json(Int64(7)) == {"$numberLong": "7"}
    assert to_json(2**60) == {"$numberLong": str(2**60)}
    assert to_json(2**31 - 1) == 2**31 - 1  # BSON int32: a number
    assert to_json(-(2**31)) == -(2**31)
    assert to_json(2**31) == {"$numberLong": str(2**31)}  # BSON int64, read back as Int64
    assert to_json(2**40) == to_json(Int64(2**40))
    assert to_json(float("nan")) == {"$numberDouble": "NaN"}
    assert to_json(float("-inf")) == {"$numberDouble": "-Infinity"}
    assert to_json(Decimal128(Decimal("1.10"))) == {"$numberDecimal": "1.10"}
    assert to_json(Regex("^a", "i")) == {"$regularExpression": {"pattern": "^a", "options": "i"}}
    assert to_json(Timestamp(5, 1)) == {"$timestamp": {"t": 5, "i": 1}}
    assert to_json((1, [True, None])) == [1, [True, None]]


def test_the_bytes_are_rfc_8785() -> None:
    # keys sorted by UTF-16 code units, no whitespace, ECMAScript numbers
    assert canonical({"b": 1, "a": [1.5, 1e21, "é"], "\u20ac": 0}) == (
        '{"a":[1.5,1e+21,"é"],"b":1,"€":0}'.encode()
    )
    assert canonical({"x": OID}) == b'{"x":{"$oid":"64b7f0c2a1b2c3d4e5f60718"}}'
    assert digest({"b": 1, "a": 2}) == digest({"a": 2, "b": 1})


def test_ms_cuts_to_what_bson_stores() -> None:
    assert ms(WHEN) == datetime(2026, 12, 5, 5, 6, 7, 891000, tzinfo=UTC)


DOC = {
    "_id": OID, "at": WHEN, "blob": b"\x00\x01payload", "typed": Binary(b"x", 128),
    "big": 2**60, "mid": 2**40, "small": Int64(3), "pi": 3.14159, "nan": float("nan"),
    "price": Decimal128("19.99"), "id": uuid.uuid4(), "nested": {"z": [1, {"y": None}]},
    "tuple": (1, 2),
}  # fmt: skip


def test_a_document_hashes_alike_before_and_after_a_round_trip(
    client: MongoClient, db: object
) -> None:
    from bson.binary import UuidRepresentation
    from bson.codec_options import CodecOptions

    coll = client[db.name].get_collection(  # type: ignore[attr-defined]
        "docs", codec_options=CodecOptions(uuid_representation=UuidRepresentation.STANDARD)
    )
    coll.insert_one(dict(DOC))
    back = coll.find_one({"_id": OID})
    assert back is not None and back["at"].tzinfo is None  # pymongo's naive UTC
    assert digest(back) == digest(DOC)
    assert digest({**back, "pi": 3.0}) != digest(DOC)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.binary(max_size=8)
    | st.floats(allow_nan=False) | st.datetimes(timezones=st.just(UTC)),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


plain_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**31), 2**31 - 1) | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=16,
)  # fmt: skip
exotic_keys = st.dictionaries(
    st.sampled_from(["a", "\ue000", "\uffff", "\U0001f600", "z", "\u00e9"]),
    st.integers(-1000, 1000),
    max_size=6,
)


@given(plain_json | exotic_keys)
def test_the_bytes_are_the_rfc8785_packages_on_either_path(value: object) -> None:
    """The fast path (the standard library's encoder) and the package agree byte for byte,
    on trees with floats and keys beyond U+E000 (which take the package's path) too."""
    assert canonical(value) == rfc8785.dumps(value)


def test_keys_beyond_u_e000_sort_by_utf16_code_units() -> None:
    # code points: U+E000 < U+1F600; UTF-16: D83D (the surrogate) < E000
    assert canonical({"\ue000": 1, "\U0001f600": 2}) == '{"\U0001f600":2,"\ue000":1}'.encode()


written_values = st.recursive(  # what a plan may carry: Python values and BSON types
    st.none() | st.booleans() | st.integers() | st.text() | st.binary(max_size=8)
    | st.floats() | st.datetimes() | st.datetimes(timezones=st.just(UTC))
    | st.datetimes(timezones=st.just(timezone(timedelta(hours=-3))))
    | st.integers(-(2**63), 2**63 - 1).map(Int64) | st.builds(ObjectId) | st.uuids()
    | st.sampled_from([Decimal128("1.10"), Binary(b"\x01", 5), Timestamp(5, 1), Regex("^a")]),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5) | st.sampled_from(["\ue000", "$set", "a.b"]),
                      inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


@given(written_values)
def test_the_bytes_are_those_of_the_reference_conversion(value: object) -> None:
    """:func:`canonical` takes a BSON round trip and ``orjson`` when it can; its bytes are
    always the reference's: :func:`to_json` node by node, then the RFC 8785 package."""
    assert canonical(value) == rfc8785.dumps(to_json(value))


def test_a_string_enum_is_the_string_bson_stores() -> None:
    class Color(str, Enum):  # noqa: UP042 (not StrEnum: str() of this one is "Color.RED")
        RED = "red"

    assert canonical({"c": Color.RED}) == canonical({"c": "red"}) == b'{"c":"red"}'
    assert to_json(Color.RED) == "red"
    assert bson.decode(bson.encode({"c": Color.RED})) == {"c": "red"}


@given(json_values)
def test_any_value_encodes_and_one_change_changes_the_digest(value: object) -> None:
    encoded = canonical(value)
    assert canonical(value) == encoded  # deterministic
    assert digest(["wrapped", value]) != digest(["wrapped", value, 0])


def test_a_value_json_cannot_carry_is_refused_loudly() -> None:
    with pytest.raises(InvalidInputError, match="keys must be strings"):
        canonical({1: "non-string key"})  # BSON keys are strings; this is not BSON


def _marked(value: object) -> object:
    """``value`` with its floats as :class:`Double`, as a bulk read has them."""
    if type(value) is float:
        return Double(value)
    if isinstance(value, dict):
        return {k: _marked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_marked(v) for v in value]
    return value


read_values = st.recursive(  # plain ints in int32's range: a read yields wider ones as Int64
    st.none() | st.booleans() | st.integers(-(2**31), 2**31 - 1) | st.text() | st.binary(max_size=8)
    | st.floats() | st.datetimes() | st.datetimes(timezones=st.just(UTC))
    | st.integers(-(2**63), 2**63 - 1).map(Int64) | st.builds(ObjectId)
    | st.sampled_from([Decimal128("1.10"), Binary.from_uuid(uuid.UUID(int=7)), Timestamp(5, 1)]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5) | st.sampled_from(["\ue000", "\U0001f600"]),
                      inner, max_size=4),
    max_leaves=16,
)  # fmt: skip


@given(read_values)
def test_the_bulk_read_path_is_canonical_byte_for_byte(value: object) -> None:
    """canonical_read (orjson, its BSON spellings, and canonical for what it leaves) writes
    canonical's bytes: doubles (NaN included), wide integers, Int64, datetimes of any
    year and zone, keys beyond U+E000, the rarer BSON types (what a read yields: no
    uuid.UUID, which orjson spells its own way)."""
    assert canonical_read(_marked(value)) == canonical(value)


def test_the_bulk_read_path_on_what_pymongo_and_json_read() -> None:
    doc = {**DOC, "id": Binary.from_uuid(DOC["id"]), "mid": 2**40, "one": 1.0, "neg": -0.0,
           "inf": float("inf"), "old": datetime(999, 1, 2, 3, 4, 5, 6000), "\ue000k": "v"}  # fmt: skip
    raw = bson.encode(doc)
    assert canonical_read(bson.decode(raw, codec_options=READ_CODEC)) == canonical(bson.decode(raw))
    text = canonical(bson.decode(raw)).decode()
    marked = json.loads(text, parse_float=Double, parse_constant=lambda c: Double(float(c)))
    assert canonical_read(marked) == canonical(json.loads(text)) == text.encode()
    assert type(bson.decode(raw, codec_options=READ_CODEC)["pi"]) is Double
