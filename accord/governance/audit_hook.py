"""The mutation audit: a kernel hook that appends hash-chained records in the SAME
transaction as every write, and records refused operations.

:class:`AuditHook` takes part in the kernel's phases (docs/platform.md, "Hooks"):

``check``
    refuses any plan that writes the audit collections (records or heads): only this
    hook writes them, from ``seal``, so the trail is append-only for everybody
    (:class:`~accord.errors.PermissionDenied`; the refusal is itself recorded).
``derive``
    gives every insert that has no ``_id`` one (an ``ObjectId``, as the driver would), so
    its record names the document it created.
``seal_reads`` + ``seal``
    inside each transaction attempt: reads the heads of the streams the batch writes
    (one read per database), then returns one record per op of every group (all
    artifact classes by default, business collections included; the audit collections
    themselves excluded) and the advanced heads. A concurrent writer of the same stream
    makes the head update a write conflict: the kernel retries the attempt and the hook
    seals again on fresh heads, so a stream's ``seq`` has neither gaps nor duplicates and
    an aborted transaction leaves neither its write nor its record.
``refused``
    a plan or read refused with ``PermissionDenied`` is recorded (``outcome:
    "refused"``, with the reason), in a transaction of its own: the kernel runs the plan
    this returns (a marker upsert of the stream's head, which this hook's ``seal``
    turns into the records), outside the refused transaction, which never starts.

It also names the collections it writes (:meth:`AuditHook.collections`), which every
component's catalog setup creates: the records collection with its ``$jsonSchema``
validator (:data:`~accord.governance.audit_records.VALIDATOR`) and indexes, and the
heads. Record format, streams and hashing: :mod:`accord.governance.audit_records`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bson import ObjectId

from accord.errors import ConfigurationError, PermissionDenied
from accord.governance.audit_records import (
    GENESIS,
    HEAD_INDEXES,
    HEADS,
    RECORD_INDEXES,
    RECORDS,
    VALIDATOR,
    Mode,
    chain_hash,
    op_body,
    read_body,
    record_id,
    stream_of,
)
from accord.governance.canonical import ms
from accord.platform.artifacts import AUDIT, CLASSES
from accord.platform.context import WriteContext
from accord.platform.hooks import HookCollection, Refusal, SealBatch, SealRead
from accord.platform.plan import COMMAND_KINDS, Group, Op, Plan

__all__ = ["REFUSED_ACTION", "AuditHook"]

#: The operation of the plans that record a refusal.
REFUSED_ACTION = "audit.refused"
MODES = ("metadata", "full")


@dataclass(frozen=True)
class _Refused:
    """What a refusal's marker group carries to ``seal``: the refused plan or read."""

    refusal: Refusal
    db: str


@dataclass
class _Pending:
    """Records of one database for one attempt, before their chain fields."""

    bodies: list[dict[str, Any]] = field(default_factory=list)


