"""Long reads let other commands run: a query pauses between slices of its work, releasing
the engine lock, and still returns exactly what its snapshot sees.

Two levels: in-process, a pause that commits inserts, updates and deletes through the
engine's own dispatcher (and collects garbage) at EVERY pause point, against a query run
without pauses at the same snapshot; through pymongo, a long scan while transactions move
a token between documents (every snapshot holds exactly one), which must see exactly one
and must have let some of those transactions commit while it ran.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from accord.platform.embedded import planner
from accord.platform.embedded.dispatch import Dispatcher
from accord.platform.embedded.engine import Engine

embedded_only = pytest.mark.embedded_only
N = 300


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


def _run_admin(dispatcher: Dispatcher, cmd: dict[str, Any]) -> None:
    reply = dispatcher.execute({**cmd, "$db": "admin"})
    assert reply.get("ok") == 1, reply


def _loaded(engine: Engine) -> Dispatcher:
    d = Dispatcher(engine, lambda cmd: {"ok": 1.0})
    _run(d, {"createIndexes": "c", "indexes": [
        {"key": {"g": 1, "k": -1}, "name": "g_k"},
        {"key": {"k": 1}, "name": "k", "unique": True},
    ]})  # fmt: skip
    docs = [{"_id": i, "g": i % 7, "k": i, "v": 0} for i in range(N)]
    _run(d, {"insert": "c", "documents": docs})
    # A second version of some documents, so entries of several versions exist.
    _run(d, {"update": "c", "updates": [{"q": {"k": {"$lt": N // 2}}, "u": {"$inc": {"v": 1}}, "multi": True}]})  # fmt: skip
    return d


QUERIES: list[planner.Query] = [
    planner.Query({"k": {"$in": list(range(0, N, 3))}}),  # many point ranges
    planner.Query({"k": {"$gte": 10, "$lt": 250}}, sort={"k": -1}),  # backward walk
    planner.Query({"g": {"$in": [1, 2, 3]}}, sort={"g": 1, "k": -1}),  # index order
    planner.Query({"g": {"$gte": 0}}, sort={"g": -1, "k": -1}),  # mixed directions
    planner.Query({"v": {"$gte": 0}}),  # collection scan
    planner.Query({"_id": {"$in": list(range(0, N, 2))}}),  # _id points
    planner.Query({"$or": [{"k": {"$lt": 40}}, {"g": 5}]}),  # union of index plans
]


def _mutating_pause(d: Dispatcher, engine: Engine, rng: random.Random) -> Callable[[], bool]:
    """A pause that runs other commands, as waiting clients would, and says it paused."""
    counter = iter(range(10**6))

    def pause(work: Callable[[], None] | None = None) -> bool:
        n = next(counter)
        key = rng.randrange(N)
        _run(d, {"insert": "c", "documents": [{"_id": N + 10 * n, "g": key % 7, "k": N + 10 * n, "v": 9}]})  # fmt: skip
        _run(d, {"update": "c", "updates": [{"q": {"_id": key}, "u": {"$set": {"v": 7, "k": 10**6 + n}}}]})  # fmt: skip
        _run(d, {"delete": "c", "deletes": [{"q": {"_id": rng.randrange(N)}, "limit": 1}]})
        with engine.locked("gc"):
            while engine.collect_garbage():
                pass
        if work is not None:  # the read's matching, done "while the lock is free"
            work()
        return True

    return pause


@embedded_only
@pytest.mark.parametrize("deferred", [False, True], ids=["matched-in-scan", "matched-at-pauses"])
@pytest.mark.parametrize("q", QUERIES, ids=lambda q: str(q.filter)[:40] + str(q.sort or ""))
def test_a_paused_query_returns_its_snapshot(
    engine: Engine, q: planner.Query, deferred: bool
) -> None:
    d = _loaded(engine)
    coll = engine.get_collection("t.c")
    assert coll is not None
    with engine.locked("find"):
        txn = engine.begin(explicit=False)
    with engine.locked("find"):
        expected = [(h.key, h.raw) for h in planner.execute(coll, txn, q).hits]
    assert expected, "the query must find something for the comparison to mean anything"
    # Each pause point commits writes (inserts, updates moving keys, deletes) and prunes
    # versions; the query re-positions its walk after each and must not notice.
    pause = _mutating_pause(d, engine, random.Random(5))
    # With ``release`` the filter is matched at the pauses, on the BSON collected before
    # each (the writes of that pause already applied), as a read does with the lock free.
    release = nullcontext if deferred else None
    got = [(h.key, h.raw) for h in planner.execute(coll, txn, q, pause=pause, release=release).hits]
    with engine.locked("find"):
        engine.abort(txn, "done")
    assert got == expected


def _killing_yield(engine: Engine, action: Callable[[], None]) -> Callable[..., bool]:
    """Stands in for ``Engine.yield_lock``: another command (``action``) runs while the
    lock is free, and so does the read's own ``work``."""

    def yield_lock(work: Callable[[], None] | None = None) -> bool:
        if work is not None:
            work()
        action()
        return True

    return yield_lock


