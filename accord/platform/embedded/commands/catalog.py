"""Catalog commands: collections, validators, indexes, databases."""

from __future__ import annotations

import copy
import re
from typing import Any

from bson.regex import Regex

from accord.platform.embedded import collation, query, validation
from accord.platform.embedded.auth.privileges import CLUSTER
from accord.platform.embedded.commands import views
from accord.platform.embedded.commands.base import (
    Context,
    Doc,
    check_db_name,
    coll_name,
    command,
    ns_of,
    opt_bool,
    opt_doc,
    opt_int,
    opt_list,
    writable_ns,
)
from accord.platform.embedded.commands.write import write_collection
from accord.platform.embedded.engine import Collection, Index
from accord.platform.embedded.errors import Code, EngineError, bad_value, type_mismatch
from accord.platform.embedded.versions import decode
from accord.platform.embedded.wire import MAX_BSON_SIZE


@command("create")
def cmd_create(ctx: Context, cmd: Doc) -> Doc:
    ns = writable_ns(ns_of(ctx, cmd, "create"))
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
            "timeseries",
            "changeStreamPreAndPostImages",
        )
    }
    images = options.get("changeStreamPreAndPostImages")
    if images is not None and (
        not isinstance(images, dict)
        or set(images) != {"enabled"}
        or not isinstance(images["enabled"], bool)
    ):
        raise EngineError(
            Code.TypeMismatch, "changeStreamPreAndPostImages must be {enabled: true|false}"
        )
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
    _refuse_capped(options)
    if "collation" in options:
        default = collation.parse(options.pop("collation"))
        if default is not None:
            options["collation"] = default.spec()
    ttl_field = _check_layout_options(options)
    if ctx.engine.get_collection(ns, ctx.txn) is not None:
        raise EngineError(Code.NamespaceExists, f"Collection {ns} already exists.")
    # In a transaction the collection is the transaction's until it commits, as in mongod.
    coll = ctx.engine.create_collection(ns, options, txn=ctx.txn if ctx.in_transaction else None)
    if ttl_field is not None:
        # Collection-level expiry (time series, clustered): a TTL index on the time field,
        # listed by listIndexes, which the TTL monitor serves like any other.
        spec = {
            "v": 2, "key": {ttl_field: 1}, "name": f"{ttl_field}_1",
            "expireAfterSeconds": options["expireAfterSeconds"],
        }  # fmt: skip
        coll.add_index(Index.from_spec(spec))
        ctx.engine.save_catalog(coll)
    return {"ok": 1.0}


_GRANULARITY_SPAN = {"seconds": 3600, "minutes": 86400, "hours": 2592000}


def _check_layout_options(options: Doc) -> str | None:
    """Check ``clusteredIndex``, ``timeseries`` and ``expireAfterSeconds`` (normalising them
    as mongod reports them); returns the field a collection-level expiry keys on."""
    clustered = options.get("clusteredIndex")
    if clustered is not None:
        if not isinstance(clustered, dict) or clustered.get("key") != {"_id": 1}:
            raise EngineError(
                Code.InvalidOptions, "clusteredIndex must be {key: {_id: 1}, unique: true}"
            )
        if clustered.get("unique") is not True:
            raise EngineError(Code.InvalidOptions, "the clusteredIndex must be unique: true")
        unknown = set(clustered) - {"key", "unique", "name", "v"}
        if unknown:
            raise EngineError(
                Code.InvalidOptions, f"unknown clusteredIndex field: {sorted(unknown)[0]}"
            )
        options["clusteredIndex"] = {
            "v": 2, "key": {"_id": 1}, "name": clustered.get("name", "_id_"), "unique": True,
        }  # fmt: skip
    ts = options.get("timeseries")
    if ts is not None:
        if (
            not isinstance(ts, dict)
            or not isinstance(ts.get("timeField"), str)
            or not ts["timeField"]
        ):
            raise EngineError(Code.InvalidOptions, "timeseries needs a 'timeField' name")
        unknown = set(ts) - {
            "timeField",
            "metaField",
            "granularity",
            "bucketMaxSpanSeconds",
            "bucketRoundingSeconds",
        }
        if unknown:
            raise EngineError(
                Code.InvalidOptions, f"unknown timeseries field: {sorted(unknown)[0]}"
            )
        meta = ts.get("metaField")
        if meta is not None and (not isinstance(meta, str) or meta == ts["timeField"]):
            raise EngineError(
                Code.InvalidOptions,
                "timeseries 'metaField' must be a name other than the timeField",
            )
        span, rounding = ts.get("bucketMaxSpanSeconds"), ts.get("bucketRoundingSeconds")
        normal: Doc = {"timeField": ts["timeField"]}
        if meta is not None:
            normal["metaField"] = meta
        if span is not None or rounding is not None:
            if (
                "granularity" in ts
                or span != rounding
                or not isinstance(span, int)
                or not 1 <= span <= 31536000
            ):
                raise EngineError(
                    Code.InvalidOptions,
                    "bucketMaxSpanSeconds and bucketRoundingSeconds must be given together, "
                    "be equal (1 to 31536000) and not be combined with granularity",
                )
            normal.update(bucketRoundingSeconds=rounding, bucketMaxSpanSeconds=span)
        else:
            granularity = ts.get("granularity", "seconds")
            if granularity not in _GRANULARITY_SPAN:
                raise EngineError(
                    Code.InvalidOptions,
                    f"timeseries granularity must be seconds, minutes or hours, got {granularity!r}",
                )
            normal.update(
                granularity=granularity, bucketMaxSpanSeconds=_GRANULARITY_SPAN[granularity]
            )
        options["timeseries"] = normal
    if "expireAfterSeconds" in options:
        eas = options["expireAfterSeconds"]
        if (
            isinstance(eas, bool)
            or not isinstance(eas, int | float)
            or not 0 <= eas < 2**63  # NaN and the infinities are not integers
            or eas != int(eas)
        ):
            raise EngineError(
                Code.InvalidOptions, "expireAfterSeconds must be a non-negative integer"
            )
        if ts is not None:
            return str(options["timeseries"]["timeField"])
        if clustered is not None:
            return "_id"
        raise EngineError(
            Code.InvalidOptions,
            "expireAfterSeconds is only valid for time-series and clustered collections",
        )
    return None


