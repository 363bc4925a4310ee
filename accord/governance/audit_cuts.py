"""Expiring the audit trail: a stream's oldest records go, and its chain starts at a cut.

A hash chain cannot lose its first records without breaking (record 1's ``prev`` is
:data:`~.audit_records.GENESIS`; a later first record's ``prev`` names a record that is
gone). So the audit class's retention (``[classes.audit] retention.expire_after``,
default 7 years) removes a stream's prefix by **cutting** it (docs/governance.md,
"Expiring the audit trail"):

1. :func:`cut_expired` (run by ``accord governance sweep``) finds, per stream, the last
   record ``k`` such that records 1..k are all older than the period, never past the
   seq committed by the newest digest taken at least the period before the sweep's
   ``now`` (so every record cut was committed outside before it expired; a stream no
   such digest covers is not cut), and checks that prefix's chain (a broken prefix is
   not cut: that would hide the break);
2. one transaction (a plan with operation :data:`CUT_ACTION`, run by an admin) inserts
   the **cut** (``accord_audit_cuts``, class ``audit_digest``): ``stream``, ``n`` (1, 2,
   ... per stream), ``seq`` = k, ``hash`` = record k's hash, ``prev_cut`` (the previous
   cut's ``cut_hash``, GENESIS first), ``first_seq``, ``count``, ``first_at`` /
   ``last_at`` of the removed records, ``records_digest`` (SHA-256 over their hashes,
   in order), ``at`` (the sweep's ``now``), ``by``, ``period_s`` (the period applied,
   seconds; a v2 cut, since 2026-12-07) and ``cut_hash`` (SHA-256 of the canonical
   body); and
   deletes records ``first_seq``..k of the stream (guarded: exactly ``count``). Only
   this shape passes the audit hook's ``check`` and the policy hook
   (:func:`is_audit_cut`, admin only); the audit hook's ``seal`` refuses, inside the
   transaction, a cut the digests do not justify (:func:`refuse_unjustified`, since
   2026-12-07), and records both groups in
   the cut stream itself (:func:`cut_entries`), so the cut's content is covered by the
   chain (the record of its insert holds the cut's image hash) and so by every later
   digest;
3. verifying starts each stream at its latest cut (record k+1's ``prev`` must be its
   ``hash``), checks the cuts' own chain (``n``, ``prev_cut``, ``cut_hash``) and that
   the latest cut is the one the stream's chain recorded (:func:`cut_problems`), and
   that each cut is justified by the digests (:func:`justify_cut`): its period is
   the one expected, a digest taken that period before it committed every record it
   removed, and no digest that already held its record predates it.

A legal hold on the stream's tenant, its thread, or the ``audit`` class stops the cut:
the sweep skips it, and the kernel's hold guard refuses a cut a hold placed meanwhile
covers (:mod:`accord.governance.hold_guard`).
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from bson import ObjectId
from pymongo import IndexModel

from accord.errors import AccordError, InvalidInputError, LegalHoldError
from accord.governance.audit_records import GENESIS, RECORDS, Mode, chain_hash, group_body
from accord.governance.canonical import canonical, ms
from accord.governance.digests import (
    DIGEST_HEADS,
    DIGESTS,
    digest_problem,
    digest_time,
    heads_at,
    list_digests,
)
from accord.governance.holds import Holds
from accord.platform.artifacts import AUDIT, AUDIT_DIGEST
from accord.platform.context import AUDITOR, Principal, ReadContext, WriteContext
from accord.platform.hooks import SealRead
from accord.platform.plan import Counts, Expect, Group, Op, Plan

__all__ = [
    "CLOCK_SKEW", "CUTS", "CUT_ACTION", "CUT_FIELDS", "CUT_FIELDS_V2", "CUT_INDEXES",
    "CUT_VALIDATOR", "Commit", "CutReport", "Justification", "WITNESSES", "audit_period",
    "commits_of", "cut_entries", "cut_expired", "cut_fields", "cut_hash",
    "cut_of", "cut_period", "cut_problems", "enforced_audit_period", "image_hash",
    "is_audit_cut", "justification_reads", "justify_cut", "latest_cuts", "refuse_unjustified",
    "thread_of", "when",
]  # fmt: skip

CUTS = "accord_audit_cuts"
CUT_ACTION = "audit.cut"
#: The fields ``cut_hash`` covers in a v1 cut (all but ``_id`` and ``cut_hash``).
CUT_FIELDS = (
    "v", "stream", "tenant_id", "n", "seq", "hash", "prev_cut", "first_seq", "count",
    "first_at", "last_at", "records_digest", "at", "by",
)  # fmt: skip
#: ... in a v2 cut (since 2026-12-07): also the period it applied, in seconds.
CUT_FIELDS_V2 = (*CUT_FIELDS, "period_s")
#: How far two clocks (the sweep's, a digest taker's) may disagree.
CLOCK_SKEW = timedelta(minutes=5)
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
            "v": {"enum": [1, 2]}, "period_s": _POSITIVE,  # required of v2 by the hook
        },
    }
}  # fmt: skip
CUT_INDEXES = [
    # two sweeps cutting one stream at once: the second's cut number is taken
    IndexModel([("stream", 1), ("n", 1)], name="stream_n", unique=True),
    IndexModel([("tenant_id", 1), ("stream", 1), ("n", 1)], name="tenant_stream_n"),
]


def cut_hash(cut: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical body of ``cut`` (stored, or as JSON in an export): its
    version's fields (a v1 cut hashes as it always did)."""
    body = {k: cut.get(k) for k in cut_fields(cut)}
    return hashlib.sha256(canonical(body)).hexdigest()


