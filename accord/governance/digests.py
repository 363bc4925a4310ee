"""Digests of the audit chains: a Merkle root over every stream's head, numbered and
chained, optionally signed, meant to be kept outside the database.

**What a digest commits to.** The heads (``seq``, ``hash``) of every audit stream of the
database, as read when it is taken, in a two-level RFC 6962 tree
(:mod:`accord.governance.merkle`): per tenant, a tree over its streams' leaves
(``{"stream", "seq", "hash"}``, sorted by stream); above, a tree over the tenants' leaves
(``{"tenant", "root", "streams"}``, sorted by tenant). The two levels let one tenant's
export prove its streams complete against the database's root while showing nothing of
the other tenants but hashes.

**Body** (RFC 8785-hashed, signed): ``v``, ``seq`` (1, 2, ...), ``prev`` (the previous
digest's ``hash``; :data:`~.audit_records.GENESIS` first), ``at`` (ISO 8601 UTC text),
``db``, ``root``, ``tenants``, ``streams``, ``records`` (the sum of the head seqs). Its
``hash`` is SHA-256 of the body's RFC 8785 bytes; its ``signature`` (optional,
:mod:`accord.governance.signing`) signs the body.

**Where it lives.** In the database, ``accord_audit_digests`` (``_id`` = ``seq``: a
concurrent second digest of one seq fails on the key) and, in
``accord_audit_digest_heads``, the heads that changed since the previous digest (one
document per stream and digest): the heads at digest n are, per stream, the latest such
document at or before n. Both are of the ``audit_digest`` class: the policy grants
``find`` and ``insert`` only, and the audit hook refuses any other write to them. And
outside it: ``accord audit digest --out FILE`` writes the digest as JSON (the form
:func:`external` returns), to keep where the database's administrators cannot write.

Heads are read one by one, not in one snapshot: each is a committed head of its
stream, so the digest commits to a real state of every chain, if not to one instant.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pymongo import IndexModel

from accord.errors import InvalidInputError
from accord.governance.audit_records import GENESIS, HEADS
from accord.governance.canonical import canonical
from accord.governance.merkle import inclusion_path, leaf_hash, root, root_from_path
from accord.platform.artifacts import AUDIT, AUDIT_DIGEST
from accord.platform.context import AUDITOR, Principal, ReadContext, WriteContext
from accord.platform.plan import Group, Op, Plan

if TYPE_CHECKING:  # cryptography is imported when a digest is signed or checked
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

__all__ = [
    "DIGESTS", "DIGEST_ACTION", "DIGEST_HEADS", "DIGEST_HEAD_INDEXES", "DIGEST_INDEXES",
    "DIGEST_VALIDATOR",
    "FORMAT_NAME", "Head", "HeadTree", "body_of", "digest_hash", "digest_problem",
    "digest_time", "external", "head_changes", "heads_at", "heads_hold", "list_digests", "read_heads",
    "write_digest",
]  # fmt: skip

DIGESTS = "accord_audit_digests"
DIGEST_HEADS = "accord_audit_digest_heads"
DIGEST_ACTION = "audit.digest"
#: ``format`` of a digest kept outside the database (:func:`external`).
FORMAT_NAME = "accord-audit-digest"
BODY_FIELDS = ("v", "seq", "prev", "at", "db", "root", "tenants", "streams", "records")

_HEX64 = {"bsonType": "string", "pattern": "^[0-9a-f]{64}$"}
_COUNT = {"bsonType": ["int", "long"], "minimum": 0}
DIGEST_VALIDATOR: dict[str, Any] = {
    "$jsonSchema": {
        "bsonType": "object",
        "required": ["_id", *BODY_FIELDS, "hash"],
        "properties": {
            "_id": {"bsonType": ["int", "long"], "minimum": 1},
            "seq": {"bsonType": ["int", "long"], "minimum": 1},
            "prev": _HEX64, "root": _HEX64, "hash": _HEX64,
            "at": {"bsonType": "string"}, "db": {"bsonType": "string"},
            "tenants": _COUNT, "streams": _COUNT, "records": _COUNT,
            "signature": {"bsonType": "object"},
        },
    }
}  # fmt: skip
DIGEST_HEAD_VALIDATOR: dict[str, Any] = {
    "$jsonSchema": {
        "bsonType": "object",
        "required": ["digest", "stream", "tenant_id", "seq", "hash"],
        "properties": {
            "digest": {"bsonType": ["int", "long"], "minimum": 1},
            "stream": {"bsonType": "string"}, "tenant_id": {"bsonType": "string"},
            "seq": _COUNT, "hash": _HEX64,
        },
    }
}  # fmt: skip
#: a cut's transaction reads the newest digests taken before a time (audit_cuts.py)
DIGEST_INDEXES = [IndexModel([("at", -1)], name="at")]
DIGEST_HEAD_INDEXES = [
    IndexModel([("stream", 1), ("digest", 1)], name="stream_digest", unique=True),
    # a cut's transaction: the first digest that committed a stream at or past a seq
    IndexModel([("stream", 1), ("seq", 1), ("digest", 1)], name="stream_seq"),
    IndexModel([("tenant_id", 1), ("digest", 1)], name="tenant_digest"),
]


@dataclass(frozen=True)
class Head:
    """A stream's head: its tenant, last ``seq`` and that record's ``hash``."""

    tenant: str
    seq: int
    hash: str


def stream_leaf(stream: str, head: Head) -> bytes:
    return leaf_hash(canonical({"stream": stream, "seq": head.seq, "hash": head.hash}))


def tenant_leaf(tenant: str, tenant_root: str, streams: int) -> bytes:
    return leaf_hash(canonical({"tenant": tenant, "root": tenant_root, "streams": streams}))


class HeadTree:
    """The two-level tree over ``heads`` (stream -> :class:`Head`), module docstring."""

    def __init__(self, heads: Mapping[str, Head]) -> None:
        self.heads = dict(heads)
        by_tenant: dict[str, list[str]] = {}
        for stream in sorted(self.heads):
            by_tenant.setdefault(self.heads[stream].tenant, []).append(stream)
        self.tenants = sorted(by_tenant)
        self.streams_of = by_tenant
        self._leaves = {
            t: [stream_leaf(s, self.heads[s]) for s in streams] for t, streams in by_tenant.items()
        }
        self.tenant_roots = {t: root(leaves).hex() for t, leaves in self._leaves.items()}
        self._top = [tenant_leaf(t, self.tenant_roots[t], len(by_tenant[t])) for t in self.tenants]
        self.root = root(self._top).hex()

    def stream_path(self, stream: str) -> tuple[int, int, list[str]]:
        """(index, size, path) of ``stream``'s leaf in its tenant's tree."""
        tenant = self.heads[stream].tenant
        index = self.streams_of[tenant].index(stream)
        leaves = self._leaves[tenant]
        return index, len(leaves), [p.hex() for p in inclusion_path(index, leaves)]

    def tenant_path(self, tenant: str) -> tuple[int, int, list[str]]:
        """(index, size, path) of ``tenant``'s leaf in the top tree."""
        index = self.tenants.index(tenant)
        return index, len(self._top), [p.hex() for p in inclusion_path(index, self._top)]


