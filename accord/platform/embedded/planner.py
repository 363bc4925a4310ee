"""Query planning and execution over ordered indexes.

``plan()`` turns a filter (+ sort, skip, limit, hint) into one of:

- ``IDHACK``: ``_id`` equality or ``$in``, answered from the record map;
- ``IXSCAN``: ranges of one index, from equality, ``$in`` and range predicates on a prefix
  of its fields (each ``$in`` point times the next field's intervals); it provides the
  sort when the sort fields follow the index's equality-bound prefix in index order, in
  any directions (entries are stored ascending and walked as the sort asks), and the
  index is not multikey;
- ``OR``: a top-level ``$or`` whose every clause has an index plan, run as the union of
  the clause plans;
- ``COLLSCAN``: everything in natural order.

The cost of an index plan is the number of entries inside its ranges, counted exactly in
O(log n) per range by bisecting the sorted entries (a superset of the matches: every
retained version is an entry). A plan that provides the sort with a ``limit`` is costed at
the entries it will probably read before ``skip + limit`` matches, scaled by how selective
the best bounded plan is. ``explain`` shows the winning plan and what it examined.

Execution never trusts the index alone: every candidate is re-checked against the whole
filter, so bounds only need to be a superset (type bracketing, multikey arrays and null
are handled by loosening them, never by narrowing).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, overload

from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.regex import Regex

from accord.platform.embedded import collation, query
from accord.platform.embedded.bsonkey import bracket, sort_key
from accord.platform.embedded.errors import Code, EngineError, bad_value
from accord.platform.embedded.indexes import PAUSE_EVERY, Index, Pause, Range, ScanStats
from accord.platform.embedded.versions import decode

if TYPE_CHECKING:
    from accord.platform.embedded.engine import Collection, Txn

Doc = dict[str, Any]
Key = tuple[Any, ...]
# Most point combinations a compound $in expands to before the rest is left to the filter.
MAX_POINTS = 4096
# Relative cost of sorting one document in memory vs fetching and matching it.
SORT_COST = 0.3
INDEX_COST = 1.05


_OPEN = object()  # an interval end at the edge of its type bracket


class Interval:
    """A value-space interval of one field, in sort-key space (with the values it came
    from, for ``explain``)."""

    __slots__ = ("lo", "lo_incl", "hi", "hi_incl", "lo_value", "hi_value")

    def __init__(
        self, lo: Key, lo_incl: bool, hi: Key, hi_incl: bool, lo_value: Any, hi_value: Any
    ) -> None:
        self.lo, self.lo_incl, self.hi, self.hi_incl = lo, lo_incl, hi, hi_incl
        self.lo_value, self.hi_value = lo_value, hi_value

    @property
    def is_point(self) -> bool:
        return self.lo_incl and self.hi_incl and self.lo == self.hi

    @property
    def shown(self) -> str:
        lo = "-inf" if self.lo_value is _OPEN else _show(self.lo_value)
        hi = "+inf" if self.hi_value is _OPEN else _show(self.hi_value)
        return f"{'[' if self.lo_incl else '('}{lo}, {hi}{']' if self.hi_incl else ')'}"


def _point(value: Any) -> Interval:
    k = sort_key(value)
    return Interval(k, True, k, True, value, value)


def _show(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    return repr(value) if not isinstance(value, int | float) else str(value)


def _unusable(value: Any) -> bool:
    """Values whose equality the index cannot bound (arrays match element-wise or whole,
    regexes match by pattern, Min/MaxKey are brackets of their own)."""
    return isinstance(value, list | re.Pattern | Regex | MinKey | MaxKey)


def _is_operator_doc(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and next(iter(value)).startswith("$")


def _cond_intervals(cond: Any, multikey: bool) -> list[Interval] | None:
    """Intervals one condition on a field allows, or None if it does not bound it."""
    if not _is_operator_doc(cond):
        return None if _unusable(cond) else [_point(cond)]
    points: list[Interval] | None = None
    ranges: list[Interval] = []
    for op, arg in cond.items():
        if op in ("$gt", "$gte", "$lt", "$lte"):
            if _unusable(arg) or arg is None:
                continue
            k = sort_key(arg)
            below, above = bracket(k)
            if op in ("$gt", "$gte"):
                ranges.append(Interval(k, op == "$gte", above, False, arg, _OPEN))
            else:
                ranges.append(Interval(below, False, k, op == "$lte", _OPEN, arg))
            continue
        found: list[Interval] | None = None
        if op == "$eq" and not _unusable(arg):
            found = [_point(arg)]
        elif op == "$in" and isinstance(arg, list) and not any(_unusable(v) for v in arg):
            unique = {sort_key(v): v for v in arg}
            found = [_point(v) for _, v in sorted(unique.items())]
        if found is None:
            continue
        if points is None:
            points = found
        else:  # $eq and $in together: the values both allow
            allowed = {iv.lo for iv in found}
            points = [iv for iv in points if iv.lo in allowed]
    if points is not None:
        return points
    if not ranges:
        return None
    if multikey:
        # Different elements of an array may satisfy different bounds: one bound alone
        # is the superset that stays correct.
        return ranges[:1]
    out = ranges[0]
    for r in ranges[1:]:
        both = _intersect(out, r)
        if both is None:
            return []
        out = both
    return [out]


def _intersect(a: Interval, b: Interval) -> Interval | None:
    if a.lo > b.lo or (a.lo == b.lo and not a.lo_incl):
        lo, lo_incl = a.lo, a.lo_incl
    else:
        lo, lo_incl = b.lo, b.lo_incl
    if a.hi < b.hi or (a.hi == b.hi and not a.hi_incl):
        hi, hi_incl = a.hi, a.hi_incl
    else:
        hi, hi_incl = b.hi, b.hi_incl
    if lo > hi or (lo == hi and not (lo_incl and hi_incl)):
        return None
    lo_value = a.lo_value if lo is a.lo else b.lo_value
    hi_value = a.hi_value if hi is a.hi else b.hi_value
    return Interval(lo, lo_incl, hi, hi_incl, lo_value, hi_value)


def _field_intervals(conds: list[Any], multikey: bool) -> list[Interval] | None:
    """Intersect what every condition on a field allows (one condition if multikey)."""
    result: list[Interval] | None = None
    for cond in conds:
        got = _cond_intervals(cond, multikey)
        if got is None:
            continue
        if result is None:
            result = got
            if multikey:
                break
            continue
        merged = []
        for a in result:
            for b in got:
                both = _intersect(a, b)
                if both is not None:
                    merged.append(both)
        result = merged
    return result


@dataclass
class Conjunction:
    """A filter as ANDed conditions per field path, plus its top-level ``$or`` lists."""

    conds: dict[str, list[Any]] = field(default_factory=dict)
    ors: list[list[Doc]] = field(default_factory=list)
    # Top-level operators the planner does not bound with ($expr, $nor, $where, ...).
    other: bool = False

    @classmethod
    def of(cls, filt: Doc) -> Conjunction:
        out = cls()
        out._add(filt)
        return out

    def _add(self, filt: Doc) -> None:
        for key, value in filt.items():
            if key == "$and" and isinstance(value, list):
                for sub in value:
                    if isinstance(sub, dict):
                        self._add(sub)
            elif key == "$or" and isinstance(value, list):
                self.ors.append([c for c in value if isinstance(c, dict)])
            elif not key.startswith("$"):
                self.conds.setdefault(key, []).append(value)
            elif key != "$comment":
                self.other = True

    def with_clause(self, clause: Doc) -> Conjunction:
        out = Conjunction({k: list(v) for k, v in self.conds.items()}, [], self.other)
        out._add(clause)
        return out

    def only_points_on(self, fields: set[str]) -> bool:
        """Whether the filter is nothing but equality / ``$in`` on ``fields`` (so an
        index bounding exactly those fields to those points answers it exactly)."""
        if self.other or self.ors or set(self.conds) - fields:
            return False
        return all(_is_point_cond(c) for conds in self.conds.values() for c in conds)


def _is_point_cond(cond: Any) -> bool:
    if not _is_operator_doc(cond):
        return not _inexact(cond)
    for op, arg in cond.items():
        if op == "$eq" and not _inexact(arg):
            continue
        if op == "$in" and isinstance(arg, list) and not any(_inexact(v) for v in arg):
            continue
        return False
    return True


def _inexact(value: Any) -> bool:
    """Points whose index entries are not exactly the matching documents: besides the
    unusable values, null (its key also stands for a path through a scalar, ``{a: 0}``
    keys ``a.x`` as null, which ``{"a.x": null}`` does not match)."""
    return value is None or _unusable(value)


@dataclass
class Plan:
    """A chosen access path, costed, with what ``explain`` shows about it."""

    kind: str  # IDHACK | IXSCAN | OR | COLLSCAN
    cost: float
    index: Index | None = None
    ranges: list[Range] = field(default_factory=list)
    reverse: bool = False
    provides_sort: bool = False
    # How an index plan walks its ranges to provide the sort (see indexes.walk).
    order: tuple[int, list[int]] | None = None
    # Index entries inside the ranges (None: not counted, there was nothing to compare).
    keys: int | None = 0
    # Per index field: its intervals (None: unbounded), for explain.
    bounds: dict[str, list[Interval] | None] = field(default_factory=dict)
    ids: list[bytes] = field(default_factory=list)
    children: list[Plan] = field(default_factory=list)
    # The index answers the filter exactly: committed hits need no re-check.
    exact: bool = False

    @property
    def full(self) -> bool:
        """An index scan with no bounds at all (it can only provide an order)."""
        return self.kind == "IXSCAN" and all(b is None for b in self.bounds.values())

    def shown_bounds(self) -> dict[str, list[str]]:
        return {
            f: ["[MinKey, MaxKey]"] if ivs is None else [iv.shown for iv in ivs]
            for f, ivs in self.bounds.items()
        }

    def describe(self) -> Doc:
        if self.kind == "IDHACK":
            return {"stage": "IDHACK"}
        if self.kind == "EOF":  # no such collection (mongod's stage for it)
            return {"stage": "EOF"}
        if self.kind in ("COLLSCAN", "VIEW"):  # a view reads its whole source
            return {"stage": "COLLSCAN", "direction": "backward" if self.reverse else "forward"}
        if self.kind == "OR":
            return {"stage": "FETCH", "inputStage": {
                "stage": "OR", "inputStages": [c.describe().get("inputStage", c.describe()) for c in self.children],
            }}  # fmt: skip
        assert self.index is not None
        return {"stage": "FETCH", "inputStage": {
            "stage": "IXSCAN", "keyPattern": dict(self.index.key), "indexName": self.index.name,
            "isMultiKey": self.index.multikey, "isUnique": self.index.unique,
            "isSparse": self.index.sparse, "isPartial": self.index.partial is not None,
            "direction": "backward" if self.reverse else "forward",
            "indexBounds": self.shown_bounds(),
        }}  # fmt: skip


@dataclass
class Query:
    filter: Doc
    sort: Doc | None = None
    skip: int = 0
    limit: int = 0
    hint: Any = None


def _usable(index: Index, conj: Conjunction) -> bool:
    if not index.plannable:
        return False
    if index.sparse and not _excludes_null(index, conj):
        return False
    return index.partial is None or _implies(conj, index.partial)


def _excludes_null(index: Index, conj: Conjunction) -> bool:
    """A sparse index misses documents without its fields: usable only if the filter
    requires one of them to hold a non-null value."""
    for f in index.fields:
        ivs = _field_intervals(conj.conds.get(f, []), True)
        if ivs and all(iv.lo > sort_key(None) or iv.hi < sort_key(None) for iv in ivs):
            return True
    return False


def _implies(conj: Conjunction, partial: Doc) -> bool:
    """Conservatively: every clause of the partial filter appears in the query as is,
    or is ``$exists: true`` on a field the query bounds away from null."""
    for key, cond in partial.items():
        if key == "$and" and isinstance(cond, list):
            if not all(isinstance(c, dict) and _implies(conj, c) for c in cond):
                return False
            continue
        present = conj.conds.get(key, [])
        if any(query.canonical(c) == query.canonical(cond) for c in present):
            continue
        if cond == {"$exists": True} or cond == {"$exists": 1}:
            ivs = _field_intervals(present, True)
            if ivs and all(iv.lo > sort_key(None) or iv.hi < sort_key(None) for iv in ivs):
                continue
        return False
    return True


@dataclass
class Bounds:
    """What one index can bound of a conjunction."""

    ranges: list[Range]
    # Fields bound to exactly one value (constant among the results), and to points.
    const: set[str]
    pointed: set[str]
    intervals: dict[str, list[Interval] | None]
    bounded: bool


def index_ranges(index: Index, conj: Conjunction) -> Bounds:
    """Entry ranges for ``conj`` on ``index``, in entry order.

    Leading fields bound to points ($eq, $in) multiply into prefixes; the first field
    bound by a range (or one more point set than ``MAX_POINTS`` allows) ends the prefix;
    later fields are left to the filter.
    """
    fields, dirs = index.fields, index.directions
    prefixes: list[tuple[Any, ...]] = [()]
    const: set[str] = set()
    pointed: set[str] = set()
    intervals: dict[str, list[Interval] | None] = dict.fromkeys(fields)
    bounded = False
    last: list[Interval] | None = None
    last_pos = -1
    for i, name in enumerate(fields):
        ivs = _field_intervals(conj.conds.get(name, []), index.multikey)
        if ivs is None:
            break
        bounded = True
        if not ivs:
            intervals[name] = []
            return Bounds([], const, pointed, intervals, True)  # contradictory: nothing
        fits = len(prefixes) * len(ivs) <= MAX_POINTS
        if not all(iv.is_point for iv in ivs) or not fits:
            if fits:
                last, last_pos = ivs, i
                intervals[name] = ivs
            break
        if len(ivs) == 1 and not index.multikey:
            const.add(name)
        pointed.add(name)
        points = sorted(iv.lo for iv in ivs)
        prefixes = [(*p, point) for p in prefixes for point in points]
        intervals[name] = ivs if dirs[i] > 0 else ivs[::-1]  # shown in key-pattern order
    if last is None:
        return Bounds([(p, index.after(p)) for p in prefixes], const, pointed, intervals, bounded)
    if dirs[last_pos] < 0:
        intervals[fields[last_pos]] = last[::-1]
    ordered = sorted(last, key=lambda iv: iv.lo)
    ranges: list[Range] = []
    for p in prefixes:
        for iv in ordered:
            lo = (*p, iv.lo) if iv.lo_incl else index.after((*p, iv.lo))
            hi = index.after((*p, iv.hi)) if iv.hi_incl else (*p, iv.hi)
            ranges.append((lo, hi))
    return Bounds(ranges, const, pointed, intervals, bounded)


def _sort_order(index: Index, sort: Doc, const: set[str]) -> tuple[int, list[int]] | None:
    """How to walk ``index`` to get ``sort``: ``(field position, directions)``, or None
    if it cannot (the sort fields, less those the filter pins to one value, must be
    consecutive index fields after a prefix of pinned fields; entries are stored
    ascending, so any directions can be walked)."""
    if index.multikey or not index.orderable:
        return None
    items = [(f, d) for f, d in sort.items() if f not in const]
    if not items:
        return (0, [1])
    fields = index.fields
    if items[0][0] not in fields:
        return None
    pos = fields.index(items[0][0])
    if any(f not in const for f in fields[:pos]) or pos + len(items) > len(fields):
        return None
    dirs: list[int] = []
    for j, (f, d) in enumerate(items):
        if fields[pos + j] != f or d not in (1, -1):
            return None
        dirs.append(int(d))
    return pos, dirs


def _id_points(conj: Conjunction) -> list[Any] | None:
    conds = conj.conds.get("_id")
    if not conds:
        return None
    for cond in conds:
        if query.is_plain_equality(cond) and not _is_operator_doc(cond):
            return [cond]
        if query.is_plain_in(cond):
            return list(cond["$in"])
    return None


def _index_plan(index: Index, conj: Conjunction, q: Query) -> Plan | None:
    b = index_ranges(index, conj)
    order = _sort_order(index, q.sort, b.const) if q.sort else None
    if not b.bounded and order is None:
        return None
    plan = Plan("IXSCAN", 0.0, index=index, ranges=b.ranges, keys=None, bounds=b.intervals)
    plan.exact = not index.multikey and conj.only_points_on(b.pointed)
    if q.sort and order is not None:
        plan.provides_sort, plan.order = True, order
        pos, dirs = order
        # explain's direction is relative to the key pattern, as mongod reports it.
        plan.reverse = dirs[0] != index.directions[pos]
    return plan


def _cost(plan: Plan, q: Query, estimate: int) -> None:
    """Cost of an index plan from its (counted) keys; ``estimate`` bounds the matches."""
    keys = plan.keys if plan.keys is not None else 0
    cost = float(keys)
    if q.sort and not plan.provides_sort:
        cost += keys * SORT_COST
    elif plan.provides_sort and q.limit:
        cost = min(float(keys), (q.skip + q.limit) * keys / max(1, estimate))
    plan.cost = cost * INDEX_COST


def _best_for(coll: Collection, conj: Conjunction, q: Query, hint: Index | None) -> list[Plan]:
    """Candidate plans for one conjunction (clause), cheapest first."""
    n = len(coll.records)
    ids = _id_points(conj)
    if ids is not None and (hint is None or hint.is_id):
        keys = list(dict.fromkeys(query.id_key(v) for v in ids))
        plan = Plan("IDHACK", float(len(keys)), ids=keys, keys=len(keys))
        plan.exact = conj.only_points_on({"_id"})
        return [plan]  # as mongod: _id equality always wins
    plans: list[Plan] = []
    for index in coll.indexes.values():
        if hint is not None and index is not hint:
            continue
        if not _usable(index, conj):
            continue
        if index.is_id and not index.built:
            if not _wants_id_order(conj, q):
                continue
            coll.build_id_index()
        p = _index_plan(index, conj, q)
        if p is not None:
            plans.append(p)
    if len(plans) == 1 and not plans[0].full:
        return plans  # the only bounded plan: never worse than a scan, no need to count
    for p in plans:
        assert p.index is not None
        p.keys = p.index.count(p.ranges)
    estimate = min((p.keys or 0 for p in plans if not p.full), default=n)
    for p in plans:
        _cost(p, q, estimate)
    plans.sort(key=lambda p: p.cost)
    return plans


def _wants_id_order(conj: Conjunction, q: Query) -> bool:
    if "_id" in conj.conds:
        return True
    return q.sort is not None and next(iter(q.sort), None) == "_id"


def _resolve_hint(coll: Collection, hint: Any) -> Index | None | str:
    if hint is None or hint == {} or hint == "":
        return None
    if isinstance(hint, dict) and list(hint) == ["$natural"]:
        return "$natural"
    for index in coll.indexes.values():
        if index.name == hint or (isinstance(hint, dict) and dict(index.key) == hint):
            return index
    raise bad_value("hint provided does not correspond to an existing index")


def _id_lookup(filt: Doc) -> Plan | None:
    """The plan for a filter of plain fields with a plain ``_id`` equality among them
    (what every update by ``_id`` sends): the ``IDHACK`` that ``_best_for`` would pick,
    without building the conjunction. None for any other filter."""
    if "_id" not in filt:
        return None
    value = filt["_id"]
    if not query.is_plain_equality(value) or _is_operator_doc(value):
        return None
    for name in filt:
        if name.startswith("$"):
            return None  # $and, $or, $expr ...: the general planner
    keys = [query.id_key(value)]
    plan = Plan("IDHACK", 1.0, ids=keys, keys=1)
    plan.exact = len(filt) == 1 and not _inexact(value)
    return plan


def plan(coll: Collection, q: Query) -> Plan:
    """The cheapest plan for ``q`` on ``coll`` (see the module docstring)."""
    if q.sort is None and q.hint in (None, "") and collation.current() is None:
        fast = _id_lookup(q.filter)
        if fast is not None:
            return fast
    n = len(coll.records)
    collscan_cost = n + (n * SORT_COST if q.sort else 0)
    natural_reverse = q.sort is not None and q.sort.get("$natural") == -1
    if q.sort is not None and "$natural" in q.sort:
        return Plan("COLLSCAN", collscan_cost, reverse=natural_reverse, provides_sort=True)
    if collation.current() is not None:
        # Index bounds and orders are binary: a collated comparison needs every document.
        return Plan("COLLSCAN", collscan_cost)
    hint = _resolve_hint(coll, q.hint)
    if hint == "$natural":
        return Plan("COLLSCAN", collscan_cost)
    hint_index = hint if isinstance(hint, Index) else None
    conj = Conjunction.of(q.filter)
    plans = _best_for(coll, conj, q, hint_index)
    if plans and plans[0].kind == "IDHACK":
        return plans[0]
    if conj.ors and hint_index is None:
        or_plan = _or_plan(coll, conj, q)
        if or_plan is not None:
            for p in plans:
                if p.keys is None:
                    assert p.index is not None
                    p.keys = p.index.count(p.ranges)
                    _cost(p, q, p.keys)
            plans.append(or_plan)
            plans.sort(key=lambda p: p.cost)
    if hint_index is not None:
        if plans:
            return plans[0]
        if hint_index.is_id and not hint_index.built:
            coll.build_id_index()
        ranges = [((), hint_index.after(()))]
        return Plan("IXSCAN", float(n), index=hint_index, ranges=ranges, keys=None,
                    bounds=dict.fromkeys(hint_index.fields))  # fmt: skip
    if plans and plans[0].cost < collscan_cost:
        return plans[0]
    return Plan("COLLSCAN", collscan_cost)


def _or_plan(coll: Collection, conj: Conjunction, q: Query) -> Plan | None:
    clauses = conj.ors[0]
    if not clauses:
        return None
    children = []
    unsorted = Query(q.filter)
    for clause in clauses:
        options = [
            p for p in _best_for(coll, conj.with_clause(clause), unsorted, None) if not p.full
        ]
        if not options:
            return None
        best = options[0]
        if best.keys is None:
            assert best.index is not None
            best.keys = best.index.count(best.ranges)
            _cost(best, unsorted, best.keys)
        children.append(best)
    cost = sum(c.cost for c in children)
    if q.sort:
        cost += cost * SORT_COST
    return Plan("OR", cost, children=children, keys=sum(c.keys or 0 for c in children))


# -- execution ------------------------------------------------------------------------------


class Hit:
    """One result: the document's id key, its BSON (committed) and/or its dict."""

    __slots__ = ("key", "raw", "_doc", "rid")

    def __init__(self, key: bytes, raw: bytes | None, doc: Doc | None, rid: float) -> None:
        self.key = key
        self.raw = raw
        self._doc = doc
        self.rid = rid

    @property
    def doc(self) -> Doc:
        if self._doc is None:
            assert self.raw is not None
            self._doc = decode(self.raw)
        return self._doc