def _refuse_capped(options: Doc) -> None:
    """A capped collection is refused: the engine would keep its options but never evict,
    so a collection sized to stay small would grow without bound (docs/engine.md)."""
    if opt_bool(options, "capped"):
        raise EngineError(
            Code.CommandNotSupported,
            "capped collections are not supported by the embedded engine (their size and max "
            "would not be enforced); use a TTL index, or a real MongoDB",
        )


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
        k: v
        for k, v in cmd.items()
        if k in ("validator", "validationLevel", "validationAction", "changeStreamPreAndPostImages")
    }
    _check_validation_options(changes)
    reply: Doc = {"ok": 1.0}
    if "index" in cmd:
        spec = opt_doc(cmd, "index")
        target = _find_index(coll, spec.get("name") if "name" in spec else spec.get("keyPattern"))
        if "expireAfterSeconds" in spec:
            _check_ttl_seconds(spec["expireAfterSeconds"], Code.InvalidOptions)
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


#: mongod's bound on a TTL index's ``expireAfterSeconds`` (an int32).
_MAX_TTL_SECONDS = 2**31 - 1


def _check_ttl_seconds(eas: Any, code: Code) -> None:
    """A TTL index's ``expireAfterSeconds``: a number from 0 to 2**31 - 1. NaN is let
    through, as by mongod (such an index never expires anything here)."""
    if isinstance(eas, bool) or not isinstance(eas, int | float):
        raise type_mismatch(
            "TTL index 'expireAfterSeconds' option must be numeric, but received a type of "
            f"'{type(eas).__name__}'"
        )
    if eas < 0:
        raise EngineError(code, "TTL index 'expireAfterSeconds' option cannot be less than 0")
    if eas > _MAX_TTL_SECONDS:
        raise EngineError(
            code,
            "TTL index 'expireAfterSeconds' option must be within an acceptable range, "
            "try a lower number",
        )


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
    # As mongod: admin holds the users and roles; local is the replica set's own.
    if ctx.db == "admin":
        raise EngineError(Code.IllegalOperation, "Dropping the 'admin' database is prohibited.")
    if ctx.db == "local":
        raise EngineError(
            Code.IllegalOperation,
            "Cannot drop 'local' database while replication is active",
        )
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
    for ns in (source, target):  # the names create would accept, nothing else
        db_part, coll_part = ns.split(".", 1)
        check_db_name(db_part)
        coll_name({"renameCollection": coll_part}, "renameCollection")
    writable_ns(target)
    if source == target:  # dropTarget would drop the very collection being renamed
        raise EngineError(Code.IllegalOperation, "Can't rename a collection to itself")
    if views.is_view(ctx.engine.get_collection(source)):
        raise EngineError(Code.CommandNotSupportedOnView, f"cannot rename the view {source}")
    if ctx.engine.get_collection(source) is None:
        raise EngineError(Code.NamespaceNotFound, f"Source collection {source} does not exist")
    if ctx.engine.get_collection(target) is not None:
        if not opt_bool(cmd, "dropTarget"):
            raise EngineError(Code.NamespaceExists, "target namespace exists")
        ctx.engine.drop_collection(target)
    ctx.engine.rename_collection(source, target)
    return {"ok": 1.0}


