"""Unit tests for the embedded engine's update semantics (pure functions, no server)."""

from __future__ import annotations

import copy
import datetime as dt
import re
from typing import Any

import bson
import pytest
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from accord.platform.embedded.errors import EngineError
from accord.platform.embedded.update import apply_update, upsert_seed
from accord.platform.embedded.values import (
    bson_type_name,
    compare_values,
    copy_value,
    format_value,
    values_equal,
)


def fails(doc: dict, update: Any, **kwargs: Any) -> EngineError:
    """Apply an update that must fail and return the error."""
    with pytest.raises(EngineError) as info:
        apply_update(doc, update, **kwargs)
    return info.value


# --------------------------------------------------------------------------------------
# $set / $unset and paths


def test_set_adds_new_field_and_keeps_existing_order() -> None:
    doc = {"_id": 1, "a": 1, "b": 2}
    assert list(apply_update(doc, {"$set": {"a": 9, "c": 3}})) == ["_id", "a", "b", "c"]
    assert apply_update(doc, {"$set": {"a": 9, "c": 3}}) == {"_id": 1, "a": 9, "b": 2, "c": 3}


def test_set_creates_new_fields_in_field_name_order_like_mongod() -> None:
    out = apply_update({"_id": 1}, {"$set": {"b": 1, "a": 1}})
    assert list(out) == ["_id", "a", "b"]


def test_set_dotted_path_creates_intermediate_documents() -> None:
    assert apply_update({"_id": 1}, {"$set": {"a.b.c": 1}}) == {"_id": 1, "a": {"b": {"c": 1}}}


def test_set_dotted_path_merges_into_existing_subdocument() -> None:
    out = apply_update({"_id": 1, "a": {"x": 1}}, {"$set": {"a.y": 2}})
    assert out == {"_id": 1, "a": {"x": 1, "y": 2}}


def test_set_array_index_replaces_element() -> None:
    assert apply_update({"_id": 1, "a": [1, 2, 3]}, {"$set": {"a.1": 9}})["a"] == [1, 9, 3]


def test_set_array_index_past_the_end_pads_with_null() -> None:
    assert apply_update({"_id": 1, "a": [1]}, {"$set": {"a.3": 4}})["a"] == [1, None, None, 4]


def test_set_field_of_array_element_document() -> None:
    out = apply_update({"_id": 1, "a": [{"b": 1}, {"b": 2}]}, {"$set": {"a.1.c": 3}})
    assert out["a"] == [{"b": 1}, {"b": 2, "c": 3}]


def test_set_numeric_component_on_a_document_is_a_field_name() -> None:
    assert apply_update({"_id": 1, "a": {}}, {"$set": {"a.0": 1}})["a"] == {"0": 1}


def test_set_under_a_scalar_is_path_not_viable() -> None:
    err = fails({"_id": 1, "a": 1}, {"$set": {"a.b": 1}})
    assert err.code == 28
    assert err.errmsg == "Cannot create field 'b' in element {a: 1}"


def test_set_under_null_is_path_not_viable() -> None:
    err = fails({"_id": 1, "a": None}, {"$set": {"a.b": 1}})
    assert (err.code, err.errmsg) == (28, "Cannot create field 'b' in element {a: null}")


def test_set_named_field_in_array_is_path_not_viable() -> None:
    err = fails({"_id": 1, "a": [1, 2]}, {"$set": {"a.x": 1}})
    assert err.code == 28
    assert err.errmsg == "Cannot create field 'x' in element {a: [ 1, 2 ]}"


def test_set_through_scalar_array_element_names_the_index() -> None:
    err = fails({"_id": 1, "a": [0]}, {"$set": {"a.0.b": 1}})
    assert err.errmsg == "Cannot create field 'b' in element {0: 0}"


def test_set_equal_value_is_a_noop_that_keeps_the_stored_type() -> None:
    out = apply_update({"_id": 1, "a": 1}, {"$set": {"a": 1.0}})
    assert type(out["a"]) is int


def test_set_copies_values_out_of_the_update() -> None:
    value = {"x": [1]}
    out = apply_update({"_id": 1}, {"$set": {"a": value}})
    out["a"]["x"].append(2)
    assert value == {"x": [1]}


def test_empty_operator_document_is_a_noop() -> None:
    assert apply_update({"_id": 1, "a": 1}, {"$set": {}}) == {"_id": 1, "a": 1}


def test_unset_removes_fields_and_ignores_missing_ones() -> None:
    doc = {"_id": 1, "a": 1, "b": {"c": 1, "d": 2}}
    assert apply_update(doc, {"$unset": {"a": "", "b.c": 1, "zz": 1, "b.q.r": 1}}) == {
        "_id": 1,
        "b": {"d": 2},
    }


def test_unset_array_element_sets_it_to_null() -> None:
    assert apply_update({"_id": 1, "a": [1, 2, 3]}, {"$unset": {"a.1": 1}})["a"] == [1, None, 3]


def test_unset_through_scalar_is_a_noop() -> None:
    assert apply_update({"_id": 1, "a": 5}, {"$unset": {"a.b": 1}}) == {"_id": 1, "a": 5}


def test_input_document_is_never_mutated() -> None:
    doc = {"_id": 1, "a": {"b": [1, 2]}, "c": 1}
    snapshot = copy.deepcopy(doc)
    apply_update(doc, {"$set": {"a.b.0": 9}, "$push": {"x": 1}, "$unset": {"c": 1}})
    assert doc == snapshot


_leaf = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.none(), st.booleans())
_docs = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abc"), inner, max_size=3)
    ),
    max_leaves=10,
)


def _containers(value: Any) -> list[int]:
    """ids of every dict and list inside ``value`` (itself included)."""
    if isinstance(value, dict):
        return [id(value)] + [i for v in value.values() for i in _containers(v)]
    if isinstance(value, list):
        return [id(value)] + [i for v in value for i in _containers(v)]
    return []


