"""Ordered indexes: entries in BSON order in a ``sortedcontainers.SortedList``.

An entry is ``(*key, rid, ts, record)``: the index key of one version of one document
(one ``sort_key`` per indexed field), the record's natural-order id, the commit timestamp
of that version, and the record. Entries are always kept in ascending order of every
field, whatever the key pattern says: tuples of plain values compare in C, and a scan
serves any combination of directions (``walk``), so a descending field costs nothing. A
document has entries for every version an open snapshot may still read, so one index
serves every snapshot: a scan yields an entry only if its version is the one the reader
sees (``record.at(snapshot)[0] == ts``). Garbage collection removes the entries of the
versions it prunes. Equal keys come back in natural order (``rid``), as mongod's
RecordId order.

The ``_id`` index is different: ``_id`` never changes for a record, so its entries are
per record (``ts == -1``) and visibility is the record's. Point lookups on ``_id`` use the
collection's record map; the ordered ``_id`` index (ranges, sorts) is built on first use.

Bounds are probes into the entry order: a probe is a prefix of an entry; ``after(prefix)``
places it after every entry with that prefix (``TOP`` in a key position, infinity in the
record-id position, so that every comparison stays between plain tuples, numbers and
strings, in C).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedList

from accord.platform.embedded import bsonkey
from accord.platform.embedded.bsonkey import ARRAY, NULL_KEY, TOP, sort_key
from accord.platform.embedded.collation import Collation, key_values
from accord.platform.embedded.collation import active as collation_active
from accord.platform.embedded.collation import parse as parse_collation
from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.versions import Record

Doc = dict[str, Any]
Key = tuple[Any, ...]
# (low probe, high probe): the entries e with low <= e < high, by bisect_left.
Range = tuple[tuple[Any, ...], tuple[Any, ...]]
ORDERED_KINDS = (1, -1)
_MISSING = object()


def _always(partial: Any, doc: Any) -> bool:
    return True


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
    # The index's collation: strings equal under it have equal keys (unique indexes).
    collation: Collation | None = None
    # Set when the index is dropped (a paused scan over it must not go on).
    dropped: bool = False

    def __post_init__(self) -> None:
        # The key pattern never changes: derive what every key extraction needs once.
        # orderable: plain ascending/descending fields (not text, 2d, 2dsphere, hashed);
        # orderable_or_hashed: the engine keeps entries (text and geo indexes have none).
        self.fields = [f for f, _ in self.key]
        self.directions = [1 if not _is_direction(d) or d > 0 else -1 for _, d in self.key]
        self._top_level = ["." not in f for f in self.fields]
        # Top-level fields only, no sparse or partial rule: the fast path of keys_of.
        self._plain = all(self._top_level) and not self.sparse and self.partial is None
        self.orderable = all(_is_direction(d) for _, d in self.key)
        self.orderable_or_hashed = all(_is_direction(d) or d == "hashed" for _, d in self.key)

    @property
    def is_id(self) -> bool:
        return self.name == "_id_"

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
            collation=parse_collation(spec.get("collation")),
        )
        if index.is_id:
            index.built = False
        return index

    # -- keys -------------------------------------------------------------------------------

    def key_tuples(self, doc: Doc, matches: Any = None) -> list[Key]:
        """The undirected keys of ``doc`` (one ``sort_key`` per field), deduplicated;
        empty when a sparse or partial index leaves the document out. ``matches`` is the
        filter evaluator (for partial indexes)."""
        return self.keys_of(doc, matches)[0]

    def keys_of(self, doc: Doc, matches: Any = None) -> tuple[list[Key], bool]:
        """``(key_tuples, whether an indexed path crossed an array)``."""
        if self._plain:
            # A missing field keys as null, like None; an array needs the general path.
            key = tuple(map(sort_key, map(doc.get, self.fields)))
            for k in key:
                if k[0] == ARRAY:
                    break
            else:
                return [key], False
        if self.partial is not None and (matches is None or not matches(self.partial, doc)):
            return [], False
        per_field: list[list[Key]] = []
        present = False
        multi = False
        for path, top in zip(self.fields, self._top_level, strict=True):
            value = doc.get(path, _MISSING) if top else _MISSING
            if top and type(value) is not list:
                # The common case: a top-level scalar (or missing) field.
                if value is _MISSING:
                    per_field.append([NULL_KEY])
                else:
                    present = True
                    per_field.append([sort_key(value)])
                continue
            keys, found, arrays = path_keys(doc, path)
            present = present or found
            multi = multi or arrays
            per_field.append(keys)
        if self.sparse and not present:
            return [], multi
        if multi:
            self.multikey = True
        if len(per_field) == 1:
            only = per_field[0]
            return ([(only[0],)] if len(only) == 1 else [(k,) for k in dict.fromkeys(only)]), multi
        if all(len(keys) == 1 for keys in per_field):
            return [tuple(keys[0] for keys in per_field)], multi
        return list(dict.fromkeys(itertools.product(*per_field))), multi

    def unique_keys(self, doc: Doc, matches: Any = None) -> list[Key]:
        """Keys of ``doc`` for the duplicate check: as ``key_tuples``, except that a path
        through arrays reads each numeric part as a position only and skips elements
        without the field (the index entries keep those extra keys; a duplicate check
        must not). Under the index's collation, strings it holds equal give equal keys."""
        if self.collation is not None:
            if self.partial is not None:
                with collation_active(self.collation):
                    if matches is None or not matches(self.partial, doc):
                        return []
            doc = key_values(doc, self.collation)
            matches = _always  # the partial filter was checked on the real values
        keys, arrays = self.keys_of(doc, matches)
        if not arrays:
            return keys
        per_field = [path_keys(doc, path, superset=False)[0] for path in self.fields]
        if self.sparse and all(keys == [NULL_KEY] for keys in per_field):
            return []
        return list(dict.fromkeys(itertools.product(*per_field)))

    # -- maintenance ------------------------------------------------------------------------

    def add_version(self, record: Record, ts: int, keys: list[Key]) -> None:
        if not self.built:
            return
        rid = record.rid
        for k in keys:
            self.entries.add((*k, rid, ts, record))

    def remove_version(self, record: Record, ts: int, keys: list[Key]) -> None:
        if not self.built:
            return
        rid = record.rid
        for k in keys:
            self.entries.discard((*k, rid, ts, record))

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

    def after(self, prefix: tuple[Any, ...]) -> tuple[Any, ...]:
        """The probe just after every entry starting with ``prefix``."""
        return after(prefix, len(self.fields))

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
        self, ranges: list[Range], *, snapshot: int, stats: ScanStats,
        skip: dict[bytes, Any] | None = None, order: tuple[int, list[int]] | None = None,
        pause: Pause | None = None,
    ) -> Iterator[tuple[Record, bytes]]:  # fmt: skip
        """The documents a reader at ``snapshot`` sees, within ``ranges`` (ascending,
        disjoint). ``order`` is ``(position, directions)``: from the index field at
        ``position`` on, walk the fields in those directions (1 ascending, -1 descending);
        None walks ascending. Records in ``skip`` (the reader's own writes) are left out;
        each record is yielded once. ``pause`` (see ``walk``) may release the engine lock
        between entries; the scan then goes on from where it was."""
        id_level = self.is_id
        seen: set[int] | None = set() if (self.multikey or len(ranges) > 1) else None
        pos, dirs = order if order is not None else (0, [1])
        nfields = len(self.fields)
        checked = None if pause is None else self._checked_pause(pause)
        for lo, hi in reversed(ranges) if dirs[0] < 0 else ranges:
            for entry in walk(self.entries, lo, hi, pos, dirs, nfields, checked):
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

    def _checked_pause(self, pause: Pause) -> Pause:
        """``pause``, then a check that this index still exists (it may have been dropped
        while the lock was free)."""

        def checked() -> bool:
            if not pause():
                return False
            if self.dropped:
                raise EngineError(
                    Code.QueryPlanKilled,
                    f"the query was killed: index {self.name!r} was dropped while it ran",
                )
            return True

        return checked


