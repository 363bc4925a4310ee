"""A ``$vectorSearch`` that releases the engine lock while it scores the matrix still
answers at its snapshot: commits made meanwhile move vectors, delete documents and reuse
their rows, and none of that may show in its results."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accord.platform.embedded import vector_search
from accord.platform.embedded.dispatch import Dispatcher
from accord.platform.embedded.engine import Engine

embedded_only = pytest.mark.embedded_only
N = 400
DIMS = 8


@pytest.fixture()
def engine(tmp_path: Path) -> Iterator[Engine]:
    # No snapshot history: garbage collection may prune everything no open read needs.
    eng = Engine(tmp_path, sync=False, history_window=0.0)
    try:
        yield eng
    finally:
        with eng.locked("shutdown"):
            eng.close()


def _run(dispatcher: Dispatcher, cmd: dict[str, Any]) -> dict[str, Any]:
    reply = dispatcher.execute({**cmd, "$db": "t"})
    assert reply.get("ok") == 1, reply
    assert not reply.get("writeErrors"), reply
    return reply


def _vec(rng: np.random.Generator) -> list[float]:
    return [float(x) for x in rng.normal(size=DIMS)]


def _search(engine: Engine, txn: Any, q: vector_search.VectorQuery) -> list[tuple[Any, float]]:
    with engine.locked("aggregate"):
        found = vector_search.manager(engine).search(txn, "t.v", q)
    return [(doc["_id"], doc[vector_search.SCORE_FIELD]) for doc in found]


@embedded_only
@pytest.mark.parametrize("similarity", ["cosine", "euclidean"])
def test_a_paused_vector_search_returns_its_snapshot(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, similarity: str
) -> None:
    d = Dispatcher(engine, lambda cmd: {"ok": 1.0})
    rng = np.random.default_rng(7)
    _run(d, {"insert": "v", "documents": [
        {"_id": i, "e": _vec(rng), "n": i % 3} for i in range(N)
    ]})  # fmt: skip
    _run(d, {"createSearchIndexes": "v", "indexes": [{
        "name": "vi", "type": "vectorSearch", "definition": {"fields": [
            {"type": "vector", "path": "e", "numDimensions": DIMS, "similarity": similarity},
            {"type": "filter", "path": "n"},
        ]},
    }]})  # fmt: skip
    query = _vec(rng)
    q = vector_search.parse_stage({
        "index": "vi", "path": "e", "queryVector": query, "numCandidates": N, "limit": 60,
        "filter": {"n": {"$in": [0, 1]}},
    })  # fmt: skip
    with engine.locked("aggregate"):
        txn = engine.begin(explicit=False)
    expected = _search(engine, txn, q)  # txn.yields is False: no pause at all
    assert len(expected) == 60

    # Each pause commits what would win if the search saw it: documents moved onto the
    # query vector, new ones there (reusing the rows of deleted ones), deletions.
    monkeypatch.setattr(vector_search, "RANK_CHUNK", 16)
    pick = random.Random(3)
    pauses: list[int] = []

    def mutating_pause() -> bool:
        n = len(pauses)
        pauses.append(n)
        _run(d, {"update": "v", "updates": [
            {"q": {"_id": pick.randrange(N)}, "u": {"$set": {"e": query, "n": 0}}},
        ]})  # fmt: skip
        _run(d, {"delete": "v", "deletes": [{"q": {"_id": pick.randrange(N)}, "limit": 1}]})
        _run(d, {"insert": "v", "documents": [{"_id": N + n, "e": query, "n": 1}]})
        with engine.locked("gc"):
            while engine.collect_garbage():
                pass
        return True

    monkeypatch.setattr(engine, "read_pause", lambda txn, coll: mutating_pause)
    txn.yields = True
    got = _search(engine, txn, q)
    with engine.locked("aggregate"):
        engine.abort(txn, "done")
    assert len(pauses) >= N // 16 - 1, "the ranking must have paused between its chunks"
    assert [k for k, _ in got] == [k for k, _ in expected]
    assert [s for _, s in got] == pytest.approx([s for _, s in expected], rel=1e-6)
    # and a new read sees the commits: the documents now on the query vector come first
    with engine.locked("aggregate"):
        fresh = engine.begin(explicit=False)
    now = _search(engine, fresh, q)
    assert now[0][1] == pytest.approx(1.0)
