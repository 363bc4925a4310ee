"""Encryption per class: governance's kernel hook that encrypts payloads and decrypts them.

A policy marks classes with ``encryption = "tenant"`` or ``"subject"``
(:mod:`accord.governance.policy`); their payload fields
(:data:`~accord.governance.crypto.PAYLOADS`: a checkpoint's serialized state and
metadata, channel values, pending writes, messages' bytes and text, memories' values and
text, and their history) are then stored as envelopes (:mod:`accord.governance.crypto`)
under a data key per scope:

* ``tenant``: one key per tenant;
* ``subject``: a thread's classes (checkpoints, values, pending writes, messages) one key
  per thread, so an erasure destroys the keys of the subject's threads; a memory derived
  from a thread (``provenance.thread_id``) that thread's key, whatever its namespace;
  other documents one key per value of the class's first ``subject_fields`` present (a
  memory's ``namespace``); a document without one is under its tenant's key.

How it runs through the kernel (docs/platform.md, "Hooks"):

* **seal** (inside each transaction attempt): ``seal_reads`` names the data keys the
  batch needs and that this process has not cached (or cached more than
  ``cache_seconds`` ago), read in the transaction's snapshot; ``seal`` creates the missing
  ones in the same transaction (an upsert whose guard retries the attempt if another
  writer created the key first) and replaces the payload values of the batch's ops by
  envelopes, starting again from the plan's values on every attempt. It is registered
  before the audit hook, so ``full`` audit images hold ciphertext too.
* **decode** (after every read): ``decode_reads`` names the keys (by ``kid``) of the
  envelopes the documents hold, read through the kernel as the reader (the policy's
  ``find`` on ``encryption_key`` applies); ``decode`` decrypts. A key that no longer
  exists raises :class:`~accord.errors.KeyDestroyed`.

Keys are cached per process; a destroyed key is forgotten by a process within
``cache_seconds`` (default 10).
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bson import ObjectId
from pymongo import ASCENDING, IndexModel

from accord.errors import EncryptionError, KeyDestroyed, MasterKeyError
from accord.governance.crypto import (
    MASTER_KEY_ENV,
    PAYLOADS,
    MasterKey,
    decrypt_value,
    encrypt_value,
    envelope_kid,
    is_envelope,
    new_data_key,
)
from accord.governance.policy import Policy
from accord.platform.artifacts import CLASSES, ENCRYPTION_KEY
from accord.platform.context import WriteContext
from accord.platform.hooks import (
    HookCollection,
    ReadRequest,
    RefreshRead,
    SealBatch,
    SealConflict,
    SealRead,
)
from accord.platform.plan import Counts, Expect, Group, Op, insert_once

__all__ = ["DEFAULT_KEYS_COLLECTION", "EncryptionHook", "Scope", "keys_collection"]

DEFAULT_KEYS_COLLECTION = "accord_keys"
#: The read of data keys (its operation, as the policy and audit see it).
KEYS_OPERATION = "encryption.keys"

_Target = tuple[Group, tuple[str, ...], list[Op], list["Scope | None"]]


def keys_collection(policy: Policy) -> str:
    """The collection of the ``encryption_key`` class under ``policy``."""
    cls = policy.of(ENCRYPTION_KEY.name)
    return (cls.collection if cls is not None else None) or DEFAULT_KEYS_COLLECTION


@dataclass(frozen=True)
class Scope:
    """What one data key encrypts: a tenant, one of its threads, or a subject value."""

    kind: str  # "tenant" | "thread" | "subject"
    tenant_id: str
    thread_id: str | None = None
    subject: Any = None

    def parts(self) -> tuple[str, ...]:
        if self.kind == "thread":
            return ("thread", self.tenant_id, str(self.thread_id))
        if self.kind == "subject":
            return (
                "subject",
                self.tenant_id,
                json.dumps(self.subject, sort_keys=True, default=str),
            )
        return ("tenant", self.tenant_id)

    def document(self, key_id: str, kid: str, wrapped: Any, master: str) -> dict[str, Any]:
        """The key document of this scope (``subject``: the value, so an erasure finds it;
        the document is deleted with the subject)."""
        doc: dict[str, Any] = {
            "_id": key_id, "kid": kid, "tenant_id": self.tenant_id, "scope": self.kind,
            "wrapped": wrapped, "master": master, "created_at": datetime.now(UTC),
        }  # fmt: skip
        if self.kind == "thread":
            doc["thread_id"] = self.thread_id
        if self.kind == "subject":
            doc["subject"] = self.subject
        return doc


def _get(doc: Mapping[str, Any], path: str) -> Any:
    cur: Any = doc
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _set(doc: Mapping[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``doc`` with ``path`` set to ``value`` (containers along the path copied)."""
    head, _, rest = path.partition(".")
    out = dict(doc)
    out[head] = _set(out.get(head) or {}, rest, value) if rest else value
    return out


