"""Read commands: find, getMore, killCursors, count, distinct, aggregate.

A read collects its documents under the engine lock, in slices (``Engine.read_pause``);
what it then does with them (sort, project, run pipeline stages, encode the reply's
batch) works on documents it owns and runs with the lock released
(``Engine.released``). A stage that reads another collection ($lookup) takes the lock
for that read only (``reader``).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import hashlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import bson

from accord.platform.embedded import collation, planner, query
from accord.platform.embedded.aggregate import Pipeline
from accord.platform.embedded.commands import changestreams, views
from accord.platform.embedded.commands.base import (
    PIPELINE_OUTPUTS,
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
from accord.platform.embedded.cursors import packed
from accord.platform.embedded.errors import (
    Code,
    EngineError,
    bad_value,
    failed_to_parse,
    type_mismatch,
)
from accord.platform.embedded.paths import MISSING
from accord.platform.embedded.values import bson_type_name, compare_values
from accord.platform.embedded.variables import (
    bind_expression,
    bind_filter,
    bind_pipeline,
    evaluate_let,
)
from accord.platform.embedded.versions import decode
from accord.platform.embedded.wire import MAX_BSON_SIZE


def find_hits(
    ctx: Context, ns: str, filt: Doc | None = None, *, sort: Doc | None = None, skip: int = 0,
    limit: int = 0, hint: Any = None,
) -> planner.Execution:  # fmt: skip
    """Run a query through the planner for the command's transaction (see ``planner``)."""
    q = planner.Query(filt or {}, sort or None, skip, limit, hint)
    return run_query(ctx, ns, q)


def run_query(ctx: Context, ns: str, q: planner.Query) -> planner.Execution:
    """``q`` on a collection through the planner, or on a view through its pipeline."""
    coll = ctx.engine.get_collection(ns, ctx.txn)
    if not views.is_view(coll):
        return ctx.engine.find(ctx.txn, ns, q)
    assert coll is not None
    query.check_filter(q.filter)
    source, pipeline = views.resolve(ctx, coll)
    found = run_query(ctx, source, planner.Query({})).hits
    with ctx.engine.released(ctx.txn):
        docs = [h.doc for h in found]
        docs = Pipeline(reader(ctx), source.split(".", 1)[1]).run(docs, pipeline, owned=True)
        docs = [d for d in docs if query.matches(q.filter, d)]
        if q.sort:
            docs = query.sort_docs(docs, q.sort)
        docs = docs[q.skip :]
        if q.limit:
            docs = docs[: q.limit]
    hits = planner.Hits(  # no keys: read-only
        planner.Hit(b"", None, d, float(i)) for i, d in enumerate(docs)
    )
    return planner.Execution(
        hits, planner.Plan("VIEW", 0.0), planner.ScanStats(), bool(q.sort), 0.0
    )


def visible_docs(ctx: Context, ns: str, filt: Doc | None = None) -> list[tuple[bytes, Doc]]:
    """``(id key, doc)`` of every document ``filt`` matches (fresh dicts, or the
    transaction's own staged ones)."""
    return [(h.key, h.doc) for h in find_hits(ctx, ns, filt).hits]


def reader(ctx: Context) -> Callable[[str], list[Doc]]:
    """Documents of another collection (or view) of the database, for $lookup: read under
    the engine lock (pipeline stages may run with it released), decoded after."""

    def read(name: str) -> list[Doc]:
        with ctx.engine.locked("aggregate"):
            hits = find_hits(ctx, f"{ctx.db}.{name}").hits
        return [h.doc for h in hits]

    return read


def reply_cursor(
    ctx: Context, ns: str, docs: list[Any], batch_size: int | None, *,
    single_batch: bool = False,
) -> Doc:  # fmt: skip
    """The reply of a read with its first batch (encoded with the engine lock released)
    and the rest kept as a cursor."""
    return ctx.cursors.first_batch(
        ns, docs, batch_size, ctx.session_key, single_batch=single_batch,
        release=lambda: ctx.engine.released(ctx.txn),
    )  # fmt: skip


def reply_doc(hit: planner.Hit) -> Any:
    """A result as the reply carries it: the stored BSON as is when there is one."""
    if hit.raw is not None:
        return hit.raw
    return hit.doc


