"""Expiring the audit trail: a stream's oldest records go, and its chain starts at a cut.

A hash chain cannot lose its first records without breaking (record 1's ``prev`` is
:data:`~.audit_records.GENESIS`; a later first record's ``prev`` names a record that is
gone). So the audit class's retention (``[classes.audit] retention.expire_after``,
default 7 years) removes a stream's prefix by **cutting** it (docs/governance.md,
"Expiring the audit trail"):

1. :func:`cut_expired` (run by ``accord governance sweep``) finds, per stream, the last
   record ``k`` such that records 1..k are all older than the period, never past the
   seq the newest digest committed to (so the newest digest can still be checked; a
   stream no digest covers is not cut), and checks that prefix's chain (a broken
   prefix is not cut: that would hide the break);
2. one transaction (a plan with operation :data:`CUT_ACTION`, run by an admin) inserts
   the **cut** (``accord_audit_cuts``, class ``audit_digest``): ``stream``, ``n`` (1, 2,
   ... per stream), ``seq`` = k, ``hash`` = record k's hash, ``prev_cut`` (the previous
   cut's ``cut_hash``, GENESIS first), ``first_seq``, ``count``, ``first_at`` /
   ``last_at`` of the removed records, ``records_digest`` (SHA-256 over their hashes,
   in order), ``at``, ``by``, and ``cut_hash`` (SHA-256 of the canonical body); and
   deletes records ``first_seq``..k of the stream (guarded: exactly ``count``). Only
   this shape passes the audit hook's ``check`` and the policy hook
   (:func:`is_audit_cut`, admin only); the audit hook's ``seal`` records both groups in
   the cut stream itself (:func:`cut_entries`), so the cut's content is covered by the
   chain (the record of its insert holds the cut's image hash) and so by every later
   digest;
3. verifying starts each stream at its latest cut (record k+1's ``prev`` must be its
   ``hash``), checks the cuts' own chain (``n``, ``prev_cut``, ``cut_hash``) and that
   the latest cut is the one the stream's chain recorded (:func:`cut_problems`).

A legal hold on the stream's tenant, its thread, or the ``audit`` class stops the cut:
the sweep skips it, and the kernel's hold guard refuses a cut a hold placed meanwhile
covers (:mod:`accord.governance.hold_guard`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bson import ObjectId
from pymongo import IndexModel

from accord.errors import AccordError, InvalidInputError, LegalHoldError
from accord.governance.audit_records import GENESIS, RECORDS, Mode, chain_hash, group_body
from accord.governance.canonical import canonical, ms
from accord.governance.digests import heads_at, list_digests
from accord.governance.holds import Holds
from accord.platform.artifacts import AUDIT, AUDIT_DIGEST
from accord.platform.context import AUDITOR, Principal, ReadContext, WriteContext
from accord.platform.plan import Counts, Expect, Group, Op, Plan

__all__ = [
    "CUTS", "CUT_ACTION", "CUT_INDEXES", "CUT_VALIDATOR", "CutReport", "cut_entries",
    "cut_expired", "cut_hash", "cut_problems", "image_hash", "is_audit_cut", "latest_cuts",
    "thread_of",
]  # fmt: skip

CUTS = "accord_audit_cuts"
CUT_ACTION = "audit.cut"
#: The fields ``cut_hash`` covers (all but ``_id`` and ``cut_hash``).
CUT_FIELDS = (
    "v", "stream", "tenant_id", "n", "seq", "hash", "prev_cut", "first_seq", "count",
    "first_at", "last_at", "records_digest", "at", "by",
)  # fmt: skip
_HEX64 = {"bsonType": "string", "pattern": "^[0-9a-f]{64}$"}
_POSITIVE = {"bsonType": ["int", "long"], "minimum": 1}
CUT_VALIDATOR: dict[str, Any] = {
    "$jsonSchema": {
        "bsonType": "object",
        "required": ["_id", *CUT_FIELDS, "cut_hash"],
        "properties": {
            "stream": {"bsonType": "string"}, "tenant_id": {"bsonType": "string"},
            "n": _POSITIVE, "seq": _POSITIVE, "first_seq": _POSITIVE, "count": _POSITIVE,
            "hash": _HEX64, "prev_cut": _HEX64, "records_digest": _HEX64, "cut_hash": _HEX64,
            "first_at": {"bsonType": "date"}, "last_at": {"bsonType": "date"},
            "at": {"bsonType": "date"}, "by": {"bsonType": "string"},
        },
    }
}  # fmt: skip
CUT_INDEXES = [
    # two sweeps cutting one stream at once: the second's cut number is taken
    IndexModel([("stream", 1), ("n", 1)], name="stream_n", unique=True),
    IndexModel([("tenant_id", 1), ("stream", 1), ("n", 1)], name="tenant_stream_n"),
]


def cut_hash(cut: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical body of ``cut`` (stored, or as JSON in an export)."""
    return hashlib.sha256(canonical({k: cut.get(k) for k in CUT_FIELDS})).hexdigest()


