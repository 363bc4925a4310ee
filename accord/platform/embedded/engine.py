"""The engine's state: catalog, multi-version documents, transactions, commits.

Concurrency model: one engine lock serialises every command (commands are short and
CPU-bound); isolation between transactions comes from multi-versioning, not from holding
the lock. Each committed write installs a new version ``(commit ts, BSON or None)`` in the
document's ``Record`` (``versions.py``) and index entries for it (``indexes.py``); a
transaction reads the version at its snapshot, overlaid with its own uncommitted writes.
Writing a document that another open transaction wrote, or that was committed after this
transaction's snapshot, raises WriteConflict (first writer wins, as in WiredTiger).

Commits (``group_commit.py``): a commit installs its versions under the lock, with a
timestamp above every snapshot handed out so far, and queues its disk batch; OUTSIDE the
lock, the caller (with no write in progress) or the committer's writer thread writes
every queued batch in one SQLite transaction with one fsync. Only then does ``visible``
(the snapshot new readers get) advance past it, and only then is it acknowledged: no
reader can observe a commit that a crash could still lose (docs/engine.md has the
argument). A failed batch rolls back every commit not yet durable and reports the cause
to each of them.

Garbage collection (``collect_garbage``) is incremental: a FIFO of records that got a new
version, in commit order, pruned a few milliseconds at a time once no snapshot (open
transaction, or snapshot read within ``history_window`` seconds, mongod's
``minSnapshotHistoryWindowInSeconds``) can read the old versions.

Timestamps are MongoDB cluster times as integers (``seconds << 32 | increment``), so
``operationTime``, ``$clusterTime`` and ``atClusterTime`` are the engine's own clock.

Commit observers (derived indexes such as vector search stay in step through them; the
interface is ``CommitObserver`` below)::

    engine.commit_observers.append(observer)
    engine.own_writes(txn, ns)    # [(id key, doc or None)]: a transaction's uncommitted writes
    engine.oldest_snapshot()      # no reader will ask for a snapshot before this

``observer.on_commit(ts, changes)`` is called under the engine lock once per commit, in
commit order, when the commit is durable and just before it becomes visible; ``changes``
is ``[(ns, id key, old doc, new doc)]`` for the collections ``observer.observes(ns)``
accepts (``old``/``new`` are fresh dicts, ``None`` for an insert/delete). Aborted and
failed commits are never reported. ``on_drop(ns)`` and ``on_rename(old, new)`` follow the
catalog.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import itertools
import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import bson
from bson.timestamp import Timestamp
from sortedcontainers import SortedList

from accord.platform.embedded import index_image, planner, query, writes_first
from accord.platform.embedded.errors import Code, EngineError, write_conflict
from accord.platform.embedded.group_commit import CommitFailed, GroupCommitter, PendingCommit
from accord.platform.embedded.indexes import Index
from accord.platform.embedded.lockstats import LockStats
from accord.platform.embedded.storage import CommitBatch, Storage
from accord.platform.embedded.versions import Record, decode, encode

log = logging.getLogger("accord.engine")

Doc = dict[str, Any]
Key = tuple[Any, ...]
TXN_LIFETIME_LIMIT_S = 60.0
SESSION_TIMEOUT_MINUTES = 30
# mongod's minSnapshotHistoryWindowInSeconds default.
HISTORY_WINDOW_S = 300.0
# Longest a garbage-collection pass holds the engine lock.
GC_PASS_S = 0.002
# A read that has held the engine lock this long lets waiting commands run (read_pause).
# 2 ms rather than 4: beside heavy searches at 100k memories, an insert's p99 was 86-92 ms
# with 2 ms slices against 132-135 ms with 4 (benchmarks.engine_reads, same hour).
READ_SLICE_S = 0.002
# How long a yielding read waits for a waiting command to take the lock, and how often it
# looks (Python's locks are not fair: without a wait it would take the lock straight back).
HANDOFF_WAIT_S = 0.002
HANDOFF_POLL_S = 0.00005

__all__ = [
    "CommitObserver", "CommitFailed", "Collection", "Engine", "Index", "Session", "Txn", "duplicate_key",
    "ts_to_timestamp", "timestamp_to_ts",
]  # fmt: skip

ID_INDEX_SPEC: Doc = {"v": 2, "key": {"_id": 1}, "name": "_id_"}


def ts_to_timestamp(ts: int) -> Timestamp:
    return Timestamp(ts >> 32, ts & 0xFFFFFFFF)


def timestamp_to_ts(value: Timestamp) -> int:
    return (value.time << 32) | value.inc


def _wall_ts(seconds: float) -> int:
    return int(seconds) << 32


class CommitObserver(Protocol):
    """What ``Engine.commit_observers`` members implement (see the module docstring)."""

    def observes(self, ns: str) -> bool: ...

    def on_commit(
        self, ts: int, changes: list[tuple[str, bytes, Doc | None, Doc | None]]
    ) -> None: ...

    def on_drop(self, ns: str) -> None: ...

    def on_rename(self, old: str, new: str) -> None: ...


class Collection:
    """A collection's records (committed versions) and indexes."""

    def __init__(self, ns: str, options: Doc, index_specs: list[Doc] | None = None) -> None:
        self.ns = ns
        self.options = options
        # id key -> record; insertion order is natural order.
        self.records: dict[bytes, Record] = {}
        self.indexes: dict[str, Index] = {}
        # Unique index name -> encoded key -> id key of the latest committed owner.
        self.unique_maps: dict[str, dict[Key, bytes]] = {}
        self._rids = itertools.count(1)
        # A collection created inside a transaction is that transaction's until it commits.
        self.pending_owner: Txn | None = None
        self.dropped = False
        # Indexes with entries other than _id (kept in step with every version).
        self._secondary: list[Index] = []
        for spec in index_specs or [ID_INDEX_SPEC]:
            self.add_index(Index.from_spec(spec))

    @property
    def db(self) -> str:
        return self.ns.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.ns.split(".", 1)[1]

    def next_rid(self) -> int:
        return next(self._rids)

    def catalog_spec(self) -> Doc:
        return {"options": self.options, "indexes": [i.spec for i in self.indexes.values()]}

    def secondary(self) -> list[Index]:
        return self._secondary

    def refresh_indexes(self) -> None:
        self._secondary = [
            i for i in self.indexes.values() if not i.is_id and i.orderable_or_hashed
        ]

    def add_index(self, index: Index) -> None:
        """Add an index and build it from every retained version; a unique index is
        refused if the latest versions violate it."""
        if index.unique and not index.is_id:
            self.unique_maps[index.name] = self._unique_owners(index)
        if not index.is_id and index.orderable_or_hashed:
            entries = []
            for record in self.records.values():
                versions = [(record.ts, record.data)] + list(record.older or [])
                for ts, data in versions:
                    if data is not None:
                        doc = decode(data)
                        for k in index.key_tuples(doc, query.matches):
                            entries.append((*k, record.rid, ts, record))
            index.entries.update(entries)
        self.indexes[index.name] = index
        self.refresh_indexes()

    def _unique_owners(self, index: Index) -> dict[Key, bytes]:
        owners: dict[Key, bytes] = {}
        for key, record in self.records.items():
            if record.data is None:
                continue
            doc = decode(record.data)
            for k in unique_keys(index, doc):
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
        return owners

    def release(self) -> None:
        """Free a dropped collection's documents, versions and index entries now. Nobody
        can read them any more (a paused read ends when it sees ``dropped``), but the
        garbage-collection queue names its records until their turn comes, up to the
        snapshot-history window later: without this, every version of every document of
        a dropped collection stayed in memory that long (hundreds of MiB after a few
        collections of large documents were dropped)."""
        for record in self.records.values():
            record.data = None
            record.older = None
        self.records.clear()
        for index in self.indexes.values():
            index.entries = SortedList()
        self.unique_maps.clear()

    def drop_index(self, name: str) -> None:
        self.indexes.pop(name).dropped = True
        self.unique_maps.pop(name, None)
        self.refresh_indexes()

    def build_id_index(self) -> None:
        """Build the ordered ``_id`` index (ranges and sorts on ``_id``) on first use."""
        index = self.indexes["_id_"]
        if not index.built:
            index.build_id((r, decode(r.key)[""]) for r in self.records.values())

    def latest_ts(self, key: bytes) -> int:
        record = self.records.get(key)
        return record.ts if record is not None else 0

    def visible(self, key: bytes, snapshot: int) -> Doc | None:
        record = self.records.get(key)
        if record is None:
            return None
        data = record.data_at(snapshot)
        return None if data is None else decode(data)

    def count_visible(self, snapshot: int) -> int:
        return sum(1 for r in self.records.values() if r.data_at(snapshot) is not None)