class EncryptionHook:
    """The kernel hook (module docstring). ``policy_of(db)`` is the policy enforced on a
    database; ``master`` the master key (None when ``ACCORD_MASTER_KEY`` is unset: a
    policy that encrypts then fails with :class:`~accord.errors.MasterKeyError`)."""

    name = "governance.encryption"

    def __init__(
        self,
        policy_of: Callable[[str], Policy],
        master: MasterKey | None = None,
        *,
        cache_seconds: float = 10.0,
    ) -> None:
        self.policy_of = policy_of
        self.master = master
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        #: (db, key _id) -> (kid, key, read at, the subjects a thread's key names)
        self._by_scope: dict[tuple[str, str], tuple[str, bytes, float, frozenset[Any]]] = {}
        self._by_kid: dict[tuple[str, str], tuple[bytes, float]] = {}
        #: per group (by id, checked by a weak reference): encrypted op id -> (encrypted
        #: op, the plan's op), so a retried attempt starts again from the plaintext
        self._plain: dict[int, tuple[weakref.ref[Group], dict[int, tuple[Op, Op]]]] = {}

    def _master(self, what: str) -> MasterKey:
        if self.master is None:
            raise MasterKeyError(
                f"{what}, and {MASTER_KEY_ENV} is not set: set it to the master key (32 "
                f"random bytes, base64) the data keys are wrapped under. Nothing was "
                f"written or returned"
            )
        return self.master

    def collections(self, db: str) -> Mapping[str, HookCollection]:
        """The keys collection, set up with the other parts' collections (only in a
        process that has a master key: one without never writes keys)."""
        if self.master is None:
            return {}
        indexes = [
            IndexModel([("kid", ASCENDING)], name="kid", unique=True),
            IndexModel([("tenant_id", ASCENDING), ("scope", ASCENDING)], name="tenant_scope"),
        ]
        coll = keys_collection(self.policy_of(db))
        return {coll: HookCollection(ENCRYPTION_KEY.name, indexes=indexes)}

    # --- which ops, which keys --------------------------------------------------------

    def _fields(self, group: Group) -> tuple[str, ...]:
        fields = PAYLOADS.get(group.artifact)
        if not fields:
            return ()
        cls = self.policy_of(group.db).of(group.artifact, group.collection)
        return fields if cls is not None and cls.encryption != "off" else ()

    def _scope(self, context: WriteContext, group: Group, source: Mapping[str, Any]) -> Scope:
        cls = self.policy_of(group.db).of(group.artifact, group.collection)
        tenant = str(source.get("tenant_id") or context.tenant_id)
        if cls is None or cls.encryption == "tenant":
            return Scope("tenant", tenant)
        if CLASSES[group.artifact].thread_scoped:
            thread = source.get("thread_id") or context.thread_id
            return (
                Scope("thread", tenant, thread_id=str(thread))
                if thread
                else Scope("tenant", tenant)
            )
        derived = _get(source, "provenance.thread_id")  # a memory derived from a thread
        if isinstance(derived, str) and derived:
            return Scope("thread", tenant, thread_id=derived)
        for path in cls.subject_fields:
            value = _get(source, path)
            if value not in (None, "", []):
                return Scope("subject", tenant, subject=value)
        return Scope("tenant", tenant)

    def _targets(self, batch: SealBatch) -> list[_Target]:
        """Each group of an encrypted class with its fields, its ops as the plan gave them
        (an op this hook encrypted in an earlier attempt maps back to its plaintext) and,
        per op, the scope of its key (None: the op writes no payload)."""
        out: list[_Target] = []
        with self._lock:
            for key in [k for k, (ref, _) in self._plain.items() if ref() is None]:
                del self._plain[key]
        for plan, group in batch.groups():
            fields = self._fields(group)
            if not fields:
                continue
            with self._lock:
                kept = self._plain.get(id(group))
                mine = kept[1] if kept is not None and kept[0]() is group else {}
            ops = []
            for op in group.ops:
                hit = mine.get(id(op))
                ops.append(hit[1] if hit is not None and hit[0] is op else op)
            scopes: list[Scope | None] = []
            for op in ops:
                source = _source(op, fields, group)
                scopes.append(None if source is None else self._scope(plan.context, group, source))
            out.append((group, fields, ops, scopes))
        return out

    def _fresh(self, at: float) -> bool:
        return time.monotonic() - at < self.cache_seconds

    # --- seal: encrypt ----------------------------------------------------------------

    def seal_reads(self, batch: SealBatch) -> Sequence[SealRead]:
        wanted: dict[str, set[str]] = {}
        for group, _, _, scopes in self._targets(batch):
            for scope in scopes:
                if scope is None:
                    continue
                master = self._master(f"the policy encrypts {group.artifact}")
                key_id = master.key_id(scope.parts())
                with self._lock:
                    hit = self._by_scope.get((group.db, key_id))
                if hit is None or not self._fresh(hit[2]):
                    wanted.setdefault(group.db, set()).add(key_id)
        return [
            SealRead(
                f"encryption:{db}",
                db,
                keys_collection(self.policy_of(db)),
                {"_id": {"$in": sorted(ids)}},
            )  # fmt: skip
            for db, ids in sorted(wanted.items())
        ]

    def seal(self, batch: SealBatch, found: Mapping[str, list[Any]]) -> Sequence[Group]:
        targets = self._targets(batch)
        if not any(s is not None for t in targets for s in t[3]):
            return []
        master = self._master(f"the policy encrypts {targets[0][0].artifact}")
        now = time.monotonic()
        for name, docs in found.items():
            if name.startswith("encryption:"):
                db = name[len("encryption:") :]
                for d in docs:
                    key = master.unwrap(d)
                    names = frozenset(_subject_values(d.get("subjects")))
                    with self._lock:
                        self._by_scope[db, str(d["_id"])] = (str(d["kid"]), key, now, names)
                        self._by_kid[db, str(d["kid"])] = (key, now)
        created: dict[str, dict[str, Op]] = {}
        fresh: dict[tuple[str, str], tuple[str, bytes]] = {}
        named = self._thread_subjects(batch)
        naming: dict[str, dict[str, set[Any]]] = {}  # db -> key _id -> subjects to add

        def key_for(db: str, scope: Scope) -> tuple[str, bytes]:
            key_id = master.key_id(scope.parts())
            subjects = named.get((db, scope.tenant_id, str(scope.thread_id)), set())
            if scope.kind != "thread":
                subjects = set()
            if (db, key_id) in fresh:
                return fresh[db, key_id]
            with self._lock:
                hit = self._by_scope.get((db, key_id))
            if hit is not None and self._fresh(hit[2]):
                if subjects - hit[3]:
                    naming.setdefault(db, {}).setdefault(key_id, set()).update(subjects - hit[3])
                return hit[0], hit[1]
            kid, key = new_data_key()  # not cached: cached once read back, committed
            doc = scope.document(key_id, kid, master.wrap(kid, scope.tenant_id, key),
                                 master.fingerprint)  # fmt: skip
            if subjects:
                doc["subjects"] = _sorted(subjects)
            created.setdefault(db, {})[key_id] = insert_once(doc)
            fresh[db, key_id] = (kid, key)
            return kid, key

        for group, fields, ops, scopes in targets:
            done: dict[int, tuple[Op, Op]] = {}
            sealed = []
            for op, scope in zip(ops, scopes, strict=True):
                if scope is not None:
                    enc = _encrypt_op(op, fields, group, key_for(group.db, scope))
                    done[id(enc)] = (enc, op)
                    op = enc
                sealed.append(op)
            group.ops[:] = sealed
            with self._lock:
                self._plain[id(group)] = (weakref.ref(group), done)
        groups = [
            Group(
                f"encryption:keys:{db}",
                db,
                keys_collection(self.policy_of(db)),
                ENCRYPTION_KEY.name,
                list(ops.values()),
                expect=Expect(error=_raced, upserted=len(ops)),
            )  # fmt: skip
            for db, ops in sorted(created.items())
        ]
        for db, by_key in sorted(naming.items()):
            with self._lock:  # read back (committed) by the next batch, not assumed
                for key_id in by_key:
                    self._by_scope.pop((db, key_id), None)
            ops = [Op("update", {"_id": key_id}, {"$addToSet": {"subjects": {"$each": _sorted(v)}}})
                   for key_id, v in sorted(by_key.items())]  # fmt: skip
            groups.append(Group(f"encryption:subjects:{db}", db,
                                keys_collection(self.policy_of(db)), ENCRYPTION_KEY.name, ops))  # fmt: skip
        return groups

    def _thread_subjects(self, batch: SealBatch) -> dict[tuple[str, str, str], set[Any]]:
        """(db, tenant, thread) -> the subject values the batch's writes of thread-scoped
        classes name (a checkpoint's ``meta.user_id``): recorded on the thread's data key,
        so that erasing the subject destroys it even once the thread is deleted (no
        document finds it then, and a backup of the thread would still decrypt)."""
        out: dict[tuple[str, str, str], set[Any]] = {}
        for plan, group in batch.groups():
            registered = CLASSES.get(group.artifact)
            if registered is None or not registered.thread_scoped:
                continue
            cls = self.policy_of(group.db).of(group.artifact, group.collection)
            if cls is None or not cls.subject_fields:
                continue
            for op in group.ops:
                written = _written(op)
                if written is None:
                    continue
                tenant = str(written.get("tenant_id") or plan.context.tenant_id)
                thread = written.get("thread_id") or plan.context.thread_id
                values = {v for path in cls.subject_fields
                          for v in _subject_values(_get(written, path))}  # fmt: skip
                if thread and values:
                    out.setdefault((group.db, tenant, str(thread)), set()).update(values)
        return out

    # --- decode: decrypt --------------------------------------------------------------

    def decode_reads(self, request: ReadRequest, docs: list[Any]) -> Sequence[RefreshRead]:
        fields = PAYLOADS.get(request.artifact)
        if not fields or not docs:
            return []
        kids: set[str] = set()
        for doc in docs:
            for path in fields:
                value = _get(doc, path) if isinstance(doc, Mapping) else None
                if value is not None and is_envelope(value):
                    kids.add(envelope_kid(value))
        with self._lock:
            missing = sorted(
                k for k in kids
                if (hit := self._by_kid.get((request.db, k))) is None or not self._fresh(hit[1])
            )  # fmt: skip
        if not missing:
            return []
        self._master(f"{request.artifact} documents are encrypted")
        return [
            RefreshRead(
                ENCRYPTION_KEY.name,
                keys_collection(self.policy_of(request.db)),
                {"kid": {"$in": missing}},
                KEYS_OPERATION,
                tenant_id=request.context.tenant_id,
            )  # fmt: skip
        ]

    def decode(self, request: ReadRequest, docs: list[Any], found: list[Any]) -> list[Any]:
        fields = PAYLOADS.get(request.artifact)
        if not fields:
            return docs
        now = time.monotonic()
        keys: dict[str, bytes] = {}
        for d in found:
            key = self._master(f"{request.artifact} documents are encrypted").unwrap(d)
            keys[str(d["kid"])] = key
            with self._lock:
                self._by_kid[request.db, str(d["kid"])] = (key, now)
        with self._lock:  # the cached keys still fresh, once per read (not per value)
            for (db, kid), (key, at) in self._by_kid.items():
                if db == request.db and kid not in keys and self._fresh(at):
                    keys[kid] = key
        return [
            self._decrypt(request, doc, fields, keys) if isinstance(doc, Mapping) else doc
            for doc in docs
        ]

    def _decrypt(self, request: ReadRequest, doc: Mapping[str, Any], fields: tuple[str, ...],
                 keys: Mapping[str, bytes]) -> Any:  # fmt: skip
        out: dict[str, Any] | None = None
        for path in fields:
            value = doc.get(path) if "." not in path else _get(doc, path)
            if value is None or not is_envelope(value):
                continue
            if "_id" not in doc:
                raise EncryptionError(
                    f"a read of {request.artifact} returned an encrypted {path!r} without the "
                    f"document's _id, which its decryption checks: include _id in the "
                    f"projection"
                )
            kid = envelope_kid(value)
            key = keys.get(kid)
            if key is None:
                raise KeyDestroyed(
                    f"{request.artifact} document {doc['_id']!r} in {request.collection!r} is "
                    f"encrypted under data key {kid}, which no longer exists: its data "
                    f"subject or tenant was erased (crypto-shredding), so it cannot be read. "
                    f"Nothing was returned",
                    kid=kid,
                )
            plain = decrypt_value(value, key=key, collection=request.collection,
                                  doc_id=doc["_id"], field=path)  # fmt: skip
            if out is None:
                out = dict(doc)
            out = _set(out, path, plain) if "." in path else {**out, path: plain}
        return out if out is not None else doc

    def forget(self) -> None:
        """Drop every cached data key (after destroying keys in this process)."""
        with self._lock:
            self._by_scope.clear()
            self._by_kid.clear()


