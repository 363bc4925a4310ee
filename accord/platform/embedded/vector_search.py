"""Atlas Vector Search in the embedded engine: search index definitions and ``$vectorSearch``.

What Atlas does with a ``vectorSearch`` index (mongot, Lucene underneath), done here with
numpy, so the same pymongo code runs on Atlas, Atlas Local and this engine:

- definitions: ``fields`` of ``{type: "vector", path, numDimensions, similarity}`` and
  ``{type: "filter", path}``; checked as mongot checks them; kept in a catalog file next to
  the engine's data (``search-indexes.json``, replaced atomically) so they survive restarts;
- vectors: one contiguous float32 matrix per index (a row per indexed document, an id map
  and a free list), kept in step with commits through the engine's commit observers, built
  in bulk (FLOAT32 BinData decoded from one buffer) when the index is created and when the
  engine starts (:func:`open_at_startup`). A document whose vector is missing, of the wrong
  length, not numeric, or zero under cosine is not indexed (Atlas skips it too);
- pre-filters: per filter path, the rows of each value and a bounded cache of them as
  boolean masks, a numeric column for ranges: a filter is a few array operations, no Python
  per row;
- queries: ``exact: true`` is an exact scan of the rows that pass the pre-filter (one
  matrix-vector product, argpartition for the top); approximate queries
  (``numCandidates``) are answered the same way, exactly, so the engine returns the true
  nearest neighbours where Atlas's HNSW returns approximate ones;
- snapshots: the matrix holds the newest committed vectors. A transaction whose snapshot is
  older than some commits, or that wrote documents itself, reads those few documents from its
  own view instead of from the matrix, so every query sees exactly its transaction's snapshot
  plus its own uncommitted writes;
- scores are normalised as Lucene/mongot do: cosine and dotProduct ``(1 + x) / 2``,
  euclidean ``1 / (1 + d²)`` (Lucene's EUCLIDEAN uses the squared distance).

Errors follow mongot's messages and arrive wrapped as mongod wraps them
("PlanExecutor error during aggregation :: caused by :: ...").
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import secrets
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bson
import numpy as np

from accord.platform.embedded import query
from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.indexes import PAUSE_EVERY
from accord.platform.embedded.paths import MISSING

log = logging.getLogger("accord.engine.vector_search")

Doc = dict[str, Any]
CATALOG_FILE = "search-indexes.json"
MAX_DIMENSIONS = 8192
MAX_NUM_CANDIDATES = 10_000
SIMILARITIES = ("cosine", "dotProduct", "euclidean")
FILTER_LEAF_OPS = {"$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "$not"}
FILTER_LOGICAL_OPS = {"$and", "$or", "$nor"}
SCORE_FIELD = "__accord_vector_search_score"
# Rows scored between two pause points of a search (about a millisecond at 64 dimensions).
RANK_CHUNK = 16_384


# -- errors -----------------------------------------------------------------------------------


def plan_error(message: str) -> EngineError:
    """A mongot query error as mongod reports it (code 8, UnknownError)."""
    return EngineError(
        Code.UnknownError, f"PlanExecutor error during aggregation :: caused by :: {message}"
    )


def definition_error(message: str) -> EngineError:
    return EngineError(Code.BadValue, f"Invalid index definition: {message}")


# -- definitions ------------------------------------------------------------------------------


@dataclass
class VectorField:
    path: str
    dims: int
    similarity: str


@dataclass
class SearchIndex:
    """One search index of a collection, as ``$listSearchIndexes`` shows it."""

    ns: str
    id: str
    name: str
    type: str
    definition: Doc
    created_at: datetime
    version: int = 0

    @property
    def vector_fields(self) -> dict[str, VectorField]:
        out = {}
        for f in self.definition.get("fields", []) if self.type == "vectorSearch" else []:
            if f.get("type") == "vector":
                out[f["path"]] = VectorField(f["path"], int(f["numDimensions"]), f["similarity"])
        return out

    @property
    def filter_paths(self) -> set[str]:
        if self.type != "vectorSearch":
            return set()
        return {f["path"] for f in self.definition.get("fields", []) if f.get("type") == "filter"}

    def listing(self) -> Doc:
        return {
            "id": self.id,
            "name": self.name,
            "type": self.type,
            "status": "READY",
            "queryable": True,
            "latestVersion": self.version,
            "latestDefinitionVersion": {"version": self.version, "createdAt": self.created_at},
            "latestDefinition": self.definition,
            "statusDetail": [],
        }

    def to_catalog(self) -> Doc:
        return {
            "ns": self.ns, "id": self.id, "name": self.name, "type": self.type,
            "definition": self.definition, "created_at": self.created_at.isoformat(),
            "version": self.version,
        }  # fmt: skip

    @classmethod
    def from_catalog(cls, doc: Doc) -> SearchIndex:
        return cls(
            ns=doc["ns"], id=doc["id"], name=doc["name"], type=doc["type"],
            definition=doc["definition"], created_at=datetime.fromisoformat(doc["created_at"]),
            version=int(doc.get("version", 0)),
        )  # fmt: skip


def validate_definition(index_type: str, definition: Any) -> Doc:
    """Check a search index definition the way Atlas does; return it normalised."""
    if not isinstance(definition, dict):
        raise definition_error('"definition" must be a document')
    if index_type == "search":
        mappings = definition.get("mappings")
        if not isinstance(mappings, dict):
            raise definition_error('"mappings" is required')
        return definition
    if index_type != "vectorSearch":
        raise definition_error(f'"type" must be one of [search, vectorSearch], got "{index_type}"')
    fields = definition.get("fields")
    if not isinstance(fields, list) or not fields:
        raise definition_error('"fields" must be a non-empty array')
    unknown = set(definition) - {"fields", "storedSource"}
    if unknown:
        raise definition_error(f'unrecognized field "{sorted(unknown)[0]}"')
    seen: set[str] = set()
    vectors = 0
    for i, f in enumerate(fields):
        where = f'"fields[{i}]'
        if not isinstance(f, dict):
            raise definition_error(f'{where}" must be a document')
        kind, path = f.get("type"), f.get("path")
        if not isinstance(path, str) or not path:
            raise definition_error(f'{where}.path" is required')
        if path in seen:
            raise definition_error(f'path "{path}" is indexed more than once')
        seen.add(path)
        if kind == "filter":
            extra = set(f) - {"type", "path"}
            if extra:
                raise definition_error(f'{where}" unrecognized field "{sorted(extra)[0]}"')
        elif kind == "vector":
            vectors += 1
            dims = f.get("numDimensions")
            if isinstance(dims, bool) or not isinstance(dims, int | float) or dims != int(dims):
                raise definition_error(f'{where}.numDimensions" must be an integer')
            if not 1 <= int(dims) <= MAX_DIMENSIONS:
                raise definition_error(
                    f'{where}.numDimensions" must be within bounds [1..{MAX_DIMENSIONS}]'
                )
            if f.get("similarity") not in SIMILARITIES:
                raise definition_error(
                    f'{where}.similarity" must be one of [cosine, dotProduct, euclidean]'
                )
            quantization = f.get("quantization", "none")
            if quantization not in ("none", "scalar", "binary"):
                raise definition_error(
                    f'{where}.quantization" must be one of [none, scalar, binary]'
                )
            extra = set(f) - {"type", "path", "numDimensions", "similarity", "quantization",
                              "hnswOptions"}  # fmt: skip
            if extra:
                raise definition_error(f'{where}" unrecognized field "{sorted(extra)[0]}"')
        else:
            raise definition_error(f'{where}.type" must be one of [filter, vector]')
    if not vectors:
        raise definition_error('at least one field of type "vector" is required')
    return definition


# -- vectors in documents ----------------------------------------------------------------------

#: The dtype byte of a FLOAT32 BSON vector (BinData subtype 9): ``[0x27, padding, floats...]``.
_FLOAT32 = 0x27


def raw_value(doc: Doc, path: str) -> Any:
    """The value at a dotted path through embedded documents (MISSING if absent)."""
    value: Any = doc
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def vector_of(doc: Doc, path: str, dims: int) -> np.ndarray | None:
    """The float32 vector at ``path``, or None when Atlas would not index one."""
    value = raw_value(doc, path)
    return None if value is MISSING else as_vector(value, dims)


def _float32_payload(value: bytes) -> bool:
    return len(value) >= 2 and value[0] == _FLOAT32 and value[1] == 0 and len(value) % 4 == 2


def as_vector(value: Any, dims: int | None = None) -> np.ndarray | None:
    if isinstance(value, bson.Binary) and value.subtype == 9:
        if _float32_payload(value):  # the common case, decoded without a Python loop
            arr = np.frombuffer(value, dtype="<f4", offset=2)
        else:
            try:
                decoded = value.as_vector()
            except (ValueError, TypeError):
                return None
            arr = np.asarray(decoded.data, dtype=np.float32)
    elif isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, list) and value:
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in value):
            return None
        arr = np.asarray(value, dtype=np.float32)
    else:
        return None
    if arr.ndim != 1 or (dims is not None and arr.shape[0] != dims):
        return None
    if not np.all(np.isfinite(arr)):
        return None
    return arr


def _filter_values(doc: Doc, path: str) -> list[Any]:
    """The values a filter on ``path`` compares (array elements, as a multikey index)."""
    if "." in path:
        return [v for v in query.path_values(doc, path) if v is not MISSING]
    value = doc.get(path, MISSING)
    if value is MISSING:
        return []
    if isinstance(value, list):
        return value if value else [None]
    return [value]


def _vkey(value: Any) -> Any:
    """A hashable key under MongoDB equality (strings, the usual filter values, directly)."""
    return ("s", value) if type(value) is str else query.value_key(value)


_NEVER_IN_NUMERIC_RANGE = (str, bool, type(None), datetime, bson.ObjectId)

# -- the matrix ---------------------------------------------------------------------------------

#: Equality masks kept per filter path (least recently used dropped): a pre-filter on a
#: cached value costs one boolean AND, no Python per row.
MASK_CACHE = 64


class VectorMatrix:
    """Rows of one index: vectors, the filter fields' values, and the id map.

    ``matrix[:high]`` is a contiguous float32 block holding every live row (unit length
    under cosine); ``live`` marks the rows in use. Filter fields keep, per path, the rows of
    each value (``eq``), a bounded cache of those as boolean masks, which rows have a value
    (``present``), a numeric column for vectorised ranges, and the rows whose value is not
    one number (``irregular``, compared one by one).
    """

    def __init__(self, vfield: VectorField, filter_paths: Iterable[str]) -> None:
        self.vfield = vfield
        self.filter_paths = sorted(filter_paths)
        self.capacity = 0
        self.high = 0
        self.matrix = np.zeros((0, vfield.dims), dtype=np.float32)
        self.sqnorm = np.zeros(0, dtype=np.float32)
        self.live = np.zeros(0, dtype=bool)
        self.row_of: dict[bytes, int] = {}
        self.key_of: list[bytes | None] = []
        self.free: list[int] = []
        self.values: dict[str, dict[int, Any]] = {p: {} for p in self.filter_paths}
        self.row_keys: dict[str, dict[int, set[Any]]] = {p: {} for p in self.filter_paths}
        self.eq: dict[str, dict[Any, set[int]]] = {p: {} for p in self.filter_paths}
        self.masks: dict[str, OrderedDict[Any, np.ndarray]] = {
            p: OrderedDict() for p in self.filter_paths
        }
        self.present: dict[str, np.ndarray] = {p: np.zeros(0, bool) for p in self.filter_paths}
        self.num: dict[str, np.ndarray] = {p: np.zeros(0) for p in self.filter_paths}
        self.irregular: dict[str, set[int]] = {p: set() for p in self.filter_paths}

    def __len__(self) -> int:
        return len(self.row_of)

    def _grow(self, need: int) -> None:
        if need <= self.capacity:
            return
        new_cap = max(need, 64, self.capacity * 2)

        def grown(old: np.ndarray, fill: Any = 0) -> np.ndarray:
            new = np.full((new_cap, *old.shape[1:]), fill, dtype=old.dtype)
            new[: self.capacity] = old[: self.capacity]
            return new

        self.matrix = grown(self.matrix)
        self.sqnorm = grown(self.sqnorm)
        self.live = grown(self.live, False)
        for p in self.filter_paths:
            self.num[p] = grown(self.num[p], np.nan)
            self.present[p] = grown(self.present[p], False)
            for k, m in self.masks[p].items():
                self.masks[p][k] = grown(m, False)
        self.key_of.extend([None] * (new_cap - self.capacity))
        self.capacity = new_cap

    def prepare(self, vec: np.ndarray) -> np.ndarray | None:
        """The row stored for ``vec`` (unit length under cosine), or None if not indexable."""
        if self.vfield.similarity == "cosine":
            norm = float(np.linalg.norm(vec))
            if norm == 0.0:
                return None
            return vec / norm
        return vec

    def put(self, key: bytes, doc: Doc | None) -> None:
        self.remove(key)
        if doc is None:
            return
        vec = vector_of(doc, self.vfield.path, self.vfield.dims)
        row_vec = None if vec is None else self.prepare(vec)
        if row_vec is None:
            return
        row = self.free.pop() if self.free else self.high
        if row >= self.capacity:
            self._grow(row + 1)
        self.high = max(self.high, row + 1)
        self.matrix[row] = row_vec
        self.sqnorm[row] = float(np.dot(row_vec, row_vec))
        self.live[row] = True
        self.row_of[key] = row
        self.key_of[row] = key
        self._index_filters(row, doc)

    def load(self, items: Iterable[tuple[bytes, Doc | None]]) -> None:
        """Fill an empty matrix with many documents at once (index builds, start-up).

        FLOAT32 BinData vectors (what accord writes) are copied from one joined buffer
        straight into the matrix and normalised there, as one array; top-level filter
        fields are indexed a column at a time. Other vector shapes go through ``put``.
        """
        assert not self.row_of and not self.free, "load() fills an empty matrix"
        dims, path = self.vfield.dims, self.vfield.path
        width = 2 + 4 * dims
        keys: list[bytes] = []
        docs: list[Doc] = []
        payloads: list[memoryview] = []
        others: list[tuple[bytes, Doc]] = []
        top_level = "." not in path
        for key, doc in items:
            if doc is None:
                continue
            value = doc.get(path, MISSING) if top_level else raw_value(doc, path)
            if (type(value) is bson.Binary and value.subtype == 9
                    and len(value) == width and value[0] == _FLOAT32 and value[1] == 0):  # fmt: skip
                keys.append(key)
                docs.append(doc)
                payloads.append(memoryview(value)[2:])
            elif value is not MISSING:
                others.append((key, doc))
        if payloads:
            n = len(payloads)
            self._grow(n)
            block = self.matrix[:n]
            block[:] = np.frombuffer(b"".join(payloads), dtype="<f4").reshape(n, dims)
            ok = np.isfinite(block).all(axis=1)
            sq = np.einsum("ij,ij->i", block, block)
            if self.vfield.similarity == "cosine":
                ok &= sq > 0
                norms = np.sqrt(sq, where=ok, out=np.ones_like(sq))
                block /= norms[:, None]
                sq = np.ones_like(sq)
            if not ok.all():  # unusable vectors (rare): close the gaps
                kept = np.flatnonzero(ok)
                block[: kept.size] = block[kept]
                sq = sq[kept]
                keys = [keys[i] for i in kept.tolist()]
                docs = [docs[i] for i in kept.tolist()]
                block[kept.size :] = 0
                n = kept.size
            self.sqnorm[:n] = sq
            self.live[:n] = True
            self.high = n
            self.row_of = dict(zip(keys, range(n), strict=True))
            self.key_of[:n] = keys
            for p in self.filter_paths:
                self._index_column(p, docs)
        for key, doc in others:
            self.put(key, doc)

    def _index_column(self, p: str, docs: list[Doc]) -> None:
        """Index filter path ``p`` of rows ``0..len(docs)-1`` (a fresh matrix)."""
        if "." in p:
            for row, doc in enumerate(docs):
                values = _filter_values(doc, p)
                if values:
                    self._index_value(p, row, query_value_of(doc, p), values)
            return
        eq, stored = self.eq[p], self.values[p]
        plain: list[int] = []
        for row, v in enumerate([d.get(p, MISSING) for d in docs]):
            if type(v) is str:  # the usual filter value (tenant, prefix, kind): one key
                rows = eq.get(("s", v))
                if rows is None:
                    eq[("s", v)] = {row}
                else:
                    rows.add(row)
                stored[row] = v
                plain.append(row)
            elif type(v) is list and v and all(type(x) is str for x in v):  # ns_prefixes
                for x in set(v):
                    rows = eq.get(("s", x))
                    if rows is None:
                        eq[("s", x)] = {row}
                    else:
                        rows.add(row)
                stored[row] = v
                plain.append(row)
            elif v is not MISSING:
                self._index_value(p, row, v, v if isinstance(v, list) and v else
                                  [None] if isinstance(v, list) else [v])  # fmt: skip
        if plain:
            self.present[p][np.asarray(plain, dtype=np.int64)] = True

    def _index_filters(self, row: int, doc: Doc) -> None:
        for p in self.filter_paths:
            values = _filter_values(doc, p)
            if values:
                raw = query_value_of(doc, p) if "." in p else doc[p]
                self._index_value(p, row, raw, values)

    def _index_value(self, p: str, row: int, raw: Any, values: list[Any]) -> None:
        self.values[p][row] = raw
        self.present[p][row] = True
        keys = {_vkey(v) for v in values}
        if "." in p:  # the raw value does not tell them again (arrays along the path)
            self.row_keys[p][row] = keys
        eq, masks = self.eq[p], self.masks[p]
        for k in keys:
            rows = eq.get(k)
            if rows is None:
                eq[k] = {row}
            else:
                rows.add(row)
            m = masks.get(k)
            if m is not None:
                m[row] = True
        if len(values) == 1 and _is_number(values[0]):
            self.num[p][row] = float(values[0])
        elif not all(isinstance(v, _NEVER_IN_NUMERIC_RANGE) for v in values):
            # Compared one by one by numeric ranges: arrays (any element may match) and
            # unusual types. A string, boolean, null, date or id never matches a numeric
            # range (type bracketing), so those rows need no look.
            self.irregular[p].add(row)

    def _keys_of(self, p: str, row: int) -> set[Any] | None:
        if "." in p:
            return self.row_keys[p].pop(row, None)
        if row not in self.values[p]:
            return None
        raw = self.values[p][row]
        values = (
            raw if isinstance(raw, list) and raw else [None] if isinstance(raw, list) else [raw]
        )
        return {_vkey(v) for v in values}

    def remove(self, key: bytes) -> None:
        row = self.row_of.pop(key, None)
        if row is None:
            return
        self.live[row] = False
        self.key_of[row] = None
        self.free.append(row)
        for p in self.filter_paths:
            keys = self._keys_of(p, row)
            if keys is None:
                continue
            del self.values[p][row]
            self.present[p][row] = False
            eq, masks = self.eq[p], self.masks[p]
            for k in keys:
                rows = eq.get(k)
                if rows is not None:
                    rows.discard(row)
                    if not rows:
                        del eq[k]
                        masks.pop(k, None)
                        continue
                m = masks.get(k)
                if m is not None:
                    m[row] = False
            self.num[p][row] = np.nan
            self.irregular[p].discard(row)

    # -- filters ------------------------------------------------------------------------------

    def mask(self, filt: Doc | None) -> np.ndarray:
        """Rows (live ones) that match an already-validated pre-filter (a fresh array)."""
        if not filt:
            return self.live.copy()
        return self.live & self._clause(filt)

    def _rows(self, rows: Iterable[int]) -> np.ndarray:
        out = np.zeros(self.capacity, dtype=bool)
        idx = np.fromiter(rows, dtype=np.int64)
        if idx.size:
            out[idx] = True
        return out

    def _eq_mask(self, path: str, value: Any) -> np.ndarray:
        """Rows whose ``path`` equals ``value`` (a cached mask: do not modify it)."""
        key = _vkey(value)
        masks = self.masks[path]
        m = masks.get(key)
        if m is not None:
            masks.move_to_end(key)
            return m
        rows = self.eq[path].get(key)
        if rows is None:
            return np.zeros(self.capacity, dtype=bool)  # not cached: nothing to keep in step
        m = self._rows(rows)
        masks[key] = m
        if len(masks) > MASK_CACHE:
            masks.popitem(last=False)
        return m

    def _any_of(self, path: str, values: Iterable[Any]) -> np.ndarray:
        out = np.zeros(self.capacity, dtype=bool)
        for v in values:
            out |= self._eq_mask(path, v)
        return out

    def _clause(self, filt: Doc) -> np.ndarray:
        out: np.ndarray | None = None
        for key, value in filt.items():
            if key == "$and":
                part = self._clause(value[0])
                for sub in value[1:]:
                    part = part & self._clause(sub)
            elif key == "$or":
                part = np.zeros(self.capacity, dtype=bool)
                for sub in value:
                    part = part | self._clause(sub)
            elif key == "$nor":
                part = np.ones(self.capacity, dtype=bool)
                for sub in value:
                    part &= ~self._clause(sub)
            else:
                part = self._field(key, value)
            out = part if out is None else out & part
        return np.ones(self.capacity, dtype=bool) if out is None else out

    def _field(self, path: str, cond: Any) -> np.ndarray:
        if not (isinstance(cond, dict) and cond and all(k.startswith("$") for k in cond)):
            return self._leaf(path, "$eq", cond)
        out: np.ndarray | None = None
        for op, operand in cond.items():
            part = self._leaf(path, op, operand)
            out = part if out is None else out & part
        assert out is not None
        return out

    def _leaf(self, path: str, op: str, operand: Any) -> np.ndarray:
        if op == "$eq":
            return self._eq_mask(path, operand)
        if op == "$ne":
            return ~self._eq_mask(path, operand)
        if op == "$in":
            return self._any_of(path, operand)
        if op == "$nin":
            return ~self._any_of(path, operand)
        if op == "$exists":
            return self.present[path] if operand else ~self.present[path]
        if op == "$not":
            return ~self._field(path, operand)
        # Ranges: numbers vectorised over the numeric column, everything else one by one
        # with the engine's own comparison rules (type bracketing, arrays, dates).
        out = np.zeros(self.capacity, dtype=bool)
        if _is_number(operand):
            col = self.num[path]
            x = float(operand)
            with np.errstate(invalid="ignore"):
                out = {"$gt": col > x, "$gte": col >= x, "$lt": col < x, "$lte": col <= x}[op]
            rows: Iterable[int] = self.irregular[path]
        else:
            rows = self.values[path]
        leaf = {path: {op: operand}}
        values = self.values[path]
        hits = [r for r in rows if query.matches(leaf, doc_at(path, values[r]))]
        if hits:
            out = out | self._rows(hits)
        return out

    # -- scoring -----------------------------------------------------------------------------

    def rank(
        self, qv: np.ndarray, mask: np.ndarray, pause: Callable[[], bool] | None = None
    ) -> tuple[np.ndarray, np.ndarray | None, int, bool]:
        """Rank the rows of ``mask`` against ``qv``: ``(rank, rows, count, paused)``, the
        ranks (float32, higher is better, -inf for rows not selected) of ``rows`` (None:
        of every row below ``high`` as it was when called), how many rows are selected,
        and whether ``pause`` released the engine lock meanwhile.

        When many rows pass the pre-filter, the whole block ``matrix[:high]`` is scored,
        one matrix-vector product per ``RANK_CHUNK`` rows (no copy), with ``pause``
        between chunks; the rest is masked out. When few do, only they are gathered.
        After a pause, rows changed by the commits made meanwhile were ranked with
        whatever they held: the caller sets those to -inf (``select`` drops them) and
        reads their documents at its snapshot instead."""
        high = self.high
        sel = mask[:high]
        count = int(np.count_nonzero(sel))
        if count == 0:
            return np.zeros(0, dtype=np.float32), None, 0, False
        euclid = self.vfield.similarity == "euclidean"
        paused = False
        if count * 8 > high:
            rank = np.empty(high, dtype=np.float32)
            for lo in range(0, high, RANK_CHUNK):
                if pause is not None and lo:
                    paused = pause() or paused
                hi = min(high, lo + RANK_CHUNK)
                # ``matrix`` may have been re-allocated while the lock was free (it grew);
                # the rows below ``high`` were copied over.
                rank[lo:hi] = matvec(self.matrix[lo:hi], qv)
                if euclid:  # -|r - q|^2 + |q|^2
                    rank[lo:hi] = 2.0 * rank[lo:hi] - self.sqnorm[lo:hi]
            rank[~sel] = -np.inf
            return rank, None, count, paused
        rows = np.flatnonzero(sel)
        rank = matvec(self.matrix[rows], qv)
        if euclid:
            rank = 2.0 * rank - self.sqnorm[rows]
        return rank, rows, count, paused

    def select(
        self, qv: np.ndarray, ranked: tuple[np.ndarray, np.ndarray | None, int, bool],
        mask: np.ndarray, limit: int,
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """The ``limit`` best of ``rank``'s rows (best first, ties by row) and their
        scores: argpartition picks the top without sorting everything, and only the
        winners are scored, in float64 (engine lock held)."""
        rank, rows, count, _ = ranked
        if count == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        # A few more candidates than asked for, re-scored exactly below, so that float32
        # rounding in the product cannot change which rows win.
        want = min(count, limit + 8 if limit < count else limit)
        n = rank.shape[0]
        # the largest ``want`` (no negated copy of the ranks)
        cand = np.argpartition(rank, n - want)[n - want :] if want < n else np.arange(n)
        cand = cand[rank[cand] > -np.inf]
        cand_rows = cand if rows is None else rows[cand]
        cand_rows = cand_rows[self.live[cand_rows] & mask[cand_rows]]
        scores = _scores(self.matrix[cand_rows], qv, self.vfield.similarity)
        order = np.lexsort((cand_rows, -scores))[:limit]
        return cand_rows[order], scores[order]

    def top(self, qv: np.ndarray, mask: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``limit`` best rows among ``mask`` (best first, ties by row) and their
        scores, exactly: every selected row is scored (``rank``, ``select``)."""
        return self.select(qv, self.rank(qv, mask), mask, limit)