_bson_leaf = st.one_of(
    _leaf,
    st.floats(allow_nan=False),
    st.binary(max_size=4).map(Binary),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.just(ObjectId("0123456789ab0123456789ab")),
    st.just(Timestamp(1, 2)),
    st.just(Decimal128("1.5")),
    st.just(dt.datetime(2024, 1, 2, 3, 4, 5)),
    st.just(Regex("^a", "i")),
    st.just(MinKey()),
)
_bson_docs = st.recursive(
    _bson_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abc"), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.sampled_from("abcd"), _bson_docs, max_size=4))
def test_copy_value_is_a_deep_copy_sharing_no_container(doc: dict) -> None:
    out = copy_value(doc)
    assert bson.encode(out) == bson.encode(doc)  # same values, same types, same order
    assert not set(_containers(out)) & set(_containers(doc))


def test_updates_share_nothing_with_the_update_document() -> None:
    """The new document owns its values: changing it later (a following update in the
    same transaction changes a copy, but the engine must not rely on that) never
    reaches the command's update document, and vice versa."""
    for update, is_insert in [
        ({"$set": {"a": [1, {"b": 2}]}}, False),
        ({"$setOnInsert": {"a": [1, {"b": 2}]}}, True),
        ({"$push": {"a": {"$each": [[1], {"b": 2}]}}}, False),
        ({"$addToSet": {"a": {"$each": [[1], {"b": 2}]}}}, False),
        ({"$max": {"a": [1, {"b": 2}]}}, False),
        ({"_id": 1, "a": [1, {"b": 2}]}, False),
    ]:
        spec = copy.deepcopy(update)
        out = apply_update({"_id": 1}, update, is_insert=is_insert)
        assert not set(_containers(out)) & set(_containers(update)), update
        assert update == spec


@given(body=st.dictionaries(st.sampled_from("abcd"), _docs, max_size=4), value=_leaf)
def test_set_never_mutates_input_and_sets_the_value(body: dict, value: Any) -> None:
    doc = {"_id": 1, **body}
    snapshot = copy.deepcopy(doc)
    out = apply_update(doc, {"$set": {"b": value}})
    assert doc == snapshot
    assert values_equal(out["b"], value)
    assert {k: v for k, v in out.items() if k != "b"} == {k: v for k, v in doc.items() if k != "b"}


# --------------------------------------------------------------------------------------
# $inc / $mul


def test_inc_adds_and_creates_missing_fields() -> None:
    out = apply_update({"_id": 1, "a": 1}, {"$inc": {"a": 2, "b.c": 5}})
    assert out == {"_id": 1, "a": 3, "b": {"c": 5}}


def test_inc_int_plus_float_is_float() -> None:
    out = apply_update({"_id": 1, "a": 1}, {"$inc": {"a": 0.5}})
    assert out["a"] == 1.5 and isinstance(out["a"], float)


def test_inc_keeps_long_type() -> None:
    out = apply_update({"_id": 1, "a": Int64(1)}, {"$inc": {"a": 1}})
    assert out["a"] == 2 and isinstance(out["a"], Int64)


def test_inc_int32_overflow_widens_to_long() -> None:
    out = apply_update({"_id": 1, "a": 2**31 - 1}, {"$inc": {"a": 1}})
    assert out["a"] == 2**31 and isinstance(out["a"], Int64)


def test_inc_int64_overflow_is_an_error() -> None:
    err = fails({"_id": 1, "a": Int64(2**63 - 1)}, {"$inc": {"a": 1}})
    assert err.code == 2 and "Failed to apply $inc" in err.errmsg


def test_inc_decimal128() -> None:
    out = apply_update({"_id": 1, "a": Decimal128("1.1")}, {"$inc": {"a": 1}})
    assert out["a"] == Decimal128("2.1")


def test_inc_non_numeric_argument_is_type_mismatch() -> None:
    err = fails({"_id": 1}, {"$inc": {"a": "x"}})
    assert (err.code, err.errmsg) == (14, 'Cannot increment with non-numeric argument: {a: "x"}')


def test_inc_bool_argument_is_not_numeric() -> None:
    assert fails({"_id": 1}, {"$inc": {"a": True}}).code == 14


def test_inc_non_numeric_target_is_type_mismatch() -> None:
    err = fails({"_id": 1, "a": "s"}, {"$inc": {"a": 1}})
    assert err.code == 14
    assert err.errmsg == (
        "Cannot apply $inc to a value of non-numeric type. {_id: 1} has the field 'a' of "
        "non-numeric type string"
    )


@given(start=st.integers(-(2**40), 2**40), step=st.integers(-(2**40), 2**40))
def test_inc_matches_integer_arithmetic(start: int, step: int) -> None:
    out = apply_update({"_id": 1, "n": start}, {"$inc": {"n": step}})
    assert out["n"] == start + step
    assert isinstance(out["n"], Int64) == (not -(2**31) <= start + step < 2**31)


@given(start=st.floats(-1e9, 1e9), step=st.integers(-1000, 1000))
def test_inc_float_matches_float_arithmetic(start: float, step: int) -> None:
    assert apply_update({"_id": 1, "n": start}, {"$inc": {"n": step}})["n"] == start + step


def test_mul_multiplies() -> None:
    assert apply_update({"_id": 1, "a": 3}, {"$mul": {"a": 4}})["a"] == 12


def test_mul_missing_field_becomes_zero_of_the_operand_type() -> None:
    out = apply_update({"_id": 1}, {"$mul": {"i": 5, "f": 2.5}})
    assert out["i"] == 0 and type(out["i"]) is int
    assert out["f"] == 0.0 and type(out["f"]) is float


def test_mul_non_numeric_argument_message() -> None:
    err = fails({"_id": 1}, {"$mul": {"a": "x"}})
    assert (err.code, err.errmsg) == (14, 'Cannot multiply with non-numeric argument: {a: "x"}')


# --------------------------------------------------------------------------------------
# $min / $max


def test_min_and_max_replace_only_when_beyond() -> None:
    doc = {"_id": 1, "lo": 5, "hi": 5}
    assert apply_update(doc, {"$min": {"lo": 3}, "$max": {"hi": 3}}) == {"_id": 1, "lo": 3, "hi": 5}
    assert apply_update(doc, {"$min": {"lo": 7}, "$max": {"hi": 7}}) == {"_id": 1, "lo": 5, "hi": 7}


def test_min_max_create_missing_fields() -> None:
    assert apply_update({"_id": 1}, {"$min": {"a": 1}, "$max": {"b": 2}}) == {
        "_id": 1,
        "a": 1,
        "b": 2,
    }


def test_min_uses_bson_type_order_across_types() -> None:
    # null sorts below numbers, strings above them
    assert apply_update({"_id": 1, "a": 5}, {"$min": {"a": None}})["a"] is None
    assert apply_update({"_id": 1, "a": 5}, {"$max": {"a": "x"}})["a"] == "x"
    assert apply_update({"_id": 1, "a": 5}, {"$min": {"a": "x"}})["a"] == 5


def test_max_with_dates() -> None:
    early, late = dt.datetime(2020, 1, 1), dt.datetime(2021, 1, 1)
    assert apply_update({"_id": 1, "d": early}, {"$max": {"d": late}})["d"] == late


# --------------------------------------------------------------------------------------
# $rename


def test_rename_moves_value_to_end() -> None:
    out = apply_update({"_id": 1, "a": 1, "b": 2}, {"$rename": {"a": "c"}})
    assert out == {"_id": 1, "b": 2, "c": 1} and list(out) == ["_id", "b", "c"]


def test_rename_overwrites_existing_target_in_place() -> None:
    out = apply_update({"_id": 1, "a": 1, "b": 2, "c": 3}, {"$rename": {"c": "a"}})
    assert list(out.items()) == [("_id", 1), ("a", 3), ("b", 2)]


def test_rename_into_new_subdocument() -> None:
    out = apply_update({"_id": 1, "a": {"b": 1}}, {"$rename": {"a.b": "x.y"}})
    assert out == {"_id": 1, "a": {}, "x": {"y": 1}}


def test_rename_missing_source_is_noop() -> None:
    assert apply_update({"_id": 1}, {"$rename": {"a": "b"}}) == {"_id": 1}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"a": 1}, "The 'to' field for $rename must be a string: a: 1"),
        ({"a": "a"}, 'The source and target field for $rename must differ: a: "a"'),
        ({"a": "a.b"}, "The source and target field for $rename must not be on the same path"),
        ({"a.$": "b"}, "The source field for $rename may not be dynamic: a.$"),
        ({"a": "b.$[]"}, "The destination field for $rename may not be dynamic: b.$[]"),
    ],
)
def test_rename_invalid_specs_are_bad_value(spec: dict, message: str) -> None:
    err = fails({"_id": 1, "a": 1}, {"$rename": spec})
    assert err.code == 2 and err.errmsg.startswith(message)