def _build_indexes(coll: Collection, indexes: list[Index]) -> None:
    """Build ``indexes`` (and their unique-key owners) from the loaded documents."""
    entries: dict[str, list[tuple[Any, ...]]] = {i.name: [] for i in indexes}
    owners: dict[str, dict[Key, bytes]] = {i.name: {} for i in indexes if i.unique}
    plan = [
        (index, index.orderable_or_hashed, entries[index.name], owners.get(index.name))
        for index in indexes
    ]
    matches = query.matches
    for record in coll.records.values():
        data = record.data
        if data is None:
            continue
        doc = decode(data)
        key = record.key
        for index, maintained, out, unique in plan:
            keys, arrays = index.keys_of(doc, matches)
            if maintained:
                rid = record.rid
                for k in keys:
                    out.append((*k, rid, 0, record))
            if unique is not None:
                # The duplicate check's own keys where they differ from the entries'
                # (paths through arrays; strings under a collation).
                checked = arrays or index.collation is not None
                for k in index.unique_keys(doc, matches) if checked else keys:
                    unique[k] = key
    for index in indexes:
        index.entries.update(entries[index.name])
        if index.unique:
            coll.unique_maps[index.name] = owners[index.name]


def _restore_indexes(
    coll: Collection, indexes: list[Index], saved: index_image.CollectionImage
) -> bool:
    """Fill ``indexes`` from the index image if it describes exactly the loaded documents
    (same count, same specs, every entry naming a loaded document); False otherwise,
    leaving them untouched."""
    records = coll.records
    if saved.count != len(records) or set(saved.indexes) != {i.name for i in indexes}:
        return False
    built: list[tuple[Index, list[tuple[Any, ...]], dict[Key, bytes] | None, bool]] = []
    for index in indexes:
        image = saved.indexes[index.name]
        ids = image.ids
        if (
            image.spec != index_image.spec_bytes(index.spec)
            or len(image.keys) != len(index.fields)
            or any(len(column) != len(ids) for column in image.keys)
        ):
            return False
        try:
            owned = list(map(records.__getitem__, ids))
        except KeyError:
            return False
        rids = [r.rid for r in owned]
        # Entries (*key, rid, ts 0, record), zipped in C from the image's columns.
        entries = list(zip(*image.keys, rids, itertools.repeat(0), owned))
        owners: dict[Key, bytes] | None = None
        if index.unique:
            # Owners name documents by their records' own id keys (one bytes object per
            # document, not another copy from the image).
            if image.owners is not None:
                try:
                    owners = {k: records[i].key for k, i in image.owners}
                except KeyError:
                    return False
            else:
                owners = dict(
                    zip(zip(*image.keys, strict=True), (r.key for r in owned), strict=True)
                )
        built.append((index, entries, owners, image.multikey))
    for index, entries, owners, multikey in built:
        # Sorting entries already in key order costs one comparison each (equal keys are
        # re-ordered by this start's record ids).
        index.entries.update(entries)
        index.multikey = multikey
        if owners is not None:
            coll.unique_maps[index.name] = owners
    return True


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None where there is none, e.g. macOS or musl)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_MALLOC_TRIM = _load_malloc_trim()


