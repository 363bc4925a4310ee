"""Change streams: ``aggregate`` with a first ``$changeStream`` stage, and its ``getMore``.

A change log (one per engine, a commit observer) records every committed change as a
change event, in commit order, from the moment the first change stream opens (until then
no commit pays for it). A stream is a cursor over that log: at ``getMore`` it returns the
events after its position that fall in its scope (a collection, a database or the whole
deployment) and pass its pipeline, waiting up to ``maxAwaitTimeMS`` (default 1 s) for one
with the engine lock released. Resume tokens are ``{_data: hex}`` of the event's commit
timestamp and position in its commit, so ``resumeAfter``/``startAfter`` and
``startAtOperationTime`` work while the event is still in the log (the last
``LOG_EVENTS`` events, and at most ``LOG_BYTES`` of their documents, as mongod's oplog is
bounded by size); older ones answer ChangeStreamHistoryLost (286), as mongod does when the
oplog has rolled over, and so does the ``getMore`` of a stream that fell that far behind.

Events: ``insert`` (with ``fullDocument``), ``update`` (with ``updateDescription`` of the
top-level fields that changed; a replacement is reported as an update too),
``delete``, ``drop`` and ``rename`` (then ``invalidate`` for a stream on that collection).
``fullDocument: "updateLookup"`` adds the document as it is when the event is returned;
``"whenAvailable"``/``"required"`` and ``fullDocumentBeforeChange`` use the versions the
commit wrote, recorded only for collections that had ``changeStreamPreAndPostImages:
{enabled: true}`` at the time.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.timestamp import Timestamp

from accord.platform.embedded.aggregate import Pipeline
from accord.platform.embedded.commands.base import Context, Doc, opt_int
from accord.platform.embedded.engine import Engine, timestamp_to_ts, ts_to_timestamp
from accord.platform.embedded.errors import Code, EngineError

# How many events the log keeps for resuming.
LOG_EVENTS = 10_000
# How many bytes of documents (BSON size) the log keeps at most.
LOG_BYTES = 64 << 20
DEFAULT_AWAIT_MS = 1000
# Stages a change stream's pipeline may have after $changeStream (as mongod allows).
ALLOWED_STAGES = {
    "$match", "$project", "$addFields", "$set", "$unset", "$replaceRoot", "$replaceWith",
}  # fmt: skip
_FULL_DOCUMENT = ("default", "updateLookup", "whenAvailable", "required")
_BEFORE_CHANGE = ("off", "whenAvailable", "required")
_LAST = 0xFFFFFFFF  # a position after every event of a commit


def token(ts: int, seq: int) -> Doc:
    return {"_data": f"{ts:016x}{seq:08x}"}


def _position(resume: Any, what: str) -> tuple[int, int]:
    data = resume.get("_data") if isinstance(resume, dict) else None
    if not isinstance(data, str) or len(data) != 24:
        raise EngineError(Code.BadValue, f"{what} must be a resume token from this engine")
    try:
        return int(data[:16], 16), int(data[16:], 16)
    except ValueError:
        raise EngineError(Code.BadValue, f"{what} is not a valid resume token") from None


@dataclass
class _Event:
    ts: int
    seq: int
    ns: str
    doc: Doc  # the event, without fullDocument lookups
    key: bytes | None = None  # the document's id key (insert/update/delete)
    post: Doc | None = None  # the version the commit wrote (post-image)
    pre: Doc | None = None  # the version it replaced (pre-image)
    size: int = 0  # BSON bytes of the documents this event holds


class ChangeLog:
    """The engine's change events, fed by its commits (a commit observer)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.events: deque[_Event] = deque()
        self.bytes = 0
        # Commits before this timestamp were not recorded.
        self.since = engine.visible
        # Events up to this position were dropped to keep the log bounded.
        self.lost_upto: tuple[int, int] = (0, 0)
        self._lock = threading.Lock()

    # -- commit observer --------------------------------------------------------------------

    def observes(self, ns: str) -> bool:
        return not ns.split(".", 1)[-1].startswith("system.")

    def on_commit(self, ts: int, changes: list[tuple[str, bytes, Doc | None, Doc | None]]) -> None:
        wall = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        images: dict[str, bool] = {}
        for seq, (ns, key, old, new) in enumerate(changes):
            if old is None and new is None:
                continue
            if ns not in images:
                images[ns] = _images_enabled(self.engine, ns)
            base: Doc = {
                "_id": token(ts, seq), "operationType": "", "clusterTime": ts_to_timestamp(ts),
                "wallTime": wall, "ns": _ns_doc(ns),
            }  # fmt: skip
            if old is None:
                assert new is not None
                base["operationType"] = "insert"
                base["fullDocument"] = new
                base["documentKey"] = {"_id": new.get("_id")}
            elif new is None:
                base["operationType"] = "delete"
                base["documentKey"] = {"_id": old.get("_id")}
            else:
                base["operationType"] = "update"
                base["documentKey"] = {"_id": new.get("_id")}
                base["updateDescription"] = _diff(old, new)
            post, pre = (new, old) if images[ns] else (None, None)
            # What the event keeps alive: the inserted document, the changed fields, images.
            if old is None or post is not None:
                size = _size(new) + _size(pre)
            else:
                size = _size(base.get("updateDescription", {}).get("updatedFields"))
            self._append(_Event(ts, seq, ns, base, key, post, pre, size))

    def on_drop(self, ns: str) -> None:
        ts = self.engine.visible
        base = {"operationType": "drop", "clusterTime": ts_to_timestamp(ts), "ns": _ns_doc(ns)}
        self._append_system(ts, ns, base)

    def on_rename(self, old: str, new: str) -> None:
        ts = self.engine.visible
        base = {
            "operationType": "rename", "clusterTime": ts_to_timestamp(ts), "ns": _ns_doc(old),
            "to": _ns_doc(new),
        }  # fmt: skip
        self._append_system(ts, old, base)

    def _append_system(self, ts: int, ns: str, base: Doc) -> None:
        with self._lock:
            last = self.events[-1] if self.events else None
            seq = last.seq + 1 if last is not None and last.ts == ts else 0
        wall = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        base = {"_id": token(ts, seq), **base, "wallTime": wall}
        self._append(_Event(ts, seq, ns, base))

    def _append(self, event: _Event) -> None:
        with self._lock:
            self.events.append(event)
            self.bytes += event.size
            while len(self.events) > 1 and (
                len(self.events) > LOG_EVENTS or self.bytes > LOG_BYTES
            ):
                dropped = self.events.popleft()
                self.bytes -= dropped.size
                self.lost_upto = max(self.lost_upto, (dropped.ts, dropped.seq))

    def history_lost(self, position: tuple[int, int]) -> bool:
        """Whether events after ``position`` were never recorded or already dropped."""
        return position[0] < self.since or position < self.lost_upto

    def after(self, position: tuple[int, int]) -> list[_Event]:
        with self._lock:
            return [e for e in self.events if (e.ts, e.seq) > position]


