"""Read commands: find, getMore, killCursors, count, distinct, aggregate."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import bson

from accord.platform.embedded import query
from accord.platform.embedded.aggregate import Pipeline
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
from accord.platform.embedded.errors import (
    Code,
    EngineError,
    bad_value,
    failed_to_parse,
    type_mismatch,
)
from accord.platform.embedded.paths import MISSING


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
            if value is MISSING:
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
            raise EngineError(
                Code.Location40324, "$out and $merge are not supported by the embedded engine"
            )
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
