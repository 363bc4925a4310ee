"""Collection validators: ``$jsonSchema`` and query-style, as mongod enforces them.

A validator is a query filter in which ``$jsonSchema`` is one more operator, so it may
stand alone, sit beside field conditions, or appear inside ``$and``/``$or``/``$nor``.
``check_validator`` rejects a malformed validator when ``create``/``collMod`` receives it
(same codes and messages as mongod's JSON Schema parser); ``validate_document`` raises
error 121 with a mongod-5-style ``errInfo`` naming the rules the document broke.

The schema dialect is MongoDB's draft-4 subset: ``exclusiveMinimum``/``exclusiveMaximum``
are booleans qualifying ``minimum``/``maximum``, ``type: "integer"`` is unsupported, and
``$ref``, ``definitions``, ``format``, ``default``, ``id`` and ``$schema`` are refused.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import uuid
from decimal import Decimal, InvalidOperation, localcontext
from typing import Any

from bson.code import Code as JavaScript
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.limits import regex_search
from accord.platform.embedded.mongomock_bridge import matches_filter
from accord.platform.embedded.values import bson_type_name, compare_values, values_equal

__all__ = ["check_validator", "validate_document"]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal128) and not isinstance(value, bool)


def _is_int32(value: Any) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool | Int64)
        and _INT32_MIN <= value <= _INT32_MAX
    )


def _is_long(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and not _is_int32(value)


# bsonType aliases mongod accepts, with the Python values each one matches. Types the
# driver never produces for us (undefined, dbPointer, symbol) match nothing.
_BSON_TYPES: dict[str, Any] = {
    "double": lambda v: isinstance(v, float),
    "string": lambda v: isinstance(v, str) and not isinstance(v, JavaScript),
    "object": lambda v: isinstance(v, dict | DBRef),
    "array": lambda v: isinstance(v, list | tuple),
    "binData": lambda v: isinstance(v, bytes | uuid.UUID),
    "undefined": lambda v: False,
    "objectId": lambda v: isinstance(v, ObjectId),
    "bool": lambda v: isinstance(v, bool),
    "date": lambda v: isinstance(v, dt.datetime),
    "null": lambda v: v is None,
    "regex": lambda v: isinstance(v, re.Pattern | Regex),
    "dbPointer": lambda v: False,
    "javascript": lambda v: isinstance(v, JavaScript) and not v.scope,
    "symbol": lambda v: False,
    "javascriptWithScope": lambda v: isinstance(v, JavaScript) and bool(v.scope),
    "int": _is_int32,
    "timestamp": lambda v: isinstance(v, Timestamp),
    "long": _is_long,
    "decimal": lambda v: isinstance(v, Decimal128),
    "minKey": lambda v: isinstance(v, MinKey),
    "maxKey": lambda v: isinstance(v, MaxKey),
    "number": _is_number,
}

# JSON Schema's own type names (the "type" keyword).
_JSON_TYPES: dict[str, Any] = {
    "object": _BSON_TYPES["object"],
    "array": _BSON_TYPES["array"],
    "number": _is_number,
    "boolean": _BSON_TYPES["bool"],
    "string": _BSON_TYPES["string"],
    "null": _BSON_TYPES["null"],
}

#: The type tests by name, shared with the fast checker (schema_fast.py).
BSON_TYPES = _BSON_TYPES
JSON_TYPES = _JSON_TYPES

_KEYWORDS = {
    "additionalItems",
    "additionalProperties",
    "allOf",
    "anyOf",
    "bsonType",
    "dependencies",
    "description",
    "enum",
    "exclusiveMaximum",
    "exclusiveMinimum",
    "items",
    "maxItems",
    "maxLength",
    "maxProperties",
    "maximum",
    "minItems",
    "minLength",
    "minProperties",
    "minimum",
    "multipleOf",
    "not",
    "oneOf",
    "pattern",
    "patternProperties",
    "properties",
    "required",
    "title",
    "type",
    "uniqueItems",
}
_UNSUPPORTED = {"$ref", "$schema", "default", "definitions", "format", "id"}
# Client-side field level encryption keywords: valid in MongoDB, meaningless here.
_ENCRYPTION = {"encrypt", "encryptMetadata"}


# --------------------------------------------------------------------------------------
# Checking the validator itself


def _fail(code: int, message: str) -> EngineError:
    return EngineError(code, message)


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise _fail(Code.Location51091, f"Regular expression is invalid: {exc}") from exc


def _check_type_keyword(keyword: str, spec: Any) -> None:
    aliases = _BSON_TYPES if keyword == "bsonType" else _JSON_TYPES
    if isinstance(spec, str):
        names = [spec]
    elif isinstance(spec, list):
        if not all(isinstance(n, str) for n in spec):
            raise _fail(
                Code.TypeMismatch, f"$jsonSchema keyword '{keyword}' array elements must be strings"
            )
        names = spec
    else:
        raise _fail(
            Code.TypeMismatch,
            f"$jsonSchema keyword '{keyword}' must be either a string or an array of strings",
        )
    if not names:
        raise _fail(
            Code.FailedToParse, f"$jsonSchema keyword '{keyword}' must name at least one type"
        )
    for name in names:
        if keyword == "type" and name == "integer":
            raise _fail(
                Code.FailedToParse, "$jsonSchema type 'integer' is not currently supported."
            )
        if name not in aliases:
            raise _fail(Code.BadValue, f"Unknown type name alias: {name}")
    if len(set(names)) != len(names):
        raise _fail(Code.BadValue, f"$jsonSchema keyword '{keyword}' has duplicate value")


def _check_count(keyword: str, value: Any) -> None:
    """mongod's parseIntegerElementToNonNegativeLong."""
    if not _is_number(value):
        raise _fail(Code.TypeMismatch, f"Expected a number in: {keyword}: {value!r}")
    number = float(value.to_decimal()) if isinstance(value, Decimal128) else value
    if not (math.isfinite(number) and float(number).is_integer()):
        raise _fail(Code.FailedToParse, f"Expected an integer: {keyword}: {value!r}")
    if number < 0:
        raise _fail(Code.FailedToParse, f"Expected a positive number in: {keyword}: {value!r}")


