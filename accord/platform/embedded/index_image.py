"""The index image: every secondary index's entries, written at a clean shutdown, so that
the next start neither decodes every document nor sorts every index again.

Start-up otherwise rebuilds each index from the documents (decode, extract keys, sort):
most of the start-up time. The image holds, per collection, its document count and, per
index, its spec, its multikey flag and its entries in index order as ``(key, id key)``
(only the newest version of each document: a clean shutdown leaves no older one that a
reader could still need), plus the unique-key owners where they differ from the entries
(paths through arrays, collations).

The payload is a pickle of plain values only (tuples, lists, dicts, strings, bytes,
numbers, ``Decimal`` for Decimal128 keys), read by an unpickler that refuses every other
class, so a crafted file cannot run code. It is a cache, never a source of truth: it is used only when everything says it
describes exactly the data being loaded, and otherwise the indexes are rebuilt as
before. It must carry the database's last commit timestamp (every durable write moves
it), the catalog's index specs, and each collection's document count, and every entry
must name a loaded document; its bytes carry a checksum. It is read once and deleted at
start-up before the engine serves anything, so a crash later on can never leave a stale
image behind; the next clean shutdown writes a new one.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import pickle
import struct
import zlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import bson

from accord.platform.embedded.indexes import Index
from accord.platform.embedded.versions import Record
from accord.platform.embedded.wire import CODEC

log = logging.getLogger("accord.engine")

FILENAME = "accord-engine.indexes"
FORMAT = 1
_HEADER = struct.Struct("<8sIIQ")  # magic, format, crc32 of the payload, payload length
_MAGIC = b"ACCIDX01"

Key = tuple[Any, ...]


@dataclass
class IndexImage:
    spec: bytes  # the index spec as BSON, compared with the catalog's
    multikey: bool
    # The entries in index order: one column per key field, and their documents' id keys.
    keys: list[tuple[Any, ...]]
    ids: list[bytes]
    # Unique-key owners (key, id key) when they are not the entries themselves.
    owners: list[tuple[Key, bytes]] | None


@dataclass
class CollectionImage:
    count: int
    indexes: dict[str, IndexImage]


class _PlainUnpickler(pickle.Unpickler):
    """Plain values only: the one class a sort key may hold is ``decimal.Decimal``."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("decimal", "Decimal"):
            return Decimal
        raise pickle.UnpicklingError(f"the index image may not hold {module}.{name}")


def spec_bytes(spec: dict[str, Any]) -> bytes:
    return bson.encode(spec, codec_options=CODEC)


def path_in(dbpath: Path) -> Path:
    return dbpath / FILENAME


def write(*args: Any) -> None:
    """``_write`` with Python's cyclic collector off: it allocates millions of tuples and
    none of them is garbage (the collector would walk them again and again)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        _write(*args)
    finally:
        if collecting:
            gc.enable()


def _write(
    dbpath: Path, last_ts: int,
    collections: Iterable[
        tuple[str, Collection[Record], list[Index], dict[str, dict[Key, bytes]]]
    ],
) -> None:  # fmt: skip
    """Write the image of ``collections`` (``(ns, records, secondary indexes, unique
    owners)``, every commit durable, nothing older than the newest version needed)."""
    image: dict[str, tuple[int, dict[str, tuple[Any, ...]]]] = {}
    for ns, records, indexes, unique_maps in collections:
        count = sum(1 for r in records if r.data is not None)
        saved: dict[str, tuple[Any, ...]] = {}
        for index in indexes:
            entries: Any = index.entries
            if any(r.older is not None or r.data is None for r in records):
                # Older versions and deletes are still retained: keep the newest only.
                entries = [e for e in entries if e[-2] == e[-1].ts and e[-1].data is not None]
            nfields = len(index.fields)
            # One column per key field (transposed in C; shared key objects stay shared in
            # the pickle), and the id key of each entry's document.
            columns = list(zip(*entries, strict=True)) if len(entries) else [()] * (nfields + 3)
            keys = columns[:nfields]
            ids = [r.key for r in columns[-1]]
            owners = unique_maps.get(index.name)
            explicit = owners is not None and (index.multikey or index.collation is not None)
            saved[index.name] = (
                spec_bytes(index.spec), index.multikey, keys, ids,
                list(owners.items()) if explicit and owners is not None else None,
            )  # fmt: skip
        image[ns] = (count, saved)
    store(dbpath, pickle.dumps((last_ts, image), protocol=pickle.HIGHEST_PROTOCOL))


def store(dbpath: Path, payload: bytes) -> None:
    """Write ``payload`` as the image file (header with its checksum, then the bytes),
    replacing any image atomically."""
    header = _HEADER.pack(_MAGIC, FORMAT, zlib.crc32(payload), len(payload))
    target = path_in(dbpath)
    partial = target.with_name(target.name + ".partial")
    with open(partial, "wb") as f:
        f.write(header)
        f.write(payload)
    os.replace(partial, target)


def take(dbpath: Path, last_ts: int) -> dict[str, CollectionImage] | None:
    """Read the image and delete it; None if there is none, or it is damaged, or it was
    written for another state of the database than ``last_ts``."""
    target = path_in(dbpath)
    try:
        data = target.read_bytes()
    except FileNotFoundError:
        return None
    finally:
        discard(dbpath)
    try:
        magic, fmt, crc, length = _HEADER.unpack_from(data)
        payload = memoryview(data)[_HEADER.size :]
        if magic != _MAGIC or fmt != FORMAT or length != len(payload) or zlib.crc32(payload) != crc:
            log.warning("index image %s is damaged: rebuilding the indexes", target)
            return None
        saved_ts, raw = _PlainUnpickler(io.BytesIO(payload)).load()
        if saved_ts != last_ts:
            log.warning("index image %s is not of this data: rebuilding the indexes", target)
            return None
        return {
            ns: CollectionImage(
                count, {name: IndexImage(*fields) for name, fields in saved.items()}
            )
            for ns, (count, saved) in raw.items()
        }
    except Exception:
        log.warning("index image %s is unreadable: rebuilding the indexes", target)
        return None


def discard(dbpath: Path) -> None:
    """Delete the image (and any half-written one)."""
    target = path_in(dbpath)
    for p in (target, target.with_name(target.name + ".partial")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


__all__ = [
    "FILENAME", "CollectionImage", "IndexImage", "discard", "path_in", "spec_bytes", "store", "take",
    "write",
]  # fmt: skip
