"""The mutation audit: a kernel hook that appends hash-chained records in the SAME
transaction as every write, and records refused operations.

:class:`AuditHook` takes part in the kernel's phases (docs/platform.md, "Hooks"):

``check``
    refuses any plan that writes the audit collections (records or heads): only this
    hook writes them, from ``seal``, so the trail is append-only for everybody
    (:class:`~accord.errors.PermissionDenied`; the refusal is itself recorded). The
    digests (:mod:`accord.governance.digests`) may be inserted, never changed.
``derive``
    gives every insert that has no ``_id`` one (an ``ObjectId``, as the driver would), so
    its record names the document it created.
``seal_reads`` + ``seal``
    inside each transaction attempt: reads the heads of the streams the batch writes
    (one read per database; none for heads this process left, which it caches:
    :mod:`accord.governance.audit_heads`), then returns the records of every plan,
    one per stream, action, class and collection (with the same principal and run),
    naming each of their ops (all artifact classes by default, business collections
    included; the audit collections themselves excluded), and the advanced heads. A
    concurrent writer of the same stream makes the head update a write conflict (or,
    for a cached head, a compare-and-set that matches nothing:
    :class:`~accord.platform.hooks.SealConflict`): the kernel retries the attempt and
    the hook seals again on heads read in the transaction, so a stream's ``seq`` has
    neither gaps nor duplicates and an aborted transaction leaves neither its write nor
    its record.

    A cut (:mod:`accord.governance.audit_cuts`, since 2026-12-07) also reads, in its
    transaction, the digests that could justify it (the newest taken its period before
    it, its stream's first digest head at or past its seq), and ``seal`` refuses it
    (:class:`RefusedCut`, an :class:`~accord.errors.InvalidInputError`; nothing of the
    cut is written) unless they do (:func:`~accord.governance.audit_cuts.justify_cut`)
    against the audit period of the policy enforced on its database, and its date is not
    ahead of ``clock``. The refusal carries a :class:`~accord.platform.hooks.Refusal` of
    the cut's insert: the kernel records it after the transaction aborted, as below (since
    2026-12-08; before, such a refusal left no record).
``refused``
    a plan or read refused with ``PermissionDenied`` is recorded (``outcome:
    "refused"``, with the reason), in a transaction of its own: the kernel runs the plan
    this returns (a marker upsert of the stream's head, which this hook's ``seal``
    turns into the records), outside the refused transaction, which never starts. A cut
    ``seal`` refused is recorded the same way (one record, of the cut's insert), once the
    refused transaction has aborted, once however many attempts it took.

It also names the collections it writes (:meth:`AuditHook.collections`), which every
component's catalog setup creates: the records collection with its ``$jsonSchema``
validator (:data:`~accord.governance.audit_records.VALIDATOR`) and indexes, and the
heads. Record format, streams and hashing: :mod:`accord.governance.audit_records`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bson import ObjectId

from accord.errors import ConfigurationError, InvalidInputError, PermissionDenied
from accord.governance.audit_cuts import (
    CUT_ACTION,
    CUT_INDEXES,
    CUT_VALIDATOR,
    CUTS,
    audit_period,
    cut_entries,
    cut_of,
    is_audit_cut,
    justification_reads,
    refuse_unjustified,
)
from accord.governance.audit_heads import HeadCache
from accord.governance.audit_records import (
    GENESIS,
    HEAD_INDEXES,
    HEADS,
    OPS_PER_RECORD,
    RECORD_INDEXES,
    RECORDS,
    VALIDATOR,
    Mode,
    chain_hash,
    group_body,
    read_body,
    record_run,
    recorded_principal,
    stream_of,
)
from accord.governance.canonical import ms
from accord.governance.digests import (
    DIGEST_HEAD_INDEXES,
    DIGEST_HEAD_VALIDATOR,
    DIGEST_HEADS,
    DIGEST_INDEXES,
    DIGEST_VALIDATOR,
    DIGESTS,
)
from accord.governance.redaction import is_image_erasure
from accord.platform.artifacts import AUDIT, AUDIT_DIGEST, CLASSES, ENCRYPTION_KEY
from accord.platform.context import WriteContext
from accord.platform.hooks import (
    HookCollection,
    Refusal,
    SealBatch,
    SealConflict,
    SealRead,
    SealRefusal,
)
from accord.platform.plan import COMMAND_KINDS, Counts, Expect, Group, Op, Plan

__all__ = ["REFUSED_ACTION", "AuditHook", "RefusedCut"]

#: A placeholder time for the bodies ``seal_reads`` does not build.
_NOW = datetime(1970, 1, 1, tzinfo=UTC)


def _stale(counts: Counts) -> SealConflict:
    return SealConflict(
        f"an audit head this process cached had moved ({counts.matched} matched): sealing "
        f"again on heads read in the transaction"
    )


#: The operation of the plans that record a refusal.
REFUSED_ACTION = "audit.refused"
#: ``metadata`` and ``full``: every audited class at least in that mode (more where the
#: policy says ``full``); ``policy``: each class in the mode its policy says.
MODES = ("metadata", "full", "policy")
_RANK = {"off": 0, "metadata": 1, "full": 2}


class RefusedCut(InvalidInputError, SealRefusal):
    """An audit cut the digests do not justify, refused by the audit hook's ``seal``
    inside the cut's transaction (which aborts: nothing of it is written). ``refusal`` is
    what the kernel records of it afterwards, in a transaction of its own: the cut's
    insert, by the cut's principal, with this message as the reason (None: a copy, e.g.
    unpickled, records nothing again)."""

    def __init__(self, message: str, plan: Plan | None = None) -> None:
        super().__init__(message)
        self.refusal = None
        if plan is not None:
            insert = Plan(plan.context, plan.groups[:1])  # the cut (its stream, n, seq, at)
            self.refusal = Refusal(plan.context, self, plan=insert)


@dataclass(frozen=True)
class _Refused:
    """What a refusal's marker group carries to ``seal``: the refused plan or read."""

    refusal: Refusal
    db: str


