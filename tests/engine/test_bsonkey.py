"""``bsonkey.sort_key`` orders and equates BSON values exactly as ``compare_values`` does.

Ordered indexes, in-memory sorts and ``$in`` sets all rest on this: if Python's order of
two sort keys ever disagreed with mongod's comparison, an index scan would return the
wrong range.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid

import pytest
from bson import Binary, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accord.platform.embedded.bsonkey import TOP, InSet, sort_key
from accord.platform.embedded.values import compare_values

pytestmark = pytest.mark.embedded_only

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.integers(min_value=-3, max_value=3).map(Int64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.5, 1.0, -0.0, 2.0, 3.5]),
    st.sampled_from(["0", "1.0", "2.5", "-3", "NaN", "Infinity"]).map(Decimal128),
    st.text(max_size=4),
    st.sampled_from(
        [ObjectId(b"\x00" * 12), ObjectId(b"\x01" * 12), ObjectId(b"\x00" * 11 + b"\x05")]
    ),
    st.datetimes(min_value=dt.datetime(1960, 1, 1), max_value=dt.datetime(2100, 1, 1)).map(
        lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)
    ),
    st.binary(max_size=3).map(lambda b: Binary(b, 0)),
    st.sampled_from([Binary(b"ab", 5), uuid.UUID(int=7)]),
    st.tuples(st.integers(0, 3), st.integers(0, 3)).map(lambda t: Timestamp(*t)),
    st.sampled_from([Regex("a", "i"), Regex("b"), MinKey(), MaxKey()]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
    ),
    max_leaves=6,
)


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def _cmp(a: tuple, b: tuple) -> int:
    return (a > b) - (a < b)


@settings(max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
@given(values, values)
def test_sort_key_order_is_bson_order(a, b) -> None:
    assert _cmp(sort_key(a), sort_key(b)) == _sign(compare_values(a, b)), (a, b)


@given(values)
def test_equal_keys_hash_equal(a) -> None:
    # A value's key is stable and hashable (sets of keys serve $in).
    assert hash(sort_key(a)) == hash(sort_key(a))


def test_numbers_of_every_type_are_one_key() -> None:
    keys = {sort_key(1), sort_key(1.0), sort_key(Int64(1)), sort_key(Decimal128("1"))}
    assert len(keys) == 1
    assert sort_key(True) != sort_key(1)  # bool is its own type in BSON
    assert sort_key(float("nan")) == sort_key(Decimal128("NaN"))
    assert sort_key(float("nan")) < sort_key(-math.inf)


@given(values)
def test_top_is_above_every_key(a) -> None:
    assert sort_key(a) < TOP
    assert (sort_key(1), sort_key(a)) < (sort_key(1), TOP) < (sort_key(2),)


def test_in_set_matches_like_mongodb() -> None:
    s = InSet([1, "x", None, [1, 2], Regex("^ab")])
    assert s.contains(1.0, missing=False)
    assert not s.contains(True, missing=False)  # mongomock's list scan said True == 1
    assert s.contains([5, 1], missing=False)  # an element equals
    assert s.contains([1, 2], missing=False)  # the whole array equals
    assert s.contains("abc", missing=False)  # regex
    assert s.contains(None, missing=True)  # null matches a missing field
    assert not InSet([1]).contains(None, missing=True)
    assert not s.contains({"a": 1}, missing=False)