def test_rename_of_array_element_is_refused() -> None:
    err = fails({"_id": 1, "a": [{"b": 1}]}, {"$rename": {"a.0.b": "c"}})
    assert err.code == 2 and "has an array field called 'a'" in err.errmsg


def test_rename_into_array_element_is_refused() -> None:
    err = fails({"_id": 1, "a": 1, "x": [{}]}, {"$rename": {"a": "x.0.b"}})
    assert err.code == 2 and err.errmsg.startswith("The destination field cannot be an array")


# --------------------------------------------------------------------------------------
# $setOnInsert / $currentDate / $bit


def test_set_on_insert_applies_only_on_insert() -> None:
    update = {"$setOnInsert": {"created": 1}, "$set": {"n": 1}}
    assert apply_update({"_id": 1}, update) == {"_id": 1, "n": 1}
    assert apply_update({"_id": 1}, update, is_insert=True) == {"_id": 1, "created": 1, "n": 1}


def test_set_on_insert_still_conflicts_with_other_paths() -> None:
    assert fails({"_id": 1}, {"$setOnInsert": {"a": 1}, "$set": {"a": 2}}).code == 40


def test_current_date_sets_naive_utc_millisecond_date() -> None:
    before = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(milliseconds=1)
    out = apply_update({"_id": 1}, {"$currentDate": {"a": True, "b": {"$type": "date"}}})
    assert out["a"].tzinfo is None and out["a"].microsecond % 1000 == 0
    assert before <= out["a"] <= dt.datetime.now(dt.UTC).replace(tzinfo=None)
    assert out["a"] == out["b"]


def test_current_date_timestamp() -> None:
    out = apply_update({"_id": 1}, {"$currentDate": {"t": {"$type": "timestamp"}}})
    assert isinstance(out["t"], Timestamp)
    later = apply_update({"_id": 1}, {"$currentDate": {"t": {"$type": "timestamp"}}})
    assert (later["t"].time, later["t"].inc) > (out["t"].time, out["t"].inc)


@pytest.mark.parametrize("spec", [{"$type": "str"}, {"$foo": "date"}, "date", 1])
def test_current_date_invalid_specs(spec: Any) -> None:
    assert fails({"_id": 1}, {"$currentDate": {"a": spec}}).code == 2


def test_bit_operations() -> None:
    out = apply_update(
        {"_id": 1, "a": 0b1100, "b": 0b1100, "c": 0b1100},
        {"$bit": {"a": {"and": 0b1010}, "b": {"or": 0b0011}, "c": {"xor": 0b1111}}},
    )
    assert (out["a"], out["b"], out["c"]) == (0b1000, 0b1111, 0b0011)


def test_bit_rejects_non_integer_target_and_unknown_op() -> None:
    assert fails({"_id": 1, "a": 1.5}, {"$bit": {"a": {"and": 1}}}).code == 2
    assert fails({"_id": 1, "a": 1}, {"$bit": {"a": {"nand": 1}}}).code == 2


# --------------------------------------------------------------------------------------
# $push


