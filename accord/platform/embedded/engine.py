"""The engine's state: catalog, multi-version documents, transactions, durability.

Concurrency model: one engine lock serialises every command (commands are short and
CPU-bound); isolation between transactions comes from multi-versioning, not from holding
the lock. Each committed write appends ``(commit_ts, doc-or-None)`` to the document's
version chain; a transaction reads the newest version at or before its snapshot,
overlaid with its own uncommitted writes. Writing a document that another open
transaction wrote, or that was committed after this transaction's snapshot, raises
WriteConflict (first writer wins, as in WiredTiger).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accord.platform.embedded import query
from accord.platform.embedded.errors import Code, EngineError, write_conflict
from accord.platform.embedded.paths import MISSING
from accord.platform.embedded.storage import CommitBatch, Storage

log = logging.getLogger("accord.engine")

Doc = dict[str, Any]
TXN_LIFETIME_LIMIT_S = 60.0
SESSION_TIMEOUT_MINUTES = 30


@dataclass
class Index:
    """One index as ``listIndexes`` shows it, plus what the engine enforces."""

    name: str
    key: list[tuple[str, Any]]
    unique: bool = False
    sparse: bool = False
    partial: Doc | None = None
    expire_after: float | None = None
    spec: Doc = field(default_factory=dict)

    @property
    def fields(self) -> list[str]:
        return [f for f, _ in self.key]

    def keys_of(self, doc: Doc) -> list[bytes]:
        if self.partial is not None and not query.matches(self.partial, doc):
            return []
        return query.index_keys(doc, self.fields, sparse=self.sparse)

    @classmethod
    def from_spec(cls, spec: Doc) -> Index:
        return cls(
            name=spec["name"],
            key=list(spec["key"].items()),
            unique=bool(spec.get("unique", False)),
            sparse=bool(spec.get("sparse", False)),
            partial=spec.get("partialFilterExpression"),
            expire_after=spec.get("expireAfterSeconds"),
            spec=spec,
        )


ID_INDEX_SPEC: Doc = {"v": 2, "key": {"_id": 1}, "name": "_id_"}


class Collection:
    """A collection's committed versions and indexes."""

    def __init__(self, ns: str, options: Doc, index_specs: list[Doc] | None = None) -> None:
        self.ns = ns
        self.options = options
        self.versions: dict[bytes, list[tuple[int, Doc | None]]] = {}
        self.indexes: dict[str, Index] = {}
        # Unique index name -> encoded key -> id key of the latest committed owner.
        self.unique_maps: dict[str, dict[bytes, bytes]] = {}
        # Every field of a secondary index -> encoded value -> id keys of documents that
        # have (or, in a version an open transaction may still read, had) that value.
        # A superset: lookups re-check the filter, so stale entries cost time, not truth.
        self.field_maps: dict[str, dict[bytes, set[bytes]]] = {}
        # Natural order: id key -> insertion sequence, to return lookups in scan order.
        self.order: dict[bytes, int] = {}
        self._next_order = itertools.count()
        for spec in index_specs or [ID_INDEX_SPEC]:
            self.add_index(Index.from_spec(spec))

    @property
    def db(self) -> str:
        return self.ns.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.ns.split(".", 1)[1]

    def note_order(self, key: bytes) -> None:
        if key not in self.order:
            self.order[key] = next(self._next_order)

    def rebuild_field_maps(self) -> None:
        """Recompute the equality lookup maps from every retained version."""
        fields = {f for i in self.indexes.values() if i.name != "_id_" for f in i.fields}
        self.field_maps = {f: {} for f in fields}
        for key, chain in self.versions.items():
            for _, doc in chain:
                if doc is not None:
                    self.map_fields(key, doc)

    def map_fields(self, key: bytes, doc: Doc) -> None:
        for field_name, values in self.field_maps.items():
            for v in query.path_values(doc, field_name):
                if v is not MISSING:
                    values.setdefault(query.value_key(v), set()).add(key)

    def candidates(self, filt: Doc) -> list[bytes] | None:
        """Id keys that may match ``filt`` (natural order), or None if no map applies."""
        best: set[bytes] | None = None
        for field_name, value in filt.items():
            values = self.field_maps.get(field_name)
            if values is None:
                continue
            if query.is_plain_equality(value):
                found = values.get(query.value_key(value), set())
            elif query.is_plain_in(value):
                found = set().union(*(values.get(query.value_key(v), set()) for v in value["$in"]))
            else:
                continue
            if best is None or len(found) < len(best):
                best = found
        if best is None:
            return None
        return sorted(best, key=lambda k: self.order.get(k, 0))

    def catalog_spec(self) -> Doc:
        return {"options": self.options, "indexes": [i.spec for i in self.indexes.values()]}

    def add_index(self, index: Index) -> None:
        """Add an index; a unique one is built first and refused if data violates it."""
        self._add_index(index)
        if index.name != "_id_" and not set(index.fields) <= set(self.field_maps):
            self.rebuild_field_maps()

    def _add_index(self, index: Index) -> None:
        if index.unique and index.name != "_id_":
            owners: dict[bytes, bytes] = {}
            for key, chain in self.versions.items():
                doc = chain[-1][1]
                if doc is None:
                    continue
                for k in index.keys_of(doc):
                    if k in owners:
                        raise EngineError(
                            Code.DuplicateKey,
                            f"Index build failed: E11000 duplicate key error collection: "
                            f"{self.ns} index: {index.name} dup key: "
                            f"{query.key_value(doc, index.fields)}",
                            extra={
                                "keyPattern": dict(index.key),
                                "keyValue": query.key_value(doc, index.fields),
                            },
                        )
                    owners[k] = key
            self.unique_maps[index.name] = owners
        self.indexes[index.name] = index

    def latest(self, key: bytes) -> tuple[int, Doc | None]:
        chain = self.versions.get(key)
        return chain[-1] if chain else (0, None)

    def visible(self, key: bytes, snapshot: int) -> Doc | None:
        chain = self.versions.get(key)
        if not chain:
            return None
        for ts, doc in reversed(chain):
            if ts <= snapshot:
                return doc
        return None


