"""Verifying the audit chains: recompute every stream and name the first break.

:func:`verify_chain` reads a database's audit records (through the kernel, as the
``auditor`` service) stream by stream in ``seq`` order and checks, for each record:

- its ``seq`` follows the previous one (1 first): a deleted record is a gap, an inserted
  or reordered one a ``seq`` out of place;
- its ``prev`` is the previous record's ``hash`` (:data:`~.audit_records.GENESIS` first);
- its ``hash`` is the SHA-256 of its canonical body (:func:`~.audit_records.chain_hash`):
  any changed field (principal, time, document id, a hash of what was written) shows;
- in ``full`` mode, each image it keeps hashes to the hash the chain covers;

and, at the end of each stream, that the stream's head (the heads collection) names its
last record: a removed tail shows. Each stream is reported at its first break (later
records of a broken stream prove nothing more); the other streams are still checked.

What this proves and what it does not: a change to any record, made by anyone who did not
also recompute every later hash of its stream AND its head, is found. Someone who can
write the database (an administrator) can rewrite a whole stream consistently; only
digests kept outside the database (Governance II's digests) detect that.

:class:`ChainChecker` is the check itself, fed documents in order: use it on records read
any other way (an async client, an export).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from accord.governance.audit_cuts import (
    all_cuts,
    commits_of,
    cut_problems,
    enforced_audit_period,
    image_hash,
    is_cut_record,
    justify_cut,
    when,
)
from accord.governance.audit_records import (
    GENESIS,
    HEADS,
    IMAGE_FIELDS,
    RECORDS,
    UNHASHED,
    chain_hash,
)
from accord.governance.canonical import READ_CODEC, canonical_read
from accord.governance.digests import digest_problem, head_changes, heads_hold, list_digests
from accord.platform.artifacts import AUDIT
from accord.platform.context import AUDITOR, Principal, ReadContext

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "AuditReport", "ChainBreak", "ChainChecker", "read_chain_hash", "unjustified_cuts",
    "verify_chain",
]  # fmt: skip


@dataclass(frozen=True)
class ChainBreak:
    """The first record of ``stream`` that does not verify: ``problem`` says what, with
    the value the chain expected and the value found."""

    stream: str
    seq: int | None
    problem: str
    expected: Any
    found: Any

    def describe(self) -> str:
        if not self.stream:  # about a digest, not one stream
            return self.problem
        at = f"seq {self.seq}" if self.seq is not None else "its head"
        text = f"stream {self.stream} breaks at {at}: {self.problem}"
        if self.expected is None and self.found is None:  # the problem says it all
            return text
        return f"{text} (expected {self.expected!r}, found {self.found!r})"


@dataclass
class AuditReport:
    """What :func:`verify_chain` found: counts, and one :class:`ChainBreak` per broken
    stream (``ok`` when there is none)."""

    streams: int = 0
    records: int = 0
    breaks: list[ChainBreak] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.breaks

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "streams": self.streams, "records": self.records,
            "breaks": [asdict(b) for b in self.breaks],
        }  # fmt: skip


class ChainChecker:
    """Checks records fed in (stream, seq) order (module docstring), then the heads."""

    def __init__(
        self,
        starts: Mapping[str, tuple[int, str]] | None = None,
        *,
        hash_of: Callable[[Mapping[str, Any]], str] = chain_hash,
    ) -> None:
        """``starts``: per stream, the (seq, hash) its first fed record follows, for
        records that do not start at seq 1 (an export from a date); default (0,
        :data:`~.audit_records.GENESIS`). ``hash_of``: how a record's hash is
        recomputed (:func:`~.audit_records.chain_hash`, or the same bytes faster for
        records read with their doubles marked: the export verifier's)."""
        self.starts = starts or {}
        self._hash_of = hash_of
        self.report = AuditReport()
        self._stream: str | None = None
        self._seq = 0
        self._hash = GENESIS
        self._broken: set[str] = set()
        self._last: dict[str, tuple[int, str]] = {}
        self._met: set[str] = set()  # every stream fed so far

    def feed(self, record: Mapping[str, Any]) -> None:
        """Check the next record."""
        stream = str(record.get("stream"))
        seq = record.get("seq")
        self.report.records += 1
        if stream != self._stream:
            self._stream = stream
            if stream in self._met:
                # restarting it would let a stream's records be repeated (or split) later
                if stream not in self._broken:
                    self._fail(ChainBreak(
                        stream, seq if _is_int(seq) else None, "the stream's records appear "
                        "again after another stream's (repeated or out of order)", None, seq,
                    ))  # fmt: skip
                return
            self._met.add(stream)
            self._seq, self._hash = self.starts.get(stream, (0, GENESIS))
            self.report.streams += 1
        if stream in self._broken:
            return
        try:
            problem = self._problem(record, stream, seq)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            # a record of a shape no writer makes: this stream's break, not the whole check's
            problem = ChainBreak(stream, seq if _is_int(seq) else None, "the record cannot be "
                                 f"checked ({type(exc).__name__}: {exc}): altered", None, None)  # fmt: skip
        if problem is not None:
            self._fail(problem)
            return
        self._seq, self._hash = int(seq), str(record["hash"])  # type: ignore[arg-type]
        self._last[stream] = (self._seq, self._hash)

    def _fail(self, problem: ChainBreak) -> None:
        self._broken.add(problem.stream)
        self.report.breaks.append(problem)

    def _problem(self, record: Mapping[str, Any], stream: str, seq: Any) -> ChainBreak | None:
        expected_seq = self._seq + 1
        if not _is_int(seq) or seq != expected_seq:
            what = "a record is missing" if _is_int(seq) and seq > expected_seq else (
                "a record is out of place (inserted or reordered)"
            )  # fmt: skip
            return ChainBreak(stream, expected_seq, what, expected_seq, seq)
        if record.get("prev") != self._hash:
            return ChainBreak(stream, seq, "its prev is not the previous record's hash",
                              self._hash, record.get("prev"))  # fmt: skip
        computed = self._hash_of(record)
        if record.get("hash") != computed:
            return ChainBreak(stream, seq, "its content does not hash to its hash (altered)",
                              computed, record.get("hash"))  # fmt: skip
        ops = record.get("ops")
        ops = ops if isinstance(ops, list) else []
        kept = record.get("images")
        if kept is not None and not isinstance(kept, list):  # outside the hash: any value
            return ChainBreak(stream, seq, "its images are not a list (altered)", "a list",
                              type(kept).__name__)  # fmt: skip
        for i, images in enumerate(kept or []):
            entry = ops[i] if i < len(ops) and isinstance(ops[i], Mapping) else {}
            for name in IMAGE_FIELDS:
                text = images.get(name) if isinstance(images, Mapping) else None
                if text is None:
                    continue
                found = hashlib.sha256(str(text).encode()).hexdigest()
                if found != entry.get(f"{name}_hash"):
                    return ChainBreak(
                        stream, seq, f"the {name} image of its op {i} does not hash to its "
                        f"{name}_hash", entry.get(f"{name}_hash"), found,
                    )  # fmt: skip
        return None

    def last(self, stream: str) -> tuple[int, str] | None:
        """The (seq, hash) of ``stream``'s last record that verified, if any."""
        return self._last.get(stream)

    def broken(self, stream: str) -> bool:
        """Whether ``stream`` broke (its first break is in the report)."""
        return stream in self._broken

    def heads(self, heads: Iterable[Mapping[str, Any]]) -> None:
        """Check every stream's head against its last record (and that every stream whose
        records were fed has a head)."""
        seen: set[str] = set()
        for head in heads:
            stream = str(head.get("_id"))
            seen.add(stream)
            if stream in self._broken:
                continue
            last = self._last.get(stream, (0, GENESIS))
            found = (head.get("seq") or 0, head.get("hash") or GENESIS)
            if not _is_int(found[0]) or not isinstance(found[1], str):
                self._fail(ChainBreak(stream, None, "its head is malformed (altered)", last,
                                      found))  # fmt: skip
                continue
            if found != last:
                self._broken.add(stream)
                # the first record missing from the end, or the first one past the head
                first = min(last[0], int(found[0])) + 1
                self.report.breaks.append(ChainBreak(
                    stream, first, "the head does not name the last record (records were "
                    "removed from its end, or forged after it)", last, found,
                ))  # fmt: skip
        for stream in sorted(set(self._last) - seen - self._broken):
            self.report.breaks.append(ChainBreak(
                stream, None, "the stream has no head", self._last[stream], None
            ))  # fmt: skip


def _is_int(value: Any) -> bool:
    """An integer, not a bool (JSON's true is no seq)."""
    return isinstance(value, int) and not isinstance(value, bool)


def read_chain_hash(record: Mapping[str, Any]) -> str:
    """:func:`~.audit_records.chain_hash` of a record read with its doubles marked
    (:data:`~.canonical.READ_CODEC`, or ``json`` with ``parse_float=Double``): the same
    hash, through :func:`~.canonical.canonical_read`."""
    body = dict(record)
    for name in UNHASHED:
        body.pop(name, None)
    return hashlib.sha256(canonical_read(body)).hexdigest()


def verify_chain(
    uow: Any,
    db_name: str,
    *,
    tenant: str | None = None,
    records: str = RECORDS,
    heads: str = HEADS,
    principal: Principal | None = None,
    audit_period: timedelta | None = None,
    now: datetime | None = None,
    pinned: Ed25519PublicKey | None = None,
) -> AuditReport:
    """Verify every audit stream of database ``db_name`` (only ``tenant``'s, when given)
    through ``uow`` (a sync kernel), reading as ``principal`` (default the ``auditor``
    service). Each audit cut must be justified by the digests
    (:func:`~.audit_cuts.justify_cut`) against ``audit_period`` (default the audit
    class's period of the policy ``uow`` enforces on the database) at ``now`` (default
    the clock); with ``pinned``, only digests signed by that key count. Returns the
    report; nothing is written."""
    context = ReadContext(
        tenant or "*", principal=principal or Principal.service(AUDITOR),
        operation="audit.verify",
    )  # fmt: skip
    where: dict[str, Any] = {} if tenant is None else {"tenant_id": tenant}
    cuts = all_cuts(uow, db_name, tenant=tenant, context=context)
    starts: dict[str, tuple[int, str]] = {}
    broken_cuts: list[ChainBreak] = []
    for stream, chain in cuts.items():
        problem = cut_problems(stream, chain)
        if problem is not None:
            broken_cuts.append(ChainBreak(stream, *problem))
        seq = chain[-1].get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            starts[stream] = (seq, str(chain[-1].get("hash")))
        # else its chain breaks where its records start (int() of it raised)
    checker = ChainChecker(starts, hash_of=read_chain_hash)
    recorded: dict[tuple[str, str], set[Any]] = {}  # (stream, cut id) -> image hashes recorded
    recorded_at: dict[tuple[str, str], int] = {}  # (stream, cut id) -> seq of its record
    for batch in uow.iterate_batches(
        context, AUDIT.name, db_name, records, where, sort=[("stream", 1), ("seq", 1)],
        batch_size=1000, codec_options=READ_CODEC,
    ):  # fmt: skip
        for record in batch:
            checker.feed(record)
            if is_cut_record(record):
                for op in record.get("ops") or ():
                    if isinstance(op, Mapping) and op.get("op") == "insert":
                        key = (str(record.get("stream")), str(op.get("doc_id")))
                        recorded.setdefault(key, set()).add(op.get("image_hash"))
                        recorded_at.setdefault(key, int(record["seq"]))
    head_docs = uow.find(context, AUDIT.name, db_name, heads, where)
    checker.heads(head_docs)
    for b in broken_cuts:
        if not checker.broken(b.stream):
            checker.report.breaks.append(b)
    for stream, chain in cuts.items():
        latest = chain[-1]
        if checker.broken(stream) or any(b.stream == stream for b in broken_cuts):
            continue
        if not _is_int(latest.get("seq")):
            continue  # (its chain broke where the records start)
        if image_hash(latest) not in recorded.get((stream, str(latest.get("_id"))), set()):
            checker.report.breaks.append(ChainBreak(
                stream, latest["seq"], "the stream's latest audit cut is not "
                "the one its chain recorded (forged or altered)", image_hash(latest),
                sorted(h for h in recorded.get((stream, str(latest.get("_id"))), ()) if h),
            ))  # fmt: skip
    broken = {b.stream for b in checker.report.breaks}
    justify = {s: c for s, c in cuts.items() if s not in broken}
    if justify:
        period = audit_period if audit_period is not None else enforced_audit_period(uow, db_name)
        checker.report.breaks.extend(unjustified_cuts(
            uow, db_name, justify, recorded_at, period, now or datetime.now(UTC), pinned
        ))  # fmt: skip
    return checker.report


def unjustified_cuts(
    uow: Any, db: str, cuts: Mapping[str, list[dict[str, Any]]],
    recorded_at: Mapping[tuple[str, str], int], period: timedelta | None, now: datetime,
    pinned: Ed25519PublicKey | None,
) -> list[ChainBreak]:  # fmt: skip
    """The first cut of each stream of ``cuts`` (stream -> its cuts in ``n`` order, on
    verified chains) the digests do not justify (:func:`~.audit_cuts.justify_cut`, with
    the audit ``period`` expected, None: records are kept forever, so any cut is one).
    ``recorded_at``: (stream, cut id) -> the seq of the cut's own record, where known
    (else the stream's latest cut bounds it). The digests that count: those that hold
    (hashed, signed by ``pinned``); the heads stored for the ones a verdict rests on must
    rebuild their roots."""
    if period is None:
        return [ChainBreak(s, c[0].get("seq"), f"audit cut 1 of stream {s} removed records, "
                           "but the policy keeps audit records forever (no period: pass the "
                           "one expected, --audit-period)", None, None)
                for s, c in sorted(cuts.items())]  # fmt: skip
    digests = {int(d["seq"]): d for d in list_digests(uow, db) if digest_problem(d, pinned) is None}
    timed = [(n, at) for n, d in sorted(digests.items()) if (at := when(d.get("at")))]
    numbers = [n for n, _ in timed]
    changes = head_changes(uow, db, cuts)
    holds: dict[int, bool] = {}  # digest -> whether its stored heads rebuild its root

    def rewritten(n: int | None) -> bool:
        if n is None or n not in digests:
            return False
        if n not in holds:
            holds[n] = heads_hold(uow, db, digests[n])
        return not holds[n]

    found: list[ChainBreak] = []
    for stream, chain in sorted(cuts.items()):
        commits = commits_of(changes.get(stream, []), timed)
        latest = int(chain[-1]["seq"])
        for cut in chain:
            # the seq of its record; one cut since (its record gone) says: at most latest
            by = recorded_at.get((stream, str(cut.get("_id"))), latest)
            verdict = justify_cut(cut, commits, recorded_by=by, now=now, min_period=period)
            before = _before(numbers, verdict.covering)
            problem = verdict.problem
            if problem is None and (rewritten(verdict.witness) or rewritten(before)):
                problem = (f"audit cut {cut.get('n')} of stream {stream} rests on digests whose "
                           "stored heads do not rebuild their roots (rewritten)")  # fmt: skip
            if problem is not None:
                found.append(ChainBreak(stream, cut.get("seq"), problem, None, None))
                break
    return found


def _before(numbers: list[int], covering: int | None) -> int | None:
    """The digest that counts (of ``numbers``, ascending) just before ``covering`` (the
    last when None): its heads show the cut's record was not held earlier."""
    i = len(numbers) if covering is None else bisect_left(numbers, covering)
    return numbers[i - 1] if i > 0 else None