def test_push_appends_and_creates() -> None:
    assert apply_update({"_id": 1, "a": [1]}, {"$push": {"a": 2}})["a"] == [1, 2]
    assert apply_update({"_id": 1}, {"$push": {"a.b": 1}}) == {"_id": 1, "a": {"b": [1]}}


def test_push_a_list_pushes_it_as_one_element() -> None:
    assert apply_update({"_id": 1, "a": []}, {"$push": {"a": [1, 2]}})["a"] == [[1, 2]]


def test_push_onto_non_array_is_bad_value() -> None:
    err = fails({"_id": 1, "a": 1}, {"$push": {"a": 2}})
    assert err.code == 2
    assert err.errmsg == "The field 'a' must be an array but is of type int in document {_id: 1}"


def test_push_each_with_position() -> None:
    doc = {"_id": 1, "a": [1, 2, 3]}
    assert apply_update(doc, {"$push": {"a": {"$each": [8, 9], "$position": 0}}})["a"] == [
        8,
        9,
        1,
        2,
        3,
    ]
    assert apply_update(doc, {"$push": {"a": {"$each": [9], "$position": -1}}})["a"] == [1, 2, 9, 3]
    assert apply_update(doc, {"$push": {"a": {"$each": [9], "$position": 99}}})["a"] == [1, 2, 3, 9]
    assert apply_update(doc, {"$push": {"a": {"$each": [9], "$position": -99}}})["a"] == [
        9,
        1,
        2,
        3,
    ]


def test_push_each_sort_and_slice() -> None:
    doc = {"_id": 1, "a": [5, 1]}
    update = {"$push": {"a": {"$each": [3, 9], "$sort": -1, "$slice": 3}}}
    assert apply_update(doc, update)["a"] == [9, 5, 3]
    update = {"$push": {"a": {"$each": [3], "$sort": 1, "$slice": -2}}}
    assert apply_update(doc, update)["a"] == [3, 5]
    assert apply_update(doc, {"$push": {"a": {"$each": [], "$slice": 0}}})["a"] == []


def test_push_sort_by_document_fields() -> None:
    doc = {"_id": 1, "q": [{"s": 2, "n": "b"}, {"s": 1, "n": "z"}]}
    update = {"$push": {"q": {"$each": [{"s": 2, "n": "a"}], "$sort": {"s": -1, "n": 1}}}}
    assert [x["n"] for x in apply_update(doc, update)["q"]] == ["a", "b", "z"]


@pytest.mark.parametrize(
    ("clause", "message"),
    [
        ({"$each": 1}, "The argument to $each in $push must be an array but it was of type: int"),
        ({"$each": [], "$foo": 1}, "Unrecognized clause in $push: $foo"),
        ({"$each": [], "$slice": "x"}, "The value for $slice must be an integer value"),
        ({"$each": [], "$position": 1.5}, "The value for $position must be an integer value"),
        ({"$each": [], "$sort": 2}, "The $sort element value must be either 1 or -1"),
        ({"$each": [], "$sort": "x"}, "The $sort is invalid"),
        ({"$each": [], "$sort": {}}, "The $sort pattern is empty"),
    ],
)
def test_push_invalid_modifiers(clause: dict, message: str) -> None:
    err = fails({"_id": 1}, {"$push": {"a": clause}})
    assert err.code == 2 and err.errmsg.startswith(message)


@given(
    start=st.lists(st.integers(), max_size=6),
    extra=st.lists(st.integers(), max_size=6),
    slice_=st.integers(-8, 8),
)
def test_push_each_slice_matches_list_semantics(start: list, extra: list, slice_: int) -> None:
    out = apply_update({"_id": 1, "a": start}, {"$push": {"a": {"$each": extra, "$slice": slice_}}})
    combined = start + extra
    expected = combined[:slice_] if slice_ >= 0 else combined[len(combined) + slice_ :]
    if slice_ < 0 and -slice_ > len(combined):
        expected = combined
    assert out["a"] == expected


@given(values=st.lists(st.integers(-50, 50), max_size=10))
def test_push_sort_orders_like_sorted(values: list) -> None:
    out = apply_update({"_id": 1}, {"$push": {"a": {"$each": values, "$sort": 1}}})
    assert out["a"] == sorted(values)


# --------------------------------------------------------------------------------------
# $addToSet / $pop / $pull / $pullAll


def test_add_to_set_adds_only_missing_values() -> None:
    doc = {"_id": 1, "a": [1, 2]}
    assert apply_update(doc, {"$addToSet": {"a": 2}})["a"] == [1, 2]
    assert apply_update(doc, {"$addToSet": {"a": 3}})["a"] == [1, 2, 3]
    assert apply_update(doc, {"$addToSet": {"a": {"$each": [2, 4, 4, 5]}}})["a"] == [1, 2, 4, 5]


def test_add_to_set_creates_array() -> None:
    assert apply_update({"_id": 1}, {"$addToSet": {"a": 1}}) == {"_id": 1, "a": [1]}


def test_add_to_set_document_equality_is_field_order_sensitive() -> None:
    doc = {"_id": 1, "a": [{"x": 1, "y": 2}]}
    assert len(apply_update(doc, {"$addToSet": {"a": {"x": 1, "y": 2}}})["a"]) == 1
    assert len(apply_update(doc, {"$addToSet": {"a": {"y": 2, "x": 1}}})["a"]) == 2


def test_add_to_set_treats_numbers_by_value() -> None:
    assert apply_update({"_id": 1, "a": [1]}, {"$addToSet": {"a": 1.0}})["a"] == [1]


def test_add_to_set_on_non_array() -> None:
    err = fails({"_id": 1, "a": 5}, {"$addToSet": {"a": 1}})
    assert err.code == 2 and err.errmsg.startswith("Cannot apply $addToSet to non-array field")


def test_add_to_set_each_must_be_array() -> None:
    assert fails({"_id": 1}, {"$addToSet": {"a": {"$each": 1}}}).code == 14