def _subject_values(value: Any) -> list[Any]:
    """The identifiers a subject field's value holds (a string or an integer, or a list
    of them), as a key document records them."""
    items = value if isinstance(value, list) else [value]
    return [v for v in items if isinstance(v, str | int) and not isinstance(v, bool) and v != ""]


def _sorted(values: set[Any]) -> list[Any]:
    return sorted(values, key=lambda v: (type(v).__name__, v))


def _written(op: Op) -> Mapping[str, Any] | None:
    """The fields an op writes (an insert's or a replacement's document, an update's
    ``$set``/``$setOnInsert`` expanded, with the filter's ``tenant_id``/``thread_id``),
    or None (a delete, a pipeline update)."""
    doc = op.doc
    if op.kind in ("delete", "delete_many") or not isinstance(doc, Mapping):
        return None
    if op.kind in ("insert", "replace"):
        return doc
    merged: dict[str, Any] = {}
    for name in ("$set", "$setOnInsert"):
        body = doc.get(name)
        if isinstance(body, Mapping):
            merged.update(body)
    return _expanded(merged, op)


def _raced(counts: Counts) -> SealConflict:
    return SealConflict("a data key was created by another writer meanwhile; retrying")


def _roots(fields: tuple[str, ...]) -> set[str]:
    return {f.split(".")[0] for f in fields}