def _check_subschema_list(keyword: str, value: Any) -> None:
    if not isinstance(value, list):
        raise _fail(Code.TypeMismatch, f"$jsonSchema keyword '{keyword}' must be an array")
    if not value:
        raise _fail(Code.BadValue, f"$jsonSchema keyword '{keyword}' must be a non-empty array")
    for sub in value:
        if not isinstance(sub, dict):
            raise _fail(
                Code.TypeMismatch,
                f"$jsonSchema keyword '{keyword}' must be an array of objects, but found an "
                f"element of type {bson_type_name(sub)}",
            )
        _check_schema(sub)


def _check_string_list(keyword: str, value: Any, what: str) -> None:
    if not isinstance(value, list):
        raise _fail(
            Code.TypeMismatch,
            f"$jsonSchema keyword '{keyword}' must be an array, but found an element of type "
            + bson_type_name(value),
        )
    if not all(isinstance(v, str) for v in value):
        raise _fail(
            Code.TypeMismatch, f"$jsonSchema keyword '{keyword}' must be an array of strings"
        )
    if not value:
        raise _fail(Code.FailedToParse, f"{what} cannot be an empty array")
    if len(set(value)) != len(value):
        raise _fail(Code.FailedToParse, f"{what} array cannot contain duplicate values")


def _check_schema(schema: dict) -> None:
    """Validate one (sub)schema's keywords, recursively."""
    for keyword in schema:
        if keyword in _UNSUPPORTED:
            raise _fail(
                Code.FailedToParse, f"$jsonSchema keyword '{keyword}' is not currently supported"
            )
        if keyword in _ENCRYPTION:
            raise _fail(
                Code.FailedToParse,
                f"$jsonSchema keyword '{keyword}' is not supported by the embedded engine",
            )
        if keyword not in _KEYWORDS:
            raise _fail(Code.FailedToParse, f"Unknown $jsonSchema keyword: {keyword}")
    if "type" in schema and "bsonType" in schema:
        raise _fail(
            Code.FailedToParse, "Cannot specify both $jsonSchema keywords 'type' and 'bsonType'"
        )
    for keyword in ("description", "title"):
        if keyword in schema and not isinstance(schema[keyword], str):
            raise _fail(
                Code.TypeMismatch, f"$jsonSchema keyword '{keyword}' must be of type string"
            )
    for keyword in ("type", "bsonType"):
        if keyword in schema:
            _check_type_keyword(keyword, schema[keyword])
    _check_scalar_keywords(schema)
    _check_array_keywords(schema)
    _check_object_keywords(schema)
    for keyword in ("allOf", "anyOf", "oneOf"):
        if keyword in schema:
            _check_subschema_list(keyword, schema[keyword])
    if "not" in schema:
        if not isinstance(schema["not"], dict):
            raise _fail(
                Code.TypeMismatch,
                "$jsonSchema keyword 'not' must be an object, but found an element of type "
                + bson_type_name(schema["not"]),
            )
        _check_schema(schema["not"])
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list):
            raise _fail(
                Code.TypeMismatch,
                "$jsonSchema keyword 'enum' must be an array, but found an element of type "
                + bson_type_name(values),
            )
        if not values:
            raise _fail(Code.FailedToParse, "$jsonSchema keyword 'enum' cannot be an empty array")
        for i, a in enumerate(values):
            if any(values_equal(a, b, ignore_field_order=True) for b in values[:i]):
                raise _fail(
                    Code.FailedToParse,
                    "$jsonSchema keyword 'enum' array cannot contain duplicate values.",
                )