def cut_fields(cut: Mapping[str, Any]) -> tuple[str, ...]:
    """The fields ``cut``'s version hashes."""
    return CUT_FIELDS_V2 if cut.get("v") == 2 else CUT_FIELDS


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
    if cut.get("v") not in (1, 2) or set(cut) != {"_id", "cut_hash", *cut_fields(cut)}:
        return False
    if cut.get("cut_hash") != cut_hash(cut):
        return False
    period = cut.get("period_s", 1)
    if not isinstance(period, int) or isinstance(period, bool) or period < 1:
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


@dataclass(frozen=True)
class Commit:
    """What one digest committed of a stream: the digest's number, its time (from its
    signed body) and the stream's head seq in it."""

    digest: int
    at: datetime
    seq: int


@dataclass(frozen=True)
class Justification:
    """The verdict on one cut (:func:`justify_cut`): ``problem`` (None: justified), and
    the digests it rests on, for a caller that must check them: ``witness`` (taken a
    period before the cut, it committed every record the cut removed) and ``covering``
    (the first that held the cut's own record; None: none yet). ``finding``: the
    problem without what it means once the cut is done (for a refusal before it)."""

    problem: str | None
    witness: int | None = None
    covering: int | None = None
    finding: str | None = None


def _unjustified(finding: str, meaning: str = "", witness: int | None = None,
                 covering: int | None = None) -> Justification:  # fmt: skip
    """A verdict against a cut: ``finding``, then (after the fact) ``meaning``."""
    problem = f"{finding}: {meaning}" if meaning else finding
    return Justification(problem, witness, covering, finding)


def commits_of(
    changes: Sequence[tuple[int, int]], digests: Sequence[tuple[int, datetime]]
) -> list[Commit]:
    """A stream's commits, from ``changes`` ((digest, head seq) of the digests that moved
    its head, in order) and ``digests`` ((number, at) of the digests that count, in
    order: signed ones, when a key is pinned): each change as of the first digest that
    counts at or after it and before the next change."""
    numbers = [n for n, _ in digests]
    found: list[Commit] = []
    for i, (n, seq) in enumerate(changes):
        j = bisect_left(numbers, n)
        end = changes[i + 1][0] if i + 1 < len(changes) else None
        if j < len(numbers) and (end is None or numbers[j] < end):
            found.append(Commit(numbers[j], digests[j][1], seq))
    return found


def when(value: Any) -> datetime | None:
    """A UTC datetime from a stored date, an export's ``{"$date": text}`` or a digest's
    ISO text; None when it is none of them."""
    if isinstance(value, Mapping):
        value = value.get("$date")
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    return _utc(value) if isinstance(value, datetime) else None


def _human(seconds: int) -> str:
    for unit, size in (("years", 365 * 86400), ("days", 86400), ("hours", 3600),
                       ("minutes", 60)):  # fmt: skip
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} seconds"


def _iso(at: datetime) -> str:
    return at.isoformat(timespec="seconds").replace("+00:00", "Z")