class Hits(Sequence[Hit]):
    """A query's results, kept as plain tuples ``(key, raw, doc, rid)``; a ``Hit`` is made
    for each one read. Python's cyclic garbage collector stops tracking a tuple of bytes
    and numbers once it has seen it, but tracks every ``Hit`` for as long as it lives: a
    read of 100,000 documents kept 100,000 of them, and every full collection walked
    them (60 ms, with every thread stopped, several times per read)."""

    __slots__ = ("_rows", "_keep_docs")

    def __init__(self, hits: Iterable[Hit] = (), *, keep_docs: bool = True) -> None:
        self._rows: list[tuple[bytes, bytes | None, Doc | None, float]] = []
        self._keep_docs = keep_docs
        for hit in hits:
            self.append(hit)

    def append(self, hit: Hit) -> None:
        # Without ``keep_docs`` a committed hit keeps its BSON only (a decoded document
        # would be tracked); a transaction's own document has nothing else.
        doc = hit._doc if self._keep_docs or hit.raw is None else None
        self._rows.append((hit.key, hit.raw, doc, hit.rid))

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, i: int) -> Hit: ...

    @overload
    def __getitem__(self, i: slice) -> Hits: ...

    def __getitem__(self, i: int | slice) -> Hit | Hits:
        if isinstance(i, slice):
            out = Hits(keep_docs=self._keep_docs)
            out._rows = self._rows[i]
            return out
        return Hit(*self._rows[i])

    def __iter__(self) -> Iterator[Hit]:
        for row in self._rows:
            yield Hit(*row)