# What MongoDB allows in a partialFilterExpression (its "partial index" expression subset).
_PARTIAL_OPERATORS = {"$eq", "$gt", "$gte", "$lt", "$lte", "$type", "$exists", "$in"}


def _unsupported_partial(what: str) -> EngineError:
    return EngineError(
        Code.CannotCreateIndex,
        f"Error in specification: partialFilterExpression: Expression not supported in "
        f"partial index: {what}; a partial index filter may use equality, $exists: true, "
        "$gt, $gte, $lt, $lte, $type, $in, $and and $or",
    )


def _check_partial_filter(expr: Any, depth: int = 0) -> None:
    """Refuse partial filters MongoDB refuses ($where, $expr, $regex, $not, ...), so every
    filter an index keeps can be evaluated on every later insert."""
    if not isinstance(expr, dict):
        raise EngineError(Code.TypeMismatch, "partialFilterExpression must be an object")
    if depth == 0:
        query.check_filter(expr)
    for key, value in expr.items():
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value or depth >= 4:
                raise _unsupported_partial(key)
            for sub in value:
                _check_partial_filter(sub, depth + 1)
        elif key.startswith("$"):
            raise _unsupported_partial(key)
        elif isinstance(value, dict) and value and next(iter(value)).startswith("$"):
            for op, arg in value.items():
                if op not in _PARTIAL_OPERATORS:
                    raise _unsupported_partial(op)
                if op == "$exists" and not arg:
                    raise _unsupported_partial("$exists: false")
                if op == "$in" and (
                    not isinstance(arg, list) or any(isinstance(v, re.Pattern | Regex) for v in arg)
                ):
                    raise _unsupported_partial("$in with a regex")
                if isinstance(arg, re.Pattern | Regex):
                    raise _unsupported_partial(f"{op} with a regex")
        elif isinstance(value, re.Pattern | Regex):
            raise _unsupported_partial("a regex")
    if depth == 0:
        try:
            query.matches(expr, {})
        except EngineError as exc:
            raise EngineError(
                Code.CannotCreateIndex, f"partialFilterExpression cannot be evaluated: {exc}"
            ) from exc


#: mongod's bounds: fields in one index key, indexes on one collection (the _id one counted).
MAX_KEY_FIELDS = 32
MAX_INDEXES = 64


