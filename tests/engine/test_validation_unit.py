"""Unit tests for the embedded engine's collection validators (pure functions, no server)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from bson.binary import Binary
from bson.code import Code
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from accord.platform.embedded.errors import EngineError
from accord.platform.embedded.validation import check_validator, validate_document


def schema(**keywords: Any) -> dict:
    return {"$jsonSchema": keywords}


def prop(name: str, **keywords: Any) -> dict:
    """A validator with one property schema."""
    return schema(properties={name: keywords})


def passes(doc: dict, validator: dict) -> bool:
    try:
        validate_document(doc, validator)
    except EngineError as exc:
        assert exc.code == 121
        return False
    return True


def failure(doc: dict, validator: dict) -> EngineError:
    with pytest.raises(EngineError) as info:
        validate_document(doc, validator)
    assert info.value.code == 121
    assert info.value.errmsg == "Document failed validation"
    return info.value


def rules(doc: dict, validator: dict) -> list[dict]:
    """The schemaRulesNotSatisfied of a failing document."""
    details = failure(doc, validator).extra["errInfo"]["details"]
    assert details["operatorName"] == "$jsonSchema"
    return details["schemaRulesNotSatisfied"]


def bad_validator(validator: dict) -> EngineError:
    with pytest.raises(EngineError) as info:
        check_validator(validator)
    return info.value


# --------------------------------------------------------------------------------------
# bsonType / type


@pytest.mark.parametrize(
    ("value", "alias"),
    [
        (1.5, "double"),
        ("s", "string"),
        ({"a": 1}, "object"),
        ([1], "array"),
        (b"x", "binData"),
        (Binary(b"x", 4), "binData"),
        (ObjectId(), "objectId"),
        (True, "bool"),
        (dt.datetime(2020, 1, 1), "date"),
        (None, "null"),
        (re.compile("x"), "regex"),
        (Regex("x"), "regex"),
        (Code("f()"), "javascript"),
        (1, "int"),
        (2**31 - 1, "int"),
        (2**31, "long"),
        (Int64(1), "long"),
        (Timestamp(1, 1), "timestamp"),
        (Decimal128("1.5"), "decimal"),
        (1, "number"),
        (1.5, "number"),
        (Int64(5), "number"),
        (Decimal128("2"), "number"),
    ],
)
def test_bson_type_aliases_match_python_values(value: Any, alias: str) -> None:
    assert passes({"_id": 1, "v": value}, prop("v", bsonType=alias))


@pytest.mark.parametrize(
    ("value", "alias"),
    [
        (True, "int"),
        (True, "number"),
        (1, "bool"),
        (1, "double"),
        (1.0, "int"),
        (Int64(1), "int"),
        (2**31, "int"),
        ("s", "objectId"),
        (Code("f()"), "string"),
        ([1], "object"),
        ({}, "array"),
        (None, "string"),
    ],
)
def test_bson_type_mismatches(value: Any, alias: str) -> None:
    assert not passes({"_id": 1, "v": value}, prop("v", bsonType=alias))


def test_bson_type_list_accepts_any_listed_type() -> None:
    validator = prop("v", bsonType=["string", "null"])
    assert passes({"v": "x"}, validator) and passes({"v": None}, validator)
    assert not passes({"v": 1}, validator)


@pytest.mark.parametrize(
    ("value", "json_type", "ok"),
    [
        (True, "boolean", True),
        (1, "boolean", False),
        (1, "number", True),
        (2.5, "number", True),
        (True, "number", False),
        (None, "null", True),
        ("x", "string", True),
        ({}, "object", True),
        ([], "array", True),
        ([], "object", False),
    ],
)
def test_json_type_keyword(value: Any, json_type: str, ok: bool) -> None:
    assert passes({"v": value}, prop("v", type=json_type)) is ok


def test_type_failure_detail_names_property_and_type() -> None:
    validator = schema(properties={"name": {"bsonType": "string", "description": "a name"}})
    [rule] = rules({"_id": 7, "name": 5}, validator)
    assert rule["operatorName"] == "properties"
    [entry] = rule["propertiesNotSatisfied"]
    assert entry["propertyName"] == "name"
    assert entry["description"] == "a name"
    assert entry["details"] == [
        {
            "operatorName": "bsonType",
            "specifiedAs": {"bsonType": "string"},
            "reason": "type did not match",
            "consideredValue": 5,
            "consideredType": "int",
        }
    ]


def test_top_level_type_other_than_object_rejects_every_document() -> None:
    assert not passes({"_id": 1}, schema(bsonType="array"))
    assert passes({"_id": 1}, schema(bsonType="object"))


@given(n=st.integers(-(2**63), 2**63 - 1))
def test_int_and_long_split_at_32_bits(n: int) -> None:
    fits = -(2**31) <= n < 2**31
    assert passes({"v": n}, prop("v", bsonType="int")) is fits
    assert passes({"v": n}, prop("v", bsonType="long")) is not fits


# --------------------------------------------------------------------------------------
# Object keywords


def test_required_lists_missing_properties() -> None:
    validator = schema(required=["a", "b", "c"])
    assert passes({"a": 1, "b": None, "c": 0}, validator)
    [rule] = rules({"_id": 1, "a": 1}, validator)
    assert rule == {
        "operatorName": "required",
        "specifiedAs": {"required": ["a", "b", "c"]},
        "missingProperties": ["b", "c"],
    }


def test_properties_only_constrain_present_fields() -> None:
    validator = prop("a", bsonType="int")
    assert passes({"_id": 1}, validator)
    assert passes({"_id": 1, "a": 3}, validator)
    assert not passes({"_id": 1, "a": "3"}, validator)


def test_nested_properties_report_the_nested_path() -> None:
    validator = schema(
        properties={"addr": {"bsonType": "object", "properties": {"zip": {"bsonType": "string"}}}}
    )
    assert passes({"addr": {"zip": "123"}}, validator)
    [rule] = rules({"addr": {"zip": 123}}, validator)
    outer = rule["propertiesNotSatisfied"][0]
    assert outer["propertyName"] == "addr"
    inner = outer["details"][0]["propertiesNotSatisfied"][0]
    assert inner["propertyName"] == "zip"
    assert inner["details"][0]["operatorName"] == "bsonType"


def test_additional_properties_false() -> None:
    validator = schema(properties={"_id": {}, "a": {}}, additionalProperties=False)
    assert passes({"_id": 1, "a": 1}, validator)
    [rule] = rules({"_id": 1, "a": 1, "x": 1, "y": 2}, validator)
    assert rule["operatorName"] == "additionalProperties"
    assert rule["additionalProperties"] == ["x", "y"]


def test_additional_properties_false_counts_id_like_mongod() -> None:
    assert not passes({"_id": 1, "a": 1}, schema(properties={"a": {}}, additionalProperties=False))


def test_additional_properties_schema() -> None:
    validator = schema(properties={"_id": {}}, additionalProperties={"bsonType": "int"})
    assert passes({"_id": "k", "a": 1, "b": 2}, validator)
    [rule] = rules({"_id": "k", "a": 1, "b": "x"}, validator)
    assert rule["details"][0]["propertyName"] == "b"


def test_pattern_properties() -> None:
    validator = schema(
        patternProperties={"^n_": {"bsonType": "number"}},
        properties={"_id": {}},
        additionalProperties=False,
    )
    assert passes({"_id": 1, "n_a": 1, "n_b": 2.5}, validator)
    failing = rules({"_id": 1, "n_a": "x", "other": 1}, validator)
    assert {r["operatorName"] for r in failing} == {"patternProperties", "additionalProperties"}
    pattern_rule = next(r for r in failing if r["operatorName"] == "patternProperties")
    assert pattern_rule["details"][0]["propertyName"] == "n_a"
    assert pattern_rule["details"][0]["regexMatched"] == "^n_"


def test_min_and_max_properties() -> None:
    validator = schema(minProperties=2, maxProperties=3)
    assert passes({"_id": 1, "a": 1}, validator)
    [rule] = rules({"_id": 1}, validator)
    assert rule["operatorName"] == "minProperties" and rule["numberOfProperties"] == 1
    [rule] = rules({"_id": 1, "a": 1, "b": 1, "c": 1}, validator)
    assert rule["operatorName"] == "maxProperties"


def test_property_dependencies() -> None:
    validator = schema(dependencies={"card": ["billing"]})
    assert passes({"name": "x"}, validator)
    assert passes({"card": 1, "billing": 2}, validator)
    [rule] = rules({"card": 1}, validator)
    assert rule["operatorName"] == "dependencies"
    assert rule["failingDependencies"][0]["missingProperties"] == ["billing"]


def test_schema_dependencies() -> None:
    validator = schema(dependencies={"card": {"required": ["billing"]}})
    assert passes({"card": 1, "billing": 2}, validator)
    assert not passes({"card": 1}, validator)


# --------------------------------------------------------------------------------------
# Scalar keywords


def test_minimum_and_maximum_inclusive() -> None:
    validator = prop("n", minimum=0, maximum=10)
    assert passes({"n": 0}, validator) and passes({"n": 10}, validator)
    assert passes({"n": Int64(5)}, validator) and passes({"n": Decimal128("9.5")}, validator)
    [rule] = rules({"n": -1}, validator)
    detail = rule["propertiesNotSatisfied"][0]["details"][0]
    assert detail["operatorName"] == "minimum"
    assert detail["reason"] == "comparison failed" and detail["consideredValue"] == -1
    assert not passes({"n": 10.5}, validator)


def test_exclusive_bounds() -> None:
    validator = prop("n", minimum=0, exclusiveMinimum=True, maximum=10, exclusiveMaximum=True)
    assert passes({"n": 5}, validator)
    assert not passes({"n": 0}, validator) and not passes({"n": 10}, validator)
    assert passes({"n": 0}, prop("n", minimum=0, exclusiveMinimum=False))


def test_numeric_keywords_ignore_non_numbers() -> None:
    assert passes({"n": "text"}, prop("n", minimum=5))


def test_multiple_of() -> None:
    validator = prop("n", multipleOf=0.5)
    assert passes({"n": 2.5}, validator) and passes({"n": 3}, validator)
    assert not passes({"n": 2.3}, validator)


def test_min_and_max_length_count_code_points() -> None:
    validator = prop("s", minLength=2, maxLength=3)
    assert passes({"s": "ab"}, validator) and passes({"s": "日本語"}, validator)
    assert not passes({"s": "a"}, validator) and not passes({"s": "abcd"}, validator)
    assert passes({"s": 12345}, validator)  # only strings are constrained


@given(text=st.text(max_size=12), minimum=st.integers(0, 8))
def test_min_length_matches_len(text: str, minimum: int) -> None:
    assert passes({"s": text}, prop("s", minLength=minimum)) is (len(text) >= minimum)


def test_pattern() -> None:
    validator = prop("email", pattern="^[^@]+@[^@]+$")
    assert passes({"email": "a@b"}, validator)
    [rule] = rules({"email": "nope"}, validator)
    detail = rule["propertiesNotSatisfied"][0]["details"][0]
    assert detail["operatorName"] == "pattern"
    assert detail["reason"] == "regular expression did not match"


def test_enum_uses_bson_equality_ignoring_field_order() -> None:
    validator = prop("v", enum=["a", 1, {"x": 1, "y": 2}])
    assert passes({"v": "a"}, validator) and passes({"v": 1.0}, validator)
    assert passes({"v": {"y": 2, "x": 1}}, validator)
    assert not passes({"v": True}, validator)
    [rule] = rules({"v": "b"}, validator)
    detail = rule["propertiesNotSatisfied"][0]["details"][0]
    assert detail["operatorName"] == "enum" and detail["reason"] == "value was not found in enum"


def test_description_and_title_are_annotations_only() -> None:
    validator = schema(title="t", description="d", properties={"a": {"title": "x"}})
    assert passes({"a": 1}, validator)


# --------------------------------------------------------------------------------------
# Array keywords


def test_items_schema_applies_to_every_element() -> None:
    validator = prop("tags", bsonType="array", items={"bsonType": "string"})
    assert passes({"tags": ["a", "b"]}, validator) and passes({"tags": []}, validator)
    [rule] = rules({"tags": ["a", 2]}, validator)
    detail = rule["propertiesNotSatisfied"][0]["details"][0]
    assert detail["operatorName"] == "items" and detail["itemIndex"] == 1


def test_positional_items_and_additional_items() -> None:
    validator = prop(
        "p", items=[{"bsonType": "string"}, {"bsonType": "int"}], additionalItems=False
    )
    assert passes({"p": ["a", 1]}, validator) and passes({"p": ["a"]}, validator)
    assert not passes({"p": [1, "a"]}, validator)
    assert not passes({"p": ["a", 1, 2]}, validator)
    extra_schema = prop("p", items=[{"bsonType": "string"}], additionalItems={"bsonType": "int"})
    assert passes({"p": ["a", 1, 2]}, extra_schema)
    assert not passes({"p": ["a", 1, "b"]}, extra_schema)


def test_min_and_max_items() -> None:
    validator = prop("a", minItems=1, maxItems=2)
    assert passes({"a": [1]}, validator) and passes({"a": [1, 2]}, validator)
    assert not passes({"a": []}, validator) and not passes({"a": [1, 2, 3]}, validator)


def test_unique_items() -> None:
    validator = prop("a", uniqueItems=True)
    assert passes({"a": [1, 2, "1"]}, validator)
    assert not passes({"a": [1, 1.0]}, validator)
    [rule] = rules({"a": [{"x": 1, "y": 2}, {"y": 2, "x": 1}]}, validator)
    detail = rule["propertiesNotSatisfied"][0]["details"][0]
    assert detail["operatorName"] == "uniqueItems"
    assert detail["duplicatedValue"] == {"y": 2, "x": 1}
    assert passes({"a": [1, 1]}, prop("a", uniqueItems=False))


# --------------------------------------------------------------------------------------
# Logical keywords


def test_all_of() -> None:
    validator = prop("n", allOf=[{"bsonType": "int"}, {"minimum": 5}])
    assert passes({"n": 6}, validator)
    [rule] = rules({"n": 4}, validator)
    detail = rule["propertiesNotSatisfied"][0]["details"][0]
    assert detail["operatorName"] == "allOf"
    assert [s["index"] for s in detail["schemasNotSatisfied"]] == [1]


def test_any_of() -> None:
    validator = prop("v", anyOf=[{"bsonType": "string"}, {"bsonType": "int", "minimum": 0}])
    assert passes({"v": "x"}, validator) and passes({"v": 3}, validator)
    assert not passes({"v": -3}, validator)


def test_one_of() -> None:
    validator = prop("n", oneOf=[{"minimum": 5}, {"maximum": 10}])
    assert passes({"n": 1}, validator) and passes({"n": 20}, validator)
    [rule] = rules({"n": 7}, validator)  # both match
    detail = rule["propertiesNotSatisfied"][0]["details"][0]
    assert detail["operatorName"] == "oneOf"
    assert detail["matchingSchemaIndexes"] == [0, 1]


def test_not() -> None:
    validator = prop("v", **{"not": {"bsonType": "string"}})
    assert passes({"v": 1}, validator)
    assert not passes({"v": "x"}, validator)


# --------------------------------------------------------------------------------------
# Whole validators


def test_empty_validator_accepts_everything() -> None:
    validate_document({"anything": 1}, {})


def test_err_info_shape() -> None:
    validator = schema(bsonType="object", required=["name"])
    info = failure({"_id": ObjectId("0123456789ab0123456789ab")}, validator).extra["errInfo"]
    assert info["failingDocumentId"] == ObjectId("0123456789ab0123456789ab")
    assert info["details"]["operatorName"] == "$jsonSchema"
    assert info["details"]["schemaRulesNotSatisfied"][0]["operatorName"] == "required"


def test_write_error_carries_err_info() -> None:
    entry = failure({"_id": 1}, schema(required=["a"])).to_write_error(0)
    assert entry["code"] == 121 and entry["errInfo"]["failingDocumentId"] == 1


def test_query_validator() -> None:
    validator = {"status": {"$in": ["open", "closed"]}, "n": {"$gte": 0}}
    assert passes({"status": "open", "n": 1}, validator)
    details = failure({"_id": 1, "status": "x", "n": 1}, validator).extra["errInfo"]["details"]
    assert details["operatorName"] == "$and"
    [clause] = details["clausesNotSatisfied"]
    assert clause["index"] == 0
    assert clause["details"]["operatorName"] == "$in"
    assert clause["details"]["consideredValue"] == "x"


def test_query_validator_missing_field_detail() -> None:
    details = failure({"_id": 1}, {"a": {"$exists": True}}).extra["errInfo"]["details"]
    assert details["operatorName"] == "$exists" and details["reason"] == "field was missing"


def test_json_schema_beside_query_conditions() -> None:
    validator = {"$jsonSchema": {"required": ["a"]}, "a": {"$gt": 0}}
    assert passes({"a": 1}, validator)
    assert not passes({"a": 0}, validator)
    assert not passes({"b": 1}, validator)


def test_json_schema_inside_and_and_or() -> None:
    in_and = {"$and": [{"$jsonSchema": {"required": ["a"]}}, {"b": 1}]}
    assert passes({"a": 1, "b": 1}, in_and) and not passes({"b": 1}, in_and)
    in_or = {"$or": [{"$jsonSchema": {"required": ["a"]}}, {"b": 1}]}
    assert passes({"a": 1}, in_or) and passes({"b": 1}, in_or)
    details = failure({"c": 1}, in_or).extra["errInfo"]["details"]
    assert details["operatorName"] == "$or" and len(details["clausesNotSatisfied"]) == 2


def test_nor_and_expr_validators() -> None:
    assert passes({"a": 1}, {"$nor": [{"a": 2}]}) and not passes({"a": 2}, {"$nor": [{"a": 2}]})
    validator = {"$expr": {"$gt": ["$hi", "$lo"]}}
    assert passes({"hi": 2, "lo": 1}, validator) and not passes({"hi": 1, "lo": 2}, validator)


# --------------------------------------------------------------------------------------
# check_validator


def test_check_validator_accepts_a_rich_valid_schema() -> None:
    check_validator(
        {
            "$jsonSchema": {
                "bsonType": "object",
                "title": "thread",
                "required": ["thread_id", "checkpoint"],
                "additionalProperties": True,
                "properties": {
                    "thread_id": {"bsonType": "string", "minLength": 1, "pattern": "^[a-z]"},
                    "n": {"bsonType": ["int", "long"], "minimum": 0, "exclusiveMinimum": True},
                    "tags": {
                        "bsonType": "array",
                        "items": {"enum": ["a", "b"]},
                        "uniqueItems": True,
                    },
                    "meta": {
                        "bsonType": "object",
                        "maxProperties": 10,
                        "dependencies": {"a": ["b"]},
                    },
                    "v": {"anyOf": [{"type": "string"}, {"not": {"type": "null"}}]},
                },
                "patternProperties": {"^x_": {"bsonType": "number", "multipleOf": 2}},
            },
            "status": {"$in": ["a", "b"]},
        }
    )


@pytest.mark.parametrize(
    ("validator", "code", "message"),
    [
        (schema(foo=1), 9, "Unknown $jsonSchema keyword: foo"),
        (schema(format="date"), 9, "$jsonSchema keyword 'format' is not currently supported"),
        (schema(**{"$ref": "#/x"}), 9, "$jsonSchema keyword '$ref' is not currently supported"),
        (schema(type="object", bsonType="object"), 9, "Cannot specify both $jsonSchema keywords"),
        (schema(bsonType="strin"), 2, "Unknown type name alias: strin"),
        (schema(type="integer"), 9, "$jsonSchema type 'integer' is not currently supported."),
        (schema(bsonType=1), 14, "must be either a string or an array of strings"),
        (schema(bsonType=[]), 9, "must name at least one type"),
        (schema(required="a"), 14, "$jsonSchema keyword 'required' must be an array"),
        (schema(required=[]), 9, "$jsonSchema keyword 'required' cannot be an empty array"),
        (schema(required=["a", "a"]), 9, "cannot contain duplicate values"),
        (schema(properties=[]), 14, "$jsonSchema keyword 'properties' must be an object"),
        (schema(properties={"a": 1}), 14, "Nested schema for $jsonSchema property 'a' must be"),
        (prop("a", minimum="1"), 14, "$jsonSchema keyword 'minimum' must be a number"),
        (prop("a", exclusiveMinimum=True), 9, "must be a present if exclusiveMinimum is present"),
        (prop("a", maximum=1, exclusiveMaximum=1), 14, "'exclusiveMaximum' must be a boolean"),
        (prop("a", minLength=-1), 9, "Expected a positive number"),
        (prop("a", minLength=1.5), 9, "Expected an integer"),
        (prop("a", maxItems="2"), 14, "Expected a number"),
        (prop("a", pattern=5), 14, "$jsonSchema keyword 'pattern' must be a string"),
        (prop("a", pattern="("), 51091, "Regular expression is invalid"),
        (prop("a", multipleOf=0), 9, "'multipleOf' must have a positive value"),
        (prop("a", enum=[]), 9, "$jsonSchema keyword 'enum' cannot be an empty array"),
        (prop("a", enum=[1, 1.0]), 9, "cannot contain duplicate values"),
        (prop("a", allOf=[]), 2, "$jsonSchema keyword 'allOf' must be a non-empty array"),
        (prop("a", anyOf={}), 14, "$jsonSchema keyword 'anyOf' must be an array"),
        (prop("a", oneOf=[1]), 14, "must be an array of objects"),
        (prop("a", **{"not": []}), 14, "$jsonSchema keyword 'not' must be an object"),
        (prop("a", items=1), 14, "$jsonSchema keyword 'items' must be an array or an object"),
        (prop("a", additionalItems=1), 14, "'additionalItems' must be either an object"),
        (schema(additionalProperties=1), 14, "must be an object or a boolean"),
        (prop("a", uniqueItems=1), 14, "'uniqueItems' must be a boolean"),
        (schema(dependencies={"a": 1}), 14, "must be either an object or an array"),
        (schema(description=1), 14, "'description' must be of type string"),
        ({"$jsonSchema": []}, 14, "$jsonSchema must be an object"),
        ({"$and": []}, 2, "$and argument must be a non-empty array"),
        ({"a": {"$bogus": 1}}, 2, "unknown operator: $bogus"),
        ({"$where": "true"}, 2, "$where is not allowed"),
    ],
)
def test_check_validator_rejects(validator: dict, code: int, message: str) -> None:
    err = bad_validator(validator)
    assert err.code == code
    assert message in err.errmsg


def test_check_validator_finds_errors_deep_in_the_schema() -> None:
    nested = schema(properties={"a": {"properties": {"b": {"items": {"oops": 1}}}}})
    assert bad_validator(nested).errmsg == "Unknown $jsonSchema keyword: oops"
    in_and = {"$and": [{"x": 1}, {"$jsonSchema": {"bsonType": "nope"}}]}
    assert bad_validator(in_and).code == 2