def justify_cut(
    cut: Mapping[str, Any],
    commits: Sequence[Commit],
    *,
    recorded_by: int,
    now: datetime,
    min_period: timedelta,
    skew: timedelta = CLOCK_SKEW,
) -> Justification:
    """Whether ``cut`` removed only expired records, judged by the digests, whose times
    are signed and kept outside (docs/governance.md, "Expiring the audit trail"):

    a. its period (a v1 cut: ``min_period``) is at least ``min_period``;
    b. a digest taken at least that period before the cut's ``at`` committed its stream
       at ``seq`` or later (so every removed record existed a period before the cut);
    c. its ``at`` is not later than (``skew`` allowed) the first digest that committed
       its stream at ``recorded_by`` (the seq of the cut's own record, or one after
       it) or later, nor than ``now`` when none did: a cut cannot be dated forward to
       make (b) hold.

    ``commits``: the stream's commits, in digest order (those where its head moved
    suffice: digest times grow). Pure."""
    name = f"audit cut {cut.get('n')} of stream {cut.get('stream')}"
    k, at = cut.get("seq"), when(cut.get("at"))
    if not isinstance(k, int) or at is None:
        return _unjustified(f"{name} holds no seq or date (altered)")
    minimum = max(1, int(min_period.total_seconds()))
    period = cut_period(cut, min_period)
    if period is None:
        return _unjustified(f"{name} holds no period (altered)")
    if period < minimum:
        return _unjustified(
            f"{name} applied a period of {_human(period)}, shorter than the {_human(minimum)} "
            f"expected (the audit class's period)", "records younger than that were cut"
        )  # fmt: skip
    older = [c for c in commits if c.at <= at - timedelta(seconds=period)]
    witness = max(older, key=lambda c: (c.seq, c.digest), default=None)
    if witness is None or witness.seq < k:
        return _unjustified(
            f"{name} removed records through seq {k} that no digest older than its period "
            f"{_human(period)} committed (such digests committed it through seq "
            f"{witness.seq if witness else 0})", "young records were cut"
        )  # fmt: skip
    covering = next((c for c in commits if c.seq >= recorded_by), None)
    if covering is not None and at > covering.at + skew:
        return _unjustified(
            f"{name} is dated {_iso(at)}, after digest {covering.digest} ({_iso(covering.at)}) "
            f"already held it", "its date was moved forward", witness.digest, covering.digest,
        )  # fmt: skip
    if covering is None and at > now + skew:
        return _unjustified(f"{name} is dated {_iso(at)}, in the future ({_iso(now)} now)",
                            witness=witness.digest)  # fmt: skip
    return Justification(None, witness.digest, covering.digest if covering else None)


def cut_period(cut: Mapping[str, Any], min_period: timedelta) -> int | None:
    """The period ``cut`` applied, in seconds: its ``period_s`` (v2), else the one
    expected, ``min_period`` (a v1 cut states none); None when it holds no valid one."""
    if cut.get("v") != 2:
        return max(1, int(min_period.total_seconds()))
    period = cut.get("period_s")
    if not isinstance(period, int) or isinstance(period, bool) or period < 1:
        return None
    return period


def audit_period(policy: Any) -> timedelta | None:
    """The ``audit`` class's retention period in ``policy`` (None: kept forever)."""
    cls = policy.of(AUDIT.name)
    retention = getattr(cls, "retention", None) if cls is not None else None
    return getattr(retention, "expire_after", None) if retention is not None else None


#: The name of governance's policy hook on a kernel (:class:`~.enforcement.PolicyHook`).
_POLICY_HOOK = "governance-policy"


def enforced_audit_period(uow: Any, db: str) -> timedelta | None:
    """The audit period of the policy ``uow`` enforces on ``db`` (the stored one, as last
    read; the built-in default when the kernel has no policy hook)."""
    hook = next((h for h in getattr(uow.hooks, "all", ()) if getattr(h, "name", None)
                 == _POLICY_HOOK), None)  # fmt: skip
    if hook is None:
        from accord.governance.loading import default_policy

        return audit_period(default_policy())
    return audit_period(hook.rules(db).policy)


# --- refusing an unjustified cut, in its transaction -----------------------------------

#: How many of the newest digests taken a period before a cut its transaction reads: the
#: newest is the witness (a stream's head only grows); the others stand in for one that
#: does not hash to its hash.
WITNESSES = 8


def cut_of(plan: Plan) -> Mapping[str, Any] | None:
    """The cut a cut plan (:func:`cut_plan`) inserts; None when it holds none."""
    ops = plan.groups[0].ops if plan.groups else []
    doc = ops[0].doc if ops else None
    return doc if isinstance(doc, Mapping) else None


def justification_reads(
    key: str, db: str, cut: Mapping[str, Any], period: timedelta | None
) -> list[SealRead]:
    """What the transaction of ``cut`` (in ``db``) reads for :func:`refuse_unjustified`,
    under ``key``: the newest :data:`WITNESSES` digests taken at least its period before
    its ``at``, and the first digest head of its stream at or past its ``seq`` (the first
    digest that committed every record it removes: a stream's head only grows). Two
    index seeks, however long the trail and its digests; none when nothing can justify it (no ``period`` expected, no valid period,
    seq or date: refused without reading)."""
    at, seq = when(cut.get("at")), cut.get("seq")
    applied = cut_period(cut, period) if period is not None else None
    if at is None or applied is None or not isinstance(seq, int):
        return []
    before = digest_time(at - timedelta(seconds=applied))
    return [
        SealRead(f"{key}:digests", db, DIGESTS, {"at": {"$lte": before}}, limit=WITNESSES,
                 sort=[("at", -1)]),
        SealRead(f"{key}:heads", db, DIGEST_HEADS, {"stream": cut.get("stream"),
                 "seq": {"$gte": seq}}, limit=1, sort=[("seq", 1), ("digest", 1)]),
    ]  # fmt: skip