def _check_key_pattern(raw: Doc) -> None:
    """What mongod's index spec validation refuses before looking at the key's values."""
    key = raw["key"]
    if len(key) > MAX_KEY_FIELDS:
        raise EngineError(
            Code.CannotCreateIndex,
            f"Index key pattern has {len(key)} fields; an index key has at most {MAX_KEY_FIELDS}",
        )
    for field_name in key:
        if field_name == "$**" or field_name.endswith(".$**"):
            continue
        if not field_name or "" in field_name.split("."):
            raise EngineError(Code.CannotCreateIndex, "Index keys cannot contain an empty field.")
        if any(part.startswith("$") for part in field_name.split(".")):
            raise EngineError(
                Code.CannotCreateIndex,
                f"Index key contains an illegal field name: field name starts with '$'. "
                f"Key: {field_name!r}",
            )
    if "hashed" in key.values() and raw.get("unique"):
        raise EngineError(
            Code.Location16764,
            "Currently hashed indexes cannot guarantee uniqueness. Use a regular index.",
        )
    name = raw.get("name", "")
    if "name" in raw and not isinstance(name, str):
        raise type_mismatch(f"The field 'name' must be a string, but got {type(name).__name__}")
    if "name" in raw and (not name or "\x00" in name or name == "*"):
        raise EngineError(Code.CannotCreateIndex, f"The index name {name!r} is not valid")


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
        _check_key_pattern(raw)
        for field_name, direction in raw["key"].items():
            ok_number = (
                isinstance(direction, int | float)
                and not isinstance(direction, bool)
                and direction != 0
                and direction == direction  # NaN is neither > 0 nor < 0
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
            _check_ttl_seconds(spec["expireAfterSeconds"], Code.CannotCreateIndex)
            if len(raw["key"]) != 1:
                raise EngineError(
                    Code.CannotCreateIndex,
                    "TTL indexes are single-field indexes, compound indexes do not support TTL.",
                )
        if "partialFilterExpression" in spec:
            _check_partial_filter(spec["partialFilterExpression"])
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
    if len(coll.indexes) + len(new_specs) > MAX_INDEXES:
        raise EngineError(
            Code.CannotCreateIndex,
            f"add index fails, too many indexes for {ns}: a collection has at most "
            f"{MAX_INDEXES} indexes",
        )
    names = [spec["name"] for spec in new_specs]
    if len(set(names)) != len(names):
        raise EngineError(Code.IndexKeySpecsConflict, "createIndexes names two indexes the same")
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
    clustered = coll.options.get("clusteredIndex")
    if clustered is not None:  # the _id index is the clustered index, under its name
        specs = [{**clustered, "clustered": True} if s.get("name") == "_id_" else s for s in specs]
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
    # authorizedCollections: only what the user holds a privilege on (checked engines).
    authorized = opt_bool(cmd, "authorizedCollections") and ctx.auth is not None
    out = []
    for coll in ctx.engine.collections_in(ctx.db, ctx.txn):
        if authorized and ctx.auth is not None and not ctx.auth.may_see_collection(coll.ns):
            continue
        if views.is_view(coll):
            info: Doc = {"name": coll.name, "type": "view"}
            if not name_only:
                info.update({"options": copy.deepcopy(coll.options), "info": {"readOnly": True}})
            if query.matches(filt, info):
                out.append(info)
            continue
        kind = "timeseries" if "timeseries" in coll.options else "collection"
        info = {"name": coll.name, "type": kind}
        if not name_only:
            info.update({"options": copy.deepcopy(coll.options), "info": {"readOnly": False}})
            if kind == "collection" and "clusteredIndex" not in coll.options:
                info["idIndex"] = dict(ID_INDEX)
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
    sess = ctx.auth
    # mongod: a user who may not list every database sees those it holds a privilege in
    # (authorizedDatabases defaults to that); asking for all of them is then refused.
    may_list_all = sess is None or sess.allows(CLUSTER, {"listDatabases"})
    wanted = cmd.get("authorizedDatabases")
    if wanted is not None and not wanted and not may_list_all:
        raise EngineError(Code.Unauthorized, "Insufficient permissions to list all databases")
    only_authorized = bool(wanted) if wanted is not None else not may_list_all
    dbs = []
    for name in ctx.engine.database_names():
        if only_authorized and sess is not None and not sess.may_see_database(name):
            continue
        info = {"name": name, "sizeOnDisk": 0, "empty": False}
        if query.matches(filt, info):
            dbs.append({"name": name} if opt_bool(cmd, "nameOnly") else info)
    return {"databases": dbs, "totalSize": 0, "ok": 1.0}


@command("validate")
def cmd_validate(ctx: Context, cmd: Doc) -> Doc:
    """Check a collection's committed documents against its indexes, as mongod's validate
    does: every document decodes, is within the BSON limit and sits under its own ``_id``;
    every unique index owns exactly the keys of the documents that have them; every
    ordered index has an entry for each key of each document."""
    ns = ns_of(ctx, cmd, "validate")
    coll = ctx.engine.get_collection(ns, ctx.txn)
    if coll is None:
        raise EngineError(Code.NamespaceNotFound, f"Collection '{ns}' does not exist to validate.")
    views.refuse_write(coll, "validate")
    errors: list[str] = []
    invalid = 0
    latest: list[tuple[Any, Doc]] = []
    for key, record in coll.records.items():
        if record.data is None:
            continue
        try:
            doc = decode(record.data)
        except Exception as exc:  # corrupt BSON is what validate exists to find
            invalid += 1
            errors.append(f"record {key!r} does not decode: {exc}")
            continue
        if len(record.data) > MAX_BSON_SIZE or "_id" not in doc or query.id_key(doc["_id"]) != key:
            invalid += 1
            errors.append(f"record {key!r} is over the size limit or not under its own _id")
            continue
        latest.append((record, doc))
    keys_per_index: Doc = {"_id_": len(latest)}
    missing = 0
    for index in coll.indexes.values():
        if index.is_id:
            continue
        count = 0
        for record, doc in latest:
            keys = index.key_tuples(doc, query.matches)
            count += len(keys)
            if index.built and index.orderable_or_hashed:
                missing += sum(
                    1 for k in keys if (*k, record.rid, record.ts, record) not in index.entries
                )
        keys_per_index[index.name] = count
        owners = coll.unique_maps.get(index.name)
        if owners is not None:
            expected: dict[Any, bytes] = {}
            for record, doc in latest:
                for k in index.unique_keys(doc, query.matches):
                    expected[k] = record.key
            if expected != owners:
                errors.append(f"unique index {index.name} does not match the documents' keys")
    if missing:
        errors.append(f"{missing} index entries are missing")
    return {
        "ns": ns, "nInvalidDocuments": invalid, "nNonCompliantDocuments": 0,
        "nrecords": len(latest) + invalid, "nIndexes": len(coll.indexes),
        "keysPerIndex": keys_per_index,
        "indexDetails": {name: {"valid": not errors} for name in coll.indexes},
        "valid": not errors and not invalid, "repaired": False, "warnings": [],
        "errors": errors, "extraIndexEntries": [], "missingIndexEntries": [],
        "corruptRecords": [], "ok": 1.0,
    }  # fmt: skip