def _return_free_memory() -> None:
    """Give the memory the process has freed back to the system (microseconds when there
    is nothing to give; ctypes releases the GIL meanwhile)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def unique_keys(index: Index, doc: Doc) -> list[Key]:
    """Keys of ``doc`` in a unique index, as mongod's duplicate check sees them."""
    return index.unique_keys(doc, query.matches)


@dataclass
class Txn:
    """A read view plus a write set: an explicit transaction or one autocommitted command."""

    id: int
    snapshot: int
    explicit: bool
    session: Session | None = None
    txn_number: int | None = None
    writes: dict[str, dict[bytes, Doc | None]] = field(default_factory=dict)
    # The BSON of staged documents the write path already encoded (its size check), so
    # the commit does not encode them again: ns -> id key -> bytes of ``writes[ns][key]``.
    encoded: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    claims: set[tuple[str, str, Key]] = field(default_factory=set)
    started: float = field(default_factory=time.monotonic)
    aborted_reason: str | None = None
    # Collections this transaction created (invisible to others until it commits).
    created: list[str] = field(default_factory=list)
    # A read command's view: its queries may pause to let other commands run
    # (``Engine.read_pause``); never set for a command that writes.
    yields: bool = False
    # An autocommitted write whose failure takes back the collections it created
    # (``$out``/``$merge``: mongod leaves no target behind; an insert's stays).
    drops_created_on_abort: bool = False

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
    # The commit of txn_number / retry_number while it is not durable yet: a retried
    # commitTransaction or retryable write waits for it instead of answering early.
    commit_ticket: PendingCommit | None = None
    retry_ticket: PendingCommit | None = None


class LockHold:
    """``Engine.locked``'s context manager. A class rather than a generator: an insert
    takes the lock four times (nested holds included), and a hold with its stats cost
    4.1 us through ``contextlib.contextmanager`` and the stats' former bookkeeping, 3.0 us
    with this and ``LockStats`` as they are now (in process, 200,000 holds)."""

    __slots__ = ("_engine", "_what", "_token")

    def __init__(self, engine: Engine, what: str) -> None:
        self._engine = engine
        self._what = what
        self._token = 0

    def __enter__(self) -> None:
        engine = self._engine
        engine._acquire()
        try:
            self._token = engine.lock_stats.enter(self._what)
        except BaseException:
            engine.lock.release()
            raise

    def __exit__(self, *exc_info: object) -> None:
        engine = self._engine
        try:
            engine.lock_stats.exit(self._token, self._what)
        finally:
            engine.lock.release()