# Called between entries of a long scan: True if it released the engine lock meanwhile
# (``Engine.read_pause``), so the entries may have changed and the walk re-positions.
Pause = Callable[[], bool]
# A walk asks ``pause`` after this many entries (and before each range).
PAUSE_EVERY = 32


def after(prefix: tuple[Any, ...], nfields: int) -> tuple[Any, ...]:
    """The probe just after every entry that starts with ``prefix`` (of an index with
    ``nfields`` key fields)."""
    return (*prefix, TOP if len(prefix) < nfields else math.inf)


def walk(
    entries: SortedList, lo: tuple[Any, ...], hi: tuple[Any, ...], pos: int, dirs: list[int],
    nfields: int, pause: Pause | None = None,
) -> Iterator[tuple[Any, ...]]:  # fmt: skip
    """Entries in ``[lo, hi)`` ordered by the fields from ``pos`` on, each in its direction
    in ``dirs``. One direction throughout is a plain walk, forwards or backwards; mixed
    directions walk the groups of equal leading field in the first direction and each
    group recursively (two bisections per group).

    With ``pause``, a plain walk asks it before its first entry and every ``PAUSE_EVERY``
    entries; when it says the lock was released, the walk starts a new iterator just past
    the last entry it gave (the list may have changed; entries are unique, so that is
    exactly where it was). Mixed walks only hold iterators in their plain sub-walks and
    bisect afresh for every group, so they resume the same way."""
    first = dirs[0]
    if all(d == first for d in dirs):
        if pause is None:
            yield from entries.irange(lo, hi, inclusive=(True, False), reverse=first < 0)
        else:
            yield from _paused_walk(entries, lo, hi, first < 0, pause)
        return
    rest_dirs = dirs[1:]
    if first > 0:
        cur = lo
        while True:
            head = next(entries.irange(cur, hi, inclusive=(True, False)), None)
            if head is None:
                return
            prefix = head[: pos + 1]
            end = after(prefix, nfields)
            yield from walk(
                entries, max(lo, prefix), min(hi, end), pos + 1, rest_dirs, nfields, pause
            )
            cur = end
    else:
        cur = hi
        while True:
            tail = next(entries.irange(lo, cur, inclusive=(True, False), reverse=True), None)
            if tail is None:
                return
            prefix = tail[: pos + 1]
            yield from walk(
                entries, max(lo, prefix), min(hi, after(prefix, nfields)), pos + 1, rest_dirs,
                nfields, pause,
            )  # fmt: skip
            cur = prefix