@command("find")
def cmd_find(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "find")
    q, projection, batch_size, single_batch = parse_find(cmd)
    bounds = _key_bounds(cmd)
    if bounds is None:
        run = run_query(ctx, ns, q)
    else:  # the key bounds before skip and limit
        run = _within(run_query(ctx, ns, dataclasses.replace(q, skip=0, limit=0)), *bounds)
        hits = run.hits[q.skip :]
        run = dataclasses.replace(run, hits=hits[: q.limit] if q.limit else hits)
    with ctx.engine.released(ctx.txn):
        # One result at a time, encoded at once: a cursor keeps bytes only (see cursors).
        docs = packed(_results(cmd, run, projection, q.filter))
    if q.limit and (batch_size is None or batch_size > q.limit):
        batch_size = q.limit
    return reply_cursor(ctx, ns, docs, batch_size, single_batch=single_batch)


def _results(cmd: Doc, run: planner.Execution, projection: Doc | None, filt: Doc) -> Iterator[Any]:
    """A find's results as its reply carries them, made one at a time (a hit's decoded
    document is not kept on the hit: 100,000 of them alive at once kept Python's garbage
    collector busy)."""
    if opt_bool(cmd, "returnKey", strict=True):
        for hit in run.hits:
            yield _index_key(run.plan, _fresh(hit))
        return
    record_id = opt_bool(cmd, "showRecordId", strict=True)
    for hit in run.hits:
        doc: Any = reply_doc(hit)
        if projection is not None:
            doc = query.project(_fresh(hit), projection, filt)
        if record_id:
            # A transaction's own new documents have no record id yet (rid inf): 0.
            rid = bson.Int64(hit.rid if hit.rid != float("inf") else 0)
            doc = {**(_fresh(hit) if projection is None else doc), "$recordId": rid}
        yield doc


def _fresh(hit: planner.Hit) -> Doc:
    """The hit's document as a dict the caller owns (decoded anew, or a copy of the
    transaction's own staged one)."""
    return decode(hit.raw) if hit.raw is not None else copy.deepcopy(hit.doc)


def _index_key(plan: planner.Plan, doc: Doc) -> Doc:
    """``returnKey``: the key of the index the plan read (nothing for a collection scan)."""
    if plan.kind == "IDHACK":
        return {"_id": doc.get("_id")}
    if plan.index is None:
        return {}
    out: Doc = {}
    for field_name in plan.index.fields:
        values = [v for v in query.path_values(doc, field_name) if v is not MISSING]
        out[field_name] = values[0] if values else None
    return out


def _key_bounds(cmd: Doc) -> tuple[Doc | None, Doc | None] | None:
    """``min``/``max`` (index key bounds of the hinted index), or None without them.
    Without a hint mongod refuses them (51173)."""
    bounds = {k: opt_doc(cmd, k) for k in ("min", "max") if cmd.get(k) not in (None, {})}
    if not bounds:
        return None
    if cmd.get("hint") in (None, {}, ""):
        raise EngineError(
            Code.Location51173,
            "When using min()/max() a hint of which index to use must be provided",
        )
    return bounds.get("min"), bounds.get("max")


def _within(run: planner.Execution, low: Doc | None, high: Doc | None) -> planner.Execution:
    """``run``'s hits whose key in the hinted index is in ``[low, high)``, in index order
    (each field's direction), as mongod's ``min`` (inclusive) and ``max`` (exclusive)."""
    pattern = (
        [("_id", 1)]
        if run.plan.kind == "IDHACK"
        else list(run.plan.index.key if run.plan.index is not None else [])
    )
    for bound in (low, high):
        if bound is not None and list(bound) != [f for f, _ in pattern]:
            raise EngineError(
                Code.Location51174,
                "The index chosen is not consistent with min/max: min and max must name "
                f"the fields of the hinted index {dict(pattern)} in order",
            )

    def compare(key: Doc, bound: Doc) -> int:
        for name, direction in pattern:
            c = compare_values(key.get(name), bound[name])
            if c:
                return c if direction != -1 else -c
        return 0

    kept = []
    for hit in run.hits:
        key = _index_key(run.plan, _fresh(hit))
        if low is not None and compare(key, low) < 0:
            continue
        if high is not None and compare(key, high) >= 0:
            continue
        kept.append(hit)
    return dataclasses.replace(run, hits=planner.Hits(kept, keep_docs=False))


