"""Catalog commands: collections, validators, indexes, databases."""

from __future__ import annotations

import copy
from typing import Any

from accord.platform.embedded import collation, query, validation
from accord.platform.embedded.commands import views
from accord.platform.embedded.commands.base import (
    Context,
    Doc,
    coll_name,
    command,
    ns_of,
    opt_bool,
    opt_doc,
    opt_int,
    opt_list,
)
from accord.platform.embedded.commands.write import write_collection
from accord.platform.embedded.engine import Collection, Index
from accord.platform.embedded.errors import Code, EngineError, bad_value, type_mismatch


@command("create")
def cmd_create(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "create")
    options = {
        k: v
        for k, v in cmd.items()
        if k
        in (
            "validator",
            "validationLevel",
            "validationAction",
            "capped",
            "size",
            "max",
            "clusteredIndex",
            "expireAfterSeconds",
            "collation",
        )
    }
    if "viewOn" in cmd or "pipeline" in cmd:
        if set(options) - {"collation"}:
            raise EngineError(
                Code.InvalidOptions,
                f"a view cannot have the options {sorted(set(options) - {'collation'})}",
            )
        options.update(
            views.check_definition(
                ctx, coll_name(cmd, "create"), cmd.get("viewOn"), cmd.get("pipeline")
            )
        )
        if ctx.in_transaction:
            raise EngineError(
                Code.OperationNotSupportedInTransaction, "Cannot create a view in a transaction"
            )
    _check_validation_options(options)
    if "collation" in options:
        default = collation.parse(options.pop("collation"))
        if default is not None:
            options["collation"] = default.spec()
    if ctx.engine.get_collection(ns, ctx.txn) is not None:
        raise EngineError(Code.NamespaceExists, f"Collection {ns} already exists.")
    # In a transaction the collection is the transaction's until it commits, as in mongod.
    ctx.engine.create_collection(ns, options, txn=ctx.txn if ctx.in_transaction else None)
    return {"ok": 1.0}


def _check_validation_options(options: Doc) -> None:
    if "validator" in options:
        if not isinstance(options["validator"], dict):
            raise type_mismatch("'validator' must be an object")
        validation.check_validator(options["validator"])
    if options.get("validationLevel", "strict") not in ("off", "strict", "moderate"):
        raise bad_value(
            f"Enumeration value '{options['validationLevel']}' for field 'validationLevel' is not a valid value."
        )
    if options.get("validationAction", "error") not in ("error", "warn", "errorAndLog"):
        raise bad_value(
            f"Enumeration value '{options['validationAction']}' for field 'validationAction' is not a valid value."
        )


@command("collMod")
def cmd_coll_mod(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "collMod")
    coll = ctx.engine.get_collection(ns)
    if coll is None:
        raise EngineError(Code.NamespaceNotFound, f"ns does not exist: {ns}")
    changes = {
        k: v for k, v in cmd.items() if k in ("validator", "validationLevel", "validationAction")
    }
    _check_validation_options(changes)
    reply: Doc = {"ok": 1.0}
    if "index" in cmd:
        spec = opt_doc(cmd, "index")
        target = _find_index(coll, spec.get("name") if "name" in spec else spec.get("keyPattern"))
        if "expireAfterSeconds" in spec:
            old = target.expire_after
            target.expire_after = spec["expireAfterSeconds"]
            target.spec["expireAfterSeconds"] = spec["expireAfterSeconds"]
            reply.update(
                {
                    "expireAfterSeconds_old": old,
                    "expireAfterSeconds_new": spec["expireAfterSeconds"],
                }
            )
    coll.options.update(changes)
    ctx.engine.save_catalog(coll)
    return reply


def _find_index(coll: Collection, name_or_key: Any) -> Index:
    for index in coll.indexes.values():
        if index.name == name_or_key or (
            isinstance(name_or_key, dict) and dict(index.key) == name_or_key
        ):
            return index
    raise EngineError(Code.IndexNotFound, f"index not found with name [{name_or_key}]")


@command("drop")
def cmd_drop(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "drop")
    coll = ctx.engine.get_collection(ns)
    n = len(coll.indexes) if coll else 0
    ctx.engine.drop_collection(ns)
    return {"nIndexesWas": n, "ns": ns, "ok": 1.0} if coll else {"ok": 1.0}


@command("dropDatabase")
def cmd_drop_database(ctx: Context, cmd: Doc) -> Doc:
    for coll in ctx.engine.collections_in(ctx.db):
        ctx.engine.drop_collection(coll.ns)
    return {"dropped": ctx.db, "ok": 1.0}