def _source(op: Op, fields: tuple[str, ...], group: Group) -> Mapping[str, Any] | None:
    """The values an op writes (for its key's scope), or None when it writes no payload
    field. Refuses what cannot be encrypted field by field."""
    roots = _roots(fields)
    if op.kind in ("delete", "delete_many"):
        return None
    doc = op.doc
    if op.kind in ("insert", "replace"):
        assert isinstance(doc, Mapping)
        return doc if any(_get(doc, f) is not None for f in fields) else None
    if not isinstance(doc, Mapping):  # a pipeline update
        if any(f'"{r}' in json.dumps(doc, default=str) for r in roots):
            raise EncryptionError(
                f"a pipeline update of {group.artifact} ({group.collection}) may touch its "
                f"encrypted fields {', '.join(fields)}; write them with $set or a "
                f"replacement. Nothing was written"
            )
        return None
    merged: dict[str, Any] = {}
    for name, body in doc.items():
        if name in ("$set", "$setOnInsert") and isinstance(body, Mapping):
            merged.update(body)
        elif (
            name != "$unset"
            and isinstance(body, Mapping)
            and any(k.split(".")[0] in roots for k in body)
        ):
            raise EncryptionError(
                f"{name} on the encrypted fields of {group.artifact} ({group.collection}) "
                f"cannot be applied to ciphertext; write them with $set or a "
                f"replacement. Nothing was written"
            )
    if not any(k.split(".")[0] in roots for k in merged):
        return None
    inside = [k for k in merged if any(k.startswith(f + ".") for f in fields)]
    if inside:
        raise EncryptionError(
            f"$set of {', '.join(sorted(inside))} would change part of an encrypted field of "
            f"{group.artifact} ({group.collection}); a ciphertext is replaced whole: set "
            f"the whole field. Nothing was written"
        )
    if op.kind not in ("update", "find_one_and_update"):
        raise EncryptionError(
            f"{op.kind} writes encrypted fields of {group.artifact} in several documents at "
            f"once; each value is bound to its document, so write them one document at a "
            f"time. Nothing was written"
        )
    return _expanded(merged, op)