def parse_find(cmd: Doc) -> tuple[planner.Query, Doc | None, int | None, bool]:
    """A find command's query, projection, batch size and single-batch flag."""
    let = evaluate_let(cmd.get("let"))
    filt = bind_filter(opt_doc(cmd, "filter"), let)
    sort = opt_doc(cmd, "sort")
    projection = bind_expression(cmd.get("projection"), let)
    skip = opt_int(cmd, "skip", 0) or 0
    limit = opt_int(cmd, "limit", 0) or 0
    batch_size = opt_int(cmd, "batchSize")
    if skip < 0:
        raise bad_value("skip value must be non-negative")
    if batch_size is not None and batch_size < 0:
        raise bad_value("batchSize must be non-negative")
    if cmd.get("tailable"):
        raise bad_value("tailable cursors are not supported by the embedded engine")
    if projection is not None and not isinstance(projection, dict):
        raise type_mismatch("projection must be an object")
    single_batch = opt_bool(cmd, "singleBatch", strict=True) or limit < 0
    for flag in ("returnKey", "showRecordId", "allowDiskUse", "noCursorTimeout", "awaitData"):
        opt_bool(cmd, flag, strict=True)  # mongod's optionalBool: a boolean or nothing
    if sort:
        planner.check_sort(sort)
    q = planner.Query(filt, sort or None, skip, abs(limit), cmd.get("hint"))
    return q, projection, batch_size, single_batch


@command("getMore")
def cmd_get_more(ctx: Context, cmd: Doc) -> Doc:
    cursor_id = cmd.get("getMore")
    if not isinstance(cursor_id, int) or isinstance(cursor_id, bool):
        raise type_mismatch("getMore must be a 64-bit integer cursor id")
    name = cmd.get("collection")
    if not isinstance(name, str) or not name:
        raise type_mismatch("getMore needs the 'collection' the cursor belongs to, as a string")
    # A cursor is read only in the session and transaction that opened it (mongod's
    # 50736-50738, then 50739-50741).
    ctx.cursors.check_session(int(cursor_id), ctx.session_key)
    ctx.cursors.check_transaction(int(cursor_id), ctx.txn_number)
    # Command cursors (listCollections, client bulkWrite, ...) live on "$cmd.*" namespaces.
    stream = ctx.cursors.streams.get(int(cursor_id))
    if stream is not None:
        return changestreams.get_more(ctx, stream, cmd, f"{ctx.db}.{name}")
    return ctx.cursors.get_more(
        int(cursor_id), f"{ctx.db}.{name}", opt_int(cmd, "batchSize"),
        release=lambda: ctx.engine.released(ctx.txn),
    )  # fmt: skip


@command("killCursors")
def cmd_kill_cursors(ctx: Context, cmd: Doc) -> Doc:
    name = cmd.get("killCursors")
    if not (isinstance(name, str) and name.startswith("$cmd.")):  # command cursors' namespace
        ns_of(ctx, cmd, "killCursors")
    ids = opt_list(cmd, "cursors")
    for i in ids:
        if not isinstance(i, int) or isinstance(i, bool):
            raise type_mismatch(
                f"BSON field 'killCursors.cursors' is the wrong type '{bson_type_name(i)}', "
                "expected type 'long'"
            )
    return ctx.cursors.kill([int(i) for i in ids])


@command("count")
def cmd_count(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "count")
    skip = opt_int(cmd, "skip", 0) or 0
    limit = abs(opt_int(cmd, "limit", 0) or 0)
    run = find_hits(
        ctx, ns, opt_doc(cmd, "query"), skip=max(0, skip), limit=limit, hint=cmd.get("hint")
    )
    return {"n": len(run.hits), "ok": 1.0}


@command("distinct")
def cmd_distinct(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "distinct")
    key = cmd.get("key")
    if not isinstance(key, str) or not key:
        raise type_mismatch("'key' must be a non-empty string")
    hits = find_hits(ctx, ns, opt_doc(cmd, "query")).hits
    seen: dict[bytes, Any] = {}
    size = 0
    with ctx.engine.released(ctx.txn):
        for hit in hits:
            for value in query.path_values(hit.doc, key, empty_array_as_null=False):
                if value is MISSING:
                    continue
                dedupe = bson.encode({"": query.canonical(collation.key_values(value))})
                if dedupe not in seen:
                    seen[dedupe] = value
                    size += len(bson.encode({"": value})) - 5  # the element, as in the array
                    if size > MAX_BSON_SIZE:  # mongod caps the values, not the reply
                        raise EngineError(Code.Location17217, "distinct too big, 16mb cap")
        values = query.sort_docs([{"v": v} for v in seen.values()], {"v": 1})
    return {"values": [d["v"] for d in values], "ok": 1.0}