@dataclass
class Execution:
    hits: Hits
    plan: Plan
    stats: ScanStats
    sorted_in_memory: bool
    millis: float


class ReadPause(Protocol):
    """``Engine.read_pause``'s pause point: True if it released the engine lock (the
    scan re-positions); ``work`` runs while the lock is free (or at once, lock held, if
    it cannot be freed)."""

    def __call__(self, work: Callable[[], None] | None = None) -> bool: ...


def _candidates(
    coll: Collection, txn: Txn, plan: Plan, stats: ScanStats, pause: Pause | None = None
) -> Iterator[Hit]:
    """Documents the plan yields for ``txn`` (its own writes included), unfiltered.

    ``pause`` (``Engine.read_pause``) may release the engine lock between documents; the
    scan holds no position that a release invalidates (index walks re-position, a
    collection scan walks a copy of the record list: records added meanwhile were
    committed after the snapshot, and a record removed meanwhile was invisible to it)."""
    own = txn.writes.get(coll.ns) or {}
    snap = txn.snapshot
    inf = float("inf")
    if plan.kind == "IDHACK":
        for i, key in enumerate(plan.ids):
            if pause is not None and i % PAUSE_EVERY == 0:
                pause()
            stats.keys_examined += 1
            if key in own:
                doc = own[key]
                if doc is not None:
                    record = coll.records.get(key)
                    yield Hit(key, None, doc, record.rid if record else inf)
                continue
            record = coll.records.get(key)
            if record is not None:
                data = record.data_at(snap)
                if data is not None:
                    yield Hit(key, data, None, record.rid)
        return
    if plan.kind == "COLLSCAN":
        records = reversed(coll.records.values()) if plan.reverse else coll.records.values()
        countdown = PAUSE_EVERY
        for record in list(records) if own or pause is not None else records:
            if pause is not None:
                countdown -= 1
                if not countdown:
                    countdown = PAUSE_EVERY
                    pause()
            if own and record.key in own:
                doc = own[record.key]
                if doc is not None:
                    yield Hit(record.key, None, doc, record.rid)
                continue
            data = record.data_at(snap)
            if data is not None:
                yield Hit(record.key, data, None, record.rid)
        for key, doc in list(own.items()):
            if doc is not None and key not in coll.records:
                yield Hit(key, None, doc, inf)
        return
    if plan.kind == "OR":
        seen: set[bytes] = set()
        merged: list[Hit] = []
        for child in plan.children:
            for hit in _candidates(coll, txn, child, stats, pause):
                if hit.key not in seen:
                    seen.add(hit.key)
                    merged.append(hit)
        merged.sort(key=lambda h: h.rid)
        yield from merged
        return
    assert plan.index is not None
    for record, data in plan.index.scan(
        plan.ranges, snapshot=snap, stats=stats, skip=own, order=plan.order, pause=pause
    ):
        yield Hit(record.key, data, None, record.rid)
    for key, doc in list(own.items()):
        if doc is not None:
            record = coll.records.get(key)
            yield Hit(key, None, doc, record.rid if record else inf)