def _expanded(merged: Mapping[str, Any], op: Op) -> dict[str, Any]:
    """An update's ``$set``/``$setOnInsert`` fields (dotted paths expanded) with the
    filter's ``tenant_id``/``thread_id``: the document as far as the update says it."""
    expanded: dict[str, Any] = {}
    for k, v in merged.items():
        expanded = _set(expanded, k, v)
    filt = op.filter or {}
    for k in ("tenant_id", "thread_id"):
        if k not in expanded and isinstance(filt.get(k), str):
            expanded[k] = filt[k]
    return expanded


def _doc_id(op: Op, group: Group) -> Any:
    doc = op.doc if isinstance(op.doc, Mapping) else {}
    if op.kind in ("insert", "replace") and "_id" in doc:
        return doc["_id"]
    filt = op.filter or {}
    value = filt.get("_id")
    if value is None or isinstance(value, Mapping):
        raise EncryptionError(
            f"a {op.kind} of {group.artifact} ({group.collection}) writes encrypted fields "
            f"without naming its document's _id (its filter is {dict(filt)!r}); the "
            f"ciphertext is bound to the _id. Nothing was written"
        )
    return value


def _encrypt_op(op: Op, fields: tuple[str, ...], group: Group, key: tuple[str, bytes]) -> Op:
    """``op`` with the values it writes to ``fields`` replaced by envelopes."""
    kid, data_key = key
    if op.kind == "insert" and isinstance(op.doc, Mapping) and "_id" not in op.doc:
        op = Op("insert", doc={"_id": ObjectId(), **op.doc})
    doc_id = _doc_id(op, group)

    def envelope(value: Any, path: str) -> Any:
        return encrypt_value(value, kid=kid, key=data_key, collection=group.collection,
                             doc_id=doc_id, field=path)  # fmt: skip

    def seal(body: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(body)
        for path in fields:
            if "." in path and path in out:  # a dotted $set key
                if out[path] is not None:
                    out[path] = envelope(out[path], path)
                continue
            value = _get(out, path)
            if value is not None:
                out = _set(out, path, envelope(value, path))
        return out

    assert isinstance(op.doc, Mapping)
    if op.kind in ("insert", "replace"):
        return Op(op.kind, op.filter, seal(op.doc), upsert=op.upsert, sort=op.sort)
    body = {
        name: seal(part) if name in ("$set", "$setOnInsert") and isinstance(part, Mapping) else part
        for name, part in op.doc.items()
    }
    return Op(op.kind, op.filter, body, upsert=op.upsert, sort=op.sort)