_LOGS: weakref.WeakKeyDictionary[Engine, ChangeLog] = weakref.WeakKeyDictionary()


def change_log(engine: Engine) -> ChangeLog:
    """The engine's change log, started (and observing commits) on first use."""
    log = _LOGS.get(engine)
    if log is None:
        log = _LOGS[engine] = ChangeLog(engine)
        engine.commit_observers.append(log)
    return log


def _ns_doc(ns: str) -> Doc:
    db, _, coll = ns.partition(".")
    return {"db": db, "coll": coll}


def _diff(old: Doc, new: Doc) -> Doc:
    updated = {k: v for k, v in new.items() if k not in old or not _same(old[k], v)}
    removed = [k for k in old if k not in new]
    return {"updatedFields": updated, "removedFields": removed, "truncatedArrays": []}


def _size(doc: Doc | None) -> int:
    return 0 if doc is None else len(bson.encode(doc))


def _same(a: Any, b: Any) -> bool:
    return bson.encode({"": a}) == bson.encode({"": b})


@dataclass
class Stream:
    """One change stream cursor."""

    id: int
    ns: str  # the cursor's namespace (db.coll, or db.$cmd.aggregate)
    scope: tuple[str | None, str | None]  # (db, collection); None: every one
    position: tuple[int, int]
    pipeline: list[Any]
    full_document: str
    before_change: str
    session: bytes | None
    last_used: float = field(default_factory=time.monotonic)
    invalidated: bool = False
    # Who opened it when privileges are checked (CursorManager.claim).
    owner: Any = None

    def in_scope(self, ns: str) -> bool:
        db, coll = self.scope
        ev_db, _, ev_coll = ns.partition(".")
        return (db is None or db == ev_db) and (coll is None or coll == ev_coll)