def _check_scalar_keywords(schema: dict) -> None:
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if exclusive in schema:
            if bound not in schema:
                raise _fail(
                    Code.FailedToParse,
                    f"$jsonSchema keyword '{bound}' must be a present if {exclusive} is present",
                )
            if not isinstance(schema[exclusive], bool):
                raise _fail(
                    Code.TypeMismatch, f"$jsonSchema keyword '{exclusive}' must be a boolean"
                )
        if bound in schema and not _is_number(schema[bound]):
            raise _fail(Code.TypeMismatch, f"$jsonSchema keyword '{bound}' must be a number")
    if "multipleOf" in schema:
        divisor = schema["multipleOf"]
        if not _is_number(divisor):
            raise _fail(Code.TypeMismatch, "$jsonSchema keyword 'multipleOf' must be a number")
        if not _as_decimal(divisor) > 0:
            raise _fail(
                Code.FailedToParse, "$jsonSchema keyword 'multipleOf' must have a positive value"
            )
    for keyword in ("minLength", "maxLength"):
        if keyword in schema:
            _check_count(keyword, schema[keyword])
    if "pattern" in schema:
        if not isinstance(schema["pattern"], str):
            raise _fail(Code.TypeMismatch, "$jsonSchema keyword 'pattern' must be a string")
        _compile(schema["pattern"])


def _check_array_keywords(schema: dict) -> None:
    for keyword in ("minItems", "maxItems"):
        if keyword in schema:
            _check_count(keyword, schema[keyword])
    if "uniqueItems" in schema and not isinstance(schema["uniqueItems"], bool):
        raise _fail(Code.TypeMismatch, "$jsonSchema keyword 'uniqueItems' must be a boolean")
    if "items" in schema:
        items = schema["items"]
        if isinstance(items, dict):
            _check_schema(items)
        elif isinstance(items, list):
            for sub in items:
                if not isinstance(sub, dict):
                    raise _fail(
                        Code.TypeMismatch,
                        "$jsonSchema keyword 'items' requires that each element of the array is "
                        f"an object, but found a {bson_type_name(sub)}",
                    )
                _check_schema(sub)
        else:
            raise _fail(
                Code.TypeMismatch,
                "$jsonSchema keyword 'items' must be an array or an object, not "
                + bson_type_name(items),
            )
    if "additionalItems" in schema:
        extra = schema["additionalItems"]
        if isinstance(extra, dict):
            _check_schema(extra)
        elif not isinstance(extra, bool):
            raise _fail(
                Code.TypeMismatch,
                "$jsonSchema keyword 'additionalItems' must be either an object or a boolean, "
                f"but got a {bson_type_name(extra)}",
            )


