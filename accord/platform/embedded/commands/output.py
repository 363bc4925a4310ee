"""``$out`` and ``$merge``: aggregation stages that write their results to a collection.

Both must be the last stage. The aggregate then runs as a write, in one autocommitted
transaction (the dispatcher treats it like insert/update), so a failure part-way (a
duplicate key, ``whenNotMatched: "fail"``) leaves the target as it was, or absent if
it did not exist. Neither is
allowed inside a multi-document transaction, as in MongoDB.

- ``$out: "coll"`` or ``{db, coll}`` replaces the target's documents with the results,
  keeping its indexes and options (and creating it if missing).
- ``$merge: {into, on, let, whenMatched, whenNotMatched}`` merges the results into the
  target: ``whenMatched`` is ``merge`` (default), ``replace``, ``keepExisting``, ``fail``
  or an update pipeline (which sees the result as ``$$new``); ``whenNotMatched`` is
  ``insert`` (default), ``discard`` or ``fail``. ``on`` fields other than ``_id`` need a
  unique index on exactly those fields.
"""

from __future__ import annotations

from typing import Any

from bson import ObjectId

from accord.platform.embedded import mongomock_bridge, query, update
from accord.platform.embedded.commands.base import (
    PIPELINE_OUTPUTS,
    Context,
    Doc,
    check_db_name,
    coll_name,
)
from accord.platform.embedded.commands.read import visible_docs
from accord.platform.embedded.commands.write import insert_one, replace_one, write_collection
from accord.platform.embedded.engine import Collection, duplicate_key
from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.paths import MISSING
from accord.platform.embedded.values import bson_type_name
from accord.platform.embedded.variables import bind_pipeline


def _target(ctx: Context, spec: Any, stage: str) -> str:
    """The namespace ``spec`` names: ``"coll"`` or ``{db, coll}``."""
    if isinstance(spec, str):
        db, name = ctx.db, spec
    elif isinstance(spec, dict) and isinstance(spec.get("coll"), str):
        db, name = spec.get("db", ctx.db), spec["coll"]
        if not isinstance(db, str):
            raise EngineError(Code.TypeMismatch, f"{stage} 'db' must be a string")
    else:
        raise EngineError(
            Code.FailedToParse, f"{stage} needs a collection name or {{db, coll}}, got {spec!r}"
        )
    check_db_name(db)
    coll_name({"c": name}, "c")
    if name.startswith("system."):
        raise EngineError(Code.InvalidNamespace, f"{stage} cannot write to {db}.{name}")
    if db in ("admin", "local", "config"):  # mongod's internal databases (31321, 31320)
        if stage == "$out":
            raise EngineError(Code.Location31321, f"Can't $out to internal database: {db}")
        raise EngineError(Code.Location31320, f"Cannot $merge to internal database: {db}")
    return f"{db}.{name}"


def _output_collection(ctx: Context, ns: str, stage: str) -> Collection:
    existing = ctx.engine.get_collection(ns)
    if existing is not None and existing.options.get("viewOn") is not None:
        raise EngineError(Code.CommandNotSupportedOnView, f"{stage} cannot write to the view {ns}")
    # A failure leaves no target it created (mongod writes $out to a temporary collection).
    ctx.txn.drops_created_on_abort = True
    return write_collection(ctx, ns)


def _with_id(doc: Any, stage: str) -> Doc:
    if not isinstance(doc, dict):
        raise EngineError(Code.TypeMismatch, f"{stage} can only write documents")
    return doc if "_id" in doc else {"_id": ObjectId(), **doc}


def run_out(ctx: Context, docs: list[Doc], spec: Any) -> None:
    """Replace the target collection's documents with ``docs``."""
    if isinstance(spec, dict) and "timeseries" in spec:
        raise EngineError(
            Code.NotImplemented,
            "$out to a time-series collection is not supported by the embedded engine",
        )
    ns = _target(ctx, spec, "$out")
    coll = _output_collection(ctx, ns, "$out")
    for key, _ in visible_docs(ctx, ns):
        ctx.engine.write(ctx.txn, coll, key, None)
    for doc in docs:
        insert_one(ctx, coll, _with_id(doc, "$out"))


_WHEN_MATCHED = ("replace", "keepExisting", "merge", "fail")
_WHEN_NOT_MATCHED = ("insert", "discard", "fail")


