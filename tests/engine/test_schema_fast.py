"""The engine's fast ``$jsonSchema`` checker (schema_fast.py) agrees with the detailed walk
(validation.py) on every document: what it passes the walk passes, what it fails the
walk explains; schemas it does not cover are left to the walk."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from bson import Int64, ObjectId
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.governance.audit_records import VALIDATOR
from accord.platform.embedded.errors import EngineError
from accord.platform.embedded.limits import regex_search
from accord.platform.embedded.schema_fast import compiled, pattern_check
from accord.platform.embedded.validation import validate_document

SCHEMAS: list[dict[str, Any]] = [
    VALIDATOR,
    {"$jsonSchema": {"bsonType": "object", "required": ["a"], "properties": {
        "a": {"bsonType": ["int", "long"], "minimum": 1, "maximum": 10},
        "b": {"type": "string", "minLength": 2, "maxLength": 4, "pattern": "^x"},
        "c": {"bsonType": "array", "minItems": 1, "maxItems": 2, "items": {"enum": [1, "y"]}},
        "d": {"bsonType": "object", "properties": {"e": {"bsonType": "date"}}},
        "f": {"minimum": 0, "exclusiveMinimum": True},
    }}},
    {"$jsonSchema": {"bsonType": "object", "properties": {  # the checker's shortcuts
        "a": {"enum": ["x", "xy", "y"]},
        "b": {"bsonType": "long", "minimum": 2.5, "maximum": 11, "exclusiveMaximum": True},
        "c": {"bsonType": ["int", "long"], "maximum": Int64(9), "minimum": float("nan")},
        "d": {"bsonType": ["long", "int"], "minimum": 3},
    }}},
]  # fmt: skip

_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 12) | st.floats(-2, 12, allow_nan=False)
    | st.sampled_from(["", "x", "xy", "xyz12", "y", "0" * 64, "a" * 64])
    | st.builds(lambda: ObjectId()) | st.just(Int64(3)) | st.just(dt.datetime(2026, 1, 1)),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e", "f", "op"]), inner, max_size=4),
    max_leaves=10,
)  # fmt: skip
_FIELDS = st.sampled_from([
    "_id", "v", "stream", "seq", "prev", "hash", "tenant_id", "at", "txn", "outcome",
    "principal", "action", "artifact", "db", "collection", "ops", "mode", "images",
    "a", "b", "c", "d", "f",
])  # fmt: skip


def _record() -> dict[str, Any]:
    return {
        "_id": ObjectId(), "v": 1, "stream": '["t","thread","x"]', "seq": 1, "prev": "0" * 64,
        "hash": "a" * 64, "tenant_id": "t", "at": dt.datetime(2026, 1, 1), "txn": "x",
        "outcome": "applied", "principal": {"name": "n", "role": "runtime", "kind": "service"},
        "action": "checkpoint.put", "artifact": "checkpoint", "db": "d", "collection": "c",
        "ops": [{"op": "insert", "doc_id": "i", "image_hash": "b" * 64}], "mode": "metadata",
    }  # fmt: skip


def _walk_passes(doc: dict[str, Any], validator: dict[str, Any]) -> bool:
    """The detailed walk's verdict: inside ``$and`` the validator is not a lone
    ``$jsonSchema``, so the fast checker stays out of it."""
    try:
        validate_document(doc, {"$and": [validator]})
    except EngineError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(SCHEMAS), st.booleans(), st.dictionaries(_FIELDS, _values, max_size=5))
def test_the_fast_checker_agrees_with_the_walk(
    validator: dict[str, Any], from_record: bool, changes: dict[str, Any]
) -> None:
    doc = {**_record(), **changes} if from_record else changes
    check = compiled(validator)
    assert check is not None
    assert check(doc) == _walk_passes(doc, validator), doc


@pytest.mark.parametrize("limit", [3, 3.0, 2.5, 3.5, Int64(3), float("nan")])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("value", [2, 3, 4, Int64(3), 3.0, True])
@pytest.mark.parametrize("bound", ["minimum", "maximum"])
def test_a_bound_at_its_edge_means_what_the_walk_says(
    bound: str, value: Any, exclusive: bool, limit: Any
) -> None:
    exclusive_key = "exclusiveMinimum" if bound == "minimum" else "exclusiveMaximum"
    validator = {"$jsonSchema": {"properties": {
        "n": {bound: limit, exclusive_key: exclusive}, "s": {"enum": ["a", "b"]},
    }}}  # fmt: skip
    check = compiled(validator)
    assert check is not None
    for doc in ({"n": value}, {"n": value, "s": "a"}, {"n": value, "s": "c"}):
        assert check(doc) == _walk_passes(doc, validator), doc


def test_a_valid_audit_record_passes_and_a_broken_one_is_explained() -> None:
    validate_document(_record(), VALIDATOR)
    broken = {**_record(), "hash": "not-hex"}
    try:
        validate_document(broken, VALIDATOR)
    except EngineError as exc:
        assert "errInfo" in (exc.extra or {})
    else:
        raise AssertionError("a record with a bad hash passed")


def test_schemas_it_does_not_cover_are_left_to_the_walk() -> None:
    assert compiled({"$jsonSchema": {"oneOf": [{"bsonType": "int"}]}}) is None
    assert compiled({"$jsonSchema": {"additionalProperties": False}}) is None
    assert compiled({"a": {"$gt": 1}}) is None
    assert compiled({"$jsonSchema": {"bsonType": "object"}, "a": 1}) is None
    assert compiled({"$and": [VALIDATOR]}) is None


@pytest.mark.parametrize(
    "pattern", ["^[0-9a-f]{64}$", "^x", "y$", "^[[:alpha:]]+$", "a.c", "(a+)+$", "^[a-z]*$"]
)
@pytest.mark.parametrize(
    "text", ["", "x", "abc", "a" * 64, "a" * 64 + "\n", "xy\n", "aaaaaaaaaaaa!"]
)
def test_a_pattern_means_what_the_engine_s_regex_means(pattern: str, text: str) -> None:
    assert pattern_check(pattern)(text) == regex_search(pattern, text)
