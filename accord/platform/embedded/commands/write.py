"""Write commands: insert, update, delete, findAndModify, and MongoDB 8.0's client bulkWrite."""

from __future__ import annotations

import copy
import datetime as dt
import re
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import bson
from bson import ObjectId

from accord.platform.embedded import collation, planner, query, update, validation
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
from accord.platform.embedded.commands.read import find_hits
from accord.platform.embedded.engine import Collection, duplicate_key
from accord.platform.embedded.errors import (
    Code,
    EngineError,
    bad_value,
    failed_to_parse,
    type_mismatch,
)
from accord.platform.embedded.variables import bind_filter, bind_pipeline, evaluate_let
from accord.platform.embedded.versions import encode
from accord.platform.embedded.wire import MAX_BSON_SIZE


def _check_field_names(doc: Doc) -> None:
    """MongoDB 5.0+ storage rules: ``$``-prefixed and dotted field names are allowed, except
    inside ``_id``."""
    for key in doc:
        if not isinstance(key, str):
            raise bad_value("field names must be strings")
    id_value = doc.get("_id")
    if isinstance(id_value, dict):
        _check_id_field_names(id_value)


def _check_id_field_names(value: Doc) -> None:
    for key, sub in value.items():
        if key.startswith("$"):
            raise EngineError(
                Code.DollarPrefixedFieldName,
                f"_id fields may not contain '$'-prefixed fields: {key} is not valid for storage.",
            )
        if isinstance(sub, dict):
            _check_id_field_names(sub)


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
        raise EngineError(Code.BadValue, "can't use an array for _id")
    if isinstance(doc["_id"], re.Pattern | bson.Regex):
        raise EngineError(Code.BadValue, "can't use a regex for _id")
    return doc


# How deep a stored document may nest: mongod's BSONDepth::getMaxDepthForUserStorage(),
# its maxBSONDepth (200 by default) less the 20 levels it keeps for documents that wrap
# stored ones (oplog entries). MongoDB's documentation speaks of 100 levels; 180 is what
# mongod enforces ("cannot insert document because it exceeds 180 levels of nesting").
MAX_STORAGE_DEPTH = 180
# Each level of nesting costs at least 7 bytes of BSON (type, key, length, terminator):
# anything shorter cannot be too deep, and is not walked.
_MIN_DEPTH_BYTES = 7


def _too_deep(doc: Doc, data: bytes) -> bool:
    """Whether ``doc`` (its BSON: ``data``) nests deeper than ``MAX_STORAGE_DEPTH``: an
    element below level 180 (top-level fields are level 1; empty documents and arrays
    add no level, as in mongod)."""
    if len(data) < MAX_STORAGE_DEPTH * _MIN_DEPTH_BYTES:
        return False
    frames: list[tuple[Any, int]] = [(doc, 1)]
    while frames:
        container, depth = frames.pop()
        for value in container.values() if isinstance(container, dict) else container:
            if isinstance(value, dict | list) and value:
                if depth == MAX_STORAGE_DEPTH:
                    return True
                frames.append((value, depth + 1))
    return False


def _check_depth(doc: Doc, data: bytes, *, updated: bool) -> None:
    """Refuse a document nested too deep for storage with mongod's error: an insert's, or
    an update's (replacements and upserts included: mongod's update path checks them)."""
    if not _too_deep(doc, data):
        return
    if updated:
        message = f"Document exceeds maximum nesting depth of {MAX_STORAGE_DEPTH}"
    else:
        message = f"cannot insert document because it exceeds {MAX_STORAGE_DEPTH} levels of nesting"
    raise EngineError(Code.Overflow, message)


def _check_size(doc: Doc, write: str) -> bytes:
    """``doc``'s BSON (what the commit stores), refused over MongoDB's 16 MB limit with the
    error mongod gives for the ``write`` ("insert", "upsert" or "update"): an insert's
    (fixDocumentForInsert), an upsert's (UpsertStage) or an update's (UpdateStage)."""
    data = encode(doc)
    size = len(data)
    if size <= MAX_BSON_SIZE:
        return data
    if write == "insert":
        raise EngineError(
            Code.BadValue,
            f"object to insert too large. size in bytes: {size}, max size: {MAX_BSON_SIZE}",
        )
    if write == "upsert":
        raise EngineError(Code.Location17420, f"Document to upsert is larger than {MAX_BSON_SIZE}")
    raise EngineError(
        Code.BSONObjectTooLarge, f"Resulting document after update is larger than {MAX_BSON_SIZE}"
    )


# mongod's write_ops::kMaxWriteBatchSize (the ``maxWriteBatchSize`` of ``hello``).
MAX_WRITE_BATCH_SIZE = 100_000