def matvec(block: np.ndarray, qv: np.ndarray) -> np.ndarray:
    """``block @ qv`` computed on the calling thread (numpy's own einsum loop, not BLAS).

    A matrix-vector product over many rows is bound by memory bandwidth, so a second BLAS
    thread gains little; and when other processes hold the cores, OpenBLAS waits for its
    helper thread to be scheduled, which made a search's p95 several times its median
    (benchmarks/vector_search.py measures both)."""
    return np.einsum("ij,j->i", block, qv)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and not math.isnan(v)


def query_value_of(doc: Doc, path: str) -> Any:
    value: Any = doc
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        else:
            return None  # arrays along the path: keep the raw top value below
    return value


def doc_at(path: str, value: Any) -> Doc:
    """``{a: {b: value}}`` for ``a.b``: the projection a leaf filter is evaluated against."""
    out: Doc = {}
    cur = out
    parts = path.split(".")
    for part in parts[:-1]:
        cur[part] = {}
        cur = cur[part]
    cur[parts[-1]] = value
    return out


# -- query parsing ------------------------------------------------------------------------------


@dataclass
class VectorQuery:
    index: str
    path: str
    vector: np.ndarray
    limit: int
    num_candidates: int | None
    exact: bool
    filter: Doc | None


def parse_stage(spec: Any) -> VectorQuery:
    if not isinstance(spec, dict):
        raise plan_error('"$vectorSearch" must be a document')
    known = {"index", "path", "queryVector", "numCandidates", "limit", "filter", "exact",
             "returnStoredSource", "explainOptions"}  # fmt: skip
    for k in spec:
        if k not in known:
            raise plan_error(f'"$vectorSearch" unrecognized field "{k}"')
    index = spec.get("index", "default")
    if not isinstance(index, str):
        raise plan_error('"index" must be a string')
    path = spec.get("path")
    if not isinstance(path, str) or not path:
        raise plan_error('"path" is required' if path is None else '"path" must be a string')
    limit = spec.get("limit")
    if limit is None:
        raise plan_error('"limit" is required')
    # mongod checks limit itself when it parses the stage, before mongot sees it: a
    # number, positive once converted to a 64-bit integer (NaN converts to 0).
    if isinstance(limit, bool) or not isinstance(limit, int | float):
        raise EngineError(
            Code.Location8575100, "Expected limit field to be a number in $vectorSearch"
        )
    if _safe_long(limit) <= 0:
        raise EngineError(Code.Location7912700, "Expected limit to be positive")
    if not _is_whole(limit):
        raise plan_error('"limit" must be a int')
    exact = spec.get("exact", False)
    if not isinstance(exact, bool):
        raise plan_error('"exact" must be a boolean')
    nc = spec.get("numCandidates")
    if nc is not None:
        if not _is_whole(nc):
            raise plan_error('"numCandidates" must be a int')
        if not 1 <= nc <= MAX_NUM_CANDIDATES:
            raise plan_error(f'"numCandidates" must be within bounds [1..{MAX_NUM_CANDIDATES}]')
    if exact and nc is not None:
        raise plan_error('"numCandidates" must be omitted when "exact" is set to true')
    if not exact:
        if nc is None:
            raise plan_error("numCandidates is required for approximate vector search")
        if limit > nc:
            raise plan_error("limit should be less than or equal to numCandidates")
    raw = spec.get("queryVector")
    if raw is None:
        raise plan_error("Exactly one and only one of query and queryVector can be present")
    vector = _query_list(raw) if isinstance(raw, list) else as_vector(raw)
    if vector is None:
        raise plan_error('"queryVector" must be an array of numbers or a BinData vector')
    filt = spec.get("filter")
    if filt is not None and not isinstance(filt, dict):
        raise plan_error('"filter" must be a document')
    return VectorQuery(index, path, vector, int(limit), None if nc is None else int(nc), exact,
                       filt or None)  # fmt: skip