def run_merge(ctx: Context, docs: list[Doc], spec: Any) -> None:
    """Merge ``docs`` into the target collection as ``spec`` says."""
    if isinstance(spec, str | dict) and not (isinstance(spec, dict) and "into" in spec):
        spec = {"into": spec}
    if not isinstance(spec, dict):
        raise EngineError(Code.FailedToParse, "$merge needs a collection name or an object")
    unknown = set(spec) - {"into", "on", "let", "whenMatched", "whenNotMatched"}
    if unknown:
        raise EngineError(Code.IDLUnknownField, f"unknown $merge field: {sorted(unknown)[0]}")
    ns = _target(ctx, spec["into"], "$merge")
    when_matched = spec.get("whenMatched", "merge")
    when_not_matched = spec.get("whenNotMatched", "insert")
    if not isinstance(when_matched, list) and when_matched not in _WHEN_MATCHED:
        raise EngineError(Code.BadValue, f"invalid $merge whenMatched: {when_matched!r}")
    if when_not_matched not in _WHEN_NOT_MATCHED:
        raise EngineError(Code.BadValue, f"invalid $merge whenNotMatched: {when_not_matched!r}")
    if "let" in spec and not isinstance(when_matched, list):
        raise EngineError(
            Code.FailedToParse, "$merge 'let' may only be used with a whenMatched pipeline"
        )
    if "let" in spec and not isinstance(spec["let"], dict):
        raise EngineError(
            Code.TypeMismatch,
            f"BSON field '$merge.let' is the wrong type '{bson_type_name(spec['let'])}', "
            "expected type 'object'",
        )
    on = spec.get("on", "_id")
    fields = [on] if isinstance(on, str) else on
    if not isinstance(fields, list) or not fields or not all(isinstance(f, str) for f in fields):
        raise EngineError(
            Code.FailedToParse, "$merge 'on' must be a field name or an array of them"
        )
    coll = _output_collection(ctx, ns, "$merge")
    if fields != ["_id"] and not any(
        i.unique and sorted(i.fields) == sorted(fields) for i in coll.indexes.values()
    ):
        raise EngineError(
            Code.Location51183,
            "Cannot find index to verify that join fields will be unique: $merge 'on' "
            f"{fields} needs a unique index on exactly those fields",
        )
    variables = spec.get("let", {"new": "$$ROOT"})
    for doc in docs:
        doc = _with_id(doc, "$merge") if fields == ["_id"] else doc
        values = {f: _single(doc, f) for f in fields}
        found = visible_docs(ctx, ns, values)
        if not found:
            if when_not_matched == "insert":
                insert_one(ctx, coll, _with_id(doc, "$merge"))
            elif when_not_matched == "fail":
                raise EngineError(
                    Code.MergeStageNoMatchingDocument,
                    f"$merge found no document to update in {ns} for {values}",
                )
            continue
        key, existing = found[0]
        if when_matched == "keepExisting":
            continue
        if when_matched == "fail":
            index = coll.indexes["_id_"] if fields == ["_id"] else _index_on(coll, fields)
            raise duplicate_key(coll, index, doc)
        if when_matched == "merge":
            new = {**existing, **{k: v for k, v in doc.items() if k != "_id"}}
        elif when_matched == "replace":
            new = {"_id": existing["_id"], **{k: v for k, v in doc.items() if k != "_id"}}
            if "_id" in doc and query.canonical(doc["_id"]) != query.canonical(existing["_id"]):
                raise EngineError(
                    Code.ImmutableField,
                    "$merge whenMatched: 'replace' would modify the immutable field '_id'",
                )
        else:
            bound = {name: _evaluated(expr, doc) for name, expr in variables.items()}
            new = update.apply_update(existing, bind_pipeline(when_matched, bound))
        replace_one(ctx, coll, key, existing, new, False)


def _single(doc: Doc, field: str) -> Any:
    values = query.path_values(doc, field, empty_array_as_null=False)
    present = [v for v in values if v is not MISSING]
    if len(present) != 1 or isinstance(present[0], list):
        raise EngineError(
            Code.Location51185,
            f"$merge write error: 'on' field '{field}' must be present exactly once, and not be an array",
        )
    return present[0]


def _index_on(coll: Collection, fields: list[str]) -> Any:
    return next(i for i in coll.indexes.values() if i.unique and sorted(i.fields) == sorted(fields))


def _evaluated(expression: Any, doc: Doc) -> Any:
    """A ``$merge`` ``let`` value for one result document (``$$new`` by default)."""
    try:
        return mongomock_bridge.evaluate_expression(expression, doc)
    except KeyError:
        return None  # a missing value


PIPELINE_OUTPUTS["$out"] = run_out
PIPELINE_OUTPUTS["$merge"] = run_merge
