"""Ordered indexes: entries in BSON order in a ``sortedcontainers.SortedList``.

An entry is ``(*key, rid, ts, record)``: the index key of one version of one document
(one ``sort_key`` per indexed field, ``Desc``-wrapped for a descending field), the
record's natural-order id, the commit timestamp of that version, and the record. A
document has entries for every version an open snapshot may still read, so one index
serves every snapshot: a scan yields an entry only if its version is the one the reader
sees (``record.at(snapshot)[0] == ts``). Garbage collection removes the entries of the
versions it prunes. Equal keys come back in natural order (``rid``), as mongod's
RecordId order.

The ``_id`` index is different: ``_id`` never changes for a record, so its entries are
per record (``ts == -1``) and visibility is the record's. Point lookups on ``_id`` use the
collection's record map; the ordered ``_id`` index (ranges, sorts) is built on first use.

Bounds are probes into the entry order: a probe is a prefix of an entry; ``HIGH`` after
a prefix places it after every entry with that prefix (see ``Range``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedList

from accord.platform.embedded import bsonkey
from accord.platform.embedded.bsonkey import HIGH, NULL_KEY, Desc, sort_key
from accord.platform.embedded.versions import Record

Doc = dict[str, Any]
Key = tuple[Any, ...]
# (low probe, high probe): the entries e with low <= e < high, by bisect_left.
Range = tuple[tuple[Any, ...], tuple[Any, ...]]
ORDERED_KINDS = (1, -1)
_MISSING = object()


def _is_direction(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value != 0


@dataclass
class ScanStats:
    """What a plan examined, for ``explain``'s executionStats."""

    keys_examined: int = 0
    docs_examined: int = 0