def check_batch_size(statements: list[Any]) -> None:
    """A write command carries 1 to 100,000 statements (mongod's checkOpCountForCommand:
    a driver splits larger batches, and mongod refuses an empty one)."""
    if not 0 < len(statements) <= MAX_WRITE_BATCH_SIZE:
        raise EngineError(
            Code.InvalidLength,
            f"Write batch sizes must be between 1 and {MAX_WRITE_BATCH_SIZE}. "
            f"Got {len(statements)} operations.",
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


def insert_one(
    ctx: Context, coll: Collection, doc: Doc, bypass: bool = False, *, upsert: bool = False
) -> Doc:
    """Stage the insert of ``doc`` (``upsert``: made by an update, and refused as one)."""
    doc = prepare_new_doc(doc)
    data = _check_size(doc, "upsert" if upsert else "insert")
    _check_depth(doc, data, updated=upsert)
    _check_time_field(coll, doc)
    key = query.id_key(doc["_id"])
    if ctx.engine.get(ctx.txn, coll.ns, key) is not None:
        raise duplicate_key(coll, coll.indexes["_id_"], doc)
    _validate(coll, doc, None, bypass)
    ctx.engine.write(ctx.txn, coll, key, doc, data)
    return doc


def _check_time_field(coll: Collection, doc: Doc) -> None:
    """A time-series collection's documents carry a date in their timeField."""
    ts = coll.options.get("timeseries")
    if ts is not None and not isinstance(doc.get(ts["timeField"]), dt.datetime):
        raise EngineError(
            Code.BadValue,
            f"'{ts['timeField']}' must be present and contain a valid BSON UTC datetime value",
        )


def replace_one(
    ctx: Context, coll: Collection, key: bytes, old: Doc, new: Doc, bypass: bool
) -> None:
    if query.canonical(new.get("_id")) != query.canonical(old.get("_id")):
        raise EngineError(
            Code.ImmutableField,
            "Performing an update on the path '_id' would modify the immutable field '_id'",
        )
    data = _check_size(new, "update")
    _check_depth(new, data, updated=True)
    _check_time_field(coll, new)
    _validate(coll, new, old, bypass)
    ctx.engine.write(ctx.txn, coll, key, new, data)


def write_collection(ctx: Context, ns: str) -> Collection:
    """The collection a write goes to, created implicitly as mongod does (by the command's
    transaction: durable with its commit, gone if it aborts inside a multi-document
    transaction); never a view."""
    views.refuse_write(ctx.engine.get_collection(ns, ctx.txn))
    return ctx.engine.ensure_collection(ns, ctx.txn)


@command("insert")
def cmd_insert(ctx: Context, cmd: Doc) -> Doc:
    ns = writable_ns(ns_of(ctx, cmd, "insert"))
    docs = opt_list(cmd, "documents")
    check_batch_size(docs)
    ordered = opt_bool(cmd, "ordered", True, strict=True)
    bypass = opt_bool(cmd, "bypassDocumentValidation")
    coll = write_collection(ctx, ns)
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
            if exc.code == Code.WriteConflict:
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
    if sort:
        planner.check_sort(sort)
    run = find_hits(ctx, ns, filt, sort=sort, limit=0 if multi else 1)
    return [(h.key, h.doc) for h in run.hits]


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
    new = insert_one(ctx, coll, new, bypass, upsert=True)
    return 1, 0, new["_id"], None, new


def statement_collation(statement: Doc) -> AbstractContextManager[None]:
    """The collation of one update/delete statement: its own ``collation``, else the
    command's or the collection's (already active)."""
    spec = statement.get("collation")
    return collation.active(collation.parse(spec)) if spec is not None else nullcontext()


def bind_update(upd: Any, let: Doc) -> Any:
    """An update with ``let`` variables bound (only a pipeline update has expressions)."""
    return bind_pipeline(upd, let) if isinstance(upd, list) else upd


@command("update")
def cmd_update(ctx: Context, cmd: Doc) -> Doc:
    ns = writable_ns(ns_of(ctx, cmd, "update"))
    statements = opt_list(cmd, "updates")
    check_batch_size(statements)
    ordered = opt_bool(cmd, "ordered", True, strict=True)
    bypass = opt_bool(cmd, "bypassDocumentValidation")
    coll = write_collection(ctx, ns)
    let = evaluate_let(cmd.get("let"))
    n = modified = 0
    upserted: list[Doc] = []

    def apply(i: int, st: Any) -> None:
        nonlocal n, modified
        if not isinstance(st, dict) or "q" not in st or "u" not in st:
            raise failed_to_parse("each update statement needs 'q' and 'u'")
        filt = st["q"]
        if not isinstance(filt, dict):
            raise type_mismatch("update 'q' must be an object")
        filt = bind_filter(filt, let)
        with statement_collation(st):
            sn, sm, up_id, _, _ = update_docs(
                ctx, coll, filt, bind_update(st["u"], let), multi=opt_bool(st, "multi", strict=True),
                upsert=opt_bool(st, "upsert", strict=True), array_filters=st.get("arrayFilters"),
                sort=opt_doc(st, "sort") or None, bypass=bypass,
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
    ns = writable_ns(ns_of(ctx, cmd, "delete"))
    statements = opt_list(cmd, "deletes")
    check_batch_size(statements)
    ordered = opt_bool(cmd, "ordered", True, strict=True)
    coll = ctx.engine.get_collection(ns, ctx.txn)
    views.refuse_write(coll)
    let = evaluate_let(cmd.get("let"))
    n = 0

    def apply(i: int, st: Any) -> None:
        nonlocal n
        if not isinstance(st, dict) or "q" not in st or "limit" not in st:
            raise failed_to_parse("each delete statement needs 'q' and 'limit'")
        filt = st["q"]
        if not isinstance(filt, dict):
            raise type_mismatch("delete 'q' must be an object")
        filt = bind_filter(filt, let)
        limit = opt_int(st, "limit")
        if limit not in (0, 1):
            raise failed_to_parse("The limit field in delete objects must be 0 or 1")
        if coll is None:
            query.check_filter(filt)
            return
        with statement_collation(st):
            picked = _pick(ctx, ns, filt, limit == 0, None)
        for key, _ in picked:
            ctx.engine.write(ctx.txn, coll, key, None)
            n += 1

    errors = each_statement(ctx, statements, ordered, apply)
    return with_write_errors({"n": n, "ok": 1.0}, errors)


@command("findAndModify", "findandmodify")
def cmd_find_and_modify(ctx: Context, cmd: Doc) -> Doc:
    name_field = "findAndModify" if "findAndModify" in cmd else "findandmodify"
    ns = writable_ns(ns_of(ctx, cmd, name_field))
    let = evaluate_let(cmd.get("let"))
    filt = bind_filter(opt_doc(cmd, "query"), let)
    sort = opt_doc(cmd, "sort") or None
    remove = opt_bool(cmd, "remove")
    upd = bind_update(cmd.get("update"), let)
    new_flag = opt_bool(cmd, "new")
    upsert = opt_bool(cmd, "upsert")
    fields = cmd.get("fields")
    if remove == (upd is not None):
        raise failed_to_parse("Either an update or remove=true must be specified")
    if remove and (new_flag or upsert):
        raise failed_to_parse("Cannot specify both remove=true and new=true or upsert=true")
    coll = write_collection(ctx, ns)
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
        raise EngineError(Code.Unauthorized, "bulkWrite may only be run against the admin database")
    ops = opt_list(cmd, "ops")
    check_batch_size(ops)
    ns_info = opt_list(cmd, "nsInfo")
    ordered = opt_bool(cmd, "ordered", True, strict=True)
    errors_only = opt_bool(cmd, "errorsOnly")
    bypass = opt_bool(cmd, "bypassDocumentValidation")
    let = evaluate_let(cmd.get("let"))
    namespaces: list[str] = []
    for entry in ns_info:
        ns = entry.get("ns") if isinstance(entry, dict) else None
        if not isinstance(ns, str) or "." not in ns:
            raise bad_value(f"invalid nsInfo entry: {entry!r}")
        db_part, coll_part = ns.split(".", 1)
        check_db_name(db_part)
        coll_name({"c": coll_part}, "c")
        namespaces.append(writable_ns(ns))
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
                insert_one(ctx, write_collection(ctx, ns), op.get("document"), bypass)  # type: ignore[arg-type]
                counts["nInserted"] += 1
                res: Doc = {"ok": 1.0, "idx": idx, "n": 1}
            elif kind == "update":
                filt = bind_filter(opt_doc(op, "filter"), let)
                with statement_collation(op):
                    n, m, up_id, _, _ = update_docs(
                        ctx, write_collection(ctx, ns), filt, bind_update(op.get("updateMods"), let),
                        multi=opt_bool(op, "multi", strict=True), upsert=opt_bool(op, "upsert", strict=True),
                        array_filters=op.get("arrayFilters"), sort=opt_doc(op, "sort") or None,
                        bypass=bypass,
                    )  # fmt: skip
                counts["nMatched"] += n if up_id is None else 0
                counts["nModified"] += m
                res = {"ok": 1.0, "idx": idx, "n": n, "nModified": m}
                if up_id is not None:
                    counts["nUpserted"] += 1
                    res["upserted"] = {"_id": up_id}
            else:
                filt = bind_filter(opt_doc(op, "filter"), let)
                coll = ctx.engine.get_collection(ns, ctx.txn)
                views.refuse_write(coll)
                n = 0
                if coll is not None:
                    with statement_collation(op):
                        picked = _pick(ctx, ns, filt, opt_bool(op, "multi", strict=True), None)
                    for key, _ in picked:
                        ctx.engine.write(ctx.txn, coll, key, None)
                        n += 1
                counts["nDeleted"] += n
                res = {"ok": 1.0, "idx": idx, "n": n}
            if not errors_only:
                results.append(res)
        except EngineError as exc:
            if exc.code == Code.WriteConflict:
                raise
            counts["nErrors"] += 1
            err = {"ok": 0.0, "idx": idx, "code": exc.code, "errmsg": exc.errmsg, **exc.extra}
            results.append(err)
            if ordered or ctx.in_transaction:
                break
    reply = ctx.cursors.first_batch("admin.$cmd.bulkWrite", results, None, ctx.session_key)
    reply.update(counts)
    return reply