def _check_object_keywords(schema: dict) -> None:
    if "required" in schema:
        _check_string_list("required", schema["required"], "$jsonSchema keyword 'required'")
    for keyword in ("properties", "patternProperties"):
        if keyword not in schema:
            continue
        if not isinstance(schema[keyword], dict):
            raise _fail(Code.TypeMismatch, f"$jsonSchema keyword '{keyword}' must be an object")
        for name, sub in schema[keyword].items():
            if not isinstance(sub, dict):
                raise _fail(
                    Code.TypeMismatch,
                    f"Nested schema for $jsonSchema property '{name}' must be an object"
                    if keyword == "properties"
                    else f"$jsonSchema keyword 'patternProperties' has property '{name}' which "
                    "is not an object",
                )
            if keyword == "patternProperties":
                _compile(name)
            _check_schema(sub)
    if "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        if isinstance(extra, dict):
            _check_schema(extra)
        elif not isinstance(extra, bool):
            raise _fail(
                Code.TypeMismatch,
                "$jsonSchema keyword 'additionalProperties' must be an object or a boolean",
            )
    for keyword in ("minProperties", "maxProperties"):
        if keyword in schema:
            _check_count(keyword, schema[keyword])
    if "dependencies" in schema:
        deps = schema["dependencies"]
        if not isinstance(deps, dict):
            raise _fail(Code.TypeMismatch, "$jsonSchema keyword 'dependencies' must be an object")
        for name, dep in deps.items():
            if isinstance(dep, dict):
                _check_schema(dep)
            elif isinstance(dep, list):
                _check_string_list(
                    "dependencies", dep, f"property '{name}' in $jsonSchema keyword 'dependencies'"
                )
            else:
                raise _fail(
                    Code.TypeMismatch,
                    f"property '{name}' in $jsonSchema keyword 'dependencies' must be either an "
                    "object or an array",
                )


def _check_filter(flt: Any) -> None:
    if not isinstance(flt, dict):
        raise _fail(Code.TypeMismatch, "validator must be an object")
    plain: dict = {}
    for key, value in flt.items():
        if key == "$jsonSchema":
            if not isinstance(value, dict):
                raise _fail(Code.TypeMismatch, "$jsonSchema must be an object")
            _check_schema(value)
        elif key in ("$and", "$or", "$nor"):
            if not isinstance(value, list) or not value:
                raise _fail(Code.BadValue, f"{key} argument must be a non-empty array")
            for sub in value:
                if not isinstance(sub, dict):
                    raise _fail(Code.BadValue, f"{key} argument's entries must be objects")
                _check_filter(sub)
        elif key in ("$where", "$near", "$nearSphere", "$text"):
            raise _fail(Code.BadValue, f"{key} is not allowed in collection validators")
        else:
            plain[key] = value
    if plain:
        # A trial match surfaces unknown operators and malformed arguments now rather than
        # on the first write.
        matches_filter(plain, {})


def check_validator(validator: dict) -> None:
    """Reject a malformed collection validator, as ``create``/``collMod`` do.

    Checks every ``$jsonSchema`` (at the top level or inside ``$and``/``$or``/``$nor``)
    keyword by keyword with mongod's codes: 9 FailedToParse for unknown, unsupported or
    contradictory keywords, 14 TypeMismatch for keywords of the wrong type, 2 BadValue for
    unknown type aliases. Query operators elsewhere get a trial evaluation.
    """
    _check_filter(validator)


# --------------------------------------------------------------------------------------
# Evaluating a schema


def _as_decimal(value: Any) -> Decimal:
    if isinstance(value, Decimal128):
        return value.to_decimal()
    if isinstance(value, float):
        return Decimal(repr(value)) if math.isfinite(value) else Decimal(str(value))
    return Decimal(int(value))


def _count(schema: dict, keyword: str) -> int:
    value = schema[keyword]
    return int(value.to_decimal()) if isinstance(value, Decimal128) else int(value)


def count_of(schema: dict, keyword: str) -> int:
    """A count keyword's value (``minLength`` ...) as an int."""
    return _count(schema, keyword)


def is_number(value: Any) -> bool:
    """Whether ``value`` is a BSON number (not a bool)."""
    return _is_number(value)


def _type_rule(keyword: str, spec: Any, value: Any) -> dict | None:
    table = _BSON_TYPES if keyword == "bsonType" else _JSON_TYPES
    names = [spec] if isinstance(spec, str) else spec
    if any(table[name](value) for name in names):
        return None
    return {
        "operatorName": keyword,
        "specifiedAs": {keyword: spec},
        "reason": "type did not match",
        "consideredValue": value,
        "consideredType": bson_type_name(value),
    }


def _rule(keyword: str, schema: dict, reason: str, **extra: Any) -> dict:
    rule = {"operatorName": keyword, "specifiedAs": {keyword: schema[keyword]}, "reason": reason}
    return rule | extra