@dataclass
class Txn:
    """A read view plus a write set: an explicit transaction or one autocommitted command."""

    id: int
    snapshot: int
    explicit: bool
    session: Session | None = None
    txn_number: int | None = None
    writes: dict[str, dict[bytes, Doc | None]] = field(default_factory=dict)
    claims: set[tuple[str, str, bytes]] = field(default_factory=set)
    started: float = field(default_factory=time.monotonic)
    aborted_reason: str | None = None
    # Collections this transaction created implicitly (mongod rolls their creation back).
    created: list[str] = field(default_factory=list)

    def own(self, ns: str, key: bytes) -> tuple[bool, Doc | None]:
        w = self.writes.get(ns)
        if w is not None and key in w:
            return True, w[key]
        return False, None


@dataclass
class Session:
    """Server-side state of one logical session (``lsid``)."""

    key: bytes
    last_used: float = field(default_factory=time.monotonic)
    txn_number: int = -1
    txn: Txn | None = None
    # "none" | "in_progress" | "committed" | "aborted" for txn_number
    txn_state: str = "none"
    retry_number: int = -1
    retry_reply: Doc | None = None


class Engine:
    """Owns all data. Every public method must be called with ``self.lock`` held."""

    def __init__(self, dbpath: Path, *, sync: bool = True) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.storage = Storage(dbpath, sync=sync)
        self.collections: dict[str, Collection] = {}
        self.clock = 1
        self._txn_ids = itertools.count(1)
        self.active: dict[int, Txn] = {}
        self.locks: dict[tuple[str, bytes], Txn] = {}
        # (ns, unique index, key) -> (transaction, id key of its document with that key)
        self.claims: dict[tuple[str, str, bytes], tuple[Txn, bytes]] = {}
        self.sessions: dict[bytes, Session] = {}
        # --- commit observers (minimal hook for vector search; engine-core replaces it) ----
        # Objects with on_commit(ts, [(ns, key, old, new)]), on_drop(ns), on_rename(old, new),
        # called under the engine lock, after a commit is installed, in commit order.
        self.commit_observers: list[Any] = []
        # --- end commit observers ---------------------------------------------------------
        self._recover()

    # -- recovery ---------------------------------------------------------------------------

    def _recover(self) -> None:
        for ns, spec in self.storage.load_collections():
            coll = Collection(ns, spec.get("options", {}), spec.get("indexes"))
            for key, doc in self.storage.load_documents(ns):
                coll.versions[key] = [(self.clock, doc)]
                coll.note_order(key)
                coll.map_fields(key, doc)
                for index in coll.indexes.values():
                    if index.name in coll.unique_maps:
                        for k in index.keys_of(doc):
                            coll.unique_maps[index.name][k] = key
            self.collections[ns] = coll
        for lsid, number, reply in self.storage.load_txn_records():
            session = self.session(lsid)
            if reply.get("kind") == "commit":
                session.txn_number, session.txn_state = number, "committed"
            else:
                session.retry_number, session.retry_reply = number, reply.get("reply")

    def close(self) -> None:
        self.storage.close()

    # -- sessions -----------------------------------------------------------------------------

    def session(self, key: bytes) -> Session:
        session = self.sessions.get(key)
        if session is None:
            session = self.sessions[key] = Session(key)
        session.last_used = time.monotonic()
        return session

    def end_session(self, key: bytes) -> None:
        session = self.sessions.pop(key, None)
        if session and session.txn and session.txn_state == "in_progress":
            self.abort(session.txn, "session ended")

    # -- catalog ----------------------------------------------------------------------------

    def get_collection(self, ns: str) -> Collection | None:
        return self.collections.get(ns)

    def create_collection(self, ns: str, options: Doc | None = None) -> Collection:
        coll = Collection(ns, options or {})
        self.storage.save_collection(ns, coll.catalog_spec())
        self.collections[ns] = coll
        return coll

    def ensure_collection(self, ns: str) -> Collection:
        return self.collections.get(ns) or self.create_collection(ns)

    def save_catalog(self, coll: Collection) -> None:
        self.storage.save_collection(coll.ns, coll.catalog_spec())

    def drop_collection(self, ns: str) -> bool:
        coll = self.collections.pop(ns, None)
        if coll is None:
            return False
        for txn in list(self.active.values()):
            if ns in txn.writes:
                self.abort(txn, f"collection {ns} was dropped")
        self.storage.drop_collection(ns)
        for observer in self.commit_observers:  # commit observers hook
            observer.on_drop(ns)
        return True

    def rename_collection(self, old: str, new: str) -> None:
        coll = self.collections.pop(old)
        for txn in list(self.active.values()):
            if old in txn.writes:
                self.abort(txn, f"collection {old} was renamed")
        coll.ns = new
        self.collections[new] = coll
        self.storage.rename_collection(old, new)
        for observer in self.commit_observers:  # commit observers hook
            observer.on_rename(old, new)

    def database_names(self) -> list[str]:
        return sorted({ns.split(".", 1)[0] for ns in self.collections})

    def collections_in(self, db: str) -> list[Collection]:
        prefix = db + "."
        return [c for ns, c in self.collections.items() if ns.startswith(prefix)]

    # -- transactions -----------------------------------------------------------------------

    def begin(self, *, explicit: bool, session: Session | None = None) -> Txn:
        txn = Txn(id=next(self._txn_ids), snapshot=self.clock, explicit=explicit, session=session)
        self.active[txn.id] = txn
        return txn

    def _release(self, txn: Txn) -> None:
        self.active.pop(txn.id, None)
        for ns, writes in txn.writes.items():
            for key in writes:
                if self.locks.get((ns, key)) is txn:
                    del self.locks[(ns, key)]
        for claim in txn.claims:
            held = self.claims.get(claim)
            if held is not None and held[0] is txn:
                del self.claims[claim]
        txn.claims.clear()
        self.changed.notify_all()

    def abort(self, txn: Txn, reason: str = "aborted") -> None:
        txn.aborted_reason = reason
        self._release(txn)
        txn.writes.clear()
        for ns in txn.created:
            coll = self.collections.get(ns)
            if coll is not None and not coll.versions:
                self.drop_collection(ns)
        txn.created.clear()
        if txn.session is not None and txn.session.txn is txn:
            txn.session.txn_state = "aborted"

    def commit(self, txn: Txn, *, record: tuple[bytes, int, Doc] | None = None) -> None:
        """Make ``txn``'s writes durable and visible, atomically."""
        if txn.aborted_reason is not None:
            raise EngineError(
                Code.NoSuchTransaction, f"Transaction has been aborted: {txn.aborted_reason}",
                labels=("TransientTransactionError",),
            )  # fmt: skip
        ts = self.clock + 1
        batch = CommitBatch()
        live: list[tuple[Collection, bytes, Doc | None]] = []
        for ns, writes in txn.writes.items():
            coll = self.collections.get(ns)
            if coll is None:
                continue
            for key, doc in writes.items():
                live.append((coll, key, doc))
                if doc is None:
                    batch.deletes.append((ns, key))
                else:
                    batch.puts.append((ns, key, doc))
        if record is not None:
            batch.txn_records.append(record)
        # Disk first: if it fails, memory is untouched and the client sees the error.
        self.storage.commit(batch)
        changes = []  # commit observers hook: (ns, key, old, new) in commit order
        for coll, key, doc in live:
            if self.commit_observers:
                changes.append((coll.ns, key, coll.latest(key)[1], doc))
            self._install(coll, key, doc, ts)
        if live:
            self.clock = ts
        self._release(txn)
        for observer in self.commit_observers:  # commit observers hook
            observer.on_commit(ts, changes)

    def _install(self, coll: Collection, key: bytes, doc: Doc | None, ts: int) -> None:
        chain = coll.versions.get(key)
        old = chain[-1][1] if chain else None
        for name, owners in coll.unique_maps.items():
            index = coll.indexes[name]
            if old is not None:
                for k in index.keys_of(old):
                    if owners.get(k) == key:
                        del owners[k]
            if doc is not None:
                for k in index.keys_of(doc):
                    owners[k] = key
        if chain is None:
            chain = coll.versions[key] = []
            coll.note_order(key)
        if doc is not None:
            coll.map_fields(key, doc)
        chain.append((ts, doc))
        self._prune(coll, key, chain)

    def oldest_snapshot(self) -> int:
        return min((t.snapshot for t in self.active.values()), default=self.clock)

    def _prune(self, coll: Collection, key: bytes, chain: list[tuple[int, Doc | None]]) -> None:
        """Drop versions no open transaction can see any more."""
        horizon = self.oldest_snapshot()
        keep_from = 0
        for i, (ts, _) in enumerate(chain):
            if ts <= horizon:
                keep_from = i
        if keep_from:
            del chain[:keep_from]
        if len(chain) == 1 and chain[0][1] is None and chain[0][0] <= horizon:
            del coll.versions[key]

    def vacuum(self) -> None:
        """Prune version chains and stale lookup entries (called periodically)."""
        for coll in self.collections.values():
            pruned = False
            for key, chain in list(coll.versions.items()):
                if len(chain) > 1 or chain[0][1] is None:
                    self._prune(coll, key, chain)
                    pruned = True
            if pruned or len(coll.order) > 2 * len(coll.versions) + 64:
                coll.rebuild_field_maps()
                coll.order = {k: v for k, v in coll.order.items() if k in coll.versions}

    # -- reads ------------------------------------------------------------------------------

    def scan(self, txn: Txn, ns: str) -> Iterator[tuple[bytes, Doc]]:
        """Every document visible to ``txn`` in natural (insertion) order."""
        coll = self.collections.get(ns)
        own = txn.writes.get(ns, {})
        if coll is not None:
            snap = txn.snapshot
            for key, chain in list(coll.versions.items()):
                if key in own:
                    doc = own[key]
                else:
                    ts, doc = chain[-1]
                    if ts > snap:
                        doc = coll.visible(key, snap)
                if doc is not None:
                    yield key, doc
        for key, doc in list(own.items()):
            if doc is not None and (coll is None or key not in coll.versions):
                yield key, doc

    def lookup(self, txn: Txn, ns: str, filt: Doc) -> Iterator[tuple[bytes, Doc]] | None:
        """Documents visible to ``txn`` that may match ``filt``, via the equality maps.

        None when no map applies (the caller scans). Own uncommitted writes are included.
        """
        coll = self.collections.get(ns)
        if coll is None:
            return None
        keys = coll.candidates(filt)
        if keys is None:
            return None
        own = txn.writes.get(ns, {})
        if own:
            known = set(keys)
            keys = keys + [k for k in own if k not in known]
        return ((k, d) for k in keys if (d := self.get(txn, ns, k)) is not None)

    def get(self, txn: Txn, ns: str, key: bytes) -> Doc | None:
        found, doc = txn.own(ns, key)
        if found:
            return doc
        coll = self.collections.get(ns)
        return coll.visible(key, txn.snapshot) if coll else None

    # -- writes -----------------------------------------------------------------------------

    def write(self, txn: Txn, coll: Collection, key: bytes, doc: Doc | None) -> None:
        """Stage a put (``doc``) or delete (``None``) of one document in ``txn``."""
        ns = coll.ns
        holder = self.locks.get((ns, key))
        if holder is not None and holder is not txn:
            raise write_conflict()
        ts, _ = coll.latest(key)
        if ts > txn.snapshot:
            raise write_conflict()
        if doc is not None:
            self._check_unique(txn, coll, key, doc)
        self.locks[(ns, key)] = txn
        txn.writes.setdefault(ns, {})[key] = doc

    def _check_unique(self, txn: Txn, coll: Collection, key: bytes, doc: Doc) -> None:
        """Enforce unique secondary indexes for a staged put of ``doc`` (id ``key``).

        A key claimed by another open transaction is a write conflict (as mongod's
        index-level conflict); one claimed by another document of this transaction that
        still has it, or owned by a committed document this transaction did not change
        away from it, is a duplicate key.
        """
        wanted: list[tuple[tuple[str, str, bytes], Index]] = []
        for name, owners in coll.unique_maps.items():
            index = coll.indexes[name]
            for k in index.keys_of(doc):
                claim = (coll.ns, name, k)
                holder = self.claims.get(claim)
                if holder is not None and holder[0] is not txn:
                    raise write_conflict()
                if holder is not None and holder[1] != key:
                    _, other = txn.own(coll.ns, holder[1])
                    if other is not None and k in index.keys_of(other):
                        raise duplicate_key(coll, index, doc)
                owner = owners.get(k)
                if owner is not None and owner != key:
                    shadowed, mine = txn.own(coll.ns, owner)
                    if not shadowed or (mine is not None and k in index.keys_of(mine)):
                        if coll.latest(owner)[0] > txn.snapshot:
                            raise write_conflict()
                        raise duplicate_key(coll, index, doc)
                wanted.append((claim, index))
        # Claims are taken only after every check passed (the _id index is the caller's).
        for claim, _ in wanted:
            self.claims[claim] = (txn, key)
            txn.claims.add(claim)


def duplicate_key(coll: Collection, index: Index, doc: Doc) -> EngineError:
    kv = query.key_value(doc, index.fields)
    shown = ", ".join(f"{k}: {v!r}" for k, v in kv.items())
    return EngineError(
        Code.DuplicateKey,
        f"E11000 duplicate key error collection: {coll.ns} index: {index.name} dup key: {{ {shown} }}",
        extra={"keyPattern": dict(index.key), "keyValue": kv},
    )