@given(start=st.lists(st.integers(0, 5), max_size=6), extra=st.lists(st.integers(0, 8), max_size=6))
def test_add_to_set_is_a_union_preserving_existing(start: list, extra: list) -> None:
    out = apply_update({"_id": 1, "a": start}, {"$addToSet": {"a": {"$each": extra}}})["a"]
    assert out[: len(start)] == start
    assert set(out) == set(start) | set(extra)
    assert len(out[len(start) :]) == len(set(out[len(start) :]))


def test_pop_first_and_last() -> None:
    doc = {"_id": 1, "a": [1, 2, 3]}
    assert apply_update(doc, {"$pop": {"a": 1}})["a"] == [1, 2]
    assert apply_update(doc, {"$pop": {"a": -1}})["a"] == [2, 3]
    assert apply_update({"_id": 1, "a": []}, {"$pop": {"a": 1}})["a"] == []
    assert apply_update({"_id": 1}, {"$pop": {"a": 1}}) == {"_id": 1}


def test_pop_invalid_argument_and_target() -> None:
    err = fails({"_id": 1, "a": [1]}, {"$pop": {"a": 2}})
    assert (err.code, err.errmsg) == (9, "$pop expects 1 or -1, found: 2")
    err = fails({"_id": 1, "a": 1}, {"$pop": {"a": 1}})
    assert (err.code, err.errmsg) == (14, "Path 'a' contains an element of non-array type 'int'")


def test_pull_by_value_and_by_condition() -> None:
    doc = {"_id": 1, "a": [1, 2, 3, 2, 4]}
    assert apply_update(doc, {"$pull": {"a": 2}})["a"] == [1, 3, 4]
    assert apply_update(doc, {"$pull": {"a": {"$gte": 3}}})["a"] == [1, 2, 2]
    assert apply_update(doc, {"$pull": {"a": {"$in": [1, 4]}}})["a"] == [2, 3, 2]


def test_pull_with_a_query_on_document_elements() -> None:
    doc = {"_id": 1, "r": [{"s": 8, "i": "A"}, {"s": 8, "i": "B"}, {"s": 9, "i": "B"}, 5]}
    assert apply_update(doc, {"$pull": {"r": {"s": 8, "i": "B"}}})["r"] == [
        {"s": 8, "i": "A"},
        {"s": 9, "i": "B"},
        5,
    ]
    assert apply_update(doc, {"$pull": {"r": {"s": {"$gt": 8}}}})["r"] == [
        {"s": 8, "i": "A"},
        {"s": 8, "i": "B"},
        5,
    ]


def test_pull_missing_is_noop_and_non_array_is_error() -> None:
    assert apply_update({"_id": 1}, {"$pull": {"a": 1}}) == {"_id": 1}
    err = fails({"_id": 1, "a": 1}, {"$pull": {"a": 1}})
    assert (err.code, err.errmsg) == (2, "Cannot apply $pull to a non-array value")


def test_pull_all() -> None:
    doc = {"_id": 1, "a": [1, 2, 3, 1, {"x": 1}]}
    assert apply_update(doc, {"$pullAll": {"a": [1, {"x": 1}]}})["a"] == [2, 3]
    err = fails(doc, {"$pullAll": {"a": 1}})
    assert (err.code, err.errmsg) == (2, "$pullAll requires an array argument but was given a int")


# --------------------------------------------------------------------------------------
# Positional operators


def test_positional_dollar_updates_the_matched_element_field() -> None:
    doc = {"_id": 1, "a": [{"x": 1}, {"x": 2}, {"x": 2}]}
    out = apply_update(doc, {"$set": {"a.$.y": 5}}, query={"_id": 1, "a.x": 2})
    assert out["a"] == [{"x": 1}, {"x": 2, "y": 5}, {"x": 2}]


def test_positional_dollar_on_scalar_array_equality() -> None:
    doc = {"_id": 1, "g": [80, 85, 90]}
    assert apply_update(doc, {"$set": {"g.$": 82}}, query={"g": 85})["g"] == [80, 82, 90]


def test_positional_dollar_with_operator_condition() -> None:
    doc = {"_id": 1, "g": [80, 85, 90]}
    assert apply_update(doc, {"$inc": {"g.$": 1}}, query={"g": {"$gte": 85}})["g"] == [80, 86, 90]


def test_positional_dollar_with_elem_match_uses_the_same_element() -> None:
    doc = {"_id": 1, "a": [{"x": 1, "y": 2}, {"x": 2, "y": 1}, {"x": 2, "y": 2}]}
    query = {"a": {"$elemMatch": {"x": 2, "y": 2}}}
    out = apply_update(doc, {"$set": {"a.$.hit": True}}, query=query)
    assert [e.get("hit") for e in out["a"]] == [None, None, True]


def test_positional_dollar_inside_and() -> None:
    doc = {"_id": 1, "a": [{"x": 1}, {"x": 2}]}
    out = apply_update(doc, {"$set": {"a.$.x": 9}}, query={"$and": [{"_id": 1}, {"a.x": 2}]})
    assert out["a"] == [{"x": 1}, {"x": 9}]


def test_positional_dollar_in_nested_array_path() -> None:
    doc = {"_id": 1, "o": {"a": [{"k": "p"}, {"k": "q"}]}}
    out = apply_update(doc, {"$set": {"o.a.$.v": 1}}, query={"o.a.k": "q"})
    assert out["o"]["a"] == [{"k": "p"}, {"k": "q", "v": 1}]


def test_positional_dollar_without_matching_query_is_bad_value() -> None:
    doc = {"_id": 1, "a": [{"x": 1}]}
    for query in (None, {"_id": 1}, {"a.x": 7}):
        err = fails(doc, {"$set": {"a.$.y": 1}}, query=query)
        assert err.code == 2
        assert err.errmsg == "The positional operator did not find the match needed from the query."


