"""Unit tests for the filter evaluator's shortcuts (pure functions, no server)."""

from __future__ import annotations

from typing import Any

import bson
from bson.int64 import Int64
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.platform.embedded import collation, query

VALUES = st.one_of(
    st.sampled_from(["a", "b", "", "A"]),
    st.integers(-2, 2),
    st.integers(-2, 2).map(Int64),
    st.sampled_from([1.0, 2.5, True, False, None]),
    st.lists(st.sampled_from(["a", 1, Int64(2)]), max_size=2),
    st.just({"x": 1}),
)
NAMES = st.sampled_from(["_id", "a", "b", "a.b", ""])


@settings(max_examples=400, deadline=None)
@given(
    spec=st.dictionaries(NAMES, VALUES, min_size=1, max_size=3),
    doc=st.dictionaries(st.sampled_from(["_id", "a", "b", ""]), VALUES, max_size=3),
)
def test_plain_equalities_agree_with_the_general_evaluator(spec: dict, doc: dict) -> None:
    """Top-level string and integer equalities are answered without mongomock's
    evaluator; inside ``$and`` (no shortcut) the general one must say the same."""
    assert query.matches(spec, doc) == query.matches({"$and": [spec]}, doc)


def test_plain_equalities_keep_bson_equality() -> None:
    assert query.matches({"n": 1}, {"n": Int64(1)})
    assert query.matches({"n": Int64(1)}, {"n": 1})
    assert not query.matches({"n": 1}, {"n": True})
    assert query.matches({"n": 1}, {"n": 1.0})  # a double equal to it (general evaluator)
    assert query.matches({"s": "a"}, {"s": ["b", "a"]})  # an array holding it
    assert not query.matches({"s": "a", "n": 1}, {"s": "a", "n": 2})
    with collation.active(collation.parse({"locale": "en", "strength": 2})):
        assert query.matches({"s": "a"}, {"s": "A"})  # the collation decides, not ==


@given(st.text(max_size=20))
def test_string_id_keys_are_their_bson(value: str) -> None:
    try:
        expected: Any = bson.encode({"": value})
    except Exception as exc:  # noqa: BLE001 - the same error either way
        expected = type(exc)
    try:
        got: Any = query.id_key(value)
    except Exception as exc:  # noqa: BLE001
        got = type(exc)
    assert got == expected
