"""MongoDB update semantics as pure functions: the entry point for every update.

``apply_update`` computes the document an update produces, the way mongod's update
subsystem does: operator updates (``update_operators``), replacement documents and
pipeline-style updates, with mongod's validation, error codes and messages.
``upsert_seed`` builds the document an upsert starts from.
"""

from __future__ import annotations

import re
from typing import Any

from bson.regex import Regex

from accord.platform.embedded import mongomock_bridge
from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.paths import MISSING, dotted
from accord.platform.embedded.positional import is_operator_doc
from accord.platform.embedded.update_operators import apply_operators
from accord.platform.embedded.values import copy_value, format_value, values_equal

__all__ = ["apply_update", "upsert_seed"]


def _check_replacement_id(original: dict, result: dict) -> dict:
    """Keep the original ``_id``: restore it when the new document lacks one, refuse a
    different one."""
    if "_id" not in original:
        return result
    if "_id" not in result:
        return {"_id": copy_value(original["_id"]), **result}
    if not values_equal(original["_id"], result["_id"]):
        raise EngineError(
            Code.ImmutableField,
            "After applying the update, the (immutable) field '_id' was found to have been "
            f"altered to _id: {format_value(result['_id'])}",
        )
    return result


def _apply_replacement(doc: dict, replacement: dict) -> dict:
    for key in replacement:
        if key.startswith("$"):
            raise EngineError(
                Code.DollarPrefixedFieldName,
                f"The dollar ($) prefixed field '{key}' in '{key}' is not allowed in the context "
                "of an update's replacement document. Consider using an aggregation pipeline "
                "with $replaceWith.",
            )
    return _check_replacement_id(doc, copy_value(replacement))


_UPDATE_STAGES = ("$addFields", "$set", "$project", "$unset", "$replaceRoot", "$replaceWith")


def _run_stage(name: str, spec: Any, doc: dict) -> dict:
    if name == "$unset":
        fields = [spec] if isinstance(spec, str) else spec
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            raise EngineError(
                Code.Location31002, "$unset specification must be a string or an array"
            )
        if not fields:
            raise EngineError(
                Code.Location31119,
                "$unset specification must be a string or an array with at least one field",
            )
        name, spec = "$project", dict.fromkeys(fields, 0)
    elif name == "$replaceWith":
        name, spec = "$replaceRoot", {"newRoot": spec}
    if name in ("$set", "$addFields", "$project", "$replaceRoot") and (
        not isinstance(spec, dict) or not spec
    ):
        raise EngineError(
            Code.BadValue,
            f"Invalid {name} :: caused by :: specification must be a non-empty object",
        )
    handler = mongomock_bridge.pipeline_stage(name)
    assert handler is not None  # every stage in _UPDATE_STAGES maps to a mongomock handler
    try:
        out = handler([copy_value(doc)], None, spec)
    except mongomock_bridge.OperationFailure as exc:
        raise EngineError(exc.code or Code.BadValue, str(exc)) from exc
    except NotImplementedError as exc:
        raise EngineError(
            Code.BadValue, f"{name} is not supported by the embedded engine: {exc}"
        ) from exc
    if not out or not isinstance(out[0], dict):
        raise EngineError(Code.BadValue, f"{name} did not produce a document")
    return dict(out[0])


def _apply_pipeline(doc: dict, pipeline: list) -> dict:
    current = copy_value(doc)
    for stage in pipeline:
        if not isinstance(stage, dict) or len(stage) != 1:
            raise EngineError(
                Code.Location40323,
                "A pipeline stage specification object must contain exactly one field.",
            )
        name, spec = next(iter(stage.items()))
        if name not in _UPDATE_STAGES:
            if mongomock_bridge.pipeline_stage(name) is not None:
                raise EngineError(
                    Code.InvalidOptions, f"{name} is not allowed to be used within an update"
                )
            raise EngineError(Code.Location40324, f"Unrecognized pipeline stage name: '{name}'")
        current = _run_stage(name, spec, current)
    return _check_replacement_id(doc, current)


def apply_update(
    doc: dict,
    update: dict | list,
    *,
    array_filters: list[dict] | None = None,
    query: dict | None = None,
    is_insert: bool = False,
) -> dict:
    """Apply a MongoDB update to ``doc`` and return the new document.

    ``doc`` is never modified. ``update`` is an operator document (``{$set: ...}``), a
    replacement document (no ``$`` keys) or an aggregation pipeline (a list of
    ``$set``/``$addFields``/``$unset``/``$project``/``$replaceRoot``/``$replaceWith``
    stages). ``query`` is the update's filter, needed to resolve the positional ``$``;
    ``array_filters`` binds the ``$[ident]`` identifiers. For an upsert that inserts,
    pass ``upsert_seed(query)`` as ``doc`` and ``is_insert=True`` (``$setOnInsert``
    only applies then).

    Raises ``EngineError`` with mongod's code and message for invalid updates (9 unknown
    modifier, 40 conflicting paths, 14 type mismatch, 28 path not viable, 66 ``_id``
    change, ...).
    """
    if isinstance(update, list):
        if array_filters:
            raise EngineError(
                Code.InvalidOptions, "arrayFilters may not be specified for pipeline-style updates"
            )
        return _apply_pipeline(doc, update)
    if not isinstance(update, dict):
        raise EngineError(Code.TypeMismatch, "Update argument must be either an object or an array")
    if update and next(iter(update)).startswith("$"):
        return apply_operators(doc, update, array_filters, query, is_insert)
    return _apply_replacement(doc, update)


def _equality_value(value: Any) -> Any:
    """The value a query condition pins a field to, or ``MISSING``."""
    if is_operator_doc(value):
        return value.get("$eq", MISSING)
    if isinstance(value, re.Pattern | Regex):
        return MISSING
    return value


def upsert_seed(query: dict) -> dict:
    """The document an upsert inserts before its update applies.

    Takes the query's equality conditions (``{a: 1}``, ``{a: {$eq: 1}}``, also inside a
    top-level ``$and``); dotted keys become nested subdocuments. Other operators,
    ``$or``/``$nor`` and regex matches contribute nothing. ``_id`` comes first.
    Two conditions on the same or overlapping paths are error 54 as in mongod.
    """
    seed: dict = {}
    seen: list[tuple[str, ...]] = []

    def add(key: str, value: Any) -> None:
        path = tuple(key.split("."))
        for other in seen:
            n = min(len(other), len(path))
            if other[:n] == path[:n]:
                detail = (
                    f"path '{key}' is matched twice"
                    if other == path
                    else f"both paths '{key}' and '{dotted(other)}' are matched"
                )
                raise EngineError(
                    Code.NotSingleValueField, f"cannot infer query fields to set, {detail}"
                )
        seen.append(path)
        node = seed
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = copy_value(value)

    def visit(q: dict) -> None:
        for key, value in q.items():
            if key == "$and" and isinstance(value, list):
                for sub in value:
                    if isinstance(sub, dict):
                        visit(sub)
            elif not key.startswith("$"):
                pinned = _equality_value(value)
                if pinned is not MISSING:
                    add(key, pinned)

    visit(query)
    if "_id" in seed:
        seed = {"_id": seed.pop("_id"), **seed}
    return seed