@command("renameCollection")
def cmd_rename(ctx: Context, cmd: Doc) -> Doc:
    if ctx.db != "admin":
        raise EngineError(
            Code.Unauthorized, "renameCollection may only be run against the admin database."
        )
    source, target = cmd.get("renameCollection"), cmd.get("to")
    if (
        not isinstance(source, str)
        or not isinstance(target, str)
        or "." not in source
        or "." not in target
    ):
        raise bad_value("renameCollection needs 'db.collection' source and 'to'")
    if ctx.engine.get_collection(source) is None:
        raise EngineError(Code.NamespaceNotFound, f"Source collection {source} does not exist")
    if ctx.engine.get_collection(target) is not None:
        if not opt_bool(cmd, "dropTarget"):
            raise EngineError(Code.NamespaceExists, "target namespace exists")
        ctx.engine.drop_collection(target)
    ctx.engine.rename_collection(source, target)
    return {"ok": 1.0}


def _index_name(key: Doc) -> str:
    return "_".join(f"{k}_{v}" for k, v in key.items())


_INDEX_OPTIONS = {
    "key", "name", "unique", "sparse", "partialFilterExpression", "expireAfterSeconds",
    "background", "v", "hidden", "collation", "weights", "default_language", "language_override",
    "textIndexVersion", "2dsphereIndexVersion", "bits", "min", "max", "wildcardProjection", "ns",
}  # fmt: skip


@command("createIndexes")
def cmd_create_indexes(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "createIndexes")
    specs = opt_list(cmd, "indexes")
    if not specs:
        raise bad_value("Must specify at least one index to create")
    existing_coll = ctx.engine.get_collection(ns, ctx.txn)
    created_coll = existing_coll is None
    if (
        ctx.in_transaction
        and existing_coll is not None
        and existing_coll.pending_owner is not ctx.txn
    ):
        raise EngineError(
            Code.OperationNotSupportedInTransaction,
            f"Cannot create new indexes on existing collection {ns} in a multi-document "
            "transaction: create the collection in the same transaction, or create the index "
            "outside it",
        )
    coll = write_collection(ctx, ns)
    before = len(coll.indexes)
    new_specs = []
    for raw in specs:
        if not isinstance(raw, dict) or not isinstance(raw.get("key"), dict) or not raw["key"]:
            raise EngineError(Code.FailedToParse, "Index spec must have a non-empty 'key' object")
        unknown = set(raw) - _INDEX_OPTIONS
        if unknown:
            raise EngineError(
                Code.InvalidIndexSpecificationOption,
                f"The field '{sorted(unknown)[0]}' is not valid for an index specification.",
            )
        for field_name, direction in raw["key"].items():
            ok_number = (
                isinstance(direction, int | float)
                and not isinstance(direction, bool)
                and direction != 0
            )
            if not (ok_number or direction in ("text", "2d", "2dsphere", "hashed")):
                raise EngineError(
                    Code.CannotCreateIndex,
                    f"Values in the index key pattern can only be numbers > 0, numbers < 0, or strings. Bad value for {field_name!r}: {direction!r}",
                )
        spec = {"v": 2, "key": raw["key"], "name": raw.get("name") or _index_name(raw["key"])}
        for opt in (
            "unique",
            "sparse",
            "partialFilterExpression",
            "expireAfterSeconds",
            "hidden",
            "collation",
        ):
            if opt in raw:
                spec[opt] = raw[opt]
        # An index's collation (or, without one, the collection's default) decides which
        # strings are equal keys; "simple" is binary and not recorded, as in mongod.
        index_collation = collation.parse(spec.pop("collation", coll.options.get("collation")))
        if index_collation is not None:
            spec["collation"] = index_collation.spec()
        if "expireAfterSeconds" in spec:
            eas = spec["expireAfterSeconds"]
            if isinstance(eas, bool) or not isinstance(eas, int | float) or eas < 0:
                raise EngineError(
                    Code.CannotCreateIndex,
                    "TTL index 'expireAfterSeconds' option must be a non-negative number",
                )
            if len(raw["key"]) != 1:
                raise EngineError(
                    Code.CannotCreateIndex,
                    "TTL indexes are single-field indexes, compound indexes do not support TTL.",
                )
        if "partialFilterExpression" in spec:
            query.check_filter(spec["partialFilterExpression"])
        existing = coll.indexes.get(spec["name"])
        same_key = next((i for i in coll.indexes.values() if dict(i.key) == spec["key"]), None)
        if existing is not None:
            if dict(existing.key) != spec["key"]:
                raise EngineError(
                    Code.IndexKeySpecsConflict,
                    f"An existing index has the same name as the requested index but a different key. Requested index: {spec}, existing index: {existing.spec}",
                )
            if _options(existing.spec) != _options(spec):
                raise EngineError(
                    Code.IndexOptionsConflict,
                    f"An equivalent index already exists with the same name but different options. Requested index: {spec}, existing index: {existing.spec}",
                )
            continue
        if same_key is not None and _options(same_key.spec) != _options(spec):
            raise EngineError(
                Code.IndexOptionsConflict,
                f"An equivalent index already exists with a different name and options. Requested index: {spec}, existing index: {same_key.spec}",
            )
        if same_key is not None:
            raise EngineError(
                Code.IndexOptionsConflict,
                f"Index already exists with a different name: {same_key.name}",
            )
        new_specs.append(spec)
    for spec in new_specs:
        index = Index.from_spec(spec)
        if index.unique:
            _check_no_pending_writes(ctx, coll)
        coll.add_index(index)
    if new_specs:
        ctx.engine.save_catalog(coll)
    reply: Doc = {
        "numIndexesBefore": before,
        "numIndexesAfter": len(coll.indexes),
        "createdCollectionAutomatically": created_coll,
        "ok": 1.0,
    }
    if not new_specs:
        reply["note"] = "all indexes already exist"
    return reply