@embedded_only
@pytest.mark.parametrize(
    "what, code",
    [("drop collection", 175), ("drop index", 175), ("rename", 175), ("abort", 251)],
)
def test_a_read_is_killed_when_what_it_reads_goes_away(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, what: str, code: int
) -> None:
    d = _loaded(engine)
    coll = engine.get_collection("t.c")
    assert coll is not None
    monkeypatch.setattr("accord.platform.embedded.engine.READ_SLICE_S", 0.0)
    actions: dict[str, Callable[[], Any]] = {
        "drop collection": lambda: _run(d, {"drop": "c"}),
        "drop index": lambda: _run(d, {"dropIndexes": "c", "index": "k"}),
        "rename": lambda: _run_admin(d, {"renameCollection": "t.c", "to": "t.d"}),
        "abort": lambda: engine.abort(txn, "killed by a test"),
    }
    with engine.locked("find"):
        txn = engine.begin(explicit=what == "abort")
        txn.yields = True
        monkeypatch.setattr(engine, "yield_lock", _killing_yield(engine, actions[what]))
        with pytest.raises(Exception) as info:
            engine.find(txn, "t.c", planner.Query({"k": {"$gte": 0}}))
    assert getattr(info.value, "code", None) == code, info.value


@embedded_only
def test_a_long_scan_lets_transactions_commit_and_sees_one_snapshot(
    client: MongoClient, db
) -> None:  # type: ignore[no-untyped-def]
    n = 20_000
    db.c.insert_many([{"_id": i, "token": i == 0, "pad": "x" * 40} for i in range(n)])
    stop = threading.Event()
    moved: list[float] = []  # when each token move was acknowledged
    errors: list[BaseException] = []

    def mover() -> None:
        rng = random.Random(3)
        holder = 0
        try:
            while not stop.is_set():
                target = rng.randrange(n)
                if target == holder:
                    continue
                with client.start_session() as s, s.start_transaction():
                    db.c.update_one({"_id": holder}, {"$set": {"token": False}}, session=s)
                    db.c.update_one({"_id": target}, {"$set": {"token": True}}, session=s)
                moved.append(time.monotonic())
                holder = target
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=mover)
    thread.start()
    try:
        while len(moved) < 3:
            time.sleep(0.01)
        for _ in range(3):
            started = time.monotonic()
            # Unindexed: a collection scan that matches every document with a regex.
            docs = list(db.c.find({"pad": {"$regex": "^x+$"}}, {"token": 1}, batch_size=n + 1))
            ended = time.monotonic()
            assert len(docs) == n
            assert sum(1 for d in docs if d["token"]) == 1, "one snapshot holds one token"
            during = [t for t in moved if started < t < ended]
            if during:
                break
        else:
            pytest.fail("no transaction committed while three long scans ran")
    finally:
        stop.set()
        thread.join()
    assert not errors, errors


@embedded_only
def test_a_paused_read_in_a_transaction_sees_its_own_writes(client: MongoClient, db) -> None:  # type: ignore[no-untyped-def]
    db.c.insert_many([{"_id": i, "v": 0} for i in range(5_000)])
    with client.start_session() as s, s.start_transaction():
        db.c.update_many({"_id": {"$lt": 100}}, {"$set": {"v": 1}}, session=s)
        db.c.insert_one({"_id": "mine", "v": 1}, session=s)
        db.c.update_many({"_id": {"$gte": 4_000}}, {"$set": {"v": 2}})  # outside: invisible
        got = list(db.c.find({"v": {"$gte": 0}}, session=s))
    assert len(got) == 5_001
    assert sum(1 for d in got if d["v"] == 1) == 101
    assert all(d["v"] != 2 for d in got)
