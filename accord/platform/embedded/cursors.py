"""Server-side cursors: materialised result sets served in batches under 16 MB.

Results are dicts or ``RawBSONDocument``s (stored BSON passed through untouched). Each
document is encoded at most once: ``_take`` measures a dict by encoding it and keeps the
encoding as a ``RawBSONDocument``, which the reply then embeds byte for byte.

A read hands its results over already encoded (``packed``: ``bytes``, which Python's
cyclic garbage collector does not track; 100,000 decoded documents kept by a cursor made
every full collection walk half a million objects, 170 ms with every thread stopped).

A cursor's documents are its own, so a batch is encoded with the engine lock released
(``release``, ``Engine.released``: a 16 MB batch took 290 ms under it). Meanwhile the
cursor is pinned: another ``getMore`` on it is refused with ``CursorInUse``, as mongod
refuses one on a cursor in use, and a cursor killed meanwhile ends that ``getMore`` with
``CursorKilled``.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.raw_bson import RawBSONDocument

from accord.platform.embedded import writes_first
from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.wire import CODEC, MAX_BSON_SIZE

Doc = dict[str, Any]
DEFAULT_FIRST_BATCH = 101
# Leave room for the reply envelope around the batch.
BATCH_BYTES = MAX_BSON_SIZE - 64 * 1024
CURSOR_TIMEOUT_S = 600.0
# mongod's BSONObjMaxInternalSize: the largest document it builds (a result of a pipeline
# or a projection included), 16 MB plus 16 KB of room; a larger one fails the command with
# BSONObjectTooLarge (only stored documents are held to 16 MB).
MAX_RESULT_SIZE = MAX_BSON_SIZE + 16 * 1024
# ``Engine.released`` for one read (or None: the work stays under the lock).
Release = Callable[[], AbstractContextManager[None]] | None


@dataclass
class Cursor:
    id: int
    ns: str
    docs: list[Any]
    pos: int = 0
    session: bytes | None = None
    # The transaction (its txnNumber in ``session``) that opened it; None: none did.
    txn_number: int | None = None
    last_used: float = field(default_factory=time.monotonic)
    # Who opened it, when the engine checks privileges: (user, re-check of the privileges
    # that opened it); see auth/checks.py.
    owner: Any = None
    # A getMore is encoding a batch of it with the engine lock released.
    pinned: bool = False


def packed(docs: Iterable[Any]) -> list[bytes]:
    """Results as the BSON a reply embeds: dicts encoded, stored BSON as it is."""
    out: list[bytes] = []
    countdown = writes_first.CHECK_EVERY
    for doc in docs:
        # With the engine lock released (a read's results): step aside for writes.
        countdown -= 1
        if not countdown:
            countdown = writes_first.CHECK_EVERY
            writes_first.step_aside()
        if isinstance(doc, RawBSONDocument):
            out.append(bytes(doc.raw))
        elif isinstance(doc, bytes):
            out.append(doc)
        else:
            out.append(bson.encode(doc, codec_options=CODEC))
    return out


class CursorManager:
    def __init__(self) -> None:
        self.cursors: dict[int, Cursor] = {}
        # Cursors that produce as they go (change streams): id -> object with ``ns``,
        # ``session`` and ``last_used``; served by their own module, killed and reaped here.
        self.streams: dict[int, Any] = {}
        self._ids = itertools.count(random.randint(1, 2**40))

    def owner_of(self, cursor_id: int) -> Any:
        """The ``owner`` recorded for a live cursor (None: no such cursor, or none
        recorded)."""
        found = self.cursors.get(cursor_id) or self.streams.get(cursor_id)
        return getattr(found, "owner", None)

    def ns_of(self, cursor_id: int) -> str | None:
        """The namespace a live cursor reads (None: no such cursor)."""
        found = self.cursors.get(cursor_id) or self.streams.get(cursor_id)
        return None if found is None else str(found.ns)

    def exists(self, cursor_id: int) -> bool:
        return cursor_id in self.cursors or cursor_id in self.streams

    def claim(self, cursor_id: int, owner: Any) -> None:
        """Record who opened ``cursor_id`` (the dispatcher, right after the command)."""
        found = self.cursors.get(cursor_id) or self.streams.get(cursor_id)
        if found is not None:
            found.owner = owner

    def check_session(self, cursor_id: int, session: bytes | None) -> None:
        """Refuse a ``getMore`` from another session than the one that opened the cursor,
        with mongod's codes (50736, 50737, 50738): a cursor's results (a transaction's
        uncommitted writes among them) are its session's."""
        found = self.cursors.get(cursor_id) or self.streams.get(cursor_id)
        if found is None:
            return
        owner: bytes | None = found.session
        if owner == session:
            return
        prefix = f"Cannot run getMore on cursor {cursor_id}, which was"
        if owner is None:
            message = f"{prefix} not created in a session, in session {_lsid_text(session)}"
            raise EngineError(Code.Location50736, message)
        if session is None:
            message = f"{prefix} created in session {_lsid_text(owner)}, without an lsid"
            raise EngineError(Code.Location50737, message)
        message = (
            f"{prefix} created in session {_lsid_text(owner)}, in session {_lsid_text(session)}"
        )
        raise EngineError(Code.Location50738, message)

    def bind_transaction(self, cursor_id: int, txn_number: int) -> None:
        """Record that ``cursor_id`` was opened in transaction ``txn_number`` of its session
        (the dispatcher, right after a command in a transaction)."""
        found = self.cursors.get(cursor_id)
        if found is not None:
            found.txn_number = txn_number

    def check_transaction(self, cursor_id: int, txn_number: int | None) -> None:
        """Refuse a ``getMore`` outside the transaction that opened the cursor, or inside
        one on a cursor opened outside it, with mongod's codes (50739, 50740, 50741): a
        transaction's cursor reads its snapshot and uncommitted writes, which no other
        transaction (nor a read after it ended) may see. Checked after ``check_session``."""
        found = self.cursors.get(cursor_id) or self.streams.get(cursor_id)
        if found is None:
            return
        opened_in: int | None = getattr(found, "txn_number", None)
        if opened_in == txn_number:
            return
        prefix = f"Cannot run getMore on cursor {cursor_id}, which was"
        if opened_in is None:
            message = f"{prefix} not created in a transaction, in transaction {txn_number}"
            raise EngineError(Code.Location50739, message)
        if txn_number is None:
            message = f"{prefix} created in transaction {opened_in}, without a txnNumber"
            raise EngineError(Code.Location50740, message)
        message = f"{prefix} created in transaction {opened_in}, in transaction {txn_number}"
        raise EngineError(Code.Location50741, message)

    def new_id(self) -> int:
        return next(self._ids)

    def first_batch(
        self, ns: str, docs: list[Any], batch_size: int | None, session: bytes | None,
        *, single_batch: bool = False, key: str = "firstBatch", release: Release = None,
    ) -> Doc:  # fmt: skip
        """Reply with the first batch of ``docs``, keeping the rest as a cursor;
        ``release`` lets the batch be encoded with the engine lock released."""
        cursor = Cursor(id=0, ns=ns, docs=docs, session=session)
        with release() if release is not None else nullcontext():
            batch = self._take(cursor, DEFAULT_FIRST_BATCH if batch_size is None else batch_size)
        cursor_id = 0
        if cursor.pos < len(docs) and not single_batch:
            cursor_id = cursor.id = next(self._ids)
            self.cursors[cursor_id] = cursor
        return {"cursor": {key: batch, "id": bson.Int64(cursor_id), "ns": ns}, "ok": 1.0}

    def get_more(
        self, cursor_id: int, ns: str, batch_size: int | None, release: Release = None
    ) -> Doc:
        """The next batch of a cursor; ``release`` lets it be encoded with the engine lock
        released (the cursor pinned meanwhile)."""
        cursor = self.cursors.get(cursor_id)
        if cursor is None:
            raise EngineError(Code.CursorNotFound, f"cursor id {cursor_id} not found")
        if cursor.ns != ns:
            raise EngineError(
                Code.Unauthorized,
                f"Requested getMore on namespace '{ns}', but cursor belongs to '{cursor.ns}'",
            )
        if cursor.pinned:
            raise EngineError(
                Code.CursorInUse, f"Cursor already in use (namespace: '{ns}', id: {cursor_id})."
            )
        cursor.last_used = time.monotonic()
        cursor.pinned = True
        try:
            with release() if release is not None else nullcontext():
                batch = self._take(cursor, batch_size or None)
        except EngineError:
            # mongod kills a cursor whose getMore fails (a result too large).
            if self.cursors.get(cursor_id) is cursor:
                del self.cursors[cursor_id]
            raise
        finally:
            cursor.pinned = False
        if self.cursors.get(cursor_id) is not cursor:
            raise EngineError(
                Code.CursorKilled, f"cursor id {cursor_id} was killed while a getMore read it"
            )
        next_id = cursor_id
        if cursor.pos >= len(cursor.docs):
            del self.cursors[cursor_id]
            next_id = 0
        return {"cursor": {"nextBatch": batch, "id": bson.Int64(next_id), "ns": ns}, "ok": 1.0}

    def kill(self, ids: list[int]) -> Doc:
        killed: list[bson.Int64] = []
        missing: list[bson.Int64] = []
        for cid in ids:
            found = self.cursors.pop(cid, None) or self.streams.pop(cid, None)
            (killed if found else missing).append(bson.Int64(cid))
        return {
            "cursorsKilled": killed, "cursorsNotFound": missing,
            "cursorsAlive": [], "cursorsUnknown": [], "ok": 1.0,
        }  # fmt: skip

    def kill_session(self, session: bytes) -> None:
        for cid, cursor in list(self.cursors.items()):
            if cursor.session == session:
                del self.cursors[cid]
        for cid, stream in list(self.streams.items()):
            if stream.session == session:
                del self.streams[cid]

    def reap(self) -> None:
        deadline = time.monotonic() - CURSOR_TIMEOUT_S
        for cid, cursor in list(self.cursors.items()):
            if cursor.last_used < deadline and not cursor.pinned:
                del self.cursors[cid]
        for cid, stream in list(self.streams.items()):
            if stream.last_used < deadline:
                del self.streams[cid]

    @staticmethod
    def _take(cursor: Cursor, limit: int | None) -> list[Any]:
        """Up to ``limit`` docs (None = no count limit), never more than fits in one reply."""
        batch: list[Any] = []
        size = 0
        while cursor.pos < len(cursor.docs) and (limit is None or len(batch) < limit):
            doc = cursor.docs[cursor.pos]
            if isinstance(doc, bytes):
                doc = RawBSONDocument(doc)
            elif not isinstance(doc, RawBSONDocument):
                doc = RawBSONDocument(bson.encode(doc, codec_options=CODEC))
            doc_size = len(doc.raw)
            if doc_size > MAX_RESULT_SIZE:
                raise result_too_large(bytes(doc.raw))
            if batch and size + doc_size > BATCH_BYTES:
                break
            batch.append(doc)
            size += doc_size
            cursor.pos += 1
        return batch


def result_too_large(raw: bytes) -> EngineError:
    """mongod's error for a result document over ``MAX_RESULT_SIZE`` (a ``$group`` that
    ``$push``-ed too much, a ``$lookup`` that joined too much ...), instead of a reply no
    driver should have to accept."""
    size = len(raw)
    first = ""
    try:
        name, value = next(iter(RawBSONDocument(raw).items()))
        first = f" First element: {name}: {_short(value)}"
    except Exception:  # noqa: BLE001, S110 (only for a message)
        pass
    return EngineError(
        Code.BSONObjectTooLarge,
        f"BSONObj size: {size} (0x{size:X}) is invalid. "
        f"Size must be between 0 and {MAX_RESULT_SIZE}(16MB){first}",
    )


def _short(value: Any) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _lsid_text(key: bytes | None) -> str:
    """A session key (the BSON of ``{id: UUID}``) as mongod prints an lsid."""
    try:
        value = bson.decode(key or b"").get("id")
    except Exception:  # noqa: BLE001 (only for a message)
        value = None
    if isinstance(value, bson.Binary):
        try:
            return f'{{ id: UUID("{value.as_uuid()}") }}'
        except ValueError:
            pass
    return repr(value)