def execute(
    coll: Collection, txn: Txn, q: Query, *, matches: Callable[[Doc, Doc], bool] = query.matches,
    chosen: Plan | None = None, pause: ReadPause | None = None,
    release: Callable[[], AbstractContextManager[None]] | None = None,
) -> Execution:  # fmt: skip
    """Run ``q`` for ``txn``: plan, scan, re-check the filter, sort, skip and limit.
    ``pause`` lets the scan release the engine lock between documents (see
    ``_candidates``); ``release`` (``Engine.released``) lets an in-memory sort run with
    the lock released: it orders the hits the scan collected, whose documents are the
    read's own.

    With both (a read that pauses), the filter is not matched under the lock either: the
    scan collects the BSON of the versions its snapshot sees (immutable) and each pause
    matches what was collected since the last one while the lock is free, so what the
    lock covers is the walk of the index or records alone (matching is most of a scan's
    work: decoding each document and running the matcher)."""
    started = time.perf_counter()
    chosen = chosen or plan(coll, q)
    stats = ScanStats()
    own = bool(txn.writes.get(coll.ns))
    needs_sort = bool(q.sort) and (not chosen.provides_sort or own)
    stop = None if needs_sort or not q.limit else q.skip + q.limit
    filt = q.filter
    # A read (one that releases the lock) decodes a hit again when it needs it, rather
    # than keep every document its filter decoded; a write keeps them (it uses them next).
    hits = Hits(keep_docs=release is None)
    exact = chosen.exact
    pending: list[Hit] = []

    def keep(batch: Iterable[Hit]) -> None:
        # Hits an exact plan found through the index match by construction; the
        # transaction's own writes (no stored BSON) always get the filter.
        for hit in batch:
            if stop is not None and len(hits) >= stop:
                return
            if filt and not (exact and hit.raw is not None) and not matches(filt, hit.doc):
                continue
            hits.append(hit)

    def match_pending() -> None:
        batch = pending[:]
        pending.clear()
        keep(batch)

    scan_pause: Pause | None = None
    deferring = pause is not None and release is not None and bool(filt)
    if pause is not None:
        read_pause = pause
        if deferring:
            scan_pause = lambda: read_pause(match_pending if pending else None)  # noqa: E731
        else:
            scan_pause = lambda: read_pause()  # noqa: E731
    for hit in _candidates(coll, txn, chosen, stats, scan_pause):
        stats.docs_examined += 1
        if deferring:
            pending.append(hit)
        else:
            keep((hit,))
        if stop is not None and len(hits) >= stop:
            break
    if pending:
        assert release is not None
        with release():
            match_pending()
    if needs_sort:
        assert q.sort is not None
        with release() if release is not None else nullcontext():
            found = list(hits)
            ordered = query.sort_docs([h.doc for h in found], q.sort)
            by_id = {id(h.doc): h for h in found}
            hits = Hits((by_id[id(d)] for d in ordered), keep_docs=release is None)
    if q.skip:
        hits = hits[q.skip :]
    if q.limit:
        hits = hits[: q.limit]
    return Execution(hits, chosen, stats, needs_sort, (time.perf_counter() - started) * 1000)