def _local_sessions(ctx: Context, spec: Any) -> list[Doc]:
    """``$listLocalSessions``: the sessions this engine knows, as mongod's session cache lists them."""
    if not isinstance(spec, dict):
        raise type_mismatch("$listLocalSessions needs an object")
    now, mono = dt.datetime.now(dt.UTC).replace(tzinfo=None), time.monotonic()
    anonymous = bson.Binary(hashlib.sha256(b"").digest())
    out = []
    for key, session in ctx.engine.sessions.items():
        last_use = now - dt.timedelta(seconds=mono - session.last_used)
        last_use = last_use.replace(microsecond=last_use.microsecond // 1000 * 1000)
        lsid = bson.decode(key)
        out.append({"_id": {"id": lsid["id"], "uid": anonymous}, "lastUse": last_use})
    return out


def pipeline_query(pipeline: list[Any]) -> tuple[planner.Query, int]:
    """The leading ``$match`` / ``$sort`` / ``$skip`` / ``$limit`` stages of a pipeline as
    one planner query, and how many stages it covers."""
    q = planner.Query({})
    used = 0
    for stage in pipeline:
        if not isinstance(stage, dict) or len(stage) != 1:
            break
        ((name, spec),) = stage.items()
        if name == "$match" and used == 0 and isinstance(spec, dict):
            if "$where" in spec or "$text" in spec:
                break
            q.filter = spec
        elif (
            name == "$sort"
            and q.sort is None
            and not q.skip
            and not q.limit
            and isinstance(spec, dict)
            and spec
        ):
            if any(
                not isinstance(d, int) or isinstance(d, bool) or d not in (1, -1)
                for d in spec.values()
            ):
                break
            q.sort = spec
        elif name == "$skip" and not q.limit and _count_arg(spec):
            q.skip += int(spec)
        elif name == "$limit" and _count_arg(spec) and spec > 0:
            q.limit = int(spec) if not q.limit else min(q.limit, int(spec))
        else:
            break
        used += 1
    if used and q.limit == 0 and q.skip == 0 and q.sort is None and not q.filter:
        return q, used  # a bare {} $match
    return q, used


def _count_arg(spec: Any) -> bool:
    return (
        isinstance(spec, int | float)
        and not isinstance(spec, bool)
        and spec >= 0
        and float(spec).is_integer()
    )


@command("aggregate")
def cmd_aggregate(ctx: Context, cmd: Doc) -> Doc:
    target = cmd.get("aggregate")
    pipeline = bind_pipeline(opt_list(cmd, "pipeline"), evaluate_let(cmd.get("let")))
    cursor_opts = cmd.get("cursor")
    if not isinstance(cursor_opts, dict) and not cmd.get("explain"):
        raise failed_to_parse(
            "The 'cursor' option is required, except for aggregate with the explain argument"
        )
    if pipeline and isinstance(pipeline[0], dict) and "$changeStream" in pipeline[0]:
        if target != 1:
            coll_name(cmd, "aggregate")
        return changestreams.open_stream(ctx, cmd, target, pipeline)
    output = None
    for position, stage in enumerate(pipeline):
        name = next(iter(stage), None) if isinstance(stage, dict) and len(stage) == 1 else None
        if name in PIPELINE_OUTPUTS:
            if position != len(pipeline) - 1:
                raise EngineError(
                    Code.Location40601, f"{name} can only be the final stage in the pipeline"
                )
            if ctx.in_transaction:
                raise EngineError(
                    Code.OperationNotSupportedInTransaction,
                    f"{name} cannot be used in a transaction",
                )
            if opt_doc(cmd, "readConcern").get("level") == "linearizable":
                raise EngineError(
                    Code.InvalidOptions, f"{name} cannot be used with a 'linearizable' read concern"
                )
            output, pipeline = (name, stage[name]), pipeline[:-1]
    hits = planner.Hits()
    docs: list[Doc] = []
    if target == 1:
        name = None
        ns = f"{ctx.db}.$cmd.aggregate"
        if pipeline and isinstance(pipeline[0], dict) and "$listLocalSessions" in pipeline[0]:
            docs, pipeline = _local_sessions(ctx, pipeline[0]["$listLocalSessions"]), pipeline[1:]
    else:
        name = coll_name(cmd, "aggregate")
        ns = f"{ctx.db}.{name}"
        q, used = pipeline_query(pipeline)
        q.hint = cmd.get("hint")
        hits = run_query(ctx, ns, q).hits
        pipeline = pipeline[used:]
    with ctx.engine.released(ctx.txn):
        docs = docs or [h.doc for h in hits]
        result = Pipeline(reader(ctx), name).run(docs, pipeline, owned=True)
        reply: list[bytes] = [] if output is not None else packed(result)
    if output is not None:
        # An aggregate that writes returns an empty cursor.
        PIPELINE_OUTPUTS[output[0]](ctx, result, output[1])
    batch_size = opt_int(cursor_opts or {}, "batchSize")
    return reply_cursor(ctx, ns, reply, batch_size)