def _number_rules(schema: dict, value: Any) -> list[dict]:
    errors = []
    for bound, exclusive, sign in (
        ("minimum", "exclusiveMinimum", 1),
        ("maximum", "exclusiveMaximum", -1),
    ):
        if bound not in schema:
            continue
        c = compare_values(value, schema[bound]) * sign  # > 0: on the allowed side
        if c < 0 or (c == 0 and schema.get(exclusive, False)):
            specified = {bound: schema[bound]}
            if exclusive in schema:
                specified[exclusive] = schema[exclusive]
            errors.append(
                {
                    "operatorName": bound,
                    "specifiedAs": specified,
                    "reason": "comparison failed",
                    "consideredValue": value,
                }
            )
    if "multipleOf" in schema:
        try:
            with localcontext() as context:
                context.prec = 400  # room for the quotient of large / small operands
                ok = _as_decimal(value) % _as_decimal(schema["multipleOf"]) == 0
        except InvalidOperation:  # inf / nan are multiples of nothing
            ok = False
        if not ok:
            errors.append(
                _rule(
                    "multipleOf",
                    schema,
                    "considered value is not a multiple of the specified value",
                    consideredValue=value,
                )
            )
    return errors


def _string_rules(schema: dict, value: str) -> list[dict]:
    errors = []
    if "minLength" in schema and len(value) < _count(schema, "minLength"):
        errors.append(
            _rule(
                "minLength",
                schema,
                "specified string length was not satisfied",
                consideredValue=value,
            )
        )
    if "maxLength" in schema and len(value) > _count(schema, "maxLength"):
        errors.append(
            _rule(
                "maxLength",
                schema,
                "specified string length was not satisfied",
                consideredValue=value,
            )
        )
    if "pattern" in schema and not regex_search(schema["pattern"], value):
        errors.append(
            _rule("pattern", schema, "regular expression did not match", consideredValue=value)
        )
    return errors


def _array_rules(schema: dict, value: list) -> list[dict]:
    errors = []
    if "minItems" in schema and len(value) < _count(schema, "minItems"):
        errors.append(
            _rule("minItems", schema, "array did not match specified length", consideredValue=value)
        )
    if "maxItems" in schema and len(value) > _count(schema, "maxItems"):
        errors.append(
            _rule("maxItems", schema, "array did not match specified length", consideredValue=value)
        )
    if schema.get("uniqueItems") is True:
        for i, item in enumerate(value):
            if any(values_equal(item, prior, ignore_field_order=True) for prior in value[:i]):
                errors.append(
                    _rule(
                        "uniqueItems",
                        schema,
                        "found a duplicate item",
                        consideredValue=value,
                        duplicatedValue=item,
                    )
                )
                break
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            details = _schema_errors(items, item)
            if details:
                errors.append(
                    {
                        "operatorName": "items",
                        "reason": "At least one item did not match the sub-schema",
                        "itemIndex": i,
                        "details": details,
                    }
                )
                break
    elif isinstance(items, list):
        for i, (sub, item) in enumerate(zip(items, value, strict=False)):
            details = _schema_errors(sub, item)
            if details:
                errors.append(
                    {
                        "operatorName": "items",
                        "reason": "At least one item did not match the sub-schema",
                        "itemIndex": i,
                        "details": details,
                    }
                )
                break
        # additionalItems only means something after a positional "items" list.
        extra = schema.get("additionalItems", True)
        for i in range(len(items), len(value)):
            details = (
                []
                if extra is True
                else (
                    [{"operatorName": "false", "reason": "additional items are not allowed"}]
                    if extra is False
                    else _schema_errors(extra, value[i])
                )
            )
            if details:
                errors.append(
                    {
                        "operatorName": "additionalItems",
                        "specifiedAs": {"additionalItems": extra},
                        "reason": "At least one additional item did not match the sub-schema",
                        "itemIndex": i,
                        "details": details,
                    }
                )
                break
    return errors


def _property_entry(name: str, sub: dict, details: list[dict]) -> dict:
    entry: dict[str, Any] = {"propertyName": name}
    if "description" in sub:
        entry["description"] = sub["description"]
    entry["details"] = details
    return entry


