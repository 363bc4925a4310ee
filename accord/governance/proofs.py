"""Proofs against digests: one record's inclusion, and one digest extending another.

**Inclusion** (:func:`prove`, checked by :func:`check_proof` without the database): a
record is in the history a digest committed to when

1. the record hashes to its ``hash`` (its canonical body, as the chain defines it);
2. every later record of its stream up to the stream's head at the digest links to it
   (each one's ``prev`` is the previous ``hash`` and each hashes to its own ``hash``;
   the proof carries their hashed bodies, images left out), ending at that head;
3. that head is a leaf of its tenant's tree (an RFC 6962 audit path), and the tenant's
   root a leaf of the digest's tree, whose root the digest holds;
4. the digest hashes to its ``hash`` and, when signed, its signature holds (by the key
   the verifier pins).

A forged or altered record fails at 1 or 2; a record that was never in the chain cannot
be linked to the head; a proof against a forged digest fails at 4 when the verifier
keeps the real digest (``--digest``) or pins the signing key.

**Extension** (:func:`check_extends`, on the live database): digest B extends digest A
when the stored digests from A to B link (each one's ``prev`` is the previous ``hash``),
the heads stored for A and for B hash to A's and B's roots, and for every stream of A
the record at A's head seq still has A's head hash and the chain from there links,
record by record, to B's head. Rewriting any record before A (even recomputing every
later hash and head) changes that record's or a later one's hash, so it fails. A stream
whose records at A's head were cut links from its cut on, and the cut must be justified
by the digests (:func:`~accord.governance.verify.unjustified_cuts`): removing young
records between A and B fails too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from bson import ObjectId
from bson.errors import InvalidId

from accord.errors import InvalidInputError
from accord.governance.audit_cuts import (
    all_cuts,
    enforced_audit_period,
    is_cut_record,
    latest_cuts,
)
from accord.governance.audit_records import RECORDS, chain_hash
from accord.governance.canonical import to_json
from accord.governance.digests import (
    DIGESTS,
    Head,
    HeadTree,
    digest_problem,
    external,
    heads_at,
    list_digests,
    root_via,
    stream_leaf,
    tenant_leaf,
)
from accord.governance.verify import ChainBreak, unjustified_cuts
from accord.platform.artifacts import AUDIT, AUDIT_DIGEST
from accord.platform.context import AUDITOR, Principal, ReadContext

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = ["PROOF_FORMAT", "ExtensionReport", "check_extends", "check_proof", "prove"]

PROOF_FORMAT = "accord-audit-proof"


def _reader() -> ReadContext:
    return ReadContext("*", principal=Principal.service(AUDITOR), operation="audit.prove")


def _hashed(record: Mapping[str, Any]) -> dict[str, Any]:
    """What a proof carries of a record: all but its images, as JSON."""
    out: dict[str, Any] = to_json({k: v for k, v in record.items() if k != "images"})
    return out


def _stored_digest(uow: Any, db: str, seq: int | None) -> dict[str, Any]:
    if seq is not None and not 1 <= seq < 2**63:  # beyond BSON's int64: no digest
        raise InvalidInputError(f"no audit digest {seq} in {db} (digests are numbered from 1)")
    where: dict[str, Any] = {} if seq is None else {"_id": seq}
    found = list(uow.find(_reader(), AUDIT_DIGEST.name, db, DIGESTS, where,
                          sort=[("_id", -1)], limit=1))  # fmt: skip
    if not found:
        raise InvalidInputError(
            f"no audit digest {seq} in {db}" if seq is not None
            else f"no audit digest in {db} yet: run `accord audit digest` first"
        )  # fmt: skip
    return found[0]


def prove(uow: Any, db: str, record_id: str, *, digest: int | None = None) -> dict[str, Any]:
    """The inclusion proof (module docstring) of record ``record_id`` (its ``_id``, 24
    hex digits) against digest ``digest`` (default the latest)."""
    try:
        oid = ObjectId(record_id)
    except (InvalidId, TypeError):
        raise InvalidInputError(
            f"{record_id!r} is not an audit record id (24 hex digits)"
        ) from None
    records = list(uow.find(_reader(), AUDIT.name, db, RECORDS, {"_id": oid}, limit=1))
    if not records:
        raise InvalidInputError(f"no audit record {record_id} in {db}")
    record = records[0]
    stored = _stored_digest(uow, db, digest)
    stream = record["stream"]
    heads = heads_at(uow, db, int(stored["seq"]))
    head = heads.get(stream)
    if head is None or head.seq < record["seq"]:
        raise InvalidInputError(
            f"record {record_id} (stream {stream}, seq {record['seq']}) is newer than digest "
            f"{stored['seq']}: take a digest (`accord audit digest`) and prove against it"
        )
    chain = [
        _hashed(r)
        for r in uow.iterate(
            _reader(), AUDIT.name, db, RECORDS,
            {"stream": stream, "seq": {"$gt": record["seq"], "$lte": head.seq}},
            sort=[("seq", 1)], batch_size=1000,
        )
    ]  # fmt: skip
    tree = HeadTree(heads)
    s_index, s_size, s_path = tree.stream_path(stream)
    t_index, t_size, t_path = tree.tenant_path(head.tenant)
    return {
        "format": PROOF_FORMAT, "record_id": str(oid), "record": _hashed(record),
        "chain": chain, "stream": stream, "head": {"seq": head.seq, "hash": head.hash},
        "tenant": head.tenant, "stream_index": s_index, "streams": s_size,
        "stream_path": s_path, "tenant_index": t_index, "tenants": t_size,
        "tenant_path": t_path, "digest": external(stored),
    }  # fmt: skip


def check_proof(
    proof: Mapping[str, Any],
    *,
    digest: Mapping[str, Any] | None = None,
    pinned: Ed25519PublicKey | None = None,
) -> str | None:
    """Why ``proof`` does not prove its record in its digest (``digest``: the digest the
    verifier kept, which the proof's must be; ``pinned``: the key it must be signed by),
    or None when it does. Needs no database."""
    try:
        return _proof_problem(proof, digest, pinned)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError,
            RecursionError) as exc:  # fmt: skip  # a seq of 1e400 is inf: int() overflows
        return f"the proof is malformed ({type(exc).__name__}: {exc})"


def _proof_problem(
    proof: Mapping[str, Any], kept: Mapping[str, Any] | None, pinned: Ed25519PublicKey | None
) -> str | None:
    if proof.get("format") != PROOF_FORMAT:
        return f"not an accord audit proof (format {proof.get('format')!r})"
    digest = proof["digest"]
    if kept is not None and (kept.get("hash"), kept.get("seq")) != (digest["hash"], digest["seq"]):
        return (f"the proof is against digest {digest['seq']} {digest['hash'][:12]}..., not the "
                f"digest kept ({kept.get('seq')} {str(kept.get('hash'))[:12]}...)")  # fmt: skip
    problem = digest_problem(kept or digest, pinned)
    if problem:
        return problem
    stream, record = proof["stream"], proof["record"]
    # the _id is outside the hash: a proof naming one record while carrying another
    # would otherwise hold, for the record it names
    carried, named = record.get("_id"), str(proof.get("record_id")).lower()
    if not isinstance(carried, Mapping) or str(carried.get("$oid")).lower() != named:
        return (f"the proof is for record {proof.get('record_id')!r} but carries record "
                f"{carried.get('$oid') if isinstance(carried, Mapping) else carried!r}")  # fmt: skip
    if record.get("stream") != stream:
        return f"the record is of stream {record.get('stream')}, not {stream}"
    if chain_hash(record) != record.get("hash"):
        return f"the record (seq {record.get('seq')}) does not hash to its hash: it was altered"
    last = record
    for link in proof["chain"]:
        if link.get("stream") != stream or link.get("seq") != last["seq"] + 1:
            return f"the chain skips or reorders records after seq {last['seq']}"
        if link.get("prev") != last["hash"]:
            return f"seq {link['seq']} does not link to seq {last['seq']} (its prev differs)"
        if chain_hash(link) != link.get("hash"):
            return f"seq {link['seq']} of the chain does not hash to its hash"
        last = link
    head = proof["head"]
    if (last["seq"], last["hash"]) != (head["seq"], head["hash"]):
        return f"the chain ends at seq {last['seq']}, not at the head the digest holds"
    tenant = proof["tenant"]
    if record.get("tenant_id") != tenant:
        return f"the record is tenant {record.get('tenant_id')!r}'s, not {tenant!r}'s"
    leaf = stream_leaf(stream, Head(tenant, int(head["seq"]), str(head["hash"])))
    tenant_root = root_via(proof["stream_index"], proof["streams"], leaf, proof["stream_path"])
    if tenant_root is None:
        return "the stream's audit path is malformed"
    top = tenant_leaf(tenant, tenant_root, int(proof["streams"]))
    found = root_via(proof["tenant_index"], proof["tenants"], top, proof["tenant_path"])
    if found != (kept or digest)["root"]:
        return "the stream's head is not in the digest's Merkle tree (the root differs)"
    return None


@dataclass
class ExtensionReport:
    """What :func:`check_extends` found: ``ok`` when digest ``to`` extends ``start``."""

    start: int
    to: int
    streams: int = 0
    problems: list[ChainBreak] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "from": self.start, "to": self.to, "streams": self.streams,
                "problems": [asdict(p) for p in self.problems]}  # fmt: skip


def check_extends(
    uow: Any,
    db: str,
    start: Mapping[str, Any],
    to: Mapping[str, Any],
    *,
    pinned: Ed25519PublicKey | None = None,
    audit_period: timedelta | None = None,
    now: datetime | None = None,
) -> ExtensionReport:
    """Whether digest ``to`` extends digest ``start`` (module docstring), both as kept
    outside the database (or as stored), on ``db``'s records. A stream whose records at
    ``start``'s head were cut extends only when its cuts are justified by the digests
    (:func:`~.verify.unjustified_cuts`) against ``audit_period`` (default the audit
    class's period of the policy ``uow`` enforces on ``db``) at ``now`` (default the
    clock)."""
    report = ExtensionReport(int(start["seq"]), int(to["seq"]))

    def fail(problem: str, stream: str = "", seq: int | None = None,
             expected: Any = None, found: Any = None) -> ExtensionReport:  # fmt: skip
        report.problems.append(ChainBreak(stream, seq, problem, expected, found))
        return report

    for d in (start, to):
        problem = digest_problem(d, pinned)
        if problem:
            return fail(problem)
    if report.start > report.to:
        return fail(f"digest {report.start} is later than digest {report.to}")
    stored = list_digests(uow, db, upto=report.to)
    by_seq = {int(d["seq"]): d for d in stored}
    for d in (start, to):
        mine = by_seq.get(int(d["seq"]))
        if mine is None or mine["hash"] != d["hash"]:
            return fail(f"the database's digest {d['seq']} is not the digest given (it was "
                        f"rewritten or removed)", expected=d["hash"],
                        found=mine and mine["hash"])  # fmt: skip
    for n in range(report.start + 1, report.to + 1):
        here, before = by_seq.get(n), by_seq.get(n - 1)
        if here is None or before is None or here["prev"] != before["hash"]:
            return fail(f"digest {n} does not link to digest {n - 1}")
    heads = {}
    for d in (start, to):
        heads[int(d["seq"])] = found = heads_at(uow, db, int(d["seq"]))
        if HeadTree(found).root != d["root"]:
            return fail(f"the heads stored for digest {d['seq']} are not the ones its root "
                        f"commits to (rewritten)", expected=d["root"],
                        found=HeadTree(found).root)  # fmt: skip
    before_heads, after_heads = heads[report.start], heads[report.to]
    chains = all_cuts(uow, db, context=_reader())
    cuts = {s: c[-1] for s, c in chains.items()}
    relied: list[str] = []  # streams whose extension rests on a cut
    recorded_at: dict[tuple[str, str], int] = {}  # (stream, cut id) -> its record's seq
    for stream, a in sorted(before_heads.items()):
        report.streams += 1
        b = after_heads.get(stream)
        if b is None or b.seq < a.seq:
            fail("the stream's head moved back between the digests", stream, a.seq,
                 a.seq, b and b.seq)  # fmt: skip
            continue
        cut = cuts.get(stream)
        if cut is not None and _cut_seq(cut) is None:
            fail("the stream's audit cut is malformed (altered)", stream, a.seq, "a seq",
                 cut.get("seq"))  # fmt: skip
            continue
        if cut is not None and a.seq <= int(cut["seq"]):
            if a.seq == int(cut["seq"]) and a.hash != cut.get("hash"):
                fail("the audit cut of the stream does not hold the hash the earlier digest "
                     "holds at its seq", stream, a.seq, a.hash, cut.get("hash"))  # fmt: skip
                continue
            # the records up to the cut are gone: the segment links from the cut on
            if _check_segment(uow, db, stream, a, b, report, recorded_at,
                              after=(int(cut["seq"]), str(cut.get("hash")))):  # fmt: skip
                relied.append(stream)
            continue
        _check_segment(uow, db, stream, a, b, report, recorded_at)
    if relied:
        # A cut removed records the earlier digest committed: only expired ones may go.
        period = audit_period if audit_period is not None else enforced_audit_period(uow, db)
        report.problems.extend(unjustified_cuts(
            uow, db, {s: chains[s] for s in relied}, recorded_at, period,
            now or datetime.now(UTC), pinned,
        ))  # fmt: skip
    return report


def _cut_seq(cut: Mapping[str, Any]) -> int | None:
    """The seq a cut ends at, or None when it holds none (written past the validator:
    ``int()`` of it raised a traceback)."""
    seq = cut.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def _check_segment(
    uow: Any, db: str, stream: str, a: Head, b: Head, report: ExtensionReport,
    recorded_at: dict[tuple[str, str], int], *, after: tuple[int, str] | None = None,
) -> bool:  # fmt: skip
    """Whether the records of ``stream`` from ``a.seq`` to ``b.seq`` link from ``a`` to
    ``b`` (from the stream's cut ``after`` (seq, hash) when ``a``'s record was cut); a
    problem is added to ``report`` when not. The seq of each cut's own record read on
    the way goes into ``recorded_at``."""
    expected_seq, last_hash = a.seq, None
    if after is not None:
        expected_seq, last_hash = after[0] + 1, after[1]
    for r in uow.iterate(
        _reader(), AUDIT.name, db, RECORDS, {"stream": stream, "seq": {"$gte": expected_seq,
                                                                       "$lte": b.seq}},
        sort=[("seq", 1)], batch_size=1000,
    ):  # fmt: skip
        seq = r.get("seq")
        if seq != expected_seq:
            report.problems.append(ChainBreak(stream, expected_seq, "a record is missing, "
                                              "inserted or reordered", expected_seq, seq))  # fmt: skip
            return False
        computed = chain_hash(r)
        if seq == a.seq and after is None:
            if r.get("hash") != a.hash or computed != a.hash:
                report.problems.append(ChainBreak(
                    stream, seq, "the record the earlier digest holds as this stream's head "
                    "was rewritten", a.hash, computed,
                ))  # fmt: skip
                return False
        elif r.get("prev") != last_hash or computed != r.get("hash"):
            report.problems.append(ChainBreak(stream, seq, "the chain breaks after the earlier "
                                              "digest", last_hash, r.get("prev")))  # fmt: skip
            return False
        if is_cut_record(r):
            for op in r.get("ops") or ():
                if isinstance(op, Mapping) and op.get("op") == "insert":
                    recorded_at.setdefault((stream, str(op.get("doc_id"))), seq)
        last_hash, expected_seq = computed, expected_seq + 1
    if expected_seq != b.seq + 1 or last_hash != b.hash:
        report.problems.append(ChainBreak(stream, expected_seq, "the chain does not reach the "
                                          "later digest's head", b.hash, last_hash))  # fmt: skip
        return False
    return True


def check_live_against(
    uow: Any, db: str, digest: Mapping[str, Any], *, pinned: Ed25519PublicKey | None = None
) -> list[ChainBreak]:
    """Whether ``db``'s chains still hold the history ``digest`` (kept outside) committed
    to: the stored digest of its number is it, the heads stored for it rebuild its root,
    and each of those heads is still a record of its stream with that hash, at or before
    the stream's current head. With :func:`~.verify.verify_chain` (every chain links up
    to its head), this proves the live chains extend the digest: a tail removed with its
    head moved back, or a history rewritten with every later hash and head recomputed,
    fails here."""
    problem = digest_problem(digest, pinned)
    if problem:
        return [ChainBreak("", None, problem, None, None)]
    seq = int(digest["seq"])
    stored = [d for d in list_digests(uow, db, upto=seq) if int(d["seq"]) == seq]
    if not stored or stored[0]["hash"] != digest["hash"]:
        return [ChainBreak("", None, f"the database's digest {seq} is not the digest given "
                           "(rewritten or removed)", digest["hash"],
                           stored[0]["hash"] if stored else None)]  # fmt: skip
    heads = heads_at(uow, db, seq)
    if HeadTree(heads).root != digest["root"]:
        return [ChainBreak("", None, f"the heads stored for digest {seq} are not the ones its "
                           "root commits to (rewritten)", digest["root"], HeadTree(heads).root)]  # fmt: skip
    found: list[ChainBreak] = []
    cuts = latest_cuts(uow, db, context=_reader())
    for stream, head in sorted(heads.items()):
        cut = cuts.get(stream)
        if cut is not None and _cut_seq(cut) is None:
            found.append(ChainBreak(stream, head.seq, "the stream's audit cut is malformed "
                                    "(altered)", "a seq", cut.get("seq")))  # fmt: skip
            continue
        if cut is not None and head.seq <= int(cut["seq"]):
            # the records it held are cut: the cut names the last one's hash
            if head.seq == int(cut["seq"]) and head.hash != cut.get("hash"):
                found.append(ChainBreak(stream, head.seq, f"the audit cut of the stream does "
                                        f"not hold the hash digest {seq} holds at its seq",
                                        head.hash, cut.get("hash")))  # fmt: skip
            continue  # older than the cut: verify_chain checks the chain from the cut
        records = list(uow.find(_reader(), AUDIT.name, db, RECORDS,
                                {"stream": stream, "seq": head.seq}, limit=2))  # fmt: skip
        hashes = [chain_hash(r) for r in records]
        if hashes != [head.hash]:
            what = (
                "is missing (removed)"
                if not records
                else "was rewritten"
                if len(records) == 1
                else "appears twice (one is forged)"
            )
            found.append(ChainBreak(stream, head.seq, f"the record digest {seq} holds as this "
                                    f"stream's head {what}", head.hash, hashes or None))  # fmt: skip
    return found