def _check_no_pending_writes(ctx: Context, coll: Collection) -> None:
    for txn in ctx.engine.active.values():
        if txn is not ctx.txn and coll.ns in txn.writes:
            raise EngineError(
                Code.WriteConflict,
                "Cannot build a unique index while a transaction writes to the collection",
                labels=("TransientTransactionError",),
            )


def _options(spec: Doc) -> Doc:
    return {k: v for k, v in spec.items() if k not in ("v", "name", "key", "background")}


@command("listIndexes")
def cmd_list_indexes(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "listIndexes")
    coll = ctx.engine.get_collection(ns)
    if coll is None:
        raise EngineError(Code.NamespaceNotFound, f"ns does not exist: {ns}")
    views.refuse_write(coll, "listIndexes")
    specs = [copy.deepcopy(i.spec) for i in coll.indexes.values()]
    return ctx.cursors.first_batch(
        ns, specs, opt_int(opt_doc(cmd, "cursor"), "batchSize"), ctx.session_key
    )


@command("dropIndexes", "deleteIndexes")
def cmd_drop_indexes(ctx: Context, cmd: Doc) -> Doc:
    field_name = "dropIndexes" if "dropIndexes" in cmd else "deleteIndexes"
    ns = ns_of(ctx, cmd, field_name)
    coll = ctx.engine.get_collection(ns)
    if coll is None:
        raise EngineError(Code.NamespaceNotFound, f"ns not found {ns}")
    views.refuse_write(coll, "dropIndexes")
    target = cmd.get("index")
    before = len(coll.indexes)
    if target == "*":
        names = [n for n in coll.indexes if n != "_id_"]
    elif isinstance(target, list):
        names = target
    else:
        names = [_find_index(coll, target).name]
    for name in names:
        if name == "_id_":
            raise EngineError(Code.InvalidOptions, "cannot drop _id index")
        if name not in coll.indexes:
            raise EngineError(Code.IndexNotFound, f"index not found with name [{name}]")
    for name in names:
        coll.drop_index(name)
    ctx.engine.save_catalog(coll)
    return {"nIndexesWas": before, "ok": 1.0}


@command("listCollections")
def cmd_list_collections(ctx: Context, cmd: Doc) -> Doc:
    filt = opt_doc(cmd, "filter")
    name_only = opt_bool(cmd, "nameOnly")
    out = []
    for coll in ctx.engine.collections_in(ctx.db, ctx.txn):
        if views.is_view(coll):
            info: Doc = {"name": coll.name, "type": "view"}
            if not name_only:
                info.update({"options": copy.deepcopy(coll.options), "info": {"readOnly": True}})
            if query.matches(filt, info):
                out.append(info)
            continue
        info = {"name": coll.name, "type": "collection"}
        if not name_only:
            info.update(
                {
                    "options": copy.deepcopy(coll.options),
                    "info": {"readOnly": False},
                    "idIndex": dict(ID_INDEX),
                }
            )
        if query.matches(filt, info):
            out.append(info)
    return ctx.cursors.first_batch(f"{ctx.db}.$cmd.listCollections", out, None, ctx.session_key)


ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}


@command("listDatabases")
def cmd_list_databases(ctx: Context, cmd: Doc) -> Doc:
    if ctx.db != "admin":
        raise EngineError(
            Code.Unauthorized, "listDatabases may only be run against the admin database."
        )
    filt = opt_doc(cmd, "filter")
    dbs = []
    for name in ctx.engine.database_names():
        info = {"name": name, "sizeOnDisk": 0, "empty": False}
        if query.matches(filt, info):
            dbs.append({"name": name} if opt_bool(cmd, "nameOnly") else info)
    return {"databases": dbs, "totalSize": 0, "ok": 1.0}