def _object_rules(schema: dict, value: Any) -> list[dict]:
    doc = value.as_doc() if isinstance(value, DBRef) else value
    errors: list[dict] = []
    if "required" in schema:
        missing = [name for name in schema["required"] if name not in doc]
        if missing:
            errors.append(
                {
                    "operatorName": "required",
                    "specifiedAs": {"required": schema["required"]},
                    "missingProperties": missing,
                }
            )
    properties = schema.get("properties", {})
    failed = []
    for name, sub in properties.items():
        if name in doc:
            details = _schema_errors(sub, doc[name])
            if details:
                failed.append(_property_entry(name, sub, details))
    if failed:
        errors.append({"operatorName": "properties", "propertiesNotSatisfied": failed})
    errors += _allowed_properties_rules(schema, doc, properties)
    count = len(doc)
    for keyword, too_few in (("minProperties", True), ("maxProperties", False)):
        if keyword in schema and (
            count < _count(schema, keyword) if too_few else count > _count(schema, keyword)
        ):
            errors.append(
                _rule(
                    keyword,
                    schema,
                    "specified number of properties was not satisfied",
                    numberOfProperties=count,
                )
            )
    for name, dep in schema.get("dependencies", {}).items():
        if name not in doc:
            continue
        if isinstance(dep, list):
            missing = [d for d in dep if d not in doc]
            if missing:
                errors.append(
                    {
                        "operatorName": "dependencies",
                        "failingDependencies": [
                            {"conditionalProperty": name, "missingProperties": missing}
                        ],
                    }
                )
        else:
            details = _schema_errors(dep, doc)
            if details:
                errors.append(
                    {
                        "operatorName": "dependencies",
                        "failingDependencies": [{"conditionalProperty": name, "details": details}],
                    }
                )
    return errors


def _allowed_properties_rules(schema: dict, doc: dict, properties: dict) -> list[dict]:
    patterns = schema.get("patternProperties", {})
    extra = schema.get("additionalProperties", True)
    if not patterns and extra is True:
        return []
    errors: list[dict] = []
    pattern_failures = []
    additional: list[str] = []
    additional_failures = []
    for name, item in doc.items():
        matched = False
        for pattern, sub in patterns.items():
            if regex_search(pattern, name):
                matched = True
                details = _schema_errors(sub, item)
                if details:
                    pattern_failures.append(
                        {"propertyName": name, "regexMatched": pattern, "details": details}
                    )
        if matched or name in properties:
            continue
        if extra is False:
            additional.append(name)
        elif isinstance(extra, dict):
            details = _schema_errors(extra, item)
            if details:
                additional_failures.append(_property_entry(name, extra, details))
    if pattern_failures:
        errors.append({"operatorName": "patternProperties", "details": pattern_failures})
    if additional:
        errors.append(
            {
                "operatorName": "additionalProperties",
                "specifiedAs": {"additionalProperties": False},
                "additionalProperties": additional,
            }
        )
    if additional_failures:
        errors.append(
            {
                "operatorName": "additionalProperties",
                "reason": "at least one additional property did not match its subschema",
                "details": additional_failures,
            }
        )
    return errors


def _logical_rules(schema: dict, value: Any) -> list[dict]:
    errors: list[dict] = []
    if "allOf" in schema:
        failed = [
            {"index": i, "details": d}
            for i, sub in enumerate(schema["allOf"])
            if (d := _schema_errors(sub, value))
        ]
        if failed:
            errors.append({"operatorName": "allOf", "schemasNotSatisfied": failed})
    if "anyOf" in schema:
        results = [_schema_errors(sub, value) for sub in schema["anyOf"]]
        if all(results):
            errors.append(
                {
                    "operatorName": "anyOf",
                    "schemasNotSatisfied": [
                        {"index": i, "details": d} for i, d in enumerate(results)
                    ],
                }
            )
    if "oneOf" in schema:
        results = [_schema_errors(sub, value) for sub in schema["oneOf"]]
        passing = [i for i, d in enumerate(results) if not d]
        if len(passing) > 1:
            errors.append(
                {
                    "operatorName": "oneOf",
                    "reason": "more than one subschema matched",
                    "matchingSchemaIndexes": passing,
                }
            )
        elif not passing:
            errors.append(
                {
                    "operatorName": "oneOf",
                    "schemasNotSatisfied": [
                        {"index": i, "details": d} for i, d in enumerate(results)
                    ],
                }
            )
    if "not" in schema and not _schema_errors(schema["not"], value):
        errors.append({"operatorName": "not", "reason": "child expression matched"})
    if "enum" in schema and not any(
        values_equal(value, option, ignore_field_order=True) for option in schema["enum"]
    ):
        errors.append(_rule("enum", schema, "value was not found in enum", consideredValue=value))
    return errors