def image_hash(doc: Mapping[str, Any]) -> str:
    """The ``image_hash`` an audit record gives the insert of ``doc``."""
    return hashlib.sha256(canonical(dict(doc))).hexdigest()


def thread_of(stream: str) -> str | None:
    """The thread of a thread stream (``["acme","thread","t-1"]``), else None."""
    try:
        parts = json.loads(stream)
    except ValueError:
        return None
    if isinstance(parts, list) and len(parts) == 3 and parts[1] == "thread":
        return str(parts[2])
    return None


# --- the plan, and the shape the hooks let through ------------------------------------


def _count_error(counts: Counts) -> InvalidInputError:
    return InvalidInputError(
        f"the audit cut deleted {counts.deleted} records, not the number it counted: the "
        f"stream changed meanwhile (another cut?); nothing was cut"
    )


def cut_plan(db: str, cut: Mapping[str, Any], *, records: str, principal: Principal) -> Plan:
    """The transaction of one cut (module docstring, step 2)."""
    context = WriteContext(
        cut["tenant_id"], thread_id=thread_of(cut["stream"]), principal=principal,
        operation=CUT_ACTION,
    )  # fmt: skip
    remove = Op("delete_many", {"stream": cut["stream"], "seq": {"$lte": cut["seq"]}})
    return Plan(context, [
        Group("audit:cut", db, CUTS, AUDIT_DIGEST.name, [Op("insert", doc=dict(cut))]),
        Group("audit:cut:records", db, records, AUDIT.name, [remove],
              expect=Expect(error=_count_error, deleted=int(cut["count"]))),
    ])  # fmt: skip


def is_audit_cut(operation: str, plan: Plan) -> bool:
    """Whether ``plan`` (of ``operation``) is exactly a cut as :func:`cut_plan` builds it:
    one insert of a well-formed cut, and the deletion of its stream's records up to its
    seq, nothing else."""
    if operation != CUT_ACTION or len(plan.groups) != 2:
        return False
    insert, remove = plan.groups
    if (
        insert.collection != CUTS
        or insert.artifact != AUDIT_DIGEST.name
        or remove.artifact != AUDIT.name
    ):
        return False
    if len(insert.ops) != 1 or len(remove.ops) != 1 or plan.events:
        return False
    op, rm = insert.ops[0], remove.ops[0]
    cut = op.doc
    if op.kind != "insert" or not isinstance(cut, Mapping) or rm.kind != "delete_many":
        return False
    if set(cut) != {"_id", "cut_hash", *CUT_FIELDS} or cut.get("cut_hash") != cut_hash(cut):
        return False
    seq, count = cut.get("seq"), cut.get("count")
    if not isinstance(seq, int) or not isinstance(count, int) or not 1 <= count <= seq:
        return False
    if cut.get("first_seq") != seq - count + 1:
        return False
    if cut.get("tenant_id") != plan.context.tenant_id:
        return False
    return rm.filter == {"stream": cut["stream"], "seq": {"$lte": seq}}