def test_positional_dollar_on_upsert_insert_fails() -> None:
    query = {"a.x": 1}
    err = fails(upsert_seed(query), {"$set": {"a.$.y": 1}}, query=query, is_insert=True)
    assert err.code == 2


def test_positional_dollar_path_rules() -> None:
    assert fails({"_id": 1}, {"$set": {"a.$.b.$": 1}}).errmsg.startswith("Too many positional")
    assert fails({"_id": 1}, {"$set": {"$.a": 1}}).code == 2


def test_all_positional_updates_every_element() -> None:
    out = apply_update({"_id": 1, "a": [1, 2, 3]}, {"$inc": {"a.$[]": 10}})
    assert out["a"] == [11, 12, 13]


def test_all_positional_on_field_of_each_document() -> None:
    out = apply_update({"_id": 1, "a": [{"n": 1}, {}]}, {"$set": {"a.$[].n": 0}})
    assert out["a"] == [{"n": 0}, {"n": 0}]


def test_all_positional_requires_an_existing_array() -> None:
    err = fails({"_id": 1}, {"$set": {"a.$[]": 1}})
    assert err.code == 2
    assert err.errmsg == "The path 'a' must exist in the document in order to apply array updates."
    err = fails({"_id": 1, "a": 5}, {"$set": {"a.$[]": 1}})
    assert (err.code, err.errmsg) == (2, "Cannot apply array updates to non-array element a: 5")


def test_filtered_positional_on_scalars() -> None:
    out = apply_update(
        {"_id": 1, "g": [95, 102, 90, 150]},
        {"$set": {"g.$[e]": 100}},
        array_filters=[{"e": {"$gte": 100}}],
    )
    assert out["g"] == [95, 100, 90, 100]


def test_filtered_positional_on_document_fields() -> None:
    doc = {"_id": 1, "g": [{"grade": 80, "mean": 75}, {"grade": 85, "mean": 90}]}
    out = apply_update(
        doc, {"$set": {"g.$[el].mean": 100}}, array_filters=[{"el.grade": {"$gte": 85}}]
    )
    assert [e["mean"] for e in out["g"]] == [75, 100]


def test_filtered_positional_with_several_conditions_and_identifiers() -> None:
    doc = {"_id": 1, "a": [{"t": "x", "n": 1}, {"t": "x", "n": 5}, {"t": "y", "n": 5}]}
    out = apply_update(
        doc,
        {"$inc": {"a.$[big].n": 100}, "$set": {"a.$[ys].seen": True}},
        array_filters=[{"big.t": "x", "big.n": {"$gt": 2}}, {"ys.t": "y"}],
    )
    assert out["a"] == [
        {"t": "x", "n": 1},
        {"t": "x", "n": 105},
        {"t": "y", "n": 5, "seen": True},
    ]


def test_nested_filtered_positionals() -> None:
    doc = {"_id": 1, "a": [{"k": 1, "b": [1, 5]}, {"k": 2, "b": [5, 6]}]}
    out = apply_update(
        doc,
        {"$set": {"a.$[i].b.$[j]": 0}},
        array_filters=[{"i.k": 2}, {"j": {"$gte": 5}}],
    )
    assert out["a"] == [{"k": 1, "b": [1, 5]}, {"k": 2, "b": [0, 0]}]


def test_all_positional_mixed_with_filtered() -> None:
    doc = {"_id": 1, "a": [{"b": [1, 2]}, {"b": [3]}]}
    out = apply_update(doc, {"$inc": {"a.$[].b.$[j]": 10}}, array_filters=[{"j": {"$gte": 2}}])
    assert out["a"] == [{"b": [1, 12]}, {"b": [13]}]


def test_array_filter_errors() -> None:
    doc = {"_id": 1, "a": [1]}
    err = fails(doc, {"$set": {"a.$[x]": 1}})
    assert (err.code, err.errmsg) == (
        2,
        "No array filter found for identifier 'x' in path 'a.$[x]'",
    )
    err = fails(doc, {"$set": {"a.$[]": 1}}, array_filters=[{"x": 1}])
    assert err.code == 9 and err.errmsg.startswith(
        "The array filter for identifier 'x' was not used"
    )
    err = fails(doc, {"$set": {"a.$[x]": 1}}, array_filters=[{"x": 1}, {"x": 2}])
    assert err.code == 9 and "multiple array filters" in err.errmsg
    err = fails(doc, {"$set": {"a.$[x]": 1}}, array_filters=[{"x": 1, "y": 2}])
    assert err.code == 9 and "Expected a single top-level field name" in err.errmsg
    err = fails(doc, {"$set": {"a.$[X]": 1}}, array_filters=[{"X": 1}])
    assert err.code == 2 and "beginning with a lowercase letter" in err.errmsg
    err = fails(doc, {"$set": {"$[x]": 1}}, array_filters=[{"x": 1}])
    assert err.code == 2 and "first position" in err.errmsg


def test_positional_elements_that_collide_at_runtime_conflict() -> None:
    err = fails({"_id": 1, "a": [1, 2]}, {"$set": {"a.$[]": 0, "a.1": 5}})
    assert (err.code, err.errmsg) == (40, "Update created a conflict at 'a.1'")


# --------------------------------------------------------------------------------------
# Parse-time validation


@pytest.mark.parametrize(
    ("update", "message"),
    [
        (
            {"$set": {"a": 1}, "$inc": {"a": 1}},
            "Updating the path 'a' would create a conflict at 'a'",
        ),
        (
            {"$set": {"a": 1}, "$inc": {"a.b": 1}},
            "Updating the path 'a.b' would create a conflict at 'a'",
        ),
        (
            {"$set": {"a.b": 1}, "$unset": {"a": 1}},
            "Updating the path 'a' would create a conflict at 'a'",
        ),
        ({"$set": {"a.b": 1, "a": 1}}, "Updating the path 'a' would create a conflict at 'a'"),
        (
            {"$rename": {"x": "a"}, "$set": {"a": 1}},
            "Updating the path 'a' would create a conflict at 'a'",
        ),
    ],
)
def test_conflicting_paths(update: dict, message: str) -> None:
    err = fails({"_id": 1}, update)
    assert (err.code, err.errmsg) == (40, message)