def _paused_walk(
    entries: SortedList, lo: tuple[Any, ...], hi: tuple[Any, ...], reverse: bool, pause: Pause
) -> Iterator[tuple[Any, ...]]:
    """A plain walk of ``[lo, hi)`` that asks ``pause`` first and every ``PAUSE_EVERY``
    entries, and re-positions just past the last entry it gave when the lock was released."""
    pause()
    it = entries.irange(lo, hi, inclusive=(True, False), reverse=reverse)
    while True:
        countdown = PAUSE_EVERY
        last = None
        for entry in it:
            yield entry
            last = entry
            countdown -= 1
            if not countdown:
                countdown = PAUSE_EVERY
                if pause():
                    break
        else:
            return
        if reverse:
            it = entries.irange(lo, last, inclusive=(True, False), reverse=True)
        else:
            it = entries.irange(last, hi, inclusive=(False, False))


def path_keys(doc: Any, path: str, *, superset: bool = True) -> tuple[list[Key], bool, bool]:
    """Index keys of one field path: ``(keys, present, through_array)``.

    Arrays are expanded as a multikey index does (an empty array and a missing value key
    as null). With ``superset``, where a path crosses an array both readings of a numeric
    part (position and field name) contribute keys, and array elements without the field
    key as null: extra keys only cost a re-check, a missing one would lose a match.
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
                    if not superset:
                        continue
                for element in value:
                    if isinstance(element, dict):
                        nxt.append(element.get(part, _MISSING))
                    elif superset:
                        nxt.append(_MISSING)
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


__all__ = [
    "PAUSE_EVERY",
    "Index",
    "Pause",
    "Range",
    "ScanStats",
    "after",
    "bsonkey",
    "path_keys",
    "walk",
]