def open_stream(ctx: Context, cmd: Doc, target: Any, pipeline: list[Any]) -> Doc:
    """Open a change stream for ``aggregate`` (``pipeline[0]`` is ``$changeStream``)."""
    spec = pipeline[0]["$changeStream"]
    if not isinstance(spec, dict):
        raise EngineError(Code.FailedToParse, "$changeStream needs an object")
    if ctx.in_transaction:
        raise EngineError(
            Code.OperationNotSupportedInTransaction, "$changeStream cannot be used in a transaction"
        )
    unknown = set(spec) - {
        "allChangesForCluster", "fullDocument", "fullDocumentBeforeChange", "resumeAfter",
        "startAfter", "startAtOperationTime", "showExpandedEvents",
    }  # fmt: skip
    if unknown:
        raise EngineError(
            Code.IDLUnknownField, f"unknown $changeStream field: {sorted(unknown)[0]}"
        )
    rest = pipeline[1:]
    for stage in rest:
        name = next(iter(stage), None) if isinstance(stage, dict) and len(stage) == 1 else None
        if name not in ALLOWED_STAGES:
            raise EngineError(
                Code.Location40324,
                f"{name!r} is not allowed in a change stream pipeline (allowed: "
                f"{', '.join(sorted(ALLOWED_STAGES))})",
            )
    if target == 1:
        if spec.get("allChangesForCluster"):
            if ctx.db != "admin":
                raise EngineError(
                    Code.InvalidOptions, "allChangesForCluster is only valid on the admin database"
                )
            scope: tuple[str | None, str | None] = (None, None)
        else:
            if ctx.db == "admin":
                raise EngineError(
                    Code.InvalidNamespace,
                    "a database change stream on admin needs allChangesForCluster: true",
                )
            scope = (ctx.db, None)
        ns = f"{ctx.db}.$cmd.aggregate"
    else:
        name = cmd["aggregate"]
        scope, ns = (ctx.db, name), f"{ctx.db}.{name}"
    full_document = spec.get("fullDocument", "default")
    before = spec.get("fullDocumentBeforeChange", "off")
    if full_document not in _FULL_DOCUMENT:
        raise EngineError(Code.BadValue, f"invalid fullDocument: {full_document!r}")
    if before not in _BEFORE_CHANGE:
        raise EngineError(Code.BadValue, f"invalid fullDocumentBeforeChange: {before!r}")
    log = change_log(ctx.engine)
    starts = [k for k in ("resumeAfter", "startAfter", "startAtOperationTime") if k in spec]
    if len(starts) > 1:
        raise EngineError(Code.BadValue, f"only one of {', '.join(starts)} may be given")
    if "startAtOperationTime" in spec:
        at = spec["startAtOperationTime"]
        if not isinstance(at, Timestamp):
            raise EngineError(Code.TypeMismatch, "startAtOperationTime must be a timestamp")
        position = (timestamp_to_ts(at) - 1, _LAST)
    elif starts:
        position = _position(spec[starts[0]], starts[0])
    else:
        position = (ctx.engine.visible, _LAST)
    if log.history_lost(position):
        raise _history_lost("Resume of change stream was not possible")
    stream = Stream(
        id=ctx.cursors.new_id(), ns=ns, scope=scope, position=position, pipeline=rest,
        full_document=full_document, before_change=before, session=ctx.session_key,
    )  # fmt: skip
    batch_size = opt_int(cmd.get("cursor") or {}, "batchSize")
    batch = _take(ctx, stream, batch_size)
    ctx.cursors.streams[stream.id] = stream
    return {
        "cursor": {
            "firstBatch": batch, "postBatchResumeToken": token(*stream.position),
            "id": bson.Int64(stream.id), "ns": ns,
        },
        "ok": 1.0,
    }  # fmt: skip


