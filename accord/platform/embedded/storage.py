"""The durable store under the engine's in-memory working set: SQLite in WAL mode.

One SQLite transaction per committed MongoDB transaction (or per autocommitted write
command), so a commit is atomic on disk, and with ``sync=True`` (``synchronous=FULL``) the
WAL is fsynced before the commit is acknowledged. SQLite's WAL frames are checksummed and a
torn tail is discarded at recovery, which is exactly the journal contract the engine needs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bson

from accord.platform.embedded.wire import CODEC

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
"""


@dataclass
class CommitBatch:
    """Everything one commit changes on disk."""

    puts: list[tuple[str, bytes, dict[str, Any]]] = field(default_factory=list)
    deletes: list[tuple[str, bytes]] = field(default_factory=list)
    txn_records: list[tuple[bytes, int, dict[str, Any]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.puts or self.deletes or self.txn_records)


class Storage:
    """SQLite-backed durable store. Not thread-safe: the engine serialises calls."""

    FILENAME = "accord-engine.sqlite3"

    def __init__(self, dbpath: Path, *, sync: bool = True) -> None:
        self.path = dbpath / self.FILENAME
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=%s" % ("FULL" if sync else "OFF"))
        self._conn.executescript(SCHEMA)

    def close(self) -> None:
        self._conn.close()

    # -- recovery -------------------------------------------------------------------------

    def load_collections(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for ns, spec in self._conn.execute("SELECT ns, spec FROM collections ORDER BY rowid"):
            yield ns, bson.decode(spec, CODEC)

    def load_documents(self, ns: str) -> Iterator[tuple[bytes, dict[str, Any]]]:
        rows = self._conn.execute(
            "SELECT id, doc FROM documents WHERE ns = ? ORDER BY rowid", (ns,)
        )
        for key, doc in rows:
            yield bytes(key), bson.decode(doc, CODEC)

    def load_txn_records(self) -> Iterator[tuple[bytes, int, dict[str, Any]]]:
        for lsid, number, reply in self._conn.execute(
            "SELECT lsid, txn_number, reply FROM txn_records"
        ):
            yield bytes(lsid), number, bson.decode(reply, CODEC)

    # -- writes ---------------------------------------------------------------------------

    def commit(self, batch: CommitBatch) -> None:
        """Apply one batch atomically (and durably when sync is on)."""
        if not batch:
            return
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            if batch.deletes:
                cur.executemany("DELETE FROM documents WHERE ns = ? AND id = ?", batch.deletes)
            if batch.puts:
                cur.executemany(
                    "INSERT INTO documents (ns, id, doc) VALUES (?, ?, ?) "
                    "ON CONFLICT (ns, id) DO UPDATE SET doc = excluded.doc",
                    _encoded(batch.puts),
                )
            if batch.txn_records:
                cur.executemany(
                    "INSERT OR REPLACE INTO txn_records (lsid, txn_number, reply) VALUES (?, ?, ?)",
                    [(lsid, n, bson.encode(reply)) for lsid, n, reply in batch.txn_records],
                )
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise

    def save_collection(self, ns: str, spec: dict[str, Any]) -> None:
        self._conn.execute(
            "INSERT INTO collections (ns, spec) VALUES (?, ?) "
            "ON CONFLICT (ns) DO UPDATE SET spec = excluded.spec",
            (ns, bson.encode(spec)),
        )

    def drop_collection(self, ns: str) -> None:
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            cur.execute("DELETE FROM documents WHERE ns = ?", (ns,))
            cur.execute("DELETE FROM collections WHERE ns = ?", (ns,))
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise

    def rename_collection(self, old: str, new: str) -> None:
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            cur.execute("UPDATE documents SET ns = ? WHERE ns = ?", (new, old))
            cur.execute("UPDATE collections SET ns = ? WHERE ns = ?", (new, old))
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise


def _encoded(
    puts: Iterable[tuple[str, bytes, dict[str, Any]]],
) -> Iterator[tuple[str, bytes, bytes]]:
    for ns, key, doc in puts:
        yield ns, key, bson.encode(doc, codec_options=CODEC)