class Engine:
    """Owns all data. Public methods expect ``self.lock`` held, except where noted."""

    def __init__(
        self, dbpath: Path, *, sync: bool = True, history_window: float = HISTORY_WINDOW_S,
        expect_durable: bool = False, repair: bool = False,
    ) -> None:  # fmt: skip
        self.lock = threading.RLock()
        # Threads waiting for ``lock`` (through ``locked``) and how many times it was taken:
        # ``yield_lock`` hands the lock to a waiter.
        self._waiters = 0
        self._waiters_lock = threading.Lock()
        self._acquisitions = 0
        self.changed = threading.Condition(self.lock)
        self.lock_stats = LockStats()
        self.storage = Storage(dbpath, sync=sync, check_unclean=expect_durable, repair=repair)
        # After an unclean shutdown (or with --repair) the index image is not trusted.
        self._unclean = expect_durable or repair
        self.collections: dict[str, Collection] = {}
        self.history_window = history_window
        self._txn_ids = itertools.count(1)
        self.active: dict[int, Txn] = {}
        self.locks: dict[tuple[str, bytes], Txn] = {}
        # (ns, unique index, key) -> (transaction, id key of its document with that key)
        self.claims: dict[tuple[str, str, Key], tuple[Txn, bytes]] = {}
        self.sessions: dict[bytes, Session] = {}
        self.commit_observers: list[CommitObserver] = []
        # Records that got a new version, in commit order: (commit ts, collection, record).
        self._gc_queue: deque[tuple[int, Collection, Record]] = deque()
        self.gc_stats = {"passes": 0, "versionsPruned": 0, "recordsRemoved": 0}
        self.committer = GroupCommitter(self)
        # Loading creates millions of long-lived objects and no cyclic garbage: Python's
        # collector would walk the growing heap again and again (a quarter of the
        # start-up time at 500k documents). It is frozen out of reach just below.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._recover()
        finally:
            if collecting:
                gc.enable()
        # Every commit gets a timestamp above the clock; readers get ``visible`` (<= clock).
        self.clock = max(self.storage.last_ts, _wall_ts(time.time()))
        self.visible = self.clock
        # Snapshots before this have no versions to read (history starts at start-up).
        self.boot_ts = self.clock
        # Everything loaded is long-lived: keep it out of Python's cyclic GC passes.
        gc.freeze()

    # -- recovery ---------------------------------------------------------------------------

    def _recover(self) -> None:
        dbpath = self.storage.path.parent
        # The index image of the last clean shutdown (see index_image), if it is of this data.
        image = None if self._unclean else index_image.take(dbpath, self.storage.last_ts)
        if self._unclean:
            index_image.discard(dbpath)
        restored = rebuilt = 0
        loaded: list[tuple[Collection, list[Index]]] = []
        for ns, spec in self.storage.load_collections():
            coll = Collection(ns, spec.get("options", {}))
            secondary = [
                Index.from_spec(s) for s in spec.get("indexes") or [] if s["name"] != "_id_"
            ]
            loaded.append((coll, secondary))
            self.collections[ns] = coll
        targets = {c.ns: (c.records, c._rids) for c, _ in loaded}
        current = None
        records: dict[bytes, Record] = {}
        rids: Iterator[int] = iter(())
        for ns, key, data in self.storage.load_documents():
            if ns != current:
                target = targets.get(ns)
                if target is None:
                    continue  # no such collection in the catalog
                current = ns
                records, rids = target
            records[key] = Record(key, next(rids), 0, data)
        for coll, secondary in loaded:
            saved = image.get(coll.ns) if image is not None else None
            if secondary:
                if saved is not None and _restore_indexes(coll, secondary, saved):
                    restored += 1
                else:
                    _build_indexes(coll, secondary)
                    rebuilt += 1
            for index in secondary:
                coll.indexes[index.name] = index
            coll.refresh_indexes()
        if image is not None and rebuilt:
            log.warning(
                "index image: %d collection(s) restored, %d did not match it and were rebuilt",
                restored, rebuilt,
            )  # fmt: skip
        for lsid, number, reply in self.storage.load_txn_records():
            session = self.session(lsid)
            if reply.get("kind") == "commit":
                session.txn_number, session.txn_state = number, "committed"
            else:
                session.retry_number, session.retry_reply = number, reply.get("reply")

    def close(self) -> None:
        """Make everything pending durable, move the storage journal into its tables, write
        the index image (so the next start need not rebuild the indexes) and close the
        store (lock held)."""
        try:
            self.committer.flush()
        except CommitFailed:
            log.exception("pending commits could not be made durable at shutdown")
        else:
            try:
                while self.committer.compact(4096):
                    pass
            except sqlite3.Error:  # nothing is lost: the next start compacts
                log.exception("the storage journal could not be emptied at shutdown")
            self._write_index_image()
        self.committer.close()
        self.storage.close()

    def _write_index_image(self) -> None:
        dbpath = self.storage.path.parent
        try:
            index_image.write(
                dbpath, self.storage.last_ts,
                (
                    (c.ns, c.records.values(), c.secondary(), c.unique_maps)
                    for c in self.collections.values()
                    if c.pending_owner is None and c.secondary()
                ),
            )  # fmt: skip
        except Exception:
            log.exception("the index image could not be written: the next start rebuilds")
            index_image.discard(dbpath)

    # -- locking ----------------------------------------------------------------------------

    def locked(self, what: str = "") -> LockHold:
        """Hold the engine lock, recording how long (``serverStatus().accordEngine``)."""
        return LockHold(self, what)

    def _acquire(self) -> None:
        """Take the engine lock, counted among its waiters while it is busy."""
        if not self.lock.acquire(blocking=False):
            with self._waiters_lock:
                self._waiters += 1
            try:
                self.lock.acquire()
            finally:
                with self._waiters_lock:
                    self._waiters -= 1
        self._acquisitions += 1

    def holds_lock_once(self) -> bool:
        """Whether this thread holds the engine lock, and only once (so releasing it once
        lets others run)."""
        stats = self.lock_stats
        return stats.depth == 1 and stats.owner == threading.get_ident()

    def yield_lock(self, work: Callable[[], None] | None = None) -> bool:
        """Release the engine lock for a moment, long enough for a waiting command to take
        it, and take it back (a long read calls this between slices of its work, see
        ``read_pause``); ``work`` runs meanwhile (without the lock). Returns False, without
        releasing or running ``work``, unless this thread holds the lock exactly once (a
        nested hold cannot be released here)."""
        if not self.holds_lock_once():
            return False
        stats = self.lock_stats
        depth = stats.suspend()
        taken = self._acquisitions
        self.lock.release()
        try:
            if work is not None:
                with writes_first.unlocked():
                    work()
            # Python's locks are not fair: without this the releasing thread would usually
            # take the lock straight back. Wait (briefly) until a waiter has it.
            deadline = time.perf_counter() + HANDOFF_WAIT_S
            while self._waiters and self._acquisitions == taken:
                if time.perf_counter() > deadline:
                    break
                time.sleep(HANDOFF_POLL_S)
            # And while a write is in flight, stay out of its way (``writes_first``).
            writes_first.give_way()
        finally:
            self._acquire()
            stats.restore(depth)
        return True

    def read_pause(self, txn: Txn, coll: Collection) -> planner.ReadPause:
        """A read's pause point: once the current hold has lasted ``READ_SLICE_S``, or at
        once while a write is in flight (``writes_first``) or when given ``work``, it
        lets waiting commands run (``yield_lock``) and returns True; the caller then
        re-positions its scan (index entries may have moved). ``work`` is what the read
        collected and can finish without the lock (matching its filter against the BSON
        it gathered): it runs while the lock is free, or at once if it cannot be freed.
        The read keeps its snapshot meanwhile: ``txn`` stays registered, so garbage
        collection keeps every version it can see, and versions committed since are
        invisible to it. If ``txn`` was aborted or the collection dropped or renamed
        meanwhile, the read ends with the error mongod gives (``QueryPlanKilled``, or
        ``NoSuchTransaction`` in a transaction)."""
        stats = self.lock_stats
        ns = coll.ns  # a rename changes coll.ns

        def pause(work: Callable[[], None] | None = None) -> bool:
            if work is None and (
                stats.held_seconds() < READ_SLICE_S and not writes_first.in_flight()
            ):
                return False
            if not self.yield_lock(work):
                if work is not None:
                    work()
                return False
            self.check_read_alive(txn, coll, ns)
            return True

        return pause

    def check_read_alive(self, txn: Txn, coll: Collection | None = None, ns: str = "") -> None:
        """After a read gave the lock up: raise what mongod raises if its transaction was
        aborted, or the collection it reads (``coll``, named ``ns`` when the read began)
        dropped or renamed, meanwhile."""
        if self.active.get(txn.id) is not txn:
            if txn.explicit:
                raise EngineError(
                    Code.NoSuchTransaction,
                    f"Transaction has been aborted: {txn.aborted_reason or 'aborted'}",
                    labels=("TransientTransactionError",),
                )
            raise EngineError(Code.QueryPlanKilled, "the query was killed: its read ended")
        if coll is not None and (coll.dropped or self.collections.get(ns) is not coll):
            raise EngineError(
                Code.QueryPlanKilled,
                f"the query was killed: collection {ns} was dropped or renamed while it ran",
            )

    @contextmanager
    def released(self, txn: Txn) -> Iterator[None]:
        """Run the block with the engine lock released, for a read's work on documents it
        already holds (sorting, projecting, pipeline stages, encoding replies): none of
        it touches the engine's records or indexes, whose versions of the read's
        snapshot are immutable BSON it decoded into its own dicts.

        Only for a read that may pause (``txn.yields``) and a thread that holds the lock
        exactly once; otherwise the block runs with the lock held, as before. Whatever
        in the block needs the engine again takes the lock (``locked``) for that part.
        Afterwards the read ends as ``check_read_alive`` says if its transaction was
        aborted meanwhile."""
        if not txn.yields or not self.holds_lock_once():
            yield
            return
        stats = self.lock_stats
        depth = stats.suspend()
        self.lock.release()
        try:
            writes_first.give_way()
            with writes_first.unlocked():
                yield
        finally:
            self._acquire()
            stats.restore(depth)
        self.check_read_alive(txn)

    def wait_changed(self, timeout: float) -> None:
        """Wait (lock held) for a commit, abort or visibility change; the wait itself
        does not count as holding the lock."""
        # What it waits for may be a commit queued by the server's loop and not yet
        # written (the loop writes at the end of its round, which this thread may be in).
        self.committer.kick()
        depth = self.lock_stats.suspend()
        try:
            self.changed.wait(timeout)
        finally:
            self.lock_stats.restore(depth)

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

    def get_collection(self, ns: str, txn: Txn | None = None) -> Collection | None:
        """The collection as ``txn`` sees it (one created by another, still open
        transaction does not exist yet for anyone else)."""
        coll = self.collections.get(ns)
        if coll is not None and coll.pending_owner is not None and coll.pending_owner is not txn:
            return None
        return coll

    def create_collection(
        self, ns: str, options: Doc | None = None, *, txn: Txn | None = None
    ) -> Collection:
        """Create ``ns``. Within ``txn`` it stays that transaction's until it commits
        (and goes away if it aborts); without one it is made durable at once."""
        existing = self.collections.get(ns)
        if existing is not None:
            if existing.pending_owner is not None and existing.pending_owner is not txn:
                raise write_conflict()
            return existing
        coll = Collection(ns, options or {})
        if txn is None:
            self.ddl(CommitBatch(catalog=[("save", ns, coll.catalog_spec())]))
        else:
            coll.pending_owner = txn
            txn.created.append(ns)
        self.collections[ns] = coll
        return coll

    def ensure_collection(self, ns: str, txn: Txn | None = None) -> Collection:
        return self.get_collection(ns, txn) or self.create_collection(ns, txn=txn)

    def save_catalog(self, coll: Collection) -> None:
        """Persist a catalog change (indexes, options) now; a pending collection's catalog
        is written by its creator's commit."""
        if coll.pending_owner is None:
            self.ddl(CommitBatch(catalog=[("save", coll.ns, coll.catalog_spec())]))

    def ddl(self, batch: CommitBatch) -> None:
        """Make a catalog change durable now, after every commit queued before it."""
        self.clock += 1
        batch.ts = self.clock
        item = PendingCommit(ts=batch.ts, batch=batch)
        self.committer.submit(item)
        self.committer.flush()
        if item.error is not None:
            raise item.error

    def drop_collection(self, ns: str) -> bool:
        coll = self.collections.get(ns)
        if coll is None:
            return False
        if coll.pending_owner is not None:
            raise write_conflict()
        self.ddl(CommitBatch(catalog=[("drop", ns, None)]))
        self.collections.pop(ns, None)
        coll.dropped = True
        coll.release()
        for txn in list(self.active.values()):
            if ns in txn.writes:
                self.abort(txn, f"collection {ns} was dropped")
        self._notify_drop(ns)
        return True

    def rename_collection(self, old: str, new: str) -> None:
        coll = self.collections[old]
        if coll.pending_owner is not None:
            raise write_conflict()
        self.ddl(CommitBatch(catalog=[("rename", old, new)]))
        self.collections.pop(old)
        for txn in list(self.active.values()):
            if old in txn.writes:
                self.abort(txn, f"collection {old} was renamed")
        coll.ns = new
        self.collections[new] = coll
        self._notify_rename(old, new)

    def database_names(self) -> list[str]:
        return sorted({c.db for c in self.collections.values() if c.pending_owner is None})

    def collections_in(self, db: str, txn: Txn | None = None) -> list[Collection]:
        prefix = db + "."
        return [
            c
            for ns, c in self.collections.items()
            if ns.startswith(prefix) and (c.pending_owner is None or c.pending_owner is txn)
        ]

    # -- commit observers ------------------------------------------------------------------

    def own_writes(self, txn: Txn, ns: str) -> list[tuple[bytes, Doc | None]]:
        """``txn``'s uncommitted writes to ``ns`` (id key, new doc or None for a delete)."""
        return list((txn.writes.get(ns) or {}).items())

    def latest_documents(self, ns: str) -> Iterator[tuple[bytes, Doc | None, int, bool]]:
        """For building a derived index: ``(id key, doc or None if deleted, commit ts,
        whether other versions are retained)`` of every document as the newest snapshot
        sees it (lock held)."""
        coll = self.collections.get(ns)
        if coll is None:
            return
        visible = self.visible
        for record in list(coll.records.values()):
            version = record.at(visible)
            if version is None:
                continue
            ts, data = version
            history = record.older is not None or record.ts > visible
            yield record.key, decode(data) if data is not None else None, ts, history

    def _observed(self, ns: str) -> bool:
        return any(o.observes(ns) for o in self.commit_observers)

    def _notify_drop(self, ns: str) -> None:
        for observer in self.commit_observers:
            try:
                observer.on_drop(ns)
            except Exception:
                log.exception("commit observer failed on drop of %s", ns)

    def _notify_rename(self, old: str, new: str) -> None:
        for observer in self.commit_observers:
            try:
                observer.on_rename(old, new)
            except Exception:
                log.exception("commit observer failed on rename of %s", old)

    # -- transactions -----------------------------------------------------------------------

    def begin(
        self, *, explicit: bool, session: Session | None = None, snapshot: int | None = None
    ) -> Txn:
        txn = Txn(
            id=next(self._txn_ids), snapshot=self.visible if snapshot is None else snapshot,
            explicit=explicit, session=session,
        )  # fmt: skip
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
        txn.encoded.clear()
        for ns in txn.created:
            coll = self.collections.get(ns)
            if coll is None or coll.pending_owner is not txn:
                continue
            if txn.explicit or txn.drops_created_on_abort:
                del self.collections[ns]  # created by the transaction: gone with it
            else:
                # A write command's implicit creation outlives its failed write, as in mongod.
                coll.pending_owner = None
                coll.records.clear()
                try:
                    self.ddl(CommitBatch(catalog=[("save", ns, coll.catalog_spec())]))
                except CommitFailed:
                    del self.collections[ns]
        txn.created.clear()
        if txn.session is not None and txn.session.txn is txn:
            txn.session.txn_state = "aborted"
        txn.session = None  # no Session <-> Txn cycle left for the cyclic GC

    def commit(
        self, txn: Txn, *, record: tuple[bytes, int, Doc] | None = None
    ) -> PendingCommit | None:
        """Install ``txn``'s writes (invisible until durable) and queue them for disk.

        Returns the ticket to wait on (``wait_durable``, without the lock) before
        acknowledging, or None if there was nothing to make durable.
        """
        if txn.aborted_reason is not None:
            raise EngineError(
                Code.NoSuchTransaction, f"Transaction has been aborted: {txn.aborted_reason}",
                labels=("TransientTransactionError",),
            )  # fmt: skip
        if not txn.writes and not txn.created and record is None:
            self._release(txn)
            return None
        ts = self.clock + 1
        wall = _wall_ts(time.time()) | 1
        if wall > ts:
            ts = wall
        batch = CommitBatch(ts=ts)
        item = PendingCommit(ts=ts, batch=batch)
        for ns in txn.created:
            coll = self.collections.get(ns)
            if coll is not None and coll.pending_owner is txn:
                coll.pending_owner = None
                item.created.append(coll)
                batch.catalog.append(("save", ns, coll.catalog_spec()))
        txn.created.clear()
        for ns, writes in txn.writes.items():
            coll = self.collections.get(ns)
            if coll is None:
                continue
            observed = self._observed(ns)
            encoded = txn.encoded.get(ns) or {}
            for key, doc in writes.items():
                data = None if doc is None else encoded.get(key) or encode(doc)
                old = self._install(coll, key, doc, data, ts, item)
                if data is None:
                    batch.deletes.append((ns, key))
                else:
                    batch.puts.append((ns, key, data))
                if observed:
                    item.changes.append((coll, key, old, data))
        if record is not None:
            batch.txn_records.append(record)
        self.clock = ts
        self._release(txn)
        self.committer.submit(item)
        return item

    def _install(
        self, coll: Collection, key: bytes, doc: Doc | None, data: bytes | None, ts: int,
        item: PendingCommit,
    ) -> bytes | None:  # fmt: skip
        """Make ``data`` the newest version of ``key``; return the previous one's BSON."""
        record = coll.records.get(key)
        old = record.data if record is not None else None
        old_doc = decode(old) if old is not None and coll.unique_maps else None
        for name, owners in coll.unique_maps.items():
            index = coll.indexes[name]
            if old_doc is not None:
                for k in unique_keys(index, old_doc):
                    if owners.get(k) == key:
                        del owners[k]
            if doc is not None:
                for k in unique_keys(index, doc):
                    owners[k] = key
        if record is None:
            record = Record(key, coll.next_rid(), ts, data)
            coll.records[key] = record
            id_index = coll.indexes["_id_"]
            if id_index.built:
                id_index.add_record(record, decode(key)[""])
            item.undo.append((coll, record, True))
        else:
            record.push(ts, data)
            item.undo.append((coll, record, False))
            self._gc_queue.append((ts, coll, record))
        if doc is not None:
            for index in coll.secondary():
                index.add_version(record, ts, index.key_tuples(doc, query.matches))
        return old

    def rollback(self, item: PendingCommit) -> None:
        """Undo a commit that did not become durable (lock held; newest first)."""
        for coll, record, created in reversed(item.undo):
            ts, data = record.ts, record.data
            doc = decode(data) if data is not None else None
            if doc is not None:
                for index in coll.secondary():
                    index.remove_version(record, ts, index.key_tuples(doc, query.matches))
            if created:
                coll.records.pop(record.key, None)
                id_index = coll.indexes["_id_"]
                if id_index.built:
                    id_index.remove_record(record, decode(record.key)[""])
                restored = None
            else:
                record.pop()
                restored = decode(record.data) if record.data is not None else None
            for name, owners in coll.unique_maps.items():
                index = coll.indexes[name]
                if doc is not None:
                    for k in unique_keys(index, doc):
                        if owners.get(k) == record.key:
                            del owners[k]
                if restored is not None:
                    for k in unique_keys(index, restored):
                        owners[k] = record.key
        for created_coll in item.created:
            if not created_coll.records and self.collections.get(created_coll.ns) is created_coll:
                del self.collections[created_coll.ns]
        for undo in item.on_failure:
            undo()

    def finalize(self, item: PendingCommit) -> None:
        """A durable commit becomes visible (lock held, in commit order)."""
        if item.changes:
            changes = [
                (coll.ns, key, decode(old) if old is not None else None,
                 decode(new) if new is not None else None)
                for coll, key, old, new in item.changes
            ]  # fmt: skip
            for observer in self.commit_observers:
                mine = [c for c in changes if observer.observes(c[0])]
                if not mine:
                    continue
                try:
                    observer.on_commit(item.ts, mine)
                except Exception:
                    log.exception("commit observer failed at commit %d", item.ts)
        if item.ts > self.visible:
            self.visible = item.ts
        self.changed.notify_all()

    def wait_durable(self, item: PendingCommit) -> None:
        """Wait (lock NOT held) until ``item`` is durable and visible; raise
        ``CommitFailed`` if it could not be made durable."""
        self.committer.wait(item)

    def advance_to(self, ts: int) -> None:
        """Make ``ts`` readable: the clock moves up to it (as a primary's no-op write does
        for ``afterClusterTime`` in the future) and waits for commits before it (lock held)."""
        if ts > self.clock:
            self.clock = ts
            if not self.committer.pending():
                self.visible = max(self.visible, ts)
        deadline = time.monotonic() + 60.0
        while self.visible < ts:
            if time.monotonic() > deadline:
                raise EngineError(
                    Code.MaxTimeMSExpired,
                    "timed out waiting for the requested cluster time to be readable",
                )
            if not self.committer.pending():
                self.visible = max(self.visible, min(ts, self.clock))
                continue
            self.wait_changed(0.05)

    def history_start(self) -> int:
        """The oldest timestamp a snapshot read may still ask for."""
        return max(self.boot_ts, _wall_ts(time.time() - self.history_window))

    # -- garbage collection ------------------------------------------------------------------

    def oldest_snapshot(self) -> int:
        """No reader will ask for a snapshot before this (lock held)."""
        return self.horizon()

    def horizon(self) -> int:
        """No reader will ask for a snapshot before this."""
        h = min(self.visible, self.history_start())
        for txn in self.active.values():
            if txn.snapshot < h:
                h = txn.snapshot
        return h

    def collect_garbage(self, budget_s: float = GC_PASS_S) -> bool:
        """One bounded pass (lock held). Returns whether due work remains."""
        queue = self._gc_queue
        if not queue:
            return False
        horizon = self.horizon()
        if queue[0][0] > horizon:
            return False
        deadline = time.perf_counter() + budget_s
        done = 0
        self.gc_stats["passes"] += 1
        while queue and queue[0][0] <= horizon:
            _, coll, record = queue.popleft()
            if not coll.dropped:
                self._prune(coll, record, horizon)
            done += 1
            if done % 8 == 0 and time.perf_counter() > deadline:
                break
        return bool(queue) and queue[0][0] <= horizon

    def _prune(self, coll: Collection, record: Record, horizon: int) -> None:
        dropped = record.prune(horizon)
        if dropped:
            indexes = coll.secondary()
            for ts, data in dropped:
                if data is not None and indexes:
                    doc = decode(data)
                    for index in indexes:
                        index.remove_version(record, ts, index.key_tuples(doc, query.matches))
            self.gc_stats["versionsPruned"] += len(dropped)
        gone = record.data is None and record.older is None and record.ts <= horizon
        if gone and coll.records.get(record.key) is record:
            del coll.records[record.key]
            id_index = coll.indexes["_id_"]
            if id_index.built:
                id_index.remove_record(record, decode(record.key)[""])
            self.gc_stats["recordsRemoved"] += 1

    def gc_backlog(self) -> int:
        return len(self._gc_queue)

    def reads_in_flight(self) -> bool:
        """Whether a read that pauses (a ``find``, ``aggregate``, ... outside a
        transaction) is under way; any thread, lock or not."""
        return any(txn.yields for txn in list(self.active.values()))

    @staticmethod
    def compact_heap() -> None:
        """Collect cyclic garbage, then freeze what survives (call without the lock).

        Python's full collections walk every tracked object: at 500k documents that is
        seconds with every thread stopped. The engine's records and index entries are
        long-lived and never cyclic garbage, so they are moved out of the collector's
        reach (``gc.freeze``) once they have survived one collection; each call then
        costs only what was allocated since the previous one. Then the C allocator is
        asked to give freed memory back to the system (glibc keeps it otherwise, so the
        resident size stayed at its peak after large documents came and went).
        """
        gc.collect()
        gc.freeze()
        _return_free_memory()

    # -- reads ------------------------------------------------------------------------------

    def find(self, txn: Txn, ns: str, q: planner.Query) -> planner.Execution:
        """Run a query for ``txn`` through the planner (see ``planner``)."""
        coll = self.get_collection(ns, txn)
        if coll is None:
            query.check_filter(q.filter)
            own = txn.writes.get(ns) or {}
            hits = planner.Hits(
                planner.Hit(k, None, d, i)
                for i, (k, d) in enumerate(own.items())
                if d is not None and query.matches(q.filter, d)
            )
            return planner.Execution(
                hits, planner.Plan("EOF", 0.0), planner.ScanStats(), False, 0.0
            )
        query.check_filter(q.filter)
        if not txn.yields:
            return planner.execute(coll, txn, q)
        return planner.execute(
            coll, txn, q, pause=self.read_pause(txn, coll), release=lambda: self.released(txn)
        )

    def scan(self, txn: Txn, ns: str) -> Iterator[tuple[bytes, Doc]]:
        """Every document visible to ``txn`` in natural (insertion) order (fresh dicts)."""
        for hit in self.find(txn, ns, planner.Query({})).hits:
            yield hit.key, hit.doc

    def get(self, txn: Txn, ns: str, key: bytes) -> Doc | None:
        """The document ``key`` as ``txn`` sees it (a fresh dict unless it is ``txn``'s own)."""
        found, doc = txn.own(ns, key)
        if found:
            return doc
        coll = self.get_collection(ns, txn)
        return coll.visible(key, txn.snapshot) if coll else None

    # -- writes -----------------------------------------------------------------------------

    def write(
        self, txn: Txn, coll: Collection, key: bytes, doc: Doc | None, data: bytes | None = None
    ) -> None:
        """Stage a put (``doc``) or delete (``None``) of one document in ``txn``.

        ``data``, when given, is ``doc`` encoded (``versions.encode``): the commit stores
        it instead of encoding ``doc`` again. A staged document is never changed in place.
        """
        ns = coll.ns
        holder = self.locks.get((ns, key))
        if holder is not None and holder is not txn:
            raise write_conflict()
        if coll.latest_ts(key) > txn.snapshot:
            raise write_conflict()
        if doc is not None:
            self._check_unique(txn, coll, key, doc)
        self.locks[(ns, key)] = txn
        txn.writes.setdefault(ns, {})[key] = doc
        encoded = txn.encoded.get(ns)
        if data is not None:
            if encoded is None:
                encoded = txn.encoded[ns] = {}
            encoded[key] = data
        elif encoded is not None:
            encoded.pop(key, None)

    def _check_unique(self, txn: Txn, coll: Collection, key: bytes, doc: Doc) -> None:
        """Enforce unique secondary indexes for a staged put of ``doc`` (id ``key``).

        A key claimed by another open transaction is a write conflict (as mongod's
        index-level conflict); one claimed by another document of this transaction that
        still has it, or owned by a committed document this transaction did not change
        away from it, is a duplicate key.
        """
        wanted: list[tuple[tuple[str, str, Key], Index]] = []
        for name, owners in coll.unique_maps.items():
            index = coll.indexes[name]
            for k in unique_keys(index, doc):
                claim = (coll.ns, name, k)
                holder = self.claims.get(claim)
                if holder is not None and holder[0] is not txn:
                    raise write_conflict()
                if holder is not None and holder[1] != key:
                    _, other = txn.own(coll.ns, holder[1])
                    if other is not None and k in unique_keys(index, other):
                        raise duplicate_key(coll, index, doc)
                owner = owners.get(k)
                if owner is not None and owner != key:
                    shadowed, mine = txn.own(coll.ns, owner)
                    if not shadowed or (mine is not None and k in unique_keys(index, mine)):
                        if coll.latest_ts(owner) > txn.snapshot:
                            raise write_conflict()
                        raise duplicate_key(coll, index, doc)
                wanted.append((claim, index))
        # Claims are taken only after every check passed (the _id index is the caller's).
        for claim, _ in wanted:
            self.claims[claim] = (txn, key)
            txn.claims.add(claim)

    # -- status -----------------------------------------------------------------------------

    def status(self) -> Doc:
        """The engine's own section of ``serverStatus`` (``accordEngine``)."""
        return {
            "lock": self.lock_stats.report(),
            "gc": {**self.gc_stats, "backlog": len(self._gc_queue)},
            "groupCommit": self.committer.stats(),
            "writesFirst": writes_first.stats(),
            "clusterTime": ts_to_timestamp(self.visible),
            "documents": sum(len(c.records) for c in self.collections.values()),
        }


def duplicate_key(coll: Collection, index: Index, doc: Doc) -> EngineError:
    kv = query.key_value(doc, index.fields)
    shown = ", ".join(f"{k}: {v!r}" for k, v in kv.items())
    return EngineError(
        Code.DuplicateKey,
        f"E11000 duplicate key error collection: {coll.ns} index: {index.name} dup key: {{ {shown} }}",
        extra={"keyPattern": dict(index.key), "keyValue": kv},
    )


def encode_id(value: Any) -> bytes:
    return bson.encode({"": query.canonical(value)})