def _safe_long(value: int | float) -> int:
    """mongod's ``BSONElement::safeNumberLong``: NaN is 0, out-of-range values clamp."""
    if isinstance(value, float):
        if math.isnan(value):
            return 0
        if value >= 2.0**63:
            return 2**63 - 1
        if value < -(2.0**63):
            return -(2**63)
        return int(value)
    return max(-(2**63), min(2**63 - 1, value))


def _is_whole(value: Any) -> bool:
    """A number with an integral value: NaN and infinities are not (``int()`` raised
    ValueError or OverflowError on them, which the client saw as an internal error)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or (math.isfinite(value) and value == int(value))


def _query_list(raw: list[Any]) -> np.ndarray | None:
    """A ``queryVector`` sent as an array: numbers only, all finite (mongot's messages)."""
    if not all(type(x) is float for x in raw):  # doubles, as drivers send them: no look
        for x in raw:
            if isinstance(x, bool) or not isinstance(x, int | float):
                raise plan_error('"queryVector" must be an array of numbers or a BinData vector')
    values = np.asarray(raw, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise plan_error(
            f"'queryVector' contains a non-finite value (Infinity or NaN) at position"
            f' [{int(bad[0])}]. All values in "queryVector" must be finite.'
        )
    if values.ndim != 1 or not values.size:
        return None
    with np.errstate(over="ignore"):  # beyond float32: infinite, refused by as_vector
        return as_vector(values.astype(np.float32))


def check_filter(filt: Any, filter_paths: set[str], where: str = "filter") -> None:
    """Accept only what a vectorSearch pre-filter allows, on fields indexed as filter."""
    if not isinstance(filt, dict):
        raise plan_error(f'"{where}" must be a document')
    for key, value in filt.items():
        if key in FILTER_LOGICAL_OPS:
            if not isinstance(value, list) or not value:
                raise plan_error(f'"{where}.{key}" must be a non-empty array')
            for i, sub in enumerate(value):
                check_filter(sub, filter_paths, f"{where}.{key}[{i}]")
        elif key.startswith("$"):
            raise plan_error(f'"{where}" unrecognized field "{key}"')
        else:
            _check_condition(key, value, filter_paths, f"{where}.{key}")


def _check_condition(path: str, cond: Any, filter_paths: set[str], where: str) -> None:
    if isinstance(cond, dict) and any(k.startswith("$") for k in cond):
        if not all(k.startswith("$") for k in cond):
            raise plan_error(f'"{where}" cannot mix operators and field names')
        for op, operand in cond.items():
            if op not in FILTER_LEAF_OPS:
                raise plan_error(f'"{where}" unrecognized field "{op}"')
            if op in ("$in", "$nin"):
                if not isinstance(operand, list):
                    raise plan_error(f'"{where}.{op}" must be an array')
                for v in operand:
                    _check_value(v, f"{where}.{op}")
            elif op == "$exists":
                if not isinstance(operand, bool):
                    raise plan_error(f'"{where}.{op}" must be a boolean')
            elif op == "$not":
                if not isinstance(operand, dict) or not operand:
                    raise plan_error(f'"{where}.$not" must be a document')
                _check_condition(path, operand, filter_paths, f"{where}.$not")
            else:
                _check_value(operand, f"{where}.{op}")
        ops = set(cond)
        if ops <= {"$exists"}:
            if path not in filter_paths:
                raise plan_error(f"Path '{path}' needs to be indexed as filter")
            return
    else:
        _check_value(cond, where)
    if path not in filter_paths:
        raise plan_error(f"Path '{path}' needs to be indexed as filter")


def _check_value(value: Any, where: str) -> None:
    ok = (
        value is None
        or isinstance(value, bool | str | datetime | bson.ObjectId)
        or (isinstance(value, int | float) and not isinstance(value, bool))
        or (isinstance(value, bson.Binary) and value.subtype in (3, 4))
        or isinstance(value, bson.Int64)
    )
    if isinstance(value, list):
        ok = all(isinstance(v, str | bool | int | float | datetime | bson.ObjectId) for v in value)
    if not ok:
        raise plan_error(
            f'"{where}" must be a boolean, date, objectId, number, string, uuid or null'
        )


# -- the manager (one per engine) -----------------------------------------------------------------


@dataclass
class _IndexState:
    index: SearchIndex
    matrices: dict[str, VectorMatrix] = field(default_factory=dict)


class SearchIndexes:
    """The search indexes of one engine: catalog, matrices, commit observer."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.path = _catalog_path(engine)
        self.by_ns: dict[str, dict[str, _IndexState]] = {}
        # Per indexed collection: (commit ts, id key) of recent changes, for snapshot reads.
        self.changes: dict[str, deque[tuple[int, bytes]]] = {}
        #: (ns, index name) -> seconds the last build of its matrices took
        self.build_seconds: dict[tuple[str, str], float] = {}
        for entry in self._load():
            index = SearchIndex.from_catalog(entry)
            self._attach(index)
        engine.commit_observers.append(self)

    # -- catalog --------------------------------------------------------------------------------

    def _load(self) -> list[Doc]:
        if self.path is None or not self.path.exists():
            return []
        try:
            return list(json.loads(self.path.read_text())["indexes"])
        except (OSError, ValueError, KeyError) as exc:
            raise EngineError(
                Code.InternalError, f"cannot read the search index catalog {self.path}: {exc}"
            ) from exc

    def _save(self) -> None:
        if self.path is None:
            return
        entries = [s.index.to_catalog() for idx in self.by_ns.values() for s in idx.values()]
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"indexes": entries}, f, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- definitions ----------------------------------------------------------------------------

    def indexes_of(self, ns: str) -> list[SearchIndex]:
        return [s.index for s in self.by_ns.get(ns, {}).values()]

    def find(self, ns: str, name: str | None = None, id_: str | None = None) -> SearchIndex | None:
        for s in self.by_ns.get(ns, {}).values():
            if (name is not None and s.index.name == name) or (
                id_ is not None and s.index.id == id_
            ):
                return s.index
        return None

    def create(self, ns: str, name: str, index_type: str, definition: Doc) -> SearchIndex:
        if self.find(ns, name=name) is not None:
            raise EngineError(
                Code.IndexAlreadyExists, f"Index {name} already exists for collection {ns}"
            )
        index = SearchIndex(ns=ns, id=secrets.token_hex(12), name=name, type=index_type,
                            definition=validate_definition(index_type, definition),
                            created_at=datetime.now(UTC))  # fmt: skip
        self._attach(index)
        self._save()
        return index

    def update(self, index: SearchIndex, definition: Doc) -> None:
        index.definition = validate_definition(index.type, definition)
        index.version += 1
        self._attach(index)
        self._save()

    def drop(self, index: SearchIndex) -> None:
        self.by_ns.get(index.ns, {}).pop(index.name, None)
        self._save()

    def _attach(self, index: SearchIndex) -> None:
        state = _IndexState(index)
        self.by_ns.setdefault(index.ns, {})[index.name] = state
        self._build(state)

    def _build(self, state: _IndexState) -> None:
        """Load every committed document's vector into fresh matrices (in bulk)."""
        started = time.perf_counter()
        coll = self.engine.get_collection(state.index.ns)
        fields = state.index.vector_fields
        state.matrices = {p: VectorMatrix(vf, state.index.filter_paths) for p, vf in fields.items()}
        changes = self.changes.setdefault(state.index.ns, deque())
        if coll is None:
            return
        horizon = self.engine.oldest_snapshot()
        latest = []
        fresh = []
        for key, doc, ts, _has_history in self.engine.latest_documents(state.index.ns):
            latest.append((key, doc))
            if ts > horizon:  # a reader may still see an older version of it
                fresh.append((ts, key))
        if fresh:  # keep the log in commit order: searches read it from the newest end
            merged = sorted([*(c for c in changes if c[0] > horizon), *fresh])
            changes.clear()
            changes.extend(merged)
        for m in state.matrices.values():
            m.load(latest)
        self.build_seconds[(state.index.ns, state.index.name)] = time.perf_counter() - started

    # -- commit observer ------------------------------------------------------------------------

    def observes(self, ns: str) -> bool:
        return ns in self.by_ns

    def on_commit(self, ts: int, changes: list[tuple[str, bytes, Doc | None, Doc | None]]) -> None:
        horizon = self.engine.oldest_snapshot()
        touched: set[str] = set()
        for ns, key, _old, new in changes:
            states = self.by_ns.get(ns)
            if not states:
                continue
            touched.add(ns)
            self.changes.setdefault(ns, deque()).append((ts, key))
            for state in states.values():
                for m in state.matrices.values():
                    m.put(key, new)
        for ns in touched:
            log_ = self.changes[ns]
            while log_ and log_[0][0] <= horizon:
                log_.popleft()

    def on_drop(self, ns: str) -> None:
        if self.by_ns.pop(ns, None) is not None:
            self.changes.pop(ns, None)
            self._save()

    def on_rename(self, old: str, new: str) -> None:
        states = self.by_ns.pop(old, None)
        self.on_drop(new)
        if states is not None:
            for state in states.values():
                state.index.ns = new
            self.by_ns[new] = states
            self.changes[new] = self.changes.pop(old, deque())
            self._save()

    # -- queries --------------------------------------------------------------------------------

    def search(self, txn: Any, ns: str, q: VectorQuery) -> list[Doc]:
        """Documents visible to ``txn``, best first, each with its score in SCORE_FIELD
        (fresh documents: the caller may change them)."""
        state = self.by_ns.get(ns, {}).get(q.index)
        if state is None or state.index.type != "vectorSearch":
            return []  # Atlas returns nothing for an index that does not exist
        matrix = state.matrices.get(q.path)
        if matrix is None:
            raise plan_error(f"{q.path} is not indexed as vector")
        dims = matrix.vfield.dims
        if q.vector.shape[0] != dims:
            raise plan_error(
                f"vector field is indexed with {dims} dimensions but queried with "
                f"{q.vector.shape[0]}"
            )
        if q.filter is not None:
            check_filter(q.filter, state.index.filter_paths)
        qv = q.vector
        if matrix.vfield.similarity == "cosine":
            norm = float(np.linalg.norm(qv))
            if norm == 0.0:
                raise plan_error("Cosine similarity cannot be calculated against a zero vector.")
            qv = qv / norm
        divergent = self._divergent(txn, ns)
        mask = matrix.mask(q.filter)
        for key in divergent:
            row = matrix.row_of.get(key)
            if row is not None:
                mask[row] = False
        # Scoring the whole matrix pauses between chunks in a read that may (tens of
        # milliseconds at 100,000 rows, once held as one step).
        coll = self.engine.get_collection(ns, txn)
        pause = self.engine.read_pause(txn, coll) if txn.yields and coll is not None else None
        ranked = matrix.rank(qv, mask, pause)
        if ranked[3]:
            # The lock was free: whatever was committed meanwhile is newer than the
            # snapshot. Its rows are dropped from the ranking (a freed row may even hold
            # another document now) and its documents read at the snapshot, below.
            if self.by_ns.get(ns, {}).get(q.index) is not state or (
                state.matrices.get(q.path) is not matrix
            ):
                raise EngineError(
                    Code.QueryPlanKilled,
                    f"the query was killed: search index {q.index!r} was dropped or "
                    "changed while it ran",
                )
            since = self._divergent(txn, ns) - divergent
            divergent |= since
            rank, rows, _, _ = ranked
            if rows is None:
                high = rank.shape[0]
                rank[~matrix.live[:high]] = -np.inf
                for key in since:
                    row = matrix.row_of.get(key)
                    if row is not None and row < high:
                        rank[row] = -np.inf
        rows, scores = matrix.select(qv, ranked, mask, q.limit)
        scored: list[tuple[float, int, bytes]] = []
        for row, score in zip(rows.tolist(), scores.tolist(), strict=True):
            row_key = matrix.key_of[row]
            if row_key is not None:
                scored.append((score, row, row_key))
        for n, key in enumerate(sorted(divergent)):
            doc = self.engine.get(txn, ns, key)
            if doc is None or (q.filter is not None and not query.matches(q.filter, doc)):
                continue
            vec = vector_of(doc, q.path, dims)
            row_vec = None if vec is None else matrix.prepare(vec)
            if row_vec is None:
                continue
            score = float(_scores(row_vec[None, :], qv, matrix.vfield.similarity)[0])
            scored.append((score, matrix.capacity + n, key))
        scored.sort(key=lambda t: (-t[0], t[1]))
        out = []
        own = txn.writes.get(ns, {})
        # Fetching up to 10,000 winners is the long part: a read lets other commands run
        # between slices of it (the winners are chosen; each is read at the snapshot).
        for n, (score, _, key) in enumerate(scored[: q.limit]):
            if pause is not None and n % PAUSE_EVERY == 0:
                pause()
            doc = self.engine.get(txn, ns, key)
            if doc is None:
                continue
            # engine.get decodes a fresh dict, except for the transaction's own writes
            hit = copy.deepcopy(doc) if key in own else dict(doc)
            hit[SCORE_FIELD] = score
            out.append(hit)
        return out

    def _divergent(self, txn: Any, ns: str) -> set[bytes]:
        """Documents ``txn`` sees differently from the newest commit: those committed
        after its snapshot (the log is in commit order: only its newest entries are read)
        and its own writes."""
        divergent: set[bytes] = set()
        for ts, k in reversed(self.changes.get(ns, ())):
            if ts <= txn.snapshot:
                break
            divergent.add(k)
        divergent.update(txn.writes.get(ns, {}))
        return divergent


def _scores(rows: np.ndarray, qv: np.ndarray, similarity: str) -> np.ndarray:
    """Atlas's scores of a few rows, in float64."""
    r = rows.astype(np.float64)
    q = qv.astype(np.float64)
    if similarity == "euclidean":
        diff = r - q
        return 1.0 / (1.0 + (diff * diff).sum(axis=1))  # type: ignore[no-any-return]
    return (1.0 + (r * q).sum(axis=1)) / 2.0  # type: ignore[no-any-return]


def _catalog_path(engine: Any) -> Path | None:
    storage_path = getattr(getattr(engine, "storage", None), "path", None)
    return Path(storage_path).parent / CATALOG_FILE if storage_path is not None else None


def open_at_startup(engine: Any) -> SearchIndexes | None:
    """Load the search indexes an engine's data directory has, building their matrices now
    (at start-up, so the first search does not pay for it). None when it has none."""
    path = _catalog_path(engine)
    if path is None or not path.exists():
        return None
    with engine.lock:
        found = manager(engine)
    for (ns, name), seconds in found.build_seconds.items():
        log.info("vector index %s on %s built in %.2f s", name, ns, seconds)
    return found


_MANAGERS: weakref.WeakKeyDictionary[Any, SearchIndexes] = weakref.WeakKeyDictionary()
_MANAGERS_LOCK = threading.Lock()


def loaded(engine: Any) -> SearchIndexes | None:
    """The engine's search indexes if they are loaded already (None: not yet)."""
    with _MANAGERS_LOCK:
        return _MANAGERS.get(engine)


def manager(engine: Any) -> SearchIndexes:
    """The search indexes of ``engine`` (built on first use; call with the engine lock held)."""
    with _MANAGERS_LOCK:
        found = _MANAGERS.get(engine)
        if found is None:
            found = _MANAGERS[engine] = SearchIndexes(engine)
            if any(found.by_ns.values()):
                log.info("search indexes loaded: %d", sum(len(v) for v in found.by_ns.values()))
        return found