@dataclass(eq=False)
class Index:
    """One index: its spec as ``listIndexes`` shows it, and its ordered entries."""

    name: str
    key: list[tuple[str, Any]]
    unique: bool = False
    sparse: bool = False
    partial: Doc | None = None
    expire_after: float | None = None
    spec: Doc = field(default_factory=dict)
    entries: SortedList = field(default_factory=SortedList, repr=False)
    # Set once any document had an array on an indexed path (as mongod's multikey flag):
    # a multikey index still bounds a query but cannot provide a sort order.
    multikey: bool = False
    # Whether entries are maintained (the _id index builds them lazily).
    built: bool = True

    @property
    def fields(self) -> list[str]:
        return [f for f, _ in self.key]

    @property
    def directions(self) -> list[int]:
        return [1 if not _is_direction(d) or d > 0 else -1 for _, d in self.key]

    @property
    def is_id(self) -> bool:
        return self.name == "_id_"

    @property
    def orderable(self) -> bool:
        """Plain ascending/descending key (not text, 2d, 2dsphere, hashed)."""
        return all(_is_direction(d) for _, d in self.key)

    @property
    def orderable_or_hashed(self) -> bool:
        """Whether the engine keeps entries for it (text and geo indexes have none)."""
        return all(_is_direction(d) or d == "hashed" for _, d in self.key)

    @property
    def plannable(self) -> bool:
        """Whether the planner may use it (not hidden, no collation, not text/geo)."""
        if self.spec.get("hidden") or self.spec.get("collation"):
            return False
        return all(_is_direction(d) or d == "hashed" for _, d in self.key)

    @classmethod
    def from_spec(cls, spec: Doc) -> Index:
        index = cls(
            name=spec["name"],
            key=list(spec["key"].items()),
            unique=bool(spec.get("unique", False)),
            sparse=bool(spec.get("sparse", False)),
            partial=spec.get("partialFilterExpression"),
            expire_after=spec.get("expireAfterSeconds"),
            spec=spec,
        )
        if index.is_id:
            index.built = False
        return index

    # -- keys -------------------------------------------------------------------------------

    def key_tuples(self, doc: Doc, matches: Any = None) -> list[Key]:
        """The undirected keys of ``doc`` (one ``sort_key`` per field), deduplicated;
        empty when a sparse or partial index leaves the document out. ``matches`` is the
        filter evaluator (for partial indexes)."""
        if self.partial is not None and (matches is None or not matches(self.partial, doc)):
            return []
        per_field: list[list[Key]] = []
        present = False
        multi = False
        for path in self.fields:
            keys, found, arrays = path_keys(doc, path)
            present = present or found
            multi = multi or arrays
            per_field.append(keys)
        if self.sparse and not present:
            return []
        if multi:
            self.multikey = True
        if len(per_field) == 1:
            return [(k,) for k in dict.fromkeys(per_field[0])]
        return list(dict.fromkeys(itertools.product(*per_field)))

    def directed(self, key: Key) -> Key:
        """A key in entry order (descending fields wrapped)."""
        dirs = self.directions
        if all(d > 0 for d in dirs):
            return key
        return tuple(k if d > 0 else Desc(k) for k, d in zip(key, dirs, strict=True))

    # -- maintenance ------------------------------------------------------------------------

    def add_version(self, record: Record, ts: int, keys: list[Key]) -> None:
        if not self.built:
            return
        rid = record.rid
        for k in keys:
            self.entries.add((*self.directed(k), rid, ts, record))

    def remove_version(self, record: Record, ts: int, keys: list[Key]) -> None:
        if not self.built:
            return
        rid = record.rid
        for k in keys:
            self.entries.discard((*self.directed(k), rid, ts, record))

    def add_record(self, record: Record, id_value: Any) -> None:
        """The ``_id`` index: one entry per record."""
        if self.built:
            self.entries.add((sort_key(id_value), record.rid, -1, record))

    def remove_record(self, record: Record, id_value: Any) -> None:
        if self.built:
            self.entries.discard((sort_key(id_value), record.rid, -1, record))

    def build_id(self, records: Iterator[tuple[Record, Any]]) -> None:
        self.entries = SortedList((sort_key(v), r.rid, -1, r) for r, v in records)
        self.built = True

    # -- reads ------------------------------------------------------------------------------

    def count(self, ranges: list[Range]) -> int:
        """Entries within ``ranges`` (every retained version; O(log n) per range)."""
        entries = self.entries
        total = 0
        for lo, hi in ranges:
            start, stop = entries.bisect_left(lo), entries.bisect_left(hi)
            if stop > start:
                total += stop - start
        return total

    def scan(
        self, ranges: list[Range], *, reverse: bool, snapshot: int, stats: ScanStats,
        skip: dict[bytes, Any] | None = None,
    ) -> Iterator[tuple[Record, bytes]]:  # fmt: skip
        """The documents a reader at ``snapshot`` sees, in entry order within each range
        (ranges must be in entry order; ``reverse`` walks everything backwards). Records
        in ``skip`` (the reader's own writes) are left out; each record is yielded once."""
        entries = self.entries
        id_level = self.is_id
        seen: set[int] | None = set() if (self.multikey or len(ranges) > 1) else None
        for lo, hi in reversed(ranges) if reverse else ranges:
            for entry in entries.irange(lo, hi, inclusive=(True, False), reverse=reverse):
                stats.keys_examined += 1
                record: Record = entry[-1]
                if skip and record.key in skip:
                    continue
                if id_level:
                    data = record.data_at(snapshot)
                else:
                    version = record.at(snapshot)
                    if version is None or version[0] != entry[-2]:
                        continue
                    data = version[1]
                if data is None:
                    continue
                if seen is not None:
                    if record.rid in seen:
                        continue
                    seen.add(record.rid)
                yield record, data


def path_keys(doc: Any, path: str) -> tuple[list[Key], bool, bool]:
    """Index keys of one field path: ``(keys, present, through_array)``.

    Arrays are expanded as a multikey index does (an empty array and a missing value key
    as null). Where a path crosses an array, both readings of a numeric part (position
    and field name) contribute keys, and array elements without the field key as null:
    extra keys only cost a re-check, a missing one would lose a match.
    """
    current: list[Any] = [doc]
    arrays = False
    for part in path.split("."):
        nxt: list[Any] = []
        for value in current:
            if isinstance(value, dict):
                nxt.append(value.get(part, _MISSING))
            elif isinstance(value, list):
                arrays = True
                if part.isdigit() and int(part) < len(value):
                    nxt.append(value[int(part)])
                for element in value:
                    nxt.append(
                        element.get(part, _MISSING) if isinstance(element, dict) else _MISSING
                    )
            else:
                nxt.append(_MISSING)
        current = nxt
    keys: list[Key] = []
    present = False
    for value in current:
        if value is _MISSING:
            keys.append(NULL_KEY)
        elif isinstance(value, list):
            arrays = True
            present = True
            if value:
                keys.extend(sort_key(v) for v in value)
            else:
                keys.append(NULL_KEY)
        else:
            present = True
            keys.append(sort_key(value))
    return keys, present, arrays


__all__ = ["HIGH", "Index", "Range", "ScanStats", "bsonkey", "path_keys"]
