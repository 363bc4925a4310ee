"""The compliance export: one tenant's audit records, the digests covering them and a
manifest, written so that :mod:`accord.governance.export_verify` can check everything
without the database.

**What is exported.** The tenant's streams, each from its first selected record up to
its head at the *covering digest* (the latest digest, or the latest taken at or before
``until``): a stream's records are exported as one unbroken run, because a hash chain
proves nothing with holes in it. So ``since`` starts each stream at its first record at
or after ``since`` (what came before is outside the export, and so outside its proof);
``until`` chooses the covering digest; ``artifact`` keeps the streams holding records of
that class (a thread's stream holds all its thread-scoped classes and is exported
whole). Records written after the covering digest wait for the next one: take a digest
(``accord audit digest``) right before exporting.

**Files** (in ``out``):

``records-NNNNN.jsonl|csv|parquet``
    the records in (stream, seq) order, :data:`PART_SIZE` per file. JSONL: one line per
    record, its RFC 8785 JSON (:func:`accord.governance.canonical.to_json`, so BSON
    types are tagged: ``{"$oid"}``, ``{"$date"}``...), images included as stored. CSV
    and Parquet: the columns of :data:`COLUMNS` for people and tools, and ``record``,
    the same JSON, which is what the verifier hashes (and each column must agree with).
``digests.json``
    every digest up to the covering one (they link), each with the audit path of the
    tenant's root in the digest's tree; the covering one and each that moved one of the
    tenant's heads with the tenant's stream heads at it: enough to recompute every
    digest's root from the export alone (the others carry ``heads: null``: theirs are
    the last listed ones).
``manifest.json``
    counts, per stream its seq range, ``prev`` of its first record and its last hash,
    every file's SHA-256 and size, the covering digest, the generator and time;
    signed (Ed25519) when a key is given.

**Bounded memory, resumable.** Records stream from one cursor in batches and are
written as they come; memory holds one part's writer and a few numbers per stream.
After each finished part, ``.export-progress.json`` records the parts written (with
their SHA-256) and where the next starts; an interrupted export run again with the same
arguments deletes the unfinished part and goes on from there. Parts end at fixed record
counts and every byte is a function of the records, so a resumed export is byte for
byte the uninterrupted one (only the manifest's ``generated_at`` differs).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import queue
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson

from accord import __version__
from accord.errors import InvalidInputError, MissingExtraError
from accord.governance.audit_cuts import enforced_audit_period, latest_cuts
from accord.governance.audit_records import RECORDS
from accord.governance.canonical import READ_CODEC, canonical_read, to_json
from accord.governance.digests import (
    DIGEST_HEADS,
    DIGESTS,
    Head,
    external,
    tenant_leaf,
    tenant_root_from,
)
from accord.governance.merkle import inclusion_path
from accord.platform.artifacts import AUDIT, AUDIT_DIGEST
from accord.platform.context import AUDITOR, Principal, ReadContext

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = [
    "COLUMNS", "DIGEST_VERSION", "EXPORT_FORMAT", "EXPORT_VERSION", "PART_SIZE", "PROGRESS",
    "REPEATING", "Format", "columns_of", "digest_entries", "export", "pyarrow_modules",
]  # fmt: skip

Format = Literal["jsonl", "csv", "parquet"]
FORMATS: tuple[Format, ...] = ("jsonl", "csv", "parquet")
EXPORT_FORMAT = "accord-audit-export"
#: The manifest's ``v``, and the digests' ``v`` this code writes: a verifier refuses others.
EXPORT_VERSION = 1
DIGEST_VERSION = 1
PART_SIZE = 100_000
#: A Parquet row group ends at this many rows, or (since 2026-12-07) once its records'
#: JSON reaches :data:`ROW_GROUP_BYTES`: the verifier reads a row group's column chunks
#: as they are, and refuses one past its bound (export_verify.ROW_GROUP_BYTES).
ROW_GROUP_ROWS = 5_000
ROW_GROUP_BYTES = 32 << 20
PROGRESS = ".export-progress.json"
#: CSV and Parquet columns (each a field of the record; ``record`` is all of it).
COLUMNS = (
    "id", "stream", "seq", "prev", "hash", "tenant_id", "at", "txn", "outcome",
    "principal", "action", "artifact", "db", "collection", "thread_id", "record",
)  # fmt: skip
#: The Parquet columns written dictionary-encoded: those whose values repeat. A record's
#: id, hashes and text are its own (a dictionary of them only grows until pyarrow falls
#: back to plain), and the verifier reads a dictionary column with more memory.
REPEATING = tuple(c for c in COLUMNS if c not in ("id", "prev", "hash", "record"))


def _reader(tenant: str) -> ReadContext:
    return ReadContext(tenant, principal=Principal.service(AUDITOR), operation="audit.export")


def columns_of(record: Mapping[str, Any], text: str) -> dict[str, Any]:
    """The CSV/Parquet row of ``record`` (as JSON; ``text`` its canonical JSON)."""
    principal = record.get("principal") or {}
    at = record.get("at")
    return {
        "id": (record.get("_id") or {}).get("$oid", ""), "stream": record.get("stream", ""),
        "seq": record.get("seq"), "prev": record.get("prev", ""), "hash": record.get("hash", ""),
        "tenant_id": record.get("tenant_id", ""),
        "at": at.get("$date", "") if isinstance(at, Mapping) else "",
        "txn": record.get("txn", ""), "outcome": record.get("outcome", ""),
        "principal": f"{principal.get('kind', '')}:{principal.get('name', '')}"
                     f" ({principal.get('role', '')})",
        "action": record.get("action", ""), "artifact": record.get("artifact", ""),
        "db": record.get("db", ""), "collection": record.get("collection", ""),
        "thread_id": record.get("thread_id") or "", "record": text,
    }  # fmt: skip


class _Part:
    """One records file being written; SHA-256 and size counted as it is written (parquet:
    read back once closed)."""

    def __init__(self, path: Path, fmt: Format) -> None:
        self.path, self.fmt, self.records = path, fmt, 0
        self._sha = hashlib.sha256()
        self._size = 0
        self._rows: list[dict[str, Any]] = []
        self._held = 0  # the bytes of the unwritten rows' records (parquet)
        self._writer: Any = None
        if fmt == "parquet":
            self._file: Any = None
        else:
            self._file = open(path, "wb")  # noqa: SIM115 (closed in close())
            if fmt == "csv":
                self._emit(_csv_lines([list(COLUMNS)]))

    def _emit(self, data: bytes) -> None:
        self._file.write(data)
        self._sha.update(data)
        self._size += len(data)

    def add(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Write ``records`` (as read, with :data:`~.canonical.READ_CODEC`: BSON types;
        each one's RFC 8785 JSON computed once from the BSON by
        :func:`~accord.governance.canonical.canonical_read`), a batch at a time."""
        self.records += len(records)
        lines = list(map(canonical_read, records))
        if self.fmt == "jsonl":
            lines.append(b"")  # the last line's newline
            self._emit(b"\n".join(lines))
            return
        # orjson reads canonical JSON as json does: its integers are within ±(2^53-1)
        rows = [columns_of(orjson.loads(data), data.decode()) for data in lines]
        if self.fmt == "csv":
            self._emit(_csv_rows(rows))
        else:
            for row, data in zip(rows, lines, strict=True):  # a batch may fill several
                self._rows.append(row)
                self._held += len(data)
                if len(self._rows) >= ROW_GROUP_ROWS or self._held >= ROW_GROUP_BYTES:
                    self._flush_rows()

    def _flush_rows(self) -> None:
        pa, pq = pyarrow_modules()
        if not self._rows:
            return
        columns = {c: [row[c] for row in self._rows] for c in COLUMNS}
        table = pa.Table.from_pydict(columns, schema=_parquet_schema(pa))
        if self._writer is None:
            self._writer = pq.ParquetWriter(str(self.path), table.schema, compression="zstd",
                                            use_dictionary=list(REPEATING))  # fmt: skip
        self._writer.write_table(table)
        self._rows, self._held = [], 0

    def close(self) -> dict[str, Any]:
        if self.fmt == "parquet":
            self._flush_rows()
            if self._writer is not None:
                self._writer.close()
            self._sha, self._size = _file_sha(self.path)
        else:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        return {"name": self.path.name, "sha256": self._sha.hexdigest(), "bytes": self._size,
                "records": self.records}  # fmt: skip

    def abandon(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._writer is not None:
            self._writer.close()


def _csv_lines(rows: list[list[Any]]) -> bytes:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue().encode()


def _csv_rows(rows: list[dict[str, Any]]) -> bytes:
    """``rows`` as CSV lines, the bytes ``csv.writer`` writes, faster: the short columns of
    the batch by one ``writerows``, the last one, ``record`` (canonical JSON: it has quotes
    and never a raw newline), quoted here as ``csv`` quotes such a field (doubled quotes
    inside quotes). A batch where that does not hold is written by ``csv`` alone."""
    records = [row["record"] for row in rows]
    if all('"' in t and "\n" not in t and "\r" not in t for t in records):
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows(
            [[row[c] for c in COLUMNS[:-1]] for row in rows]
        )
        heads = buffer.getvalue().split("\n")
        if len(heads) == len(rows) + 1:  # one line per row: no newline inside a field
            return "".join(
                f'{head},"{text.replace(chr(34), chr(34) * 2)}"\n'
                for head, text in zip(heads, records, strict=False)
            ).encode()
    return _csv_lines([[row[c] for c in COLUMNS] for row in rows])


def _file_sha(path: Path) -> tuple[Any, int]:
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            size += len(chunk)
    return sha, size


def pyarrow_modules() -> tuple[Any, Any]:
    """``pyarrow`` and ``pyarrow.parquet``, or a ``MissingExtraError`` naming the extra."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtraError(
            "the parquet format needs pyarrow: pip install 'accord[export]'"
        ) from None
    return pa, pq


def _parquet_schema(pa: Any) -> Any:
    return pa.schema([(c, pa.int64() if c == "seq" else pa.string()) for c in COLUMNS])


@dataclass
class _Stream:
    first_seq: int
    first_prev: str
    last_seq: int
    last_hash: str
    count: int

    def as_dict(self) -> dict[str, Any]:
        return {"first_seq": self.first_seq, "first_prev": self.first_prev,
                "last_seq": self.last_seq, "last_hash": self.last_hash, "count": self.count}  # fmt: skip


_STREAM_FIELDS = {"first_seq", "first_prev", "last_seq", "last_hash", "count"}


def _covering(uow: Any, db: str, until: datetime | None) -> dict[str, Any]:
    context = _reader("*")
    where: dict[str, Any] = {}
    if until is not None:
        where["at"] = {"$lte": _iso(until)}
    found = list(uow.find(context, AUDIT_DIGEST.name, db, DIGESTS, where,
                          sort=[("_id", -1)], limit=1))  # fmt: skip
    if not found:
        when = f" taken at or before {_iso(until)}" if until is not None else ""
        raise InvalidInputError(
            f"no audit digest{when} in {db}: an export is proved by a digest; run "
            f"`accord audit digest` first"
        )
    return found[0]


def _iso(when: datetime) -> str:
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Heads:
    """Every stream's head, digest after digest, and the top tree's leaf of each tenant
    kept up to date (:mod:`~accord.governance.digests`' two levels): a tenant's root is
    recomputed when one of its heads moves, the tenant's audit path when a tenant's leaf
    changed, so a digest that moved nothing costs nothing and one that moved another
    tenant costs a path over the tenants, not a tree over every stream."""

    def __init__(self) -> None:
        self.streams: dict[str, dict[str, Head]] = {}  # tenant -> stream -> head
        self._leaves: dict[str, bytes] = {}  # tenant -> its leaf in the top tree
        self._moved: set[str] = set()  # tenants whose leaf is stale
        self._paths: dict[str, tuple[int, int, list[str]]] = {}  # tenant -> its path

    def move(self, stream: str, head: Head) -> None:
        self.streams.setdefault(head.tenant, {})[stream] = head
        self._moved.add(head.tenant)

    def listed(self, tenant: str) -> list[list[Any]]:
        """``tenant``'s heads as an export lists them: [stream, seq, hash], by stream."""
        heads = self.streams.get(tenant, {})
        return [[s, heads[s].seq, heads[s].hash] for s in sorted(heads)]

    def tenant_path(self, tenant: str) -> tuple[int, int, list[str]] | None:
        """(index, size, path) of ``tenant``'s leaf in the top tree, as
        :meth:`~accord.governance.digests.HeadTree.tenant_path`; None when it has no
        stream yet."""
        for moved in self._moved:
            heads = self.listed(moved)
            root = tenant_root_from([(s, seq, h) for s, seq, h in heads])
            self._leaves[moved] = tenant_leaf(moved, root, len(heads))
        if self._moved:
            self._moved.clear()
            self._paths.clear()
        if tenant not in self._leaves:
            return None
        if tenant not in self._paths:
            tenants = sorted(self._leaves)
            index = tenants.index(tenant)
            path = inclusion_path(index, [self._leaves[t] for t in tenants])
            self._paths[tenant] = (index, len(tenants), [p.hex() for p in path])
        return self._paths[tenant]

    @property
    def tenants(self) -> int:
        return len(self.streams)


def digest_entries(uow: Any, db: str, tenant: str, upto: int) -> list[dict[str, Any]]:
    """Every digest 1..``upto``, each with ``tenant``'s audit path in its tree, and with
    the tenant's heads at it when it moved one of them (or is the last): a digest that
    left them alone lists none (``heads: null``; they are the last listed ones, which
    its path proves: a tree over every stream per digest would cost the export O(digests
    x streams) hashes)."""
    stored = {
        int(d["seq"]): d
        for d in uow.find(
            _reader("*"), AUDIT_DIGEST.name, db, DIGESTS, {"_id": {"$lte": upto}}, sort=[("_id", 1)]
        )  # fmt: skip
    }
    state = _Heads()
    entries: list[dict[str, Any]] = []
    changes = uow.iterate(
        _reader("*"), AUDIT_DIGEST.name, db, DIGEST_HEADS, {"digest": {"$lte": upto}},
        sort=[("digest", 1), ("stream", 1)], batch_size=1000,
    )  # fmt: skip
    pending = next(changes, None)
    for n in range(1, upto + 1):
        moved = False  # whether this digest moved one of the tenant's heads
        while pending is not None and int(pending["digest"]) == n:
            state.move(pending["stream"], Head(pending["tenant_id"], int(pending["seq"]),
                                               pending["hash"]))  # fmt: skip
            moved = moved or pending["tenant_id"] == tenant
            pending = next(changes, None)
        if n not in stored:
            continue  # a gap: the verifier names it (the digests must link)
        entry: dict[str, Any] = {"digest": external(stored[n]), "tenant": tenant}
        listing = moved or n == upto
        where = state.tenant_path(tenant)
        if where is not None:
            index, size, path = where
            entry.update(tenant_index=index, tenants=size, tenant_path=path,
                         heads=state.listed(tenant) if listing else None)  # fmt: skip
        elif listing:  # the tenant has no stream yet
            entry.update(tenant_index=None, tenants=state.tenants, tenant_path=[], heads=[])
        else:
            entry.update(tenant_index=None, tenants=None, tenant_path=None, heads=None)
        entries.append(entry)
    return entries


def _selected_streams(
    uow: Any, db: str, tenant: str, heads: Mapping[str, Head], since: datetime | None,
    artifact: str | None,
) -> dict[str, int]:  # fmt: skip
    """Stream -> first seq to export."""
    context = _reader(tenant)
    if since is None:
        firsts = dict.fromkeys(heads, 1)
    else:
        rows = uow.aggregate(context, AUDIT.name, db, RECORDS, [
            {"$match": {"tenant_id": tenant, "at": {"$gte": since}}},
            {"$group": {"_id": "$stream", "first": {"$min": "$seq"}}},
        ])  # fmt: skip
        firsts = {r["_id"]: int(r["first"]) for r in rows if r["_id"] in heads}
    if artifact is not None:
        rows = uow.aggregate(context, AUDIT.name, db, RECORDS, [
            {"$match": {"tenant_id": tenant, "artifact": artifact}},
            {"$group": {"_id": "$stream"}},
        ])  # fmt: skip
        keep = {r["_id"] for r in rows}
        firsts = {s: f for s, f in firsts.items() if s in keep}
    return {s: f for s, f in sorted(firsts.items()) if f <= heads[s].seq}


def export(
    uow: Any,
    db: str,
    out: Path,
    *,
    tenant: str,
    since: datetime | None = None,
    until: datetime | None = None,
    artifact: str | None = None,
    fmt: Format = "jsonl",
    key: Ed25519PrivateKey | None = None,
    part_size: int = PART_SIZE,
    progress: Callable[[int, int], None] | None = None,
    audit_period: timedelta | None = None,
) -> dict[str, Any]:
    """Export ``tenant``'s audit trail to ``out`` (module docstring), resuming an
    interrupted export of the same arguments; returns the manifest. ``progress(done,
    total)`` is called after each batch. The manifest records ``audit_period`` (default
    the audit class's period of the policy ``uow`` enforces), which the verifier holds
    the audit cuts to."""
    if fmt not in FORMATS:
        raise InvalidInputError(f"export format {fmt!r} is not one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        pyarrow_modules()
    covering = _covering(uow, db, until)
    upto = int(covering["seq"])
    digests = digest_entries(uow, db, tenant, upto)
    heads = {s: Head(tenant, seq, h) for s, seq, h in digests[-1]["heads"]} if digests else {}
    firsts = _selected_streams(uow, db, tenant, heads, since, artifact)
    # a cut stream starts after its cut (audit_cuts.py); the manifest carries the cut
    cuts = {s: c for s, c in latest_cuts(uow, db, tenant=tenant, context=_reader(tenant)).items()
            if s in firsts}  # fmt: skip
    firsts = {s: max(f, int(cuts[s]["seq"]) + 1) if s in cuts else f for s, f in firsts.items()}
    firsts = {s: f for s, f in firsts.items() if f <= heads[s].seq}
    if not firsts:
        raise InvalidInputError(
            f"tenant {tenant!r} has no audit records to export up to digest {upto}"
            f"{' with these filters' if since or artifact else ''}"
        )
    total = sum(heads[s].seq - f + 1 for s, f in firsts.items())
    params = {
        "db": db, "tenant": tenant, "since": _iso(since) if since else None,
        "until": _iso(until) if until else None, "class": artifact, "records_format": fmt,
        "digest": {"seq": upto, "hash": covering["hash"]}, "part_size": part_size,
    }  # fmt: skip
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file there, no permission, a read-only place
        raise InvalidInputError(f"cannot write the export into {out}: {exc.strerror}") from None
    finished = _finished(out, params)
    if finished is not None:  # run again after it ended (killed before it said so)
        return finished
    state = _resume(out, params)
    streams = {s: _Stream(**v) for s, v in state["streams"].items()}
    done = sum(p["records"] for p in state["parts"])
    after: tuple[str, int] | None = tuple(state["after"]) if state["after"] else None  # type: ignore[assignment]
    part: _Part | None = None
    bounds = {s: (f, heads[s].seq) for s, f in firsts.items()}  # stream -> seqs to export
    records = _records(uow, db, tenant, after, batch=1000)
    try:
        for batch in records:
            kept = [r for r in batch if _within(r, bounds)]
            while kept:
                if part is None:
                    part = _Part(out / f"records-{len(state['parts']):05d}.{fmt}", fmt)
                chunk, kept = kept[: part_size - part.records], kept[part_size - part.records :]
                part.add(chunk)
                _track(streams, chunk)
                done += len(chunk)
                if part.records >= part_size:
                    state["parts"].append(part.close())
                    part = None
                    state["after"] = [chunk[-1]["stream"], int(chunk[-1]["seq"])]
                    state["streams"] = {s: v.as_dict() for s, v in streams.items()}
                    _save(out, state)
            if progress is not None:
                progress(done, total)
        if part is not None:
            state["parts"].append(part.close())
            part = None
    finally:
        records.close()  # stops the reader thread now, not when the generator is collected
        if part is not None:
            part.abandon()
    if progress is not None:
        progress(done, total)
    period = audit_period if audit_period is not None else enforced_audit_period(uow, db)
    manifest = _finish(out, params, state["parts"], streams, digests, key,
                       cuts={s: to_json(c) for s, c in cuts.items()
                             if s in streams and streams[s].first_seq == int(c["seq"]) + 1},
                       audit_period=period)  # fmt: skip
    (out / PROGRESS).unlink(missing_ok=True)
    return manifest


def _within(record: Mapping[str, Any], bounds: Mapping[str, tuple[int, int]]) -> bool:
    """Whether ``record`` is in its stream's exported range."""
    bound = bounds.get(record["stream"])
    return bound is not None and bound[0] <= int(record["seq"]) <= bound[1]


def _track(streams: dict[str, _Stream], records: Sequence[Mapping[str, Any]]) -> None:
    """Count ``records`` (in (stream, seq) order) in their streams' ranges."""
    for stream, group in groupby(records, key=_STREAM):
        run = list(group)
        first, last = run[0], run[-1]
        known = streams.get(stream)
        if known is None:
            streams[stream] = _Stream(int(first["seq"]), first["prev"], int(last["seq"]),
                                      last["hash"], len(run))  # fmt: skip
        else:
            known.last_seq, known.last_hash = int(last["seq"]), last["hash"]
            known.count += len(run)


_STREAM = itemgetter("stream")


def _records(
    uow: Any, db: str, tenant: str, after: tuple[str, int] | None, *, batch: int
) -> Generator[list[Any], None, None]:
    """The tenant's records in (stream, seq) order, after ``after`` (a resume), read one
    batch ahead by a thread of their own: the database prepares the next batch while
    this one is encoded (the cursor waits without the GIL), and each batch is decoded at
    once (``iterate_batches``), doubles marked (:data:`~.canonical.READ_CODEC`). At most
    three batches are held."""
    where: dict[str, Any] = {"tenant_id": tenant}
    if after is not None:
        stream, seq = after
        where["$or"] = [{"stream": stream, "seq": {"$gt": seq}}, {"stream": {"$gt": stream}}]
    cursor = uow.iterate_batches(
        _reader(tenant), AUDIT.name, db, RECORDS, where,
        sort=[("tenant_id", 1), ("stream", 1), ("seq", 1)], batch_size=batch,
        codec_options=READ_CODEC,
    )  # fmt: skip
    ahead: queue.Queue[Any] = queue.Queue(maxsize=2)
    stop = threading.Event()
    end = object()

    def read() -> None:
        try:
            for chunk in cursor:
                if not _put(ahead, chunk, stop):
                    return
            _put(ahead, end, stop)
        except BaseException as exc:  # handed to the consumer, which raises it
            _put(ahead, exc, stop)
        finally:
            cursor.close()

    reader = threading.Thread(target=read, name="audit-export-reader", daemon=True)
    reader.start()
    try:
        while True:
            item = ahead.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        reader.join(timeout=30)


def _put(ahead: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    """Put ``item``, unless the consumer stopped; whether it was put."""
    while not stop.is_set():
        try:
            ahead.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _finished(out: Path, params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The manifest of a finished export of these arguments in ``out`` whose files are
    intact (a process killed after finishing it, before it exited), or None."""
    path = out / "manifest.json"
    if (out / PROGRESS).exists() or not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
    except ValueError:
        return None
    if not isinstance(manifest, dict) or any(manifest.get(k) != v for k, v in params.items()):
        return None
    entries = [*manifest.get("files", []), manifest.get("digests_file") or {}]
    for entry in entries:
        name = entry.get("name")
        if not name or not (out / name).exists():
            return None
        sha, _ = _file_sha(out / name)
        if sha.hexdigest() != entry.get("sha256"):
            return None
    return manifest


def _resume(out: Path, params: Mapping[str, Any]) -> dict[str, Any]:
    """The progress of an earlier run of this export in ``out`` (parts it finished are
    checked and kept, anything after them deleted), or a fresh start."""
    fresh: dict[str, Any] = {"params": dict(params), "parts": [], "after": None, "streams": {}}
    marker = out / PROGRESS
    if not marker.exists():
        leftovers = [p.name for p in out.iterdir() if p.name != PROGRESS]
        if leftovers:
            raise InvalidInputError(
                f"{out} is not empty ({', '.join(sorted(leftovers)[:3])}...) and holds no "
                f"unfinished export: export into a new directory"
            )
        return fresh
    state = _progress(marker)
    if state.get("params") != dict(params):
        raise InvalidInputError(
            f"{out} holds an unfinished export with other arguments ({state.get('params')}); "
            f"run it again with those, or export into a new directory"
        )
    kept = {p["name"] for p in state["parts"]}
    for p in state["parts"]:
        try:
            sha, _ = _file_sha(out / p["name"])
        except OSError as exc:  # a finished part removed (or unreadable) since
            raise InvalidInputError(f"{out / p['name']}, a finished part of the unfinished "
                                    f"export, cannot be read ({exc.strerror}); export into a "
                                    f"new directory") from None  # fmt: skip
        if sha.hexdigest() != p["sha256"]:
            raise InvalidInputError(f"{out / p['name']} changed since it was written; "
                                    f"export into a new directory")  # fmt: skip
    for leftover in out.iterdir():
        if leftover.name != PROGRESS and leftover.name not in kept:
            leftover.unlink()  # the part being written when the export stopped
    return state


def _progress(marker: Path) -> dict[str, Any]:
    """The progress file's state, or an error saying it cannot be resumed: a torn or
    hand-edited file is not guessed at (its parts could not be trusted)."""
    try:
        state = json.loads(marker.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise InvalidInputError(
            f"{marker} cannot be read ({exc}): the unfinished export in {marker.parent} "
            f"cannot be resumed; export into a new directory"
        ) from None
    parts = state.get("parts") if isinstance(state, dict) else None
    if (
        not isinstance(parts, list)
        or not all(isinstance(p, dict) and isinstance(p.get("name"), str)
                   and isinstance(p.get("sha256"), str) and isinstance(p.get("records"), int)
                   for p in parts)
        or not isinstance(state.get("streams"), dict)
        or not all(isinstance(v, dict) and set(v) == _STREAM_FIELDS
                   for v in state["streams"].values())
        or not (state.get("after") is None or isinstance(state.get("after"), list))
    ):  # fmt: skip
        raise InvalidInputError(
            f"{marker} is not an export's progress: the unfinished export in "
            f"{marker.parent} cannot be resumed; export into a new directory"
        )
    return state


def _save(out: Path, state: Mapping[str, Any]) -> None:
    tmp = out / (PROGRESS + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, out / PROGRESS)


def _finish(
    out: Path, params: Mapping[str, Any], parts: list[dict[str, Any]],
    streams: Mapping[str, _Stream], digests: list[dict[str, Any]],
    key: Ed25519PrivateKey | None,
    cuts: Mapping[str, Any] | None = None,
    audit_period: timedelta | None = None,
) -> dict[str, Any]:  # fmt: skip
    digest_bytes = json.dumps(digests, indent=1, sort_keys=True).encode() + b"\n"
    (out / "digests.json").write_bytes(digest_bytes)
    manifest: dict[str, Any] = {
        "format": EXPORT_FORMAT, "v": EXPORT_VERSION, "generator": f"accord {__version__}",
        "generated_at": _iso(datetime.now(UTC)), **params,
        "records": sum(p["records"] for p in parts), "files": parts,
        "digests_file": {"name": "digests.json",
                         "sha256": hashlib.sha256(digest_bytes).hexdigest()},
        "streams": {s: v.as_dict() for s, v in sorted(streams.items())},
    }  # fmt: skip
    if cuts:  # where the cut streams start (audit_cuts.py); absent without cuts
        manifest["cuts"] = dict(sorted(cuts.items()))
    if audit_period is not None:  # what the verifier holds the cuts to (since 2026-12-07)
        manifest["audit_period_s"] = max(1, int(audit_period.total_seconds()))
    if key is not None:
        from accord.governance.signing import sign

        manifest["signature"] = sign(key, manifest)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest
