"""Committed versions of one document, stored as raw BSON.

A ``Record`` is one document identity (``_id``) in one collection. Its newest version is
``(ts, data)``; versions an open snapshot may still read are kept in ``older`` (oldest
first). ``data`` is the BSON the commit wrote to disk (``None`` for a delete), so a read
decodes a fresh dict (cheaper than the ``deepcopy`` it replaces, and the caller owns it),
and a reply can carry the bytes without re-encoding them. Memory is that of the BSON plus
one small object per document. Versions loaded at start-up have ``ts == 0``: visible to
every snapshot.

``rid`` is the record's position in natural order (mongod's RecordId): index entries with
equal keys come back in that order.
"""

from __future__ import annotations

from typing import Any

import bson

from accord.platform.embedded.wire import CODEC

Doc = dict[str, Any]
Version = tuple[int, bytes | None]


class Record:
    __slots__ = ("key", "rid", "ts", "data", "older")

    def __init__(self, key: bytes, rid: int, ts: int, data: bytes | None) -> None:
        self.key = key
        self.rid = rid
        self.ts = ts
        self.data = data
        self.older: list[Version] | None = None

    def at(self, snapshot: int) -> Version | None:
        """The version a reader at ``snapshot`` sees, or None if none existed yet."""
        if self.ts <= snapshot:
            return self.ts, self.data
        older = self.older
        if older:
            for i in range(len(older) - 1, -1, -1):
                if older[i][0] <= snapshot:
                    return older[i]
        return None

    def data_at(self, snapshot: int) -> bytes | None:
        """The BSON a reader at ``snapshot`` sees, or None (absent or deleted)."""
        if self.ts <= snapshot:
            return self.data
        version = self.at(snapshot)
        return None if version is None else version[1]

    def push(self, ts: int, data: bytes | None) -> None:
        """Install a newer version; the current one becomes history."""
        if self.older is None:
            self.older = [(self.ts, self.data)]
        else:
            self.older.append((self.ts, self.data))
        self.ts, self.data = ts, data

    def pop(self) -> Version:
        """Remove the newest version (a commit that did not become durable); return it."""
        popped = (self.ts, self.data)
        assert self.older, "pop needs an older version"
        self.ts, self.data = self.older.pop()
        if not self.older:
            self.older = None
        return popped

    def prune(self, horizon: int) -> list[Version]:
        """Drop versions no reader at or after ``horizon`` can see; return them."""
        older = self.older
        if not older:
            return []
        if self.ts <= horizon:
            dropped, self.older = older, None
            return dropped
        # Keep the newest older version at or before the horizon: readers there see it.
        keep = 0
        for i in range(len(older) - 1, -1, -1):
            if older[i][0] <= horizon:
                keep = i
                break
        if keep == 0:
            return []
        dropped = older[:keep]
        del older[:keep]
        return dropped


def decode(data: bytes) -> Doc:
    return bson.decode(data, CODEC)


def encode(doc: Doc) -> bytes:
    return bson.encode(doc, codec_options=CODEC)