def refuse_unjustified(
    key: str,
    cut: Mapping[str, Any],
    found: Mapping[str, list[Any]],
    *,
    period: timedelta | None,
    now: datetime,
    skew: timedelta = CLOCK_SKEW,
) -> None:
    """Refuse ``cut`` (:class:`~accord.errors.InvalidInputError`) unless the digests read
    in its transaction (``found``, under ``key``: :func:`justification_reads`) justify it
    against the audit ``period`` expected (None: audit records are kept forever) by
    :func:`justify_cut`: (b) judged at the cut's own ``at``, (c) against ``now``, the
    clock (its own record is being written: no digest holds it yet). The digests count
    when they hash to their hash (and their signature, if any, holds); whether their
    stored heads rebuild their roots, and a pinned key, are the verifier's (a cut's
    transaction reads two documents, not the heads of every stream)."""
    name = f"audit cut {cut.get('n')} of stream {cut.get('stream')}"
    if period is None:
        _refuse(f"{name} removes audit records, but the policy keeps them forever")
    rows = found.get(f"{key}:heads") or []
    changes = [(int(r["digest"]), int(r["seq"])) for r in rows[:1]]
    digests = sorted(
        (int(d["seq"]), taken) for d in found.get(f"{key}:digests") or []
        if digest_problem(d) is None and (taken := when(d.get("at"))) is not None
    )  # fmt: skip
    commits = commits_of(changes, digests)
    # the seq of the cut's own record: past every head a digest committed
    written = max((c.seq for c in commits), default=int(cut.get("seq") or 0)) + 1
    verdict = justify_cut(cut, commits, recorded_by=written, now=now, min_period=period,
                          skew=skew)  # fmt: skip
    if verdict.problem is not None:
        _refuse(verdict.finding or verdict.problem)


#: How the kernel's refusal of an unjustified cut begins.
REFUSED = "audit cut refused, nothing was cut"


def _refuse(finding: str) -> NoReturn:
    raise InvalidInputError(
        f"{REFUSED}: {finding}. A cut removes only records a "
        f"digest committed at least the audit period before it (take digests with `accord "
        f'audit digest`; docs/governance.md, "What a cut proves")'
    )


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
    #: the kernel's refusals of a cut the digests do not justify (its message: the
    #: sweep's clock ahead of the kernel's, or digests rewritten)
    refused: list[str] = field(default_factory=list)


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
    prefix takes several cuts, one transaction each, ``pause`` between them). ``now``
    (default the clock) is the cuts' ``at``: a test's future ``now`` dates them there."""
    report = CutReport()
    period = audit_period(policy)
    if period is None:
        return report
    if holds.holds_class(AUDIT.name, records):
        report.held = 1
        return report
    # whole seconds, at least one: the period the cut records is the one applied
    period = timedelta(seconds=max(1, int(period.total_seconds())))
    now = _utc(now or datetime.now(UTC))  # one clock: the cutoff's and the cuts' ``at``
    cutoff = now - period
    context = ReadContext("*", principal=principal, operation="governance.sweep.audit")
    # only what a digest committed a period ago may go: the verifier asks the same
    # (justify_cut), of digests signed and kept outside, whose times no one can move
    old = [d for d in list_digests(uow, db) if (taken := when(d.get("at"))) and taken <= cutoff]
    if not old:
        return report  # nothing was committed outside a period ago: nothing may go
    covered = heads_at(uow, db, int(old[-1]["seq"]))
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
            cut = _build(uow, context, db, records, stream, tenant, last, upto, principal,
                         at=now, period=period)  # fmt: skip
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
                elif isinstance(exc, InvalidInputError) and str(exc).startswith(REFUSED):
                    report.refused.append(str(exc))
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
    last: Mapping[str, Any] | None, k: int, principal: Principal, *, at: datetime,
    period: timedelta,
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
        "_id": ObjectId(), "v": 2, "stream": stream, "tenant_id": tenant,
        "n": int(last["n"]) + 1 if last else 1, "seq": k, "hash": prev,
        "prev_cut": str(last["cut_hash"]) if last else GENESIS, "first_seq": first,
        "count": k - first + 1, "first_at": ms(_utc(first_at)), "last_at": ms(_utc(last_at)),
        "records_digest": hashlib.sha256(b"".join(hashes)).hexdigest(),
        "at": ms(at), "by": principal.describe(), "period_s": int(period.total_seconds()),
    }  # fmt: skip
    cut["cut_hash"] = cut_hash(cut)
    return cut


def _utc(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