class AuditHook:
    """The audit hook (module docstring).

    Args:
        mode: ``metadata`` (default): records carry hashes of the op's filter, change and
            after image; ``full``: they keep those images too (as canonical JSON text,
            outside the hashed body, so erasing one later keeps the chain verifiable);
            ``policy``: each class in the mode the policy says (``off``: no record).
            With ``policy`` given, ``metadata`` and ``full`` are a floor: a class the
            policy audits in a higher mode (``full``) gets it.
        records, heads: the collection names, in the database of each write.
        classes: the artifact classes audited (default every class).
        policy: the policy enforced on a database, by name (the kernel's policy hook's:
            the newest stored version, re-read as enforcement re-reads it); each class's
            ``audit`` mode comes from it, and the audit period a cut is held to (without
            it, the built-in default policy's). Required by ``policy``.
        clock: the time a cut's date may not be ahead of (a test's sweep dated years
            ahead runs its kernel on the same clock).
    """

    name = "audit"

    def __init__(
        self,
        mode: Mode = "metadata",
        *,
        records: str = RECORDS,
        heads: str = HEADS,
        classes: Sequence[str] | None = None,
        policy: Callable[[str], Any] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if mode not in MODES:
            raise ConfigurationError(f"audit mode must be one of {MODES}, got {mode!r}")
        if mode == "policy" and policy is None:
            raise ConfigurationError(
                "audit mode 'policy' takes each class's mode from the policy: pass policy= "
                "(accord.runtime.kernel does)"
            )
        unknown = sorted(set(classes or ()) - set(CLASSES))
        if unknown:
            raise ConfigurationError(
                f"audit classes {unknown} are not artifact classes; one of {sorted(CLASSES)}"
            )
        if records == heads:
            raise ConfigurationError("the audit records and heads need two collections")
        self.mode = mode
        self.policy = policy
        self.clock = clock
        #: (policy id, class, business collection) -> (that policy, the mode or None)
        self._modes: dict[tuple[int, str, str | None], tuple[Any, Mode | None]] = {}
        self.records = records
        self.heads = heads
        self.classes = frozenset(classes) if classes is not None else None
        #: heads this process left: seals without a read (accord/governance/audit_heads.py)
        self.cache = HeadCache()

    # --- what it owns -------------------------------------------------------------

    def collections(self, db: str) -> Mapping[str, HookCollection]:
        """The collections this hook writes in ``db``, for the catalog's setup."""
        return {
            self.records: HookCollection(AUDIT.name, VALIDATOR, RECORD_INDEXES),
            self.heads: HookCollection(AUDIT.name, None, HEAD_INDEXES),
            DIGESTS: HookCollection(AUDIT_DIGEST.name, DIGEST_VALIDATOR, DIGEST_INDEXES),
            DIGEST_HEADS: HookCollection(
                AUDIT_DIGEST.name, DIGEST_HEAD_VALIDATOR, DIGEST_HEAD_INDEXES
            ),
            CUTS: HookCollection(AUDIT_DIGEST.name, CUT_VALIDATOR, CUT_INDEXES),
        }

    def own(self, collection: str) -> bool:
        """Whether ``collection`` is one of the audit collections (never audited)."""
        return collection in (self.records, self.heads, DIGESTS, DIGEST_HEADS, CUTS)

    # --- check / derive -------------------------------------------------------------

    def check(self, plan: Plan) -> None:
        if is_audit_cut(plan.context.operation, plan) and plan.groups[1].collection == self.records:
            return  # the audit class's retention: a stream's prefix cut (audit_cuts.py)
        for group in plan.groups:
            if group.collection in (DIGESTS, DIGEST_HEADS) and all(
                op.kind == "insert" for op in group.ops
            ):
                continue  # digests are appended (accord audit digest), never changed
            if group.collection == self.records and is_image_erasure(plan.context.operation, group):
                continue  # a subject's erasure: images go, their hashes stay (redaction.py)
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
        keys = {(db, stream) for db, stream, _ in self._entries(batch, _NOW, build=False)}
        streams: dict[str, list[str]] = defaultdict(list)
        if batch.attempt == 0:  # the kernel's probe: what a first attempt would read
            wanted = self.cache.unknown(keys)
        else:
            wanted = self.cache.to_read(batch.transaction_id, batch.attempt, keys)
        for db, stream in sorted(wanted):
            streams[db].append(stream)
        reads = [
            SealRead(f"audit:{db}", db, self.heads, {"_id": {"$in": names}})
            for db, names in sorted(streams.items())
        ]
        if batch.attempt > 0:  # a cut is judged in its transaction, not in the probe
            for key, db, cut, _ in self._cuts(batch):
                reads.extend(justification_reads(key, db, cut, self.audit_period(db)))
        return reads

    def seal(self, batch: SealBatch, found: Mapping[str, list[Any]]) -> Sequence[Group]:
        if batch.attempt == 0:  # the kernel's probe: whether there is a record, not which
            for db, _, _ in self._entries(batch, _NOW, build=False):
                return [Group("audit:probe", db, self.records, AUDIT.name, [])]
            return []
        at = ms(datetime.now(UTC))
        txn = batch.transaction_id
        read = self.cache.read_for(txn, batch.attempt)
        for reads, db, cut, plan in self._cuts(batch):  # before anything is written
            try:
                refuse_unjustified(reads, cut, found, period=self.audit_period(db),
                                   now=self.clock())  # fmt: skip
            except InvalidInputError as exc:  # recorded by the kernel once this aborted
                raise RefusedCut(str(exc), plan) from exc
        heads: dict[tuple[str, str], tuple[int, str]] = dict.fromkeys(read, (0, GENESIS))
        for name, docs in found.items():
            if name.startswith("audit:"):
                db = name[len("audit:") :]
                for d in docs:
                    heads[db, d["_id"]] = (int(d.get("seq") or 0), d.get("hash") or GENESIS)
        bases: dict[tuple[str, str], tuple[int, str]] = {}
        records: dict[str, list[Op]] = defaultdict(list)
        tenants: dict[tuple[str, str], str] = {}
        for db, stream, body in self._entries(batch, at):
            key = (db, stream)
            if key not in heads:  # not read: chained from the head this process left
                heads[key] = self.cache.base(txn, key) or (0, GENESIS)
            bases.setdefault(key, heads[key])
            seq, prev = heads[key]
            body.update(stream=stream, seq=seq + 1, prev=prev)
            body["hash"] = chain_hash(body)
            body["_id"] = ObjectId()
            heads[key] = (seq + 1, body["hash"])
            records[db].append(Op("insert", doc=body))
            tenants[key] = body["tenant_id"]
        groups: list[Group] = []
        for db in sorted(records):
            groups.append(Group(f"audit:records:{db}", db, self.records, AUDIT.name, records[db]))
            upserts: list[Op] = []
            swaps: list[Op] = []
            for key in sorted(k for k in bases if k[0] == db):
                (seq, digest), base = heads[key], bases[key]
                move = {"$set": {"seq": seq, "hash": digest, "tenant_id": tenants[key], "at": at}}
                if key in read:  # read in this snapshot: a concurrent writer conflicts
                    upserts.append(Op("update", {"_id": key[1]}, move, upsert=True))
                else:  # from the cache: only if the head is still what it said
                    swaps.append(
                        Op("update", {"_id": key[1], "seq": base[0], "hash": base[1]}, move)
                    )
                self.cache.sealed(txn, key, base, heads[key])
            groups.append(Group(f"audit:heads:{db}", db, self.heads, AUDIT.name, upserts))
            groups.append(Group(
                f"audit:heads-cas:{db}", db, self.heads, AUDIT.name, swaps,
                expect=Expect(error=_stale, matched=len(swaps)),
            ))  # fmt: skip
        return groups

    def _cuts(self, batch: SealBatch) -> Iterator[tuple[str, str, Mapping[str, Any], Plan]]:
        """(key of its reads, database, cut, its plan) of every audit cut of the batch."""
        for i, plan in enumerate(batch.plans):
            cut = cut_of(plan)
            if cut is not None and is_audit_cut(plan.context.operation, plan):
                yield f"cut:{i}", plan.groups[0].db, cut, plan

    def audit_period(self, db: str) -> timedelta | None:
        """The audit class's period in the policy enforced on ``db`` (the built-in
        default's without ``policy``); None: audit records are kept forever."""
        if self.policy is not None:
            return audit_period(self.policy(db))
        from accord.governance.loading import default_policy

        return audit_period(default_policy())

    def _entries(
        self, batch: SealBatch, at: datetime, *, build: bool = True
    ) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """(db, stream, record body) of every mutation and refusal of the batch: refusals
        and cuts as their plans come, then the applied ops' records in the order of their
        first op (``build=False``: an empty body, for the reads that only need the
        streams)."""
        # One record per (stream, action, class, collection, principal, run) of the
        # transaction: the ops of every plan of the batch that share them, in plan order
        # (audit_records.py says why).
        merged: dict[tuple[Any, ...], tuple[WriteContext, Group, Mode, list[tuple[Op, Any]]]] = {}
        for plan in batch.plans:
            if plan.context.operation == REFUSED_ACTION:
                yield from self._refused_entries(plan, batch.transaction_id, at, build)
                continue
            if plan.context.operation == CUT_ACTION:  # recorded in the cut stream itself
                yield from cut_entries(plan, batch.transaction_id, at, self.mode, build)
                continue
            context = plan.context
            for group in plan.groups:
                if not group.ops or self.own(group.collection):
                    continue
                mode = self.mode_of(group.db, group.artifact, group.collection)
                if mode is None:
                    continue
                # a claim's result; absent before the transaction (the kernel asking
                # whether a single-op plan needs one), when it may yet change something
                returned = batch.found.get(group.name)
                ops: list[tuple[Op, Any]] = []
                for i, op in enumerate(group.ops):
                    doc = returned[i] if returned is not None and i < len(returned) else None
                    found_nothing = returned is not None and doc is None and not op.upsert
                    if op.kind in COMMAND_KINDS and found_nothing:
                        continue  # a claim that found nothing changed nothing
                    ops.append((op, doc))
                if not ops:
                    continue
                key = (
                    group.db, group.artifact, group.collection, mode, context.tenant_id,
                    context.thread_id, context.operation, recorded_principal(context.principal),
                    record_run(context),
                )  # fmt: skip
                entry = merged.get(key)
                if entry is None:
                    merged[key] = (context, group, mode, ops)
                else:
                    entry[3].extend(ops)
        for context, group, mode, ops in merged.values():
            stream = stream_of(
                context.tenant_id, context.thread_id, group.artifact, group.collection
            )
            for start in range(0, len(ops), OPS_PER_RECORD):
                if not build:
                    yield group.db, stream, {}
                    continue
                body = group_body(
                    context, group, ops[start : start + OPS_PER_RECORD], at=at,
                    txn=batch.transaction_id, mode=mode,
                )  # fmt: skip
                yield group.db, stream, body

    def _audits(self, group: Group) -> bool:
        return self.classes is None or group.artifact in self.classes

    def mode_of(self, db: str, artifact: str, collection: str | None = None) -> Mode | None:
        """The mode a write of class ``artifact`` (in ``collection``, for business) to
        ``db`` is recorded in; None: not recorded (left out of ``classes``, or ``off`` in
        the policy under ``policy`` mode). A class the policy does not know is recorded
        (in ``metadata`` at least): the audit fails towards recording."""
        if self.classes is not None and artifact not in self.classes:
            return None
        if self.policy is None:
            return self.mode  # type: ignore[return-value]  # metadata or full (checked)
        policy = self.policy(db)
        key = (id(policy), artifact, collection if artifact == "business" else None)
        hit = self._modes.get(key)
        if hit is not None and hit[0] is policy:
            return hit[1]
        cls = policy.of(artifact, collection)
        declared: str = cls.audit if cls is not None else "metadata"
        if self.mode != "policy" and _RANK[self.mode] > _RANK[declared]:
            declared = self.mode  # the explicit setting is a floor
        if artifact == ENCRYPTION_KEY.name and declared == "full":
            # a key's image is the key, wrapped under a master key that still unwraps it
            # after the key is destroyed: hashes only, so shredding leaves no copy here
            declared = "metadata"
        found: Mode | None = None if declared == "off" else declared  # type: ignore[assignment]
        if len(self._modes) > 4096:  # policy versions come and go: rebuilt when asked
            self._modes.clear()
        self._modes[key] = (policy, found)
        return found

    def _refusal_mode(self, db: str, artifact: str, collection: str) -> Mode:
        """A refusal is recorded whatever the class's mode (``metadata`` at least)."""
        return self.mode_of(db, artifact, collection) or "metadata"

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
                    refused = [(op, None) for op in group.ops]
                    for start in range(0, len(refused), OPS_PER_RECORD):
                        if not build:
                            yield note.db, stream, {}
                            continue
                        yield note.db, stream, group_body(
                            context, group, refused[start : start + OPS_PER_RECORD], at=at,
                            txn=txn, outcome="refused", reason=reason,
                            mode=self._refusal_mode(group.db, group.artifact, group.collection),
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
                    kind=read.kind, query=query, at=at, txn=txn, reason=reason,
                    mode=self._refusal_mode(read.db, read.artifact, read.collection),
                )  # fmt: skip