def cut_entries(
    plan: Plan, txn: str, at: datetime, mode: Mode, build: bool
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """The audit records of a cut plan (the audit hook's ``seal``): one per group, in the
    cut stream (not the stream of the audit collections, which are never audited)."""
    cut = plan.groups[0].ops[0].doc if plan.groups and plan.groups[0].ops else None
    if not isinstance(cut, Mapping):
        return
    for group in plan.groups:
        if not build:
            yield group.db, str(cut["stream"]), {}
            continue
        yield (
            group.db,
            str(cut["stream"]),
            group_body(
                plan.context, group, [(op, None) for op in group.ops], at=at, txn=txn, mode=mode
            ),
        )


# --- reading and checking -----------------------------------------------------------


def _reader(tenant: str | None = None, operation: str = "audit.cuts.read") -> ReadContext:
    return ReadContext(tenant or "*", principal=Principal.service(AUDITOR), operation=operation)


def all_cuts(uow: Any, db: str, *, tenant: str | None = None,
             context: ReadContext | None = None) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Every cut of ``db`` (``tenant``'s), per stream, in ``n`` order."""
    where: dict[str, Any] = {} if tenant is None else {"tenant_id": tenant}
    found: dict[str, list[dict[str, Any]]] = {}
    for doc in uow.iterate(context or _reader(tenant), AUDIT_DIGEST.name, db, CUTS, where,
                           sort=[("stream", 1), ("n", 1)], batch_size=1000):  # fmt: skip
        found.setdefault(str(doc.get("stream")), []).append(doc)
    return found


def latest_cuts(uow: Any, db: str, *, tenant: str | None = None,
                context: ReadContext | None = None) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per stream, its latest cut (where its chain starts)."""
    return {s: cuts[-1] for s, cuts in all_cuts(uow, db, tenant=tenant, context=context).items()}


def cut_problems(
    stream: str, cuts: Sequence[Mapping[str, Any]]
) -> tuple[int | None, str, Any, Any] | None:
    """Why the cuts of ``stream`` (in ``n`` order) are not a chain of their own: (seq,
    problem, expected, found), or None."""
    prev, seq = GENESIS, 0
    for i, cut in enumerate(cuts, start=1):
        at = cut.get("seq") if isinstance(cut.get("seq"), int) else None
        if cut.get("n") != i:
            return at, f"audit cut {i} of the stream is missing or out of place", i, cut.get("n")
        if cut.get("cut_hash") != cut_hash(cut):
            return (
                at,
                f"audit cut {i} does not hash to its cut_hash (altered)",
                cut_hash(cut),
                cut.get("cut_hash"),
            )
        if cut.get("prev_cut") != prev:
            return (
                at,
                f"audit cut {i}'s prev_cut is not cut {i - 1}'s hash",
                prev,
                cut.get("prev_cut"),
            )
        if not isinstance(at, int) or at <= seq or cut.get("first_seq") != seq + 1:
            return at, f"audit cut {i} does not continue cut {i - 1}", seq + 1, cut.get("first_seq")
        prev, seq = str(cut["cut_hash"]), at
    return None


def is_cut_record(record: Mapping[str, Any]) -> bool:
    """Whether ``record`` is the audit record of a cut's insert."""
    return record.get("action") == CUT_ACTION and record.get("collection") == CUTS


# --- the sweep ----------------------------------------------------------------------


@dataclass
class CutReport:
    """What :func:`cut_expired` did."""

    streams: int = 0
    records: int = 0
    held: int = 0
    #: streams whose expired prefix does not link (not cut: ``verify`` names the break)
    broken: list[str] = field(default_factory=list)


def _period(policy: Any) -> Any:
    cls = policy.of(AUDIT.name)
    retention = getattr(cls, "retention", None) if cls is not None else None
    return getattr(retention, "expire_after", None) if retention is not None else None


def cut_expired(
    uow: Any,
    db: str,
    policy: Any,
    holds: Holds,
    *,
    principal: Principal,
    records: str = RECORDS,
    now: datetime | None = None,
    limit: int = 1000,
    batch: int = 1000,
    pause: Callable[[], None] | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> CutReport:
    """Cut, in at most ``limit`` streams of ``db``, the records older than the ``audit``
    class's period (module docstring) through ``uow``, a kernel with the audit hook on,
    acting as ``principal`` (an admin); at most ``batch`` records per cut (a longer
    prefix takes several cuts, one transaction each, ``pause`` between them)."""
    report = CutReport()
    period = _period(policy)
    if period is None:
        return report
    if holds.holds_class(AUDIT.name, records):
        report.held = 1
        return report
    context = ReadContext("*", principal=principal, operation="governance.sweep.audit")
    digests = list_digests(uow, db)
    if not digests:
        return report  # nothing is committed outside yet: nothing may go
    covered = heads_at(uow, db, int(digests[-1]["seq"]))
    cutoff = (now or datetime.now(UTC)) - period
    # one pass over the trail: per stream, its last old record and its first young one
    # (a prefix goes only while every record in it is old: clocks of writers may differ)
    rows = uow.aggregate(context, AUDIT.name, db, records, [
        {"$group": {
            "_id": "$stream", "tenant": {"$first": "$tenant_id"},
            "old": {"$max": {"$cond": [{"$lt": ["$at", cutoff]}, "$seq", 0]}},
            "young": {"$min": {"$cond": [{"$gte": ["$at", cutoff]}, "$seq", None]}},
        }},
        {"$match": {"old": {"$gt": 0}}},
        {"$sort": {"_id": 1}},
    ])  # fmt: skip
    cuts = latest_cuts(uow, db, context=context)
    for row in rows:
        if report.streams >= limit:
            break
        stream, tenant = str(row["_id"]), str(row["tenant"])
        head = covered.get(stream)
        if head is None:
            continue
        if holds.holds_thread(tenant, thread_of(stream)):
            report.held += 1
            continue
        young = row.get("young")
        k = min(head.seq, int(row["old"]), int(young) - 1 if young else head.seq)
        last = cuts.get(stream)
        cut_any = False
        while k > (int(last["seq"]) if last else 0):
            upto = min(k, (int(last["seq"]) if last else 0) + batch)
            cut = _build(uow, context, db, records, stream, tenant, last, upto, principal)
            if cut is None:
                report.broken.append(stream)
                break
            if pause is not None and (report.streams or cut_any):
                pause()
            try:
                uow.execute(cut_plan(db, cut, records=records, principal=principal))
            except AccordError as exc:  # a hold placed meanwhile, a concurrent cut: next pass
                if isinstance(exc, LegalHoldError):
                    report.held += 1
                break
            report.records += int(cut["count"])
            last, cut_any = cut, True
        if cut_any:
            report.streams += 1
            if progress is not None:
                progress("audit cut", 1)
    return report


def _build(
    uow: Any, context: ReadContext, db: str, records: str, stream: str, tenant: str,
    last: Mapping[str, Any] | None, k: int, principal: Principal,
) -> dict[str, Any] | None:  # fmt: skip
    """The cut of ``stream`` at ``k``, after checking the prefix it removes links from the
    previous cut (None when it does not: a broken chain is not cut, `verify` names it)."""
    seq, prev = (int(last["seq"]), str(last["hash"])) if last else (0, GENESIS)
    first = seq + 1
    hashes: list[bytes] = []
    first_at = last_at = None
    # the stream's records from its start (those before ``first`` are cut), to ``k``
    for r in uow.iterate(context, AUDIT.name, db, records, {"stream": stream},
                         sort=[("seq", 1)], batch_size=min(k - seq, 1000) + 1):  # fmt: skip
        if r.get("seq") != seq + 1 or r.get("prev") != prev or chain_hash(r) != r.get("hash"):
            return None
        seq, prev = seq + 1, str(r["hash"])
        hashes.append(bytes.fromhex(prev))
        first_at = first_at or r["at"]
        last_at = r["at"]
        if seq == k:
            break
    if seq != k or first_at is None or last_at is None:
        return None
    cut: dict[str, Any] = {
        "_id": ObjectId(), "v": 1, "stream": stream, "tenant_id": tenant,
        "n": int(last["n"]) + 1 if last else 1, "seq": k, "hash": prev,
        "prev_cut": str(last["cut_hash"]) if last else GENESIS, "first_seq": first,
        "count": k - first + 1, "first_at": ms(_utc(first_at)), "last_at": ms(_utc(last_at)),
        "records_digest": hashlib.sha256(b"".join(hashes)).hexdigest(),
        "at": ms(datetime.now(UTC)), "by": principal.describe(),
    }  # fmt: skip
    cut["cut_hash"] = cut_hash(cut)
    return cut


def _utc(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
