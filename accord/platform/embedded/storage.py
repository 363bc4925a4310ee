"""The durable store under the engine's in-memory working set: SQLite in WAL mode.

``apply`` writes a group of commits (``group_commit.py``) atomically; with ``sync=True``
(``synchronous=FULL``) the WAL is fsynced before it returns, which is when the commits
are acknowledged. Documents are stored as the BSON the engine keeps in memory. SQLite's
WAL frames are checksummed and a torn tail is discarded at recovery, which is exactly the
journal contract the engine needs.

A group is written as ONE row of the ``journal`` table: a single autocommitted statement
(one SQLite transaction, one fsync, one or two pages). Writing it into the tables
(documents, transaction records, the last timestamp: six b-trees) took a dozen calls into
SQLite, each of which hands the interpreter lock to another thread and waits to get it
back; under load that doubled the time every waiting commit spends in the write (0.33 ms
alone, 0.7 ms with four clients, for a group of two). ``compact`` moves journal rows,
catalog changes included, into the tables later, in order, in slices of at most
``COMPACT_ROWS`` rows and ``JOURNAL_MAX_BYTES`` (the housekeeping thread, every second,
as the group committer's writer). A group with more documents than that goes to the
tables with its own commit, after the journal rows before it, so that its cost is paid
by its own commit and not by the commits that would wait behind its compaction. The store
opens with an empty journal (``__init__`` compacts what a crash left) and the engine's
clean shutdown empties it too, so what loads the data at start-up reads the tables only.

What SQLite cannot tell is a journal that lost acknowledged commits: a deleted or
truncated WAL, or an emptied database file, looks like a smaller, valid database. So
every batch also records its last commit timestamp in the database, and after it is
durable the same timestamp goes to a small side file (``accord-engine.durable``; no
fsync needed: it only has to survive the process, not the machine). After an unclean
shutdown the database must hold at least that timestamp; if it does not, or if the
database file is empty, the engine refuses to start unless told to ``repair``.

Test-only seams: ``limit_pages(n)`` caps the database size so commits fail with SQLite's
"database or disk is full" (disk-full tests); ``fail_next`` makes the next ``apply``
raise the given exception.
"""

from __future__ import annotations

import logging
import mmap
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bson

from accord.errors import EngineStartError
from accord.platform.embedded.wire import CODEC

log = logging.getLogger("accord.engine")

SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    ns TEXT PRIMARY KEY,
    spec BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS documents (
    ns TEXT NOT NULL,
    id BLOB NOT NULL,
    doc BLOB NOT NULL,
    UNIQUE (ns, id)
);
CREATE TABLE IF NOT EXISTS txn_records (
    lsid BLOB PRIMARY KEY,
    txn_number INTEGER NOT NULL,
    reply BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS journal (
    seq INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    batches BLOB NOT NULL
);
"""

# The side file: a timestamp of 20 digits and a newline.
_DURABLE_SIZE = 21

# A group carrying more document bytes than this is written to the tables by its own
# commit (after the journal rows before it), and a ``compact`` call moves no more than this
# after its first row: moving 50 MB of documents took the housekeeping thread half a
# second, during which every commit waited.
JOURNAL_MAX_BYTES = 4 * 1024 * 1024
# Journal rows moved into the tables per ``compact`` call (each call holds the writer
# role, so commits queue behind it: keep it short).
COMPACT_ROWS = 64


@dataclass
class CommitBatch:
    """Everything one commit (or catalog change) changes on disk, in this order:
    catalog operations, deletes, puts, transaction records."""

    ts: int = 0
    # ("save", ns, spec) | ("drop", ns, None) | ("rename", old, new)
    catalog: list[tuple[str, str, Any]] = field(default_factory=list)
    puts: list[tuple[str, bytes, bytes]] = field(default_factory=list)
    deletes: list[tuple[str, bytes]] = field(default_factory=list)
    txn_records: list[tuple[bytes, int, dict[str, Any]]] = field(default_factory=list)


# Bytes the WAL file keeps when it starts over (``PRAGMA journal_size_limit``): rewriting
# a file in place is a cheaper fsync than extending it, so it is not cut back to nothing.
WAL_SIZE_LIMIT = 64 * 1024 * 1024


class Storage:
    """SQLite-backed durable store. Calls are serialised by the group committer."""

    FILENAME = "accord-engine.sqlite3"
    DURABLE_FILE = "accord-engine.durable"

    def __init__(
        self, dbpath: Path, *, sync: bool = True, check_unclean: bool = False, repair: bool = False
    ) -> None:
        self.path = dbpath / self.FILENAME
        self._durable_path = dbpath / self.DURABLE_FILE
        self.fail_next: BaseException | None = None
        if self.path.exists() and self.path.stat().st_size == 0:
            if not repair:
                raise EngineStartError(
                    f"the database file {self.path} is empty: its data was lost or it was "
                    "truncated. Restore it from a backup, or start with --repair to begin "
                    "from an empty database (everything it held is gone)"
                )
            log.warning("--repair: starting over the empty database file %s", self.path)
            self.path.unlink()
        self._sync = sync
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        # Deleted content is overwritten with zeros, not left in free pages (an erased data
        # subject must not stay readable in the file): docs/engine.md, "Physical deletion".
        self._conn.execute("PRAGMA secure_delete=ON")
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=%s" % ("FULL" if sync else "OFF"))
        # Checkpoints (copying the WAL into the database file) run in the background
        # (``checkpoint``), not inside the commit that crosses SQLite's threshold.
        self._conn.execute("PRAGMA wal_autocheckpoint=0")
        # A WAL that a burst grew is cut back to this size when it next starts over.
        self._conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        self._conn.executescript(SCHEMA)
        self._checkpointer: sqlite3.Connection | None = None
        self._checkpoint_lock = threading.Lock()
        # Whether the WAL may hold frames not yet copied into the database file.
        self._unchecked = True
        row = self._conn.execute("SELECT value FROM meta WHERE name = 'last_ts'").fetchone()
        journal = self._conn.execute("SELECT max(ts) FROM journal").fetchone()
        self.last_ts: int = max(int(row[0]) if row else 0, int(journal[0] or 0))
        acknowledged = self._read_durable()
        if check_unclean and acknowledged > self.last_ts:
            message = (
                f"the last shutdown was unclean and the journal ({self.path.name}-wal) is "
                f"missing or truncated: commits up to cluster time {acknowledged >> 32}:"
                f"{acknowledged & 0xFFFFFFFF} were acknowledged, the database holds only up to "
                f"{self.last_ts >> 32}:{self.last_ts & 0xFFFFFFFF}. Restore the data directory "
                "from a backup, or start with --repair to accept the loss"
            )
            if not repair:
                self._conn.close()
                raise EngineStartError(message)
            log.warning("--repair: %s", message)
        # Mapped, so noting a timestamp is a store to memory rather than a system call on
        # every commit (the page cache keeps it when the process dies).
        fd = os.open(self._durable_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, _DURABLE_SIZE)
            self._durable = mmap.mmap(fd, _DURABLE_SIZE)
        finally:
            os.close(fd)
        self._note_durable(self.last_ts)
        try:
            self.compact_all()
        except sqlite3.Error as exc:
            self.close()
            raise EngineStartError(
                f"the commits in the journal of {self.path} could not be moved into its "
                f"tables ({exc}); nothing was lost: free space on the data directory's "
                "disk and start again"
            ) from exc

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
        self._conn.close()
        self._durable.close()

    def checkpoint(self) -> tuple[int, int]:
        """Copy the WAL into the database file (what SQLite's automatic checkpoint does
        inside a commit) if anything was written since the last complete copy. Runs on
        its own connection, concurrently with commits; returns SQLite's (frames in the
        WAL, frames of it now in the database file), or (0, 0) if there was nothing to
        copy. Once every frame is copied, the next write starts the WAL over."""
        with self._checkpoint_lock:  # one connection: one copy at a time
            if not self._unchecked:
                return 0, 0
            if self._checkpointer is None:
                self._checkpointer = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False
                )
                self._checkpointer.execute(
                    "PRAGMA synchronous=%s" % ("FULL" if self._sync else "OFF")
                )
                self._checkpointer.execute("PRAGMA secure_delete=ON")
            # Cleared first: a write during the copy sets it again.
            self._unchecked = False
            # fetchall: a statement left unfinished would keep a read of the WAL open.
            ((_, frames, copied),) = self._checkpointer.execute(
                "PRAGMA wal_checkpoint(PASSIVE)"
            ).fetchall()
            if copied < frames:
                self._unchecked = True
            return int(frames), int(copied)

    def _read_durable(self) -> int:
        try:
            text = self._durable_path.read_text().strip()
        except FileNotFoundError:
            return 0
        return int(text) if text.isdigit() else 0

    def _note_durable(self, ts: int) -> None:
        self._durable[:_DURABLE_SIZE] = b"%020d\n" % ts

    # -- recovery -------------------------------------------------------------------------

    def load_collections(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for ns, spec in self._conn.execute("SELECT ns, spec FROM collections ORDER BY rowid"):
            yield ns, bson.decode(spec, CODEC)

    def load_documents(self) -> Iterator[tuple[str, bytes, bytes]]:
        """``(ns, id key, BSON)`` of every document, in natural order within each
        collection: one pass over the table in rowid order (reading collection by
        collection through the ``(ns, id)`` index would sort each by rowid first)."""
        cur = self._conn.execute("SELECT ns, id, doc FROM documents NOT INDEXED ORDER BY rowid")
        while True:
            rows = cur.fetchmany(4096)
            if not rows:
                return
            yield from rows

    def load_txn_records(self) -> Iterator[tuple[bytes, int, dict[str, Any]]]:
        for lsid, number, reply in self._conn.execute(
            "SELECT lsid, txn_number, reply FROM txn_records"
        ):
            yield bytes(lsid), number, bson.decode(reply, CODEC)

    # -- writes ---------------------------------------------------------------------------

    def apply(self, batches: list[CommitBatch]) -> None:
        """Apply ``batches`` in order, atomically (and durably when sync is on)."""
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        last = max(self.last_ts, max(batch.ts for batch in batches))
        if _document_bytes(batches) <= JOURNAL_MAX_BYTES:
            # One autocommitted statement: atomic, and durable before it returns.
            self._conn.execute(
                "INSERT INTO journal (ts, batches) VALUES (?, ?)", (last, _encode(batches))
            )
            self._unchecked = True
        else:
            # Its cost is paid by its own commit, not by whoever commits while a later
            # compaction moves it: after the (small) journal rows before it, in order.
            rows = self._conn.execute("SELECT seq, ts, batches FROM journal ORDER BY seq")
            self._move(rows.fetchall(), batches, last)
        self.last_ts = last
        self._note_durable(last)

    def compact(self, rows: int = COMPACT_ROWS, max_bytes: int = JOURNAL_MAX_BYTES) -> int:
        """Move the oldest journal rows (at most ``rows``, and no more than ``max_bytes``
        of them after the first) into the tables, in order, in one SQLite transaction;
        returns how many moved (0: the journal is empty). The caller holds the group
        committer's writer role (nothing else writes meanwhile), so a call is kept short.
        If it fails (a full disk), nothing of it happened: the rows stay in the journal."""
        sizes = self._conn.execute(
            "SELECT seq, length(batches) FROM journal ORDER BY seq LIMIT ?", (rows,)
        ).fetchall()
        if not sizes:
            return 0
        upto, total = sizes[0][0], 0
        for seq, size in sizes:
            total += size
            if total > max_bytes and seq != sizes[0][0]:
                break
            upto = seq
        found = self._conn.execute(
            "SELECT seq, ts, batches FROM journal WHERE seq <= ? ORDER BY seq", (upto,)
        ).fetchall()
        self._move(found, [], found[-1][1])
        return len(found)

    def _move(
        self, rows: list[tuple[int, int, bytes]], batches: list[CommitBatch], tables_ts: int
    ) -> None:
        """In one SQLite transaction: journal ``rows`` into the tables (and out of the
        journal), then ``batches``; the tables then hold every commit up to
        ``tables_ts`` (``meta.last_ts``; the start-up check also takes the journal's
        newest row)."""
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            _write_tables(cur, [b for _, _, data in rows for b in _decode(data)] + batches)
            if rows:
                cur.execute("DELETE FROM journal WHERE seq <= ?", (rows[-1][0],))
            cur.execute(
                "INSERT INTO meta (name, value) VALUES ('last_ts', ?) "
                "ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)",
                (tables_ts,),
            )
            cur.execute("COMMIT")
            self._unchecked = True
        except BaseException:
            # SQLite may already have rolled back (SQLITE_FULL does): only roll back an
            # open transaction, so the real error is what the caller sees.
            if self._conn.in_transaction:
                try:
                    cur.execute("ROLLBACK")
                except sqlite3.Error:
                    log.exception("rollback after a failed write to the tables failed")
            raise

    def compact_all(self) -> None:
        """Empty the journal (at start-up, and at shutdown as the writer)."""
        while self.compact(4096):
            pass

    def vacuum(self) -> tuple[int, int]:
        """Leave nothing deleted readable in the files (the ``compact`` command): move the
        journal into the tables, rebuild the database file (``VACUUM``, its temporary copy
        in memory, not in a temporary file), copy the WAL into it and truncate the WAL to
        nothing (``wal_checkpoint(TRUNCATE)``). With ``secure_delete`` the pages freed
        meanwhile were zeroed; the rebuild leaves no free page and no stale cell behind.
        Returns the bytes of the database and WAL files (before, after). The caller holds
        the writer role."""
        before = self._files_bytes()
        with self._checkpoint_lock:  # no background copy of the WAL meanwhile
            self.compact_all()
            self._conn.execute("PRAGMA temp_store=MEMORY")
            self._conn.execute("VACUUM")
            for _ in range(100):
                ((busy, _frames, _copied),) = self._conn.execute(
                    "PRAGMA wal_checkpoint(TRUNCATE)"
                ).fetchall()
                if not busy:
                    break
                time.sleep(0.01)  # a reader of the WAL (none but ours): try again
            else:
                raise sqlite3.OperationalError("the WAL could not be truncated: still busy")
            self._unchecked = False
        return before, self._files_bytes()

    def _files_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            path = Path(f"{self.path}{suffix}")
            total += path.stat().st_size if path.exists() else 0
        return total

    # -- test-only seams --------------------------------------------------------------------

    def limit_pages(self, pages: int | None) -> None:
        """Cap the database at ``pages`` pages (None: lift the cap). Tests only."""
        value = 1073741823 if pages is None else max(1, pages)
        self._conn.execute(f"PRAGMA max_page_count = {int(value)}")

    def page_count(self) -> int:
        return int(self._conn.execute("PRAGMA page_count").fetchone()[0])


def _document_bytes(batches: list[CommitBatch]) -> int:
    return sum(len(data) for batch in batches for _, _, data in batch.puts)


def _encode(batches: list[CommitBatch]) -> bytes:
    """A group as one BSON document (documents are BSON already: they go in as binary)."""
    return bson.encode(
        {"b": [[b.ts, b.catalog, b.deletes, b.puts, b.txn_records] for b in batches]},
        codec_options=CODEC,
    )


def _decode(data: bytes) -> list[CommitBatch]:
    return [
        CommitBatch(
            ts=ts,
            catalog=[(op, a, b) for op, a, b in catalog],
            deletes=[(ns, key) for ns, key in deletes],
            puts=[(ns, key, doc) for ns, key, doc in puts],
            txn_records=[(lsid, number, reply) for lsid, number, reply in records],
        )
        for ts, catalog, deletes, puts, records in bson.decode(data, CODEC)["b"]
    ]


def _write_tables(cur: sqlite3.Cursor, batches: list[CommitBatch]) -> None:
    """Each batch's catalog operations, deletes, puts and transaction records, in order.

    Only each document's and each session's last state is written: a compaction moves
    up to ``COMPACT_ROWS`` groups at once, and most of their commits are retryable writes
    of a few sessions (a driver reuses its sessions), whose transaction records then take
    one row write per session instead of one per commit; a document written several times
    is written once. What a catalog operation (a drop, a rename) acts on is written before
    it, so the order still holds."""
    documents: dict[tuple[str, bytes], bytes | None] = {}  # None: deleted
    sessions: dict[bytes, tuple[int, dict[str, Any]]] = {}
    for batch in batches:
        if batch.catalog:
            _write_documents(cur, documents)
            documents.clear()
        for op, a, b in batch.catalog:
            if op == "save":
                cur.execute(
                    "INSERT INTO collections (ns, spec) VALUES (?, ?) "
                    "ON CONFLICT (ns) DO UPDATE SET spec = excluded.spec",
                    (a, bson.encode(b, codec_options=CODEC)),
                )
            elif op == "drop":
                cur.execute("DELETE FROM documents WHERE ns = ?", (a,))
                cur.execute("DELETE FROM collections WHERE ns = ?", (a,))
            elif op == "rename":
                cur.execute("UPDATE documents SET ns = ? WHERE ns = ?", (b, a))
                cur.execute("UPDATE collections SET ns = ? WHERE ns = ?", (b, a))
        for deleted in batch.deletes:
            documents[deleted] = None
        for ns, doc_id, doc in batch.puts:
            documents[(ns, doc_id)] = doc
        for lsid, number, reply in batch.txn_records:
            sessions[lsid] = (number, reply)
    _write_documents(cur, documents)
    if sessions:
        cur.executemany(
            "INSERT OR REPLACE INTO txn_records (lsid, txn_number, reply) VALUES (?, ?, ?)",
            [
                (lsid, number, bson.encode(reply, codec_options=CODEC))
                for lsid, (number, reply) in sessions.items()
            ],
        )


def _write_documents(cur: sqlite3.Cursor, documents: dict[tuple[str, bytes], bytes | None]) -> None:
    """Each document's last state: written, or deleted (None)."""
    deletes = [key for key, doc in documents.items() if doc is None]
    if deletes:
        cur.executemany("DELETE FROM documents WHERE ns = ? AND id = ?", deletes)
    puts = [(ns, key, doc) for (ns, key), doc in documents.items() if doc is not None]
    if puts:
        cur.executemany(
            "INSERT INTO documents (ns, id, doc) VALUES (?, ?, ?) "
            "ON CONFLICT (ns, id) DO UPDATE SET doc = excluded.doc",
            puts,
        )
