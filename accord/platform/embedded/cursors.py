"""Server-side cursors: materialised result sets served in batches under 16 MB.

Results are dicts or ``RawBSONDocument``s (stored BSON passed through untouched). Each
document is encoded at most once: ``_take`` measures a dict by encoding it and keeps the
encoding as a ``RawBSONDocument``, which the reply then embeds byte for byte.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.raw_bson import RawBSONDocument

from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.wire import CODEC, MAX_BSON_SIZE

Doc = dict[str, Any]
DEFAULT_FIRST_BATCH = 101
# Leave room for the reply envelope around the batch.
BATCH_BYTES = MAX_BSON_SIZE - 64 * 1024
CURSOR_TIMEOUT_S = 600.0


@dataclass
class Cursor:
    id: int
    ns: str
    docs: list[Any]
    pos: int = 0
    session: bytes | None = None
    last_used: float = field(default_factory=time.monotonic)
    # Who opened it, when the engine checks privileges: (user, re-check of the privileges
    # that opened it); see auth/checks.py.
    owner: Any = None


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

    def exists(self, cursor_id: int) -> bool:
        return cursor_id in self.cursors or cursor_id in self.streams

    def claim(self, cursor_id: int, owner: Any) -> None:
        """Record who opened ``cursor_id`` (the dispatcher, right after the command)."""
        found = self.cursors.get(cursor_id) or self.streams.get(cursor_id)
        if found is not None:
            found.owner = owner

    def new_id(self) -> int:
        return next(self._ids)

    def first_batch(
        self, ns: str, docs: list[Any], batch_size: int | None, session: bytes | None,
        *, single_batch: bool = False, key: str = "firstBatch",
    ) -> Doc:  # fmt: skip
        cursor = Cursor(id=0, ns=ns, docs=docs, session=session)
        batch = self._take(cursor, DEFAULT_FIRST_BATCH if batch_size is None else batch_size)
        cursor_id = 0
        if cursor.pos < len(docs) and not single_batch:
            cursor_id = cursor.id = next(self._ids)
            self.cursors[cursor_id] = cursor
        return {"cursor": {key: batch, "id": bson.Int64(cursor_id), "ns": ns}, "ok": 1.0}

    def get_more(self, cursor_id: int, ns: str, batch_size: int | None) -> Doc:
        cursor = self.cursors.get(cursor_id)
        if cursor is None:
            raise EngineError(Code.CursorNotFound, f"cursor id {cursor_id} not found")
        if cursor.ns != ns:
            raise EngineError(
                Code.Unauthorized,
                f"Requested getMore on namespace '{ns}', but cursor belongs to '{cursor.ns}'",
            )
        cursor.last_used = time.monotonic()
        batch = self._take(cursor, batch_size or None)
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
            if cursor.last_used < deadline:
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
            if not isinstance(doc, RawBSONDocument):
                doc = RawBSONDocument(bson.encode(doc, codec_options=CODEC))
            doc_size = len(doc.raw)
            if batch and size + doc_size > BATCH_BYTES:
                break
            batch.append(doc)
            size += doc_size
            cursor.pos += 1
        return batch