def _schema_errors(schema: dict, value: Any) -> list[dict]:
    """The rules of ``schema`` that ``value`` breaks (empty when it satisfies it).

    Like JSON Schema, type-specific keywords (``minimum``, ``minLength``, ``items``,
    ``properties`` ...) only constrain values of their type.
    """
    errors: list[dict] = []
    for keyword in ("bsonType", "type"):
        if keyword in schema:
            broken = _type_rule(keyword, schema[keyword], value)
            if broken:
                errors.append(broken)
    if _is_number(value):
        errors += _number_rules(schema, value)
    elif isinstance(value, str) and not isinstance(value, JavaScript):
        errors += _string_rules(schema, value)
    elif isinstance(value, list | tuple):
        errors += _array_rules(schema, list(value))
    elif isinstance(value, dict | DBRef):
        errors += _object_rules(schema, value)
    errors += _logical_rules(schema, value)
    return errors


# --------------------------------------------------------------------------------------
# Evaluating a validator


def _clause_detail(key: str, cond: Any, doc: dict) -> dict:
    operator = (
        next(iter(cond))
        if isinstance(cond, dict) and cond and next(iter(cond)).startswith("$")
        else "$eq"
    )
    detail: dict[str, Any] = {"operatorName": operator, "specifiedAs": {key: cond}}
    value: Any = doc
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            detail["reason"] = "field was missing"
            return detail
        value = value[part]
    detail["reason"] = "comparison failed"
    detail["consideredValue"] = value
    return detail


def _clause_failure(key: str, value: Any, doc: dict) -> dict | None:
    if key == "$jsonSchema":
        rules = _schema_errors(value, doc)
        if not rules:
            return None
        return {"operatorName": "$jsonSchema", "schemaRulesNotSatisfied": rules}
    if key in ("$and", "$or", "$nor"):
        results = [_filter_failure(sub, doc) for sub in value]
        if key == "$and" and any(results):
            clauses = [{"index": i, "details": d} for i, d in enumerate(results) if d]
            return {"operatorName": "$and", "clausesNotSatisfied": clauses}
        if key == "$or" and all(results):
            clauses = [{"index": i, "details": d} for i, d in enumerate(results)]
            return {"operatorName": "$or", "clausesNotSatisfied": clauses}
        if key == "$nor" and not all(results):
            matched = [{"index": i} for i, d in enumerate(results) if not d]
            return {"operatorName": "$nor", "clausesSatisfied": matched}
        return None
    if key == "$comment" or matches_filter({key: value}, doc):
        return None
    if key.startswith("$"):
        return {
            "operatorName": key,
            "specifiedAs": {key: value},
            "reason": "expression did not match",
        }
    return _clause_detail(key, value, doc)


def _filter_failure(flt: dict, doc: dict) -> dict | None:
    """Why ``doc`` fails ``flt`` (``None`` when it passes); ``$jsonSchema`` anywhere."""
    failures = [
        (i, detail)
        for i, (key, value) in enumerate(flt.items())
        if (detail := _clause_failure(key, value, doc)) is not None
    ]
    if not failures:
        return None
    if len(flt) == 1:
        return failures[0][1]
    return {
        "operatorName": "$and",
        "clausesNotSatisfied": [{"index": i, "details": d} for i, d in failures],
    }


def validate_document(doc: dict, validator: dict) -> None:
    """Raise error 121 DocumentValidationFailure unless ``doc`` satisfies ``validator``.

    ``validator`` is a collection validator: ``{$jsonSchema: {...}}``, a query filter, or
    both. The error's ``extra`` carries mongod 5+'s ``errInfo``:
    ``{failingDocumentId, details: {operatorName: "$jsonSchema",
    schemaRulesNotSatisfied: [...]}}`` (``$and``/query-operator details for combined
    validators), each rule naming the keyword and, for properties, the property.
    """
    if not validator:
        return
    from accord.platform.embedded.schema_fast import compiled  # it imports this module

    fast = compiled(validator)
    if fast is not None and fast(doc):
        return  # valid: no detail to build (a failure is explained by the walk below)
    details = _filter_failure(validator, doc)
    if details is None:
        return
    raise EngineError(
        Code.DocumentValidationFailure,
        "Document failed validation",
        extra={"errInfo": {"failingDocumentId": doc.get("_id"), "details": details}},
    )