def tenant_root_from(heads: Sequence[tuple[str, int, str]]) -> str:
    """A tenant's root from its stream heads ((stream, seq, hash), any order)."""
    leaves = [stream_leaf(s, Head("", seq, h)) for s, seq, h in sorted(heads)]
    return root(leaves).hex()


def root_via(index: int, size: int, leaf: bytes, path: Sequence[str]) -> str | None:
    try:
        found = root_from_path(index, size, leaf, [bytes.fromhex(p) for p in path])
    except ValueError:
        return None
    return None if found is None else found.hex()


def body_of(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A digest's signed body, from a stored or external digest."""
    return {k: doc[k] for k in BODY_FIELDS if k in doc}


def digest_time(at: datetime) -> str:
    """A digest's ``at``: ISO 8601 UTC text to the millisecond (one width, so that two
    compare as text as they do as times: a query on ``at`` needs no parse)."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def digest_hash(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(body_of(body))).hexdigest()


def external(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The digest ``doc`` as kept outside the database (JSON)."""
    out: dict[str, Any] = {"format": FORMAT_NAME, **body_of(doc), "hash": doc["hash"]}
    if doc.get("signature"):
        out["signature"] = dict(doc["signature"])
    return out


def digest_problem(digest: Mapping[str, Any], pinned: Ed25519PublicKey | None = None) -> str | None:
    """Why ``digest`` (stored or external) is not self-consistent: its hash, its
    signature (required when a key is ``pinned``); None when it is."""
    missing = [k for k in BODY_FIELDS if k not in digest]
    if missing:
        return f"digest {digest.get('seq')!r} lacks {', '.join(missing)}"
    if digest_hash(digest) != digest.get("hash"):
        return f"digest {digest['seq']}'s content does not hash to its hash (altered)"
    from accord.governance.signing import signature_problem

    signature = digest.get("signature")
    if signature:
        problem = signature_problem(body_of(digest), signature, pinned)
        if problem:
            return f"digest {digest['seq']}: {problem}"
    elif pinned is not None:
        return f"digest {digest['seq']} is not signed, and a public key was pinned"
    return None


# --- the database side --------------------------------------------------------------


def _reader(tenant: str | None = None) -> ReadContext:
    return ReadContext(
        tenant or "*", principal=Principal.service(AUDITOR), operation="audit.digest.read"
    )


def read_heads(uow: Any, db: str, *, heads: str = HEADS) -> dict[str, Head]:
    """Every stream's current head in ``db``."""
    found: dict[str, Head] = {}
    for doc in uow.iterate(_reader(), AUDIT.name, db, heads, {}, batch_size=1000):
        if doc.get("seq"):
            found[str(doc["_id"])] = Head(str(doc.get("tenant_id")), int(doc["seq"]), doc["hash"])
    return found


def list_digests(uow: Any, db: str, *, upto: int | None = None) -> list[dict[str, Any]]:
    """The digests stored in ``db``, oldest first (those up to seq ``upto``)."""
    where: dict[str, Any] = {} if upto is None else {"_id": {"$lte": upto}}
    return list(uow.find(_reader(), AUDIT_DIGEST.name, db, DIGESTS, where, sort=[("_id", 1)]))


def heads_at(uow: Any, db: str, seq: int, *, tenant: str | None = None) -> dict[str, Head]:
    """The heads digest ``seq`` committed to (only ``tenant``'s streams, when given)."""
    where: dict[str, Any] = {"digest": {"$lte": seq}}
    if tenant is not None:
        where["tenant_id"] = tenant
    found: dict[str, Head] = {}
    for doc in uow.iterate(
        _reader(tenant), AUDIT_DIGEST.name, db, DIGEST_HEADS, where,
        sort=[("stream", 1), ("digest", 1)], batch_size=1000,
    ):  # fmt: skip
        found[doc["stream"]] = Head(doc["tenant_id"], int(doc["seq"]), doc["hash"])
    return found


def head_changes(uow: Any, db: str, streams: Iterable[str]) -> dict[str, list[tuple[int, int]]]:
    """Per stream of ``streams``, the (digest, head seq) of every digest that moved its
    head, in digest order."""
    found: dict[str, list[tuple[int, int]]] = {}
    for doc in uow.iterate(
        _reader(), AUDIT_DIGEST.name, db, DIGEST_HEADS, {"stream": {"$in": sorted(streams)}},
        sort=[("stream", 1), ("digest", 1)], batch_size=1000,
    ):  # fmt: skip
        found.setdefault(str(doc["stream"]), []).append((int(doc["digest"]), int(doc["seq"])))
    return found


def heads_hold(uow: Any, db: str, digest: Mapping[str, Any]) -> bool:
    """Whether the heads stored for ``digest`` rebuild its root (else they were rewritten)."""
    return HeadTree(heads_at(uow, db, int(digest["seq"]))).root == digest.get("root")


def heads_by_digest(
    uow: Any, db: str, tenant: str, upto: int
) -> Iterable[tuple[int, dict[str, Head]]]:
    """(seq, ``tenant``'s heads at it) for every digest 1..``upto``, one pass."""
    changes: dict[int, list[dict[str, Any]]] = {}
    for doc in uow.iterate(
        _reader(tenant), AUDIT_DIGEST.name, db, DIGEST_HEADS,
        {"tenant_id": tenant, "digest": {"$lte": upto}}, sort=[("digest", 1)], batch_size=1000,
    ):  # fmt: skip
        changes.setdefault(int(doc["digest"]), []).append(doc)
    state: dict[str, Head] = {}
    for n in range(1, upto + 1):
        for doc in changes.get(n, ()):
            state[doc["stream"]] = Head(tenant, int(doc["seq"]), doc["hash"])
        yield n, dict(state)


def write_digest(
    uow: Any,
    db: str,
    *,
    key: Ed25519PrivateKey | None = None,
    principal: Principal | None = None,
    at: datetime | None = None,
) -> dict[str, Any]:
    """Take a digest of ``db``'s audit heads now, store it (through the kernel) and
    return it (signed with ``key`` when given)."""
    current = read_heads(uow, db)
    previous = list(
        uow.find(_reader(), AUDIT_DIGEST.name, db, DIGESTS, {}, sort=[("_id", -1)], limit=1)
    )
    seq = int(previous[0]["seq"]) + 1 if previous else 1
    before = heads_at(uow, db, seq - 1) if previous else {}
    for stream, head in before.items():
        now = current.get(stream)
        if now is None or now.seq < head.seq:
            raise InvalidInputError(
                f"the audit head of stream {stream} is at seq {now.seq if now else 0}, behind "
                f"digest {seq - 1}'s seq {head.seq}: the heads were rewound (run `accord "
                f"audit verify --live`); no digest written"
            )
    tree = HeadTree(current)
    body = {
        "v": 1, "seq": seq, "prev": previous[0]["hash"] if previous else GENESIS,
        "at": digest_time(at or datetime.now(UTC)), "db": db,
        "root": tree.root, "tenants": len(tree.tenants), "streams": len(current),
        "records": sum(h.seq for h in current.values()),
    }  # fmt: skip
    doc: dict[str, Any] = {"_id": seq, **body, "hash": digest_hash(body)}
    if key is not None:
        from accord.governance.signing import sign

        doc["signature"] = sign(key, body)
    changed = [
        Op(
            "insert",
            doc={"digest": seq, "stream": s, "tenant_id": h.tenant, "seq": h.seq, "hash": h.hash},
        )  # fmt: skip
        for s, h in sorted(current.items())
        if before.get(s) != h
    ]
    context = WriteContext("*", principal=principal, operation=DIGEST_ACTION)
    groups = [Group("digest", db, DIGESTS, AUDIT_DIGEST.name, [Op("insert", doc=doc)])]
    if changed:
        groups.append(Group("digest:heads", db, DIGEST_HEADS, AUDIT_DIGEST.name, changed))
    uow.execute(Plan(context, groups))
    return doc