class AuditHook:
    """The audit hook (module docstring).

    Args:
        mode: ``metadata`` (default): records carry hashes of the op's filter, change and
            after image; ``full``: they keep those images too (as canonical JSON text,
            outside the hashed body, so erasing one later keeps the chain verifiable).
        records, heads: the collection names, in the database of each write.
        classes: the artifact classes audited (default every class).
    """

    name = "audit"

    def __init__(
        self,
        mode: Mode = "metadata",
        *,
        records: str = RECORDS,
        heads: str = HEADS,
        classes: Sequence[str] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ConfigurationError(f"audit mode must be one of {MODES}, got {mode!r}")
        unknown = sorted(set(classes or ()) - set(CLASSES))
        if unknown:
            raise ConfigurationError(
                f"audit classes {unknown} are not artifact classes; one of {sorted(CLASSES)}"
            )
        if records == heads:
            raise ConfigurationError("the audit records and heads need two collections")
        self.mode: Mode = mode
        self.records = records
        self.heads = heads
        self.classes = frozenset(classes) if classes is not None else None

    # --- what it owns -------------------------------------------------------------

    def collections(self, db: str) -> Mapping[str, HookCollection]:
        """The collections this hook writes in ``db``, for the catalog's setup."""
        return {
            self.records: HookCollection(AUDIT.name, VALIDATOR, RECORD_INDEXES),
            self.heads: HookCollection(AUDIT.name, None, HEAD_INDEXES),
        }

    def own(self, collection: str) -> bool:
        """Whether ``collection`` is one of the audit collections (never audited)."""
        return collection in (self.records, self.heads)

    # --- check / derive -------------------------------------------------------------

    def check(self, plan: Plan) -> None:
        for group in plan.groups:
            if group.ops and self.own(group.collection):
                who = plan.context.principal.describe() if plan.context.principal else "nobody"
                kinds = sorted({op.kind for op in group.ops})
                raise PermissionDenied(
                    f"{who} may not write {group.db}.{group.collection} ({', '.join(kinds)} in "
                    f"group {group.name!r} of {plan.context.operation or 'a plan'}): the audit "
                    f"trail is append-only and only accord's audit hook writes it"
                )

    def derive(self, plan: Plan) -> None:
        for group in plan.groups:
            for i, op in enumerate(group.ops):
                if op.kind == "insert" and isinstance(op.doc, Mapping) and "_id" not in op.doc:
                    group.ops[i] = Op("insert", doc={"_id": ObjectId(), **op.doc})

    # --- seal -----------------------------------------------------------------------

    def seal_reads(self, batch: SealBatch) -> Sequence[SealRead]:
        streams: dict[str, set[str]] = defaultdict(set)
        for db, stream, _ in self._entries(batch, datetime.now(UTC), build=False):
            streams[db].add(stream)
        return [
            SealRead(f"audit:{db}", db, self.heads, {"_id": {"$in": sorted(names)}})
            for db, names in sorted(streams.items())
        ]

    def seal(self, batch: SealBatch, found: Mapping[str, list[Any]]) -> Sequence[Group]:
        at = ms(datetime.now(UTC))
        heads: dict[tuple[str, str], tuple[int, str]] = {}
        for key, docs in found.items():
            if key.startswith("audit:"):
                db = key[len("audit:") :]
                for d in docs:
                    heads[db, d["_id"]] = (int(d.get("seq") or 0), d.get("hash") or GENESIS)
        records: dict[str, list[Op]] = defaultdict(list)
        advanced: dict[tuple[str, str], tuple[int, str, str]] = {}
        for db, stream, body in self._entries(batch, at):
            seq, prev = heads.get((db, stream), (0, GENESIS))
            body.update(stream=stream, seq=seq + 1, prev=prev)
            body["hash"] = chain_hash(body)
            body["_id"] = record_id(stream, seq + 1)
            heads[db, stream] = (seq + 1, body["hash"])
            advanced[db, stream] = (seq + 1, body["hash"], body["tenant_id"])
            records[db].append(Op("insert", doc=body))
        groups: list[Group] = []
        for db in sorted(records):
            groups.append(Group(f"audit:records:{db}", db, self.records, AUDIT.name, records[db]))
            moves = [
                Op(
                    "update",
                    {"_id": stream},
                    {
                        "$set": {
                            "seq": seq,
                            "hash": digest,
                            "tenant_id": tenant,
                            "at": at,
                        }
                    },
                    upsert=True,
                )  # fmt: skip
                for (hdb, stream), (seq, digest, tenant) in sorted(advanced.items())
                if hdb == db
            ]
            groups.append(Group(f"audit:heads:{db}", db, self.heads, AUDIT.name, moves))
        return groups

    def _entries(
        self, batch: SealBatch, at: datetime, *, build: bool = True
    ) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """(db, stream, record body) of every mutation and refusal of the batch, in order
        (``build=False``: an empty body, for the reads that only need the streams)."""
        for plan in batch.plans:
            if plan.context.operation == REFUSED_ACTION:
                yield from self._refused_entries(plan, batch.transaction_id, at, build)
                continue
            for group in plan.groups:
                if not group.ops or self.own(group.collection) or not self._audits(group):
                    continue
                returned = batch.found.get(group.name, [])
                for i, op in enumerate(group.ops):
                    doc = returned[i] if i < len(returned) else None
                    if op.kind in COMMAND_KINDS and doc is None and not op.upsert:
                        continue  # a claim that found nothing changed nothing
                    stream = stream_of(
                        plan.context.tenant_id, plan.context.thread_id, group.artifact,
                        group.collection,
                    )  # fmt: skip
                    if not build:
                        yield group.db, stream, {}
                        continue
                    yield group.db, stream, op_body(
                        plan.context, group, op, at=at, txn=batch.transaction_id,
                        mode=self.mode, found=doc,
                    )  # fmt: skip

    def _audits(self, group: Group) -> bool:
        return self.classes is None or group.artifact in self.classes

    # --- refusals -------------------------------------------------------------------

    def refused(self, refusal: Refusal) -> Plan | None:
        """A plan recording ``refusal``: per database it names, a marker upsert of the
        head of a stream it records into (``seal`` writes the records)."""
        context = refusal.context
        by_db: dict[str, set[str]] = defaultdict(set)
        if refusal.plan is not None:
            for group in refusal.plan.groups:
                if group.ops and self._audits(group):
                    by_db[group.db].add(
                        stream_of(context.tenant_id, context.thread_id, group.artifact,
                                  group.collection)
                    )  # fmt: skip
        elif refusal.read is not None:
            read = refusal.read
            by_db[read.db].add(
                stream_of(context.tenant_id, context.thread_id, read.artifact, read.collection)
            )
        if not by_db:
            return None
        groups = [
            Group(
                f"audit:refused:{db}",
                db,
                self.heads,
                AUDIT.name,
                [
                    Op(
                        "update",
                        {"_id": s},
                        {"$setOnInsert": {"tenant_id": context.tenant_id}},
                        upsert=True,
                    )
                    for s in sorted(streams)
                ],
                sources=[_Refused(refusal, db)] * len(streams),
            )  # fmt: skip
            for db, streams in sorted(by_db.items())
        ]
        marker = WriteContext(
            context.tenant_id, thread_id=context.thread_id, principal=context.principal,
            operation=REFUSED_ACTION,
        )  # fmt: skip
        return Plan(marker, groups)

    def _refused_entries(
        self, plan: Plan, txn: str, at: datetime, build: bool
    ) -> Iterator[tuple[str, str, dict[str, Any]]]:
        for marker in plan.groups:
            note = marker.source(0)
            if not isinstance(note, _Refused):
                continue
            refusal, reason = note.refusal, str(note.refusal.error)
            context = refusal.context
            if refusal.plan is not None:
                for group in refusal.plan.groups:
                    if group.db != note.db or not group.ops or not self._audits(group):
                        continue
                    stream = stream_of(
                        context.tenant_id, context.thread_id, group.artifact, group.collection
                    )
                    for op in group.ops:
                        if not build:
                            yield note.db, stream, {}
                            continue
                        yield note.db, stream, op_body(
                            context, group, op, at=at, txn=txn, mode=self.mode,
                            outcome="refused", reason=reason,
                        )  # fmt: skip
            elif refusal.read is not None:
                read = refusal.read
                query = read.pipeline if read.kind == "aggregate" else read.filter
                stream = stream_of(
                    context.tenant_id, context.thread_id, read.artifact, read.collection
                )
                if not build:
                    yield note.db, stream, {}
                    continue
                yield note.db, stream, read_body(
                    context, artifact=read.artifact, db=read.db, collection=read.collection,
                    kind=read.kind, query=query, at=at, txn=txn, mode=self.mode, reason=reason,
                )  # fmt: skip