def _pairwise_conflict(update: dict) -> str | None:
    """The parse-time conflict message as a pairwise check over every earlier path
    finds it (the reference the engine's prefix-set check must agree with)."""
    seen: list[tuple[str, ...]] = []
    for fields in update.values():
        for name in fields:
            path = tuple(name.split("."))
            for other in seen:
                n = min(len(other), len(path))
                if other[:n] == path[:n]:
                    return (
                        f"Updating the path '{name}' would create a conflict at "
                        f"'{'.'.join(path[:n])}'"
                    )
            seen.append(path)
    return None


_OP_ARGS = {"$set": 1, "$inc": 1, "$unset": "", "$max": 1}


@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(_OP_ARGS)),
            st.lists(st.sampled_from("abc"), min_size=1, max_size=3).map(".".join),
        ),
        max_size=6,
    )
)
def test_conflict_check_agrees_with_a_pairwise_check(mods: list[tuple[str, str]]) -> None:
    update: dict[str, dict[str, Any]] = {}
    for op, name in mods:
        update.setdefault(op, {})[name] = _OP_ARGS[op]
    expected = _pairwise_conflict(update)
    if expected is None:
        apply_update({"_id": 1}, update)
    else:
        err = fails({"_id": 1}, update)
        assert (err.code, err.errmsg) == (40, expected)


def test_sibling_paths_do_not_conflict() -> None:
    out = apply_update({"_id": 1}, {"$set": {"a.b": 1, "a.c": 2}, "$inc": {"ab": 1}})
    assert out == {"_id": 1, "a": {"b": 1, "c": 2}, "ab": 1}


def test_unknown_modifier() -> None:
    err = fails({"_id": 1}, {"$foo": {"a": 1}})
    assert err.code == 9
    assert err.errmsg == (
        "Unknown modifier: $foo. Expected a valid update modifier or pipeline-style update "
        "specified as an array"
    )


def test_operator_document_mixed_with_plain_field() -> None:
    err = fails({"_id": 1}, {"$set": {"a": 1}, "b": 2})
    assert err.code == 9 and err.errmsg.startswith("Unknown modifier: b.")


def test_modifier_argument_must_be_a_document() -> None:
    err = fails({"_id": 1}, {"$set": 1})
    assert err.code == 9 and err.errmsg.startswith(
        "Modifiers operate on fields but we found type int"
    )


def test_empty_paths_and_empty_components() -> None:
    err = fails({"_id": 1}, {"$set": {"": 1}})
    assert (err.code, err.errmsg) == (56, "An empty update path is not valid.")
    err = fails({"_id": 1}, {"$set": {"a..b": 1}})
    assert err.code == 56 and "contains an empty field name" in err.errmsg


def test_dollar_prefixed_path_component() -> None:
    assert fails({"_id": 1}, {"$set": {"a.$bad": 1}}).code == 52


# --------------------------------------------------------------------------------------
# _id immutability


@pytest.mark.parametrize(
    ("doc", "update", "path"),
    [
        ({"_id": 1}, {"$set": {"_id": 2}}, "_id"),
        ({"_id": 1}, {"$unset": {"_id": 1}}, "_id"),
        ({"_id": 1}, {"$inc": {"_id": 1}}, "_id"),
        ({"_id": {"x": 0}}, {"$set": {"_id.x": 1}}, "_id.x"),
    ],
)
def test_modifying_id_is_immutable_field(doc: dict, update: dict, path: str) -> None:
    err = fails(doc, update)
    assert err.code == 66
    assert err.errmsg == (
        f"Performing an update on the path '{path}' would modify the immutable field '_id'"
    )


def test_rename_of_id_is_immutable_field() -> None:
    err = fails({"_id": 1}, {"$rename": {"_id": "x"}})
    assert err.code == 66 and err.errmsg.startswith("Unsetting the path '_id' using $rename")


def test_setting_id_to_an_equal_value_is_allowed() -> None:
    out = apply_update({"_id": 1, "a": 1}, {"$set": {"_id": 1.0, "a": 2}})
    assert out == {"_id": 1, "a": 2} and type(out["_id"]) is int


def test_upsert_insert_may_set_id_only_when_query_did_not() -> None:
    assert apply_update({}, {"$set": {"_id": 7}}, is_insert=True) == {"_id": 7}
    assert fails({"_id": 1}, {"$set": {"_id": 7}}, is_insert=True).code == 66


# --------------------------------------------------------------------------------------
# Replacement and pipeline updates


def test_replacement_keeps_id_and_drops_other_fields() -> None:
    out = apply_update({"_id": 1, "a": 1, "b": 2}, {"c": 3})
    assert out == {"_id": 1, "c": 3} and list(out)[0] == "_id"


def test_replacement_with_same_id_is_allowed() -> None:
    assert apply_update({"_id": 1, "a": 1}, {"_id": 1, "b": 2}) == {"_id": 1, "b": 2}


def test_replacement_with_different_id_is_immutable_field() -> None:
    err = fails({"_id": 1}, {"_id": 2})
    assert err.code == 66
    assert err.errmsg == (
        "After applying the update, the (immutable) field '_id' was found to have been altered "
        "to _id: 2"
    )


def test_empty_replacement_keeps_only_id() -> None:
    assert apply_update({"_id": 1, "a": 1}, {}) == {"_id": 1}


def test_replacement_with_top_level_dollar_field() -> None:
    err = fails({"_id": 1}, {"a": 1, "$set": {"b": 1}})
    assert err.code == 52 and "not allowed in the context of an update's replacement" in err.errmsg


def test_replacement_result_does_not_share_structure_with_update() -> None:
    replacement = {"a": [1]}
    out = apply_update({"_id": 1}, replacement)
    out["a"].append(2)
    assert replacement == {"a": [1]}


def test_pipeline_set_with_expressions() -> None:
    out = apply_update(
        {"_id": 1, "a": 2, "b": 3},
        [
            {"$set": {"sum": {"$add": ["$a", "$b"]}}},
            {"$addFields": {"twice": {"$multiply": ["$sum", 2]}}},
        ],
    )
    assert out == {"_id": 1, "a": 2, "b": 3, "sum": 5, "twice": 10}


def test_pipeline_unset_string_and_list() -> None:
    doc = {"_id": 1, "a": 1, "b": 2, "c": 3}
    assert apply_update(doc, [{"$unset": "a"}]) == {"_id": 1, "b": 2, "c": 3}
    assert apply_update(doc, [{"$unset": ["a", "b"]}]) == {"_id": 1, "c": 3}


def test_pipeline_project() -> None:
    assert apply_update({"_id": 1, "a": 1, "b": 2}, [{"$project": {"a": 1}}]) == {"_id": 1, "a": 1}


def test_pipeline_replace_with_restores_id() -> None:
    doc = {"_id": 1, "inner": {"x": 1}}
    assert apply_update(doc, [{"$replaceWith": "$inner"}]) == {"_id": 1, "x": 1}
    assert apply_update(doc, [{"$replaceRoot": {"newRoot": "$inner"}}]) == {"_id": 1, "x": 1}


def test_pipeline_cannot_change_id() -> None:
    assert fails({"_id": 1}, [{"$set": {"_id": 2}}]).code == 66


def test_pipeline_rejects_other_stages() -> None:
    err = fails({"_id": 1}, [{"$match": {}}])
    assert (err.code, err.errmsg) == (72, "$match is not allowed to be used within an update")
    assert fails({"_id": 1}, [{"$bogus": {}}]).code == 40324
    assert fails({"_id": 1}, [{"$set": {"a": 1}, "$unset": "b"}]).code == 40323


def test_pipeline_with_array_filters_is_refused() -> None:
    assert fails({"_id": 1}, [{"$set": {"a": 1}}], array_filters=[{"x": 1}]).code == 72


def test_update_must_be_document_or_array() -> None:
    assert fails({"_id": 1}, "nope").code == 14  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# Upserts


def test_upsert_seed_takes_equality_fields() -> None:
    query = {
        "name": "x",
        "n": {"$eq": 3},
        "a.b": 1,
        "big": {"$gt": 1},
        "re": re.compile("^x"),
        "sub": {"k": 1},
        "$and": [{"c": 2}, {"d": {"$in": [1]}}],
        "$or": [{"e": 1}],
        "_id": 9,
    }
    seed = upsert_seed(query)
    assert seed == {"_id": 9, "name": "x", "n": 3, "a": {"b": 1}, "sub": {"k": 1}, "c": 2}
    assert list(seed)[0] == "_id"


def test_upsert_seed_of_empty_query_is_empty() -> None:
    assert upsert_seed({}) == {}


def test_upsert_seed_refuses_paths_matched_twice() -> None:
    with pytest.raises(EngineError) as info:
        upsert_seed({"a": 1, "$and": [{"a": 2}]})
    assert info.value.code == 54
    with pytest.raises(EngineError) as info:
        upsert_seed({"a": 1, "a.b": 2})
    assert info.value.code == 54


def test_upsert_flow_applies_update_to_seed() -> None:
    query = {"_id": "k", "tenant": "t1"}
    update = {"$set": {"v": 1}, "$setOnInsert": {"created": True}, "$inc": {"n": 1}}
    out = apply_update(upsert_seed(query), update, query=query, is_insert=True)
    assert out == {"_id": "k", "tenant": "t1", "created": True, "n": 1, "v": 1}


# --------------------------------------------------------------------------------------
# Value helpers


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (None, "null"),
        (True, "bool"),
        (1, "int"),
        (2**40, "long"),
        (Int64(1), "long"),
        (1.5, "double"),
        (Decimal128("1"), "decimal"),
        ("s", "string"),
        ({}, "object"),
        ([], "array"),
        (b"x", "binData"),
        (ObjectId(), "objectId"),
        (dt.datetime(2020, 1, 1), "date"),
        (Timestamp(1, 1), "timestamp"),
        (re.compile("x"), "regex"),
        (MinKey(), "minKey"),
        (MaxKey(), "maxKey"),
    ],
)
def test_bson_type_name(value: Any, name: str) -> None:
    assert bson_type_name(value) == name


def test_compare_values_follows_bson_type_order() -> None:
    ordered = [
        MinKey(),
        None,
        -1,
        2.5,
        "a",
        {"a": 1},
        [1],
        b"x",
        ObjectId("000000000000000000000000"),
        False,
        True,
        dt.datetime(2020, 1, 1),
        Timestamp(1, 1),
        re.compile("x"),
        MaxKey(),
    ]
    for i, a in enumerate(ordered):
        for j, b in enumerate(ordered):
            assert compare_values(a, b) == (i > j) - (i < j), (a, b)


def test_values_equal_numbers_and_documents() -> None:
    assert values_equal(1, 1.0) and values_equal(Int64(2), 2) and values_equal(Decimal128("3"), 3)
    assert not values_equal(True, 1)
    assert not values_equal({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert values_equal({"a": 1, "b": 2}, {"b": 2, "a": 1}, ignore_field_order=True)


@given(a=st.one_of(st.integers(), st.text()), b=st.one_of(st.integers(), st.text()))
def test_compare_values_is_antisymmetric_and_matches_python_within_a_type(a: Any, b: Any) -> None:
    assert compare_values(a, b) == -compare_values(b, a)
    if type(a) is type(b):
        assert compare_values(a, b) == (a > b) - (a < b)


def test_format_value_mimics_mongod_shell_output() -> None:
    assert format_value({"a": 1, "b": "x", "c": [1, 2.0], "d": None, "e": {}}) == (
        '{ a: 1, b: "x", c: [ 1, 2.0 ], d: null, e: {} }'
    )