def get_more(ctx: Context, stream: Stream, cmd: Doc, ns: str) -> Doc:
    """The next events of ``stream``, waiting up to ``maxTimeMS`` (the await time) for one."""
    if stream.ns != ns:
        raise EngineError(
            Code.Unauthorized,
            f"Requested getMore on namespace '{ns}', but cursor belongs to '{stream.ns}'",
        )
    stream.last_used = time.monotonic()
    batch_size = opt_int(cmd, "batchSize")
    wait_ms = opt_int(cmd, "maxTimeMS", DEFAULT_AWAIT_MS) or DEFAULT_AWAIT_MS
    deadline = time.monotonic() + wait_ms / 1000.0
    batch = _take(ctx, stream, batch_size)
    while not batch and not stream.invalidated:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ctx.engine.wait_changed(min(left, 0.25))  # releases the engine lock meanwhile
        batch = _take(ctx, stream, batch_size)
    cursor_id = 0 if stream.invalidated else stream.id
    if stream.invalidated:
        ctx.cursors.streams.pop(stream.id, None)
    return {
        "cursor": {
            "nextBatch": batch, "postBatchResumeToken": token(*stream.position),
            "id": bson.Int64(cursor_id), "ns": ns,
        },
        "ok": 1.0,
    }  # fmt: skip


def _history_lost(what: str) -> EngineError:
    return EngineError(
        Code.ChangeStreamHistoryLost,
        f"{what}, as the resume point may no longer be in the change log (it keeps the "
        f"events since the first change stream opened, at most {LOG_EVENTS} events and "
        f"{LOG_BYTES:,} bytes of their documents): open a new stream",
    )


def _take(ctx: Context, stream: Stream, batch_size: int | None) -> list[Doc]:
    log = change_log(ctx.engine)
    if log.history_lost(stream.position):
        ctx.cursors.streams.pop(stream.id, None)
        raise _history_lost("The change stream fell behind the change log")
    out: list[Doc] = []
    limit = batch_size if batch_size else None
    for event in log.after(stream.position):
        if limit is not None and len(out) >= limit:
            break
        stream.position = (event.ts, event.seq)
        if not stream.in_scope(event.ns):
            continue
        doc = _render(ctx, stream, event)
        if doc is None:
            continue
        kind = doc["operationType"]
        matched = Pipeline(lambda name: [], None).run([doc], stream.pipeline, owned=True)
        out.extend(matched)
        if kind in ("drop", "rename") and stream.scope[1] is not None:
            out.append({"_id": token(event.ts, event.seq + 1), "operationType": "invalidate",
                        "clusterTime": ts_to_timestamp(event.ts)})  # fmt: skip
            stream.invalidated = True
            break
    if not out and not stream.invalidated:
        # Nothing new: the stream has seen everything committed so far.
        stream.position = max(stream.position, (ctx.engine.visible, _LAST))
    return out


def _images_enabled(engine: Engine, ns: str) -> bool:
    coll = engine.get_collection(ns)
    images = coll.options.get("changeStreamPreAndPostImages") if coll is not None else None
    return isinstance(images, dict) and bool(images.get("enabled"))


def _render(ctx: Context, stream: Stream, event: _Event) -> Doc | None:
    doc = dict(event.doc)
    kind = doc["operationType"]
    if kind == "update":
        mode = stream.full_document
        if mode == "updateLookup" and event.key is not None:
            # The document as it is now (the command's snapshot predates the wait).
            coll = ctx.engine.get_collection(event.ns)
            current = coll.visible(event.key, ctx.engine.visible) if coll is not None else None
            doc["fullDocument"] = current
        elif mode in ("whenAvailable", "required"):
            if event.post is not None:
                doc["fullDocument"] = event.post
            elif mode == "whenAvailable":
                doc["fullDocument"] = None
            else:
                raise EngineError(
                    Code.NoMatchingDocument,
                    f"fullDocument: 'required' but no post-image was recorded for this change "
                    f"({event.ns} did not have changeStreamPreAndPostImages: {{enabled: true}} "
                    "when it was written; set it with create or collMod)",
                )
    if kind in ("update", "delete") and stream.before_change != "off":
        if event.pre is not None:
            doc["fullDocumentBeforeChange"] = event.pre
        elif stream.before_change == "whenAvailable":
            doc["fullDocumentBeforeChange"] = None
        else:
            raise EngineError(
                Code.NoMatchingDocument,
                f"fullDocumentBeforeChange: 'required' but no pre-image was recorded for this "
                f"change ({event.ns} did not have changeStreamPreAndPostImages: "
                "{enabled: true} when it was written; set it with create or collMod)",
            )
    return doc
