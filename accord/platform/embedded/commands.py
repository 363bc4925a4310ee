"""Command handlers: what each MongoDB command does to the engine.

A handler receives a ``Context`` (engine, database, the transaction it reads and writes
through) and the command document, and returns the reply. Session and transaction
bookkeeping happens before and after, in ``dispatch``.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import bson
from bson import ObjectId

from accord.platform.embedded import query, update, validation
from accord.platform.embedded.aggregate import Pipeline
from accord.platform.embedded.cursors import CursorManager
from accord.platform.embedded.engine import Collection, Engine, Index, Txn, duplicate_key
from accord.platform.embedded.errors import EngineError, bad_value, failed_to_parse, type_mismatch
from accord.platform.embedded.wire import MAX_BSON_SIZE

Doc = dict[str, Any]
SERVER_VERSION = "8.0.4"
MAX_WIRE_VERSION = 25


@dataclass
class Context:
    engine: Engine
    cursors: CursorManager
    db: str
    txn: Txn
    in_transaction: bool
    session_key: bytes | None
    hello: Callable[[Doc], Doc]


Handler = Callable[[Context, Doc], Doc]
COMMANDS: dict[str, Handler] = {}
# Commands that write: outside a transaction they run in their own autocommitted txn.
WRITE_COMMANDS = {"insert", "update", "delete", "findAndModify", "bulkWrite"}
# Commands allowed inside a multi-document transaction (as in mongod).
TXN_COMMANDS = {
    "find", "getMore", "killCursors", "insert", "update", "delete", "findAndModify",
    "aggregate", "distinct", "bulkWrite", "commitTransaction", "abortTransaction",
    "create", "createIndexes", "ping", "hello", "isMaster", "buildInfo", "connectionStatus",
}  # fmt: skip


def command(*names: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for n in names:
            COMMANDS[n] = fn
        return fn

    return register


# -- argument helpers -----------------------------------------------------------------------

_DB_BAD = re.compile(r'[/\\. "$\x00]')


def check_db_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) >= 64 or _DB_BAD.search(name):
        raise EngineError(73, f"Invalid database name: '{name}'")
    return name


def coll_name(cmd: Doc, field_name: str) -> str:
    name = cmd.get(field_name)
    if not isinstance(name, str):
        raise EngineError(
            73, f"collection name has invalid type {type(name).__name__}; expected a string"
        )
    if not name or "\x00" in name or name.startswith(".") or "$" in name:
        raise EngineError(73, f"Invalid collection name: '{name}'")
    return name


def ns_of(ctx: Context, cmd: Doc, field_name: str) -> str:
    return f"{ctx.db}.{coll_name(cmd, field_name)}"


def opt_doc(cmd: Doc, key: str, default: Doc | None = None) -> Doc:
    value = cmd.get(key, default)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise type_mismatch(
            f"BSON field '{key}' is the wrong type '{type(value).__name__}', expected type 'object'"
        )
    return value


def opt_int(cmd: Doc, key: str, default: int | None = None) -> int | None:
    value = cmd.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise type_mismatch(
            f"BSON field '{key}' is the wrong type '{type(value).__name__}', expected a number"
        )
    return int(value)


def opt_bool(cmd: Doc, key: str, default: bool = False) -> bool:
    value = cmd.get(key, default)
    if not isinstance(value, bool | int | float):
        raise type_mismatch(
            f"BSON field '{key}' is the wrong type '{type(value).__name__}', expected type 'bool'"
        )
    return bool(value)


def opt_list(cmd: Doc, key: str) -> list[Any]:
    value = cmd.get(key)
    if not isinstance(value, list):
        raise type_mismatch(f"BSON field '{key}' is missing or not an array")
    return value


# -- reads ----------------------------------------------------------------------------------


def visible_docs(ctx: Context, ns: str, filt: Doc | None = None) -> list[tuple[bytes, Doc]]:
    filt = filt or {}
    query.check_filter(filt)
    # Fast path: _id equality or $in is a point lookup, as the _id index makes it in mongod.
    id_value = filt.get("_id")
    if query.is_plain_equality(id_value) or query.is_plain_in(id_value):
        ids = id_value["$in"] if isinstance(id_value, dict) else [id_value]
        out = []
        for key in dict.fromkeys(query.id_key(v) for v in ids):
            doc = ctx.engine.get(ctx.txn, ns, key)
            if doc is not None and query.matches(filt, doc):
                out.append((key, doc))
        coll = ctx.engine.get_collection(ns)
        if coll is not None and len(out) > 1:
            out.sort(key=lambda kd: coll.order.get(kd[0], len(coll.order)))
        return out
    found = ctx.engine.lookup(ctx.txn, ns, filt) if filt else None
    if found is None:
        found = ctx.engine.scan(ctx.txn, ns)
    return [(k, d) for k, d in found if query.matches(filt, d)]


def reader(ctx: Context) -> Callable[[str], list[Doc]]:
    return lambda name: [d for _, d in ctx.engine.scan(ctx.txn, f"{ctx.db}.{name}")]


@command("find")
def cmd_find(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "find")
    filt = opt_doc(cmd, "filter")
    sort = opt_doc(cmd, "sort")
    projection = cmd.get("projection")
    skip = opt_int(cmd, "skip", 0) or 0
    limit = opt_int(cmd, "limit", 0) or 0
    batch_size = opt_int(cmd, "batchSize")
    if skip < 0:
        raise bad_value("skip value must be non-negative")
    if batch_size is not None and batch_size < 0:
        raise bad_value("batchSize must be non-negative")
    if cmd.get("tailable"):
        raise bad_value("tailable cursors are not supported by the embedded engine")
    single_batch = opt_bool(cmd, "singleBatch") or limit < 0
    limit = abs(limit)
    docs = [d for _, d in visible_docs(ctx, ns, filt)]
    if sort:
        docs = query.sort_docs(docs, sort)
    docs = docs[skip:]
    if limit:
        docs = docs[:limit]
    if projection is not None and not isinstance(projection, dict):
        raise type_mismatch("projection must be an object")
    docs = [query.project(copy.deepcopy(d), projection, filt) for d in docs]
    if limit and (batch_size is None or batch_size > limit):
        batch_size = limit
    return ctx.cursors.first_batch(ns, docs, batch_size, ctx.session_key, single_batch=single_batch)


@command("getMore")
def cmd_get_more(ctx: Context, cmd: Doc) -> Doc:
    cursor_id = cmd.get("getMore")
    if not isinstance(cursor_id, int) or isinstance(cursor_id, bool):
        raise type_mismatch("getMore must be a 64-bit integer cursor id")
    name = cmd.get("collection")
    if not isinstance(name, str) or not name:
        raise type_mismatch("getMore needs the 'collection' the cursor belongs to, as a string")
    # Command cursors (listCollections, client bulkWrite, ...) live on "$cmd.*" namespaces.
    return ctx.cursors.get_more(int(cursor_id), f"{ctx.db}.{name}", opt_int(cmd, "batchSize"))


@command("killCursors")
def cmd_kill_cursors(ctx: Context, cmd: Doc) -> Doc:
    ns_of(ctx, cmd, "killCursors")
    ids = opt_list(cmd, "cursors")
    return ctx.cursors.kill([int(i) for i in ids])


@command("count")
def cmd_count(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "count")
    n = len(visible_docs(ctx, ns, opt_doc(cmd, "query")))
    n = max(0, n - (opt_int(cmd, "skip", 0) or 0))
    limit = abs(opt_int(cmd, "limit", 0) or 0)
    if limit:
        n = min(n, limit)
    return {"n": n, "ok": 1.0}


@command("distinct")
def cmd_distinct(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "distinct")
    key = cmd.get("key")
    if not isinstance(key, str) or not key:
        raise type_mismatch("'key' must be a non-empty string")
    seen: dict[bytes, Any] = {}
    for _, doc in visible_docs(ctx, ns, opt_doc(cmd, "query")):
        for value in query.path_values(doc, key, empty_array_as_null=False):
            if value is query._MISSING:
                continue
            seen.setdefault(bson.encode({"": query.canonical(value)}), value)
    values = query.sort_docs([{"v": v} for v in seen.values()], {"v": 1})
    return {"values": [d["v"] for d in values], "ok": 1.0}


@command("aggregate")
def cmd_aggregate(ctx: Context, cmd: Doc) -> Doc:
    target = cmd.get("aggregate")
    pipeline = opt_list(cmd, "pipeline")
    cursor_opts = cmd.get("cursor")
    if not isinstance(cursor_opts, dict) and not cmd.get("explain"):
        raise failed_to_parse(
            "The 'cursor' option is required, except for aggregate with the explain argument"
        )
    for stage in pipeline:
        if isinstance(stage, dict) and ("$out" in stage or "$merge" in stage):
            raise EngineError(40324, "$out and $merge are not supported by the embedded engine")
    if target == 1:
        name, docs = None, []
        ns = f"{ctx.db}.$cmd.aggregate"
    else:
        name = coll_name(cmd, "aggregate")
        ns = f"{ctx.db}.{name}"
        first = pipeline[0] if pipeline and isinstance(pipeline[0], dict) else {}
        prefilter = first.get("$match") if isinstance(first.get("$match"), dict) else None
        docs = [d for _, d in visible_docs(ctx, ns, prefilter)]
        if prefilter is not None:
            pipeline = pipeline[1:]
    result = Pipeline(reader(ctx), name).run(docs, pipeline)
    batch_size = opt_int(cursor_opts or {}, "batchSize")
    return ctx.cursors.first_batch(ns, result, batch_size, ctx.session_key)


# -- writes ---------------------------------------------------------------------------------


def _check_field_names(doc: Doc, top: bool = True) -> None:
    for key, value in doc.items():
        if not isinstance(key, str):
            raise bad_value("field names must be strings")
        if top and key.startswith("$"):
            raise EngineError(52, f"Document can't have $ prefixed field names: {key}")
        if isinstance(value, dict):
            _check_field_names(value, top=False)


def prepare_new_doc(doc: Any) -> Doc:
    """Give a document to be inserted its ``_id`` (first, as mongod stores it)."""
    if not isinstance(doc, dict):
        raise type_mismatch("documents to insert must be objects")
    _check_field_names(doc)
    if "_id" not in doc:
        doc = {"_id": ObjectId(), **doc}
    elif next(iter(doc)) != "_id":
        doc = {"_id": doc["_id"], **{k: v for k, v in doc.items() if k != "_id"}}
    if isinstance(doc["_id"], list):
        raise EngineError(2, "can't use an array for _id")
    if isinstance(doc["_id"], re.Pattern | bson.Regex):
        raise EngineError(2, "can't use a regex for _id")
    return doc


def _check_size(doc: Doc) -> None:
    size = len(bson.encode(doc))
    if size > MAX_BSON_SIZE:
        raise EngineError(
            10334, f"BSONObj size: {size} is invalid. Size must be between 0 and 16793600(16MB)"
        )


def _validate(coll: Collection, doc: Doc, old: Doc | None, bypass: bool) -> None:
    validator = coll.options.get("validator")
    if not validator or bypass:
        return
    level = coll.options.get("validationLevel", "strict")
    if level == "off":
        return
    if level == "moderate" and old is not None:
        try:
            validation.validate_document(old, validator)
        except EngineError:
            return  # moderate: updates to already-invalid documents are not checked
    try:
        validation.validate_document(doc, validator)
    except EngineError:
        if coll.options.get("validationAction", "error") == "warn":
            return
        raise


def insert_one(ctx: Context, coll: Collection, doc: Doc, bypass: bool = False) -> Doc:
    doc = prepare_new_doc(doc)
    _check_size(doc)
    key = query.id_key(doc["_id"])
    if ctx.engine.get(ctx.txn, coll.ns, key) is not None:
        raise duplicate_key(coll, coll.indexes["_id_"], doc)
    _validate(coll, doc, None, bypass)
    ctx.engine.write(ctx.txn, coll, key, doc)
    return doc


def replace_one(
    ctx: Context, coll: Collection, key: bytes, old: Doc, new: Doc, bypass: bool
) -> None:
    if query.canonical(new.get("_id")) != query.canonical(old.get("_id")):
        raise EngineError(
            66, "Performing an update on the path '_id' would modify the immutable field '_id'"
        )
    _check_size(new)
    _validate(coll, new, old, bypass)
    ctx.engine.write(ctx.txn, coll, key, new)


def _write_coll(ctx: Context, ns: str) -> Collection:
    coll = ctx.engine.get_collection(ns)
    if coll is None:
        coll = ctx.engine.create_collection(ns)
        if ctx.in_transaction:
            ctx.txn.created.append(ns)  # dropped again if the transaction aborts
    return coll


@command("insert")
def cmd_insert(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "insert")
    docs = opt_list(cmd, "documents")
    ordered = opt_bool(cmd, "ordered", True)
    bypass = opt_bool(cmd, "bypassDocumentValidation")
    coll = _write_coll(ctx, ns)
    n = 0

    def apply(i: int, doc: Any) -> None:
        nonlocal n
        insert_one(ctx, coll, doc, bypass)
        n += 1

    errors = each_statement(ctx, docs, ordered, apply)
    return with_write_errors({"n": n, "ok": 1.0}, errors)


def each_statement(
    ctx: Context, statements: list[Any], ordered: bool, apply: Callable[[int, Any], None]
) -> list[Doc]:
    """Run the statements of a write command in order.

    A failed statement becomes a ``writeErrors`` entry while the statements before it stay
    applied, as in mongod; an ordered batch (and any batch in a transaction, which the
    dispatcher then aborts) stops there. A write conflict propagates: outside a
    transaction the caller retries the whole command, inside one it is a transient
    top-level error.
    """
    errors: list[Doc] = []
    for i, statement in enumerate(statements):
        try:
            apply(i, statement)
        except EngineError as exc:
            if exc.code == 112:
                raise
            errors.append(exc.to_write_error(i))
            if ordered or ctx.in_transaction:
                break
    return errors


def with_write_errors(reply: Doc, errors: list[Doc]) -> Doc:
    if errors:
        reply["writeErrors"] = errors
    return reply


def _pick(
    ctx: Context, ns: str, filt: Doc, multi: bool, sort: Doc | None
) -> list[tuple[bytes, Doc]]:
    found = visible_docs(ctx, ns, filt)
    if sort:
        order = query.sort_docs([d for _, d in found], sort)
        by_id = {id(d): (k, d) for k, d in found}
        found = [by_id[id(d)] for d in order]
    return found if multi else found[:1]


def update_docs(
    ctx: Context, coll: Collection, filt: Doc, upd: Any, *, multi: bool, upsert: bool,
    array_filters: list[Doc] | None, sort: Doc | None, bypass: bool, replacement_only: bool = False,
) -> tuple[int, int, Any, Doc | None, Doc | None]:  # fmt: skip
    """Apply one update statement. Returns (n, nModified, upserted_id, before, after)."""
    if not isinstance(upd, dict | list):
        raise failed_to_parse("Update argument must be either an object or an array")
    if multi and isinstance(upd, dict) and upd and not next(iter(upd)).startswith("$"):
        raise failed_to_parse("multi update is not supported for replacement-style update")
    if array_filters is not None and not isinstance(array_filters, list):
        raise type_mismatch("arrayFilters must be an array")
    n = modified = 0
    before = after = None
    for key, doc in _pick(ctx, coll.ns, filt, multi, sort):
        new = update.apply_update(doc, upd, array_filters=array_filters, query=filt)
        n += 1
        before, after = doc, new
        if new != doc or list(new) != list(doc):
            replace_one(ctx, coll, key, doc, new, bypass)
            modified += 1
    if n or not upsert:
        return n, modified, None, before, after
    if isinstance(upd, dict) and upd and not next(iter(upd)).startswith("$"):
        seed = {"_id": filt["_id"]} if "_id" in filt and not isinstance(filt["_id"], dict) else {}
        new = update.apply_update(seed, upd, is_insert=True)
    else:
        new = update.apply_update(
            update.upsert_seed(filt), upd, array_filters=array_filters, query=filt, is_insert=True
        )
    new = insert_one(ctx, coll, new, bypass)
    return 1, 0, new["_id"], None, new


@command("update")
def cmd_update(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "update")
    statements = opt_list(cmd, "updates")
    ordered = opt_bool(cmd, "ordered", True)
    bypass = opt_bool(cmd, "bypassDocumentValidation")
    coll = _write_coll(ctx, ns)
    n = modified = 0
    upserted: list[Doc] = []

    def apply(i: int, st: Any) -> None:
        nonlocal n, modified
        if not isinstance(st, dict) or "q" not in st or "u" not in st:
            raise failed_to_parse("each update statement needs 'q' and 'u'")
        filt = st["q"]
        if not isinstance(filt, dict):
            raise type_mismatch("update 'q' must be an object")
        sn, sm, up_id, _, _ = update_docs(
            ctx, coll, filt, st["u"], multi=opt_bool(st, "multi"), upsert=opt_bool(st, "upsert"),
            array_filters=st.get("arrayFilters"), sort=opt_doc(st, "sort") or None, bypass=bypass,
        )  # fmt: skip
        n += sn
        modified += sm
        if up_id is not None:
            upserted.append({"index": i, "_id": up_id})

    errors = each_statement(ctx, statements, ordered, apply)
    reply: Doc = {"n": n, "nModified": modified, "ok": 1.0}
    if upserted:
        reply["upserted"] = upserted
    return with_write_errors(reply, errors)


@command("delete")
def cmd_delete(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "delete")
    statements = opt_list(cmd, "deletes")
    ordered = opt_bool(cmd, "ordered", True)
    coll = ctx.engine.get_collection(ns)
    n = 0

    def apply(i: int, st: Any) -> None:
        nonlocal n
        if not isinstance(st, dict) or "q" not in st or "limit" not in st:
            raise failed_to_parse("each delete statement needs 'q' and 'limit'")
        filt = st["q"]
        if not isinstance(filt, dict):
            raise type_mismatch("delete 'q' must be an object")
        limit = opt_int(st, "limit")
        if limit not in (0, 1):
            raise failed_to_parse("The limit field in delete objects must be 0 or 1")
        if coll is None:
            query.check_filter(filt)
            return
        for key, _ in _pick(ctx, ns, filt, limit == 0, None):
            ctx.engine.write(ctx.txn, coll, key, None)
            n += 1

    errors = each_statement(ctx, statements, ordered, apply)
    return with_write_errors({"n": n, "ok": 1.0}, errors)


@command("findAndModify", "findandmodify")
def cmd_find_and_modify(ctx: Context, cmd: Doc) -> Doc:
    name_field = "findAndModify" if "findAndModify" in cmd else "findandmodify"
    ns = ns_of(ctx, cmd, name_field)
    filt = opt_doc(cmd, "query")
    sort = opt_doc(cmd, "sort") or None
    remove = opt_bool(cmd, "remove")
    upd = cmd.get("update")
    new_flag = opt_bool(cmd, "new")
    upsert = opt_bool(cmd, "upsert")
    fields = cmd.get("fields")
    if remove == (upd is not None):
        raise failed_to_parse("Either an update or remove=true must be specified")
    if remove and (new_flag or upsert):
        raise failed_to_parse("Cannot specify both remove=true and new=true or upsert=true")
    coll = _write_coll(ctx, ns)
    last_error: Doc = {"n": 0}
    value: Doc | None = None
    if remove:
        picked = _pick(ctx, ns, filt, False, sort)
        if picked:
            key, doc = picked[0]
            ctx.engine.write(ctx.txn, coll, key, None)
            last_error = {"n": 1}
            value = doc
    else:
        n, _, up_id, before, after = update_docs(
            ctx, coll, filt, upd, multi=False, upsert=upsert, array_filters=cmd.get("arrayFilters"),
            sort=sort, bypass=opt_bool(cmd, "bypassDocumentValidation"),
        )  # fmt: skip
        last_error = {"n": n, "updatedExisting": up_id is None and n > 0}
        if up_id is not None:
            last_error["upserted"] = up_id
        value = after if new_flag else before
    if value is not None and fields:
        value = query.project(copy.deepcopy(value), fields, filt)
    return {"lastErrorObject": last_error, "value": value, "ok": 1.0}


@command("bulkWrite")
def cmd_bulk_write(ctx: Context, cmd: Doc) -> Doc:
    if ctx.db != "admin":
        raise EngineError(13, "bulkWrite may only be run against the admin database")
    ops = opt_list(cmd, "ops")
    ns_info = opt_list(cmd, "nsInfo")
    ordered = opt_bool(cmd, "ordered", True)
    errors_only = opt_bool(cmd, "errorsOnly")
    bypass = opt_bool(cmd, "bypassDocumentValidation")
    namespaces: list[str] = []
    for entry in ns_info:
        ns = entry.get("ns") if isinstance(entry, dict) else None
        if not isinstance(ns, str) or "." not in ns:
            raise bad_value(f"invalid nsInfo entry: {entry!r}")
        db_part, coll_part = ns.split(".", 1)
        check_db_name(db_part)
        coll_name({"c": coll_part}, "c")
        namespaces.append(ns)
    counts = dict.fromkeys(
        ("nInserted", "nMatched", "nModified", "nUpserted", "nDeleted", "nErrors"), 0
    )
    results: list[Doc] = []
    for idx, op in enumerate(ops):
        try:
            if not isinstance(op, dict) or not op:
                raise failed_to_parse("bulkWrite ops must be objects")
            kind = next(iter(op))
            ns_index = op[kind]
            if (
                kind not in ("insert", "update", "delete")
                or not isinstance(ns_index, int)
                or not 0 <= ns_index < len(namespaces)
            ):
                raise failed_to_parse(f"invalid bulkWrite operation: {kind!r}")
            ns = namespaces[ns_index]
            if kind == "insert":
                insert_one(ctx, _write_coll(ctx, ns), op.get("document"), bypass)  # type: ignore[arg-type]
                counts["nInserted"] += 1
                res: Doc = {"ok": 1.0, "idx": idx, "n": 1}
            elif kind == "update":
                filt = opt_doc(op, "filter")
                n, m, up_id, _, _ = update_docs(
                    ctx, _write_coll(ctx, ns), filt, op.get("updateMods"), multi=opt_bool(op, "multi"),
                    upsert=opt_bool(op, "upsert"), array_filters=op.get("arrayFilters"),
                    sort=opt_doc(op, "sort") or None, bypass=bypass,
                )  # fmt: skip
                counts["nMatched"] += n if up_id is None else 0
                counts["nModified"] += m
                res = {"ok": 1.0, "idx": idx, "n": n, "nModified": m}
                if up_id is not None:
                    counts["nUpserted"] += 1
                    res["upserted"] = {"_id": up_id}
            else:
                filt = opt_doc(op, "filter")
                coll = ctx.engine.get_collection(ns)
                n = 0
                if coll is not None:
                    for key, _ in _pick(ctx, ns, filt, opt_bool(op, "multi"), None):
                        ctx.engine.write(ctx.txn, coll, key, None)
                        n += 1
                counts["nDeleted"] += n
                res = {"ok": 1.0, "idx": idx, "n": n}
            if not errors_only:
                results.append(res)
        except EngineError as exc:
            if exc.code == 112:
                raise
            counts["nErrors"] += 1
            err = {"ok": 0.0, "idx": idx, "code": exc.code, "errmsg": exc.errmsg, **exc.extra}
            results.append(err)
            if ordered or ctx.in_transaction:
                break
    reply = ctx.cursors.first_batch("admin.$cmd.bulkWrite", results, None, ctx.session_key)
    reply.update(counts)
    return reply


# -- DDL ------------------------------------------------------------------------------------


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
        )
    }
    _check_validation_options(options)
    if ctx.engine.get_collection(ns) is not None:
        raise EngineError(48, f"Collection {ns} already exists.")
    ctx.engine.create_collection(ns, options)
    if ctx.in_transaction:
        ctx.txn.created.append(ns)  # rolled back if the transaction aborts, as in mongod
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
        raise EngineError(26, f"ns does not exist: {ns}")
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
    raise EngineError(27, f"index not found with name [{name_or_key}]")


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
        raise EngineError(13, "renameCollection may only be run against the admin database.")
    source, target = cmd.get("renameCollection"), cmd.get("to")
    if (
        not isinstance(source, str)
        or not isinstance(target, str)
        or "." not in source
        or "." not in target
    ):
        raise bad_value("renameCollection needs 'db.collection' source and 'to'")
    if ctx.engine.get_collection(source) is None:
        raise EngineError(26, f"Source collection {source} does not exist")
    if ctx.engine.get_collection(target) is not None:
        if not opt_bool(cmd, "dropTarget"):
            raise EngineError(48, "target namespace exists")
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
    created_coll = ctx.engine.get_collection(ns) is None
    coll = _write_coll(ctx, ns)
    before = len(coll.indexes)
    new_specs = []
    for raw in specs:
        if not isinstance(raw, dict) or not isinstance(raw.get("key"), dict) or not raw["key"]:
            raise EngineError(9, "Index spec must have a non-empty 'key' object")
        unknown = set(raw) - _INDEX_OPTIONS
        if unknown:
            raise EngineError(
                197, f"The field '{sorted(unknown)[0]}' is not valid for an index specification."
            )
        for field_name, direction in raw["key"].items():
            ok_number = (
                isinstance(direction, int | float)
                and not isinstance(direction, bool)
                and direction != 0
            )
            if not (ok_number or direction in ("text", "2d", "2dsphere", "hashed")):
                raise EngineError(
                    67,
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
        if "expireAfterSeconds" in spec:
            eas = spec["expireAfterSeconds"]
            if isinstance(eas, bool) or not isinstance(eas, int | float) or eas < 0:
                raise EngineError(
                    67, "TTL index 'expireAfterSeconds' option must be a non-negative number"
                )
            if len(raw["key"]) != 1:
                raise EngineError(
                    67, "TTL indexes are single-field indexes, compound indexes do not support TTL."
                )
        if "partialFilterExpression" in spec:
            query.check_filter(spec["partialFilterExpression"])
        existing = coll.indexes.get(spec["name"])
        same_key = next((i for i in coll.indexes.values() if dict(i.key) == spec["key"]), None)
        if existing is not None:
            if dict(existing.key) != spec["key"]:
                raise EngineError(
                    86,
                    f"An existing index has the same name as the requested index but a different key. Requested index: {spec}, existing index: {existing.spec}",
                )
            if _options(existing.spec) != _options(spec):
                raise EngineError(
                    85,
                    f"An equivalent index already exists with the same name but different options. Requested index: {spec}, existing index: {existing.spec}",
                )
            continue
        if same_key is not None and _options(same_key.spec) != _options(spec):
            raise EngineError(
                85,
                f"An equivalent index already exists with a different name and options. Requested index: {spec}, existing index: {same_key.spec}",
            )
        if same_key is not None:
            raise EngineError(85, f"Index already exists with a different name: {same_key.name}")
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
                112,
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
        raise EngineError(26, f"ns does not exist: {ns}")
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
        raise EngineError(26, f"ns not found {ns}")
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
            raise EngineError(72, "cannot drop _id index")
        if name not in coll.indexes:
            raise EngineError(27, f"index not found with name [{name}]")
    for name in names:
        coll.indexes.pop(name)
        coll.unique_maps.pop(name, None)
    ctx.engine.save_catalog(coll)
    return {"nIndexesWas": before, "ok": 1.0}


@command("listCollections")
def cmd_list_collections(ctx: Context, cmd: Doc) -> Doc:
    filt = opt_doc(cmd, "filter")
    name_only = opt_bool(cmd, "nameOnly")
    out = []
    for coll in ctx.engine.collections_in(ctx.db):
        info: Doc = {"name": coll.name, "type": "collection"}
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
        raise EngineError(13, "listDatabases may only be run against the admin database.")
    filt = opt_doc(cmd, "filter")
    dbs = []
    for name in ctx.engine.database_names():
        info = {"name": name, "sizeOnDisk": 0, "empty": False}
        if query.matches(filt, info):
            dbs.append({"name": name} if opt_bool(cmd, "nameOnly") else info)
    return {"databases": dbs, "totalSize": 0, "ok": 1.0}


# -- admin ----------------------------------------------------------------------------------


@command("ping")
def cmd_ping(ctx: Context, cmd: Doc) -> Doc:
    return {"ok": 1.0}


@command("hello", "isMaster", "ismaster")
def cmd_hello(ctx: Context, cmd: Doc) -> Doc:
    return ctx.hello(cmd)


@command("buildInfo", "buildinfo")
def cmd_build_info(ctx: Context, cmd: Doc) -> Doc:
    return {
        "version": SERVER_VERSION, "versionArray": [8, 0, 4, 0], "gitVersion": "accord-embedded",
        "bits": 64, "maxBsonObjectSize": MAX_BSON_SIZE, "storageEngines": ["accord-sqlite"],
        "modules": [], "ok": 1.0,
    }  # fmt: skip


@command("endSessions", "killSessions")
def cmd_end_sessions(ctx: Context, cmd: Doc) -> Doc:
    name = "endSessions" if "endSessions" in cmd else "killSessions"
    for lsid in cmd.get(name) or []:
        if isinstance(lsid, dict) and "id" in lsid:
            key = bson.encode({"id": lsid["id"]})
            ctx.engine.end_session(key)
            ctx.cursors.kill_session(key)
    return {"ok": 1.0}


@command("whatsmyuri")
def cmd_whatsmyuri(ctx: Context, cmd: Doc) -> Doc:
    return {"you": "127.0.0.1:0", "ok": 1.0}


@command("getParameter")
def cmd_get_parameter(ctx: Context, cmd: Doc) -> Doc:
    return {"featureCompatibilityVersion": {"version": "8.0"}, "ok": 1.0}


@command("serverStatus")
def cmd_server_status(ctx: Context, cmd: Doc) -> Doc:
    return {
        "host": "localhost", "version": SERVER_VERSION, "process": "accord-engine",
        "localTime": dt.datetime.now(dt.UTC).replace(tzinfo=None),
        "transactions": {"currentOpen": sum(1 for t in ctx.engine.active.values() if t.explicit)},
        "ok": 1.0,
    }  # fmt: skip


@command("dbStats")
def cmd_db_stats(ctx: Context, cmd: Doc) -> Doc:
    colls = ctx.engine.collections_in(ctx.db)
    objects = sum(len(c.versions) for c in colls)
    return {"db": ctx.db, "collections": len(colls), "objects": objects, "ok": 1.0}


@command("connectionStatus")
def cmd_connection_status(ctx: Context, cmd: Doc) -> Doc:
    return {"authInfo": {"authenticatedUsers": [], "authenticatedUserRoles": []}, "ok": 1.0}


@command("commitTransaction", "abortTransaction")
def cmd_end_transaction(ctx: Context, cmd: Doc) -> Doc:
    # The dispatcher completes these itself; reaching here means no transaction was open.
    raise EngineError(50768, f"{next(iter(cmd))} must be run within a transaction")