def explain_doc(coll_ns: str, q: Query, run: Execution, verbosity: str) -> Doc:
    """``explain`` output: ``queryPlanner`` and, unless asked only for it, ``executionStats``."""
    stage = run.plan.describe()
    if run.sorted_in_memory:
        stage = {
            "stage": "SORT",
            "sortPattern": q.sort,
            "memLimit": 104857600,
            "type": "simple",
            "inputStage": stage,
        }
    if q.skip:
        stage = {"stage": "SKIP", "skipAmount": q.skip, "inputStage": stage}
    if q.limit:
        stage = {"stage": "LIMIT", "limitAmount": q.limit, "inputStage": stage}
    out: Doc = {
        "queryPlanner": {
            "namespace": coll_ns, "parsedQuery": q.filter, "indexFilterSet": False,
            "winningPlan": stage, "rejectedPlans": [],
        },
    }  # fmt: skip
    if verbosity != "queryPlanner":
        out["executionStats"] = {
            "executionSuccess": True, "nReturned": len(run.hits),
            "executionTimeMillis": int(run.millis), "totalKeysExamined": run.stats.keys_examined,
            "totalDocsExamined": run.stats.docs_examined, "executionStages": stage,
        }  # fmt: skip
    return out


def check_sort(sort: Doc) -> None:
    for key, direction in sort.items():
        if isinstance(direction, dict):
            raise bad_value(f"unsupported sort specification for {key!r}: {direction}")
        if direction not in (1, -1):
            raise EngineError(
                Code.Location15975,
                f"$sort key ordering must be 1 (for ascending) or -1 (for descending): {key!r}",
            )
