"""A long read holds up no other client (issue 22, item 4).

A read collects its documents under the engine lock in slices; what it then does with
them (an in-memory sort, a projection, pipeline stages, encoding a ``getMore`` batch)
runs with the lock released. Each test stops a read in the middle of one of those steps
(a gate in the step's function) and runs an insert from another thread meanwhile: the
insert must complete while the read is stopped there. Before, the step ran under the
lock and the insert waited for all of it (the test's bound, ``WAIT_S``, is only there
to turn that wait into a failure). The read's result must still be its snapshot's.

In-process (engine + dispatcher), since only there can a read be stopped at a step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bson
import pytest

from accord.platform.embedded import aggregate, query
from accord.platform.embedded.cursors import CursorManager
from accord.platform.embedded.dispatch import Dispatcher
from accord.platform.embedded.engine import Engine

embedded_only = pytest.mark.embedded_only
# Far longer than an insert takes, even on a loaded machine: reaching it means the insert
# waited for the stopped read.
WAIT_S = 10.0
N = 500


@pytest.fixture()
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = Engine(tmp_path, sync=False)
    try:
        yield eng
    finally:
        with eng.locked("shutdown"):
            eng.close()


@pytest.fixture()
def d(engine: Engine) -> Dispatcher:
    dispatcher = Dispatcher(engine, lambda cmd: {"ok": 1.0})
    docs = [{"_id": i, "g": i % 7, "k": (i * 37) % N, "pad": "x" * 20} for i in range(N)]
    _run(dispatcher, {"insert": "c", "documents": docs})
    return dispatcher


def _run(dispatcher: Dispatcher, cmd: dict[str, Any]) -> dict[str, Any]:
    # As a client gets it: through BSON (results are stored or encoded BSON).
    reply = bson.decode(bson.encode(dispatcher.execute({**cmd, "$db": "t"})))
    assert reply.get("ok") == 1, reply
    assert not reply.get("writeErrors"), reply
    return reply


class Gate:
    """Stops the first call of a wrapped function until ``open``."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._open = threading.Event()

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def stopped(*args: Any, **kwargs: Any) -> Any:
            if not self.entered.is_set():
                self.entered.set()
                # Longer than the insert is given: an insert stuck behind the stopped step
                # must be seen stuck before the step goes on by itself.
                self._open.wait(3 * WAIT_S)
            return fn(*args, **kwargs)

        return stopped

    def open(self) -> None:
        self._open.set()


def _insert_while_stopped(
    d: Dispatcher, gate: Gate, read: Callable[[], dict[str, Any]]
) -> tuple[dict[str, Any], bool]:
    """Run ``read`` until it stops at ``gate``, insert from another thread, then let the
    read go on. Returns the read's reply and whether the insert completed meanwhile."""
    replies: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: replies.append(read()))
    reader.start()
    try:
        assert gate.entered.wait(WAIT_S), "the read never reached the step under test"
        completed = _insert_within_wait(d)
    finally:
        gate.open()
        reader.join()
    return replies[0], completed


def _insert_within_wait(d: Dispatcher) -> bool:
    """Insert from another thread; whether it was acknowledged within ``WAIT_S``."""
    done = threading.Event()

    def insert() -> None:
        _run(d, {"insert": "o", "documents": [{}]})
        done.set()

    threading.Thread(target=insert, daemon=True).start()
    return done.wait(WAIT_S)


@embedded_only
def test_an_insert_completes_while_a_find_sorts_in_memory(
    d: Dispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate()
    monkeypatch.setattr(query, "sort_docs", gate.wrap(query.sort_docs))

    def read() -> dict[str, Any]:
        # No index on k: the sort is done in memory, after the scan.
        return _run(d, {"find": "c", "filter": {"g": 3}, "sort": {"k": -1}, "batchSize": N})

    reply, completed = _insert_while_stopped(d, gate, read)
    assert completed, "the insert waited for the read's in-memory sort"
    got = [doc["k"] for doc in reply["cursor"]["firstBatch"]]
    assert got == sorted(((i * 37) % N for i in range(N) if i % 7 == 3), reverse=True)


@embedded_only
def test_an_insert_completes_while_a_find_projects(
    d: Dispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate()
    monkeypatch.setattr(query, "project", gate.wrap(query.project))

    def read() -> dict[str, Any]:
        return _run(d, {"find": "c", "projection": {"pad": 0}, "batchSize": N})

    reply, completed = _insert_while_stopped(d, gate, read)
    assert completed, "the insert waited for the read's projection"
    assert reply["cursor"]["firstBatch"] == [
        {"_id": i, "g": i % 7, "k": (i * 37) % N} for i in range(N)
    ]


@embedded_only
def test_an_insert_completes_while_an_aggregate_runs_its_stages(
    d: Dispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate()
    monkeypatch.setattr(aggregate.Pipeline, "_stage", gate.wrap(aggregate.Pipeline._stage))

    def read() -> dict[str, Any]:
        return _run(d, {"aggregate": "c", "cursor": {}, "pipeline": [
            {"$group": {"_id": "$g", "n": {"$sum": 1}}}, {"$sort": {"_id": 1}},
        ]})  # fmt: skip

    reply, completed = _insert_while_stopped(d, gate, read)
    assert completed, "the insert waited for the aggregate's stages"
    expected = [{"_id": g, "n": sum(1 for i in range(N) if i % 7 == g)} for g in range(7)]
    assert reply["cursor"]["firstBatch"] == expected


@embedded_only
def test_an_insert_completes_while_a_lookup_runs(
    d: Dispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$lookup reads its other collection under the lock, and matches without it."""
    _run(d, {"insert": "g", "documents": [{"_id": g, "name": f"group {g}"} for g in range(7)]})
    gate = Gate()
    monkeypatch.setattr(query, "path_values", gate.wrap(query.path_values))

    def read() -> dict[str, Any]:
        return _run(d, {"aggregate": "c", "cursor": {"batchSize": N}, "pipeline": [
            {"$lookup": {"from": "g", "localField": "g", "foreignField": "_id", "as": "group"}},
        ]})  # fmt: skip

    reply, completed = _insert_while_stopped(d, gate, read)
    assert completed, "the insert waited for the $lookup"
    batch = reply["cursor"]["firstBatch"]
    assert [doc["group"] for doc in batch] == [
        [{"_id": i % 7, "name": f"group {i % 7}"}] for i in range(N)
    ]


@embedded_only
def test_an_insert_completes_while_a_getmore_encodes_its_batch(
    d: Dispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _run(d, {"find": "c", "sort": {"_id": 1}, "batchSize": 10})
    cursor_id = first["cursor"]["id"]
    assert cursor_id
    gate = Gate()
    monkeypatch.setattr(CursorManager, "_take", staticmethod(gate.wrap(CursorManager._take)))
    get_more = {"getMore": bson.Int64(cursor_id), "collection": "c", "batchSize": 20}
    second: list[dict[str, Any]] = []

    def same_cursor() -> None:
        # While the first getMore holds the cursor, another is refused as mongod refuses
        # a getMore on a cursor in use.
        second.append(bson.decode(bson.encode(d.execute({**get_more, "$db": "t"}))))

    replies: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: replies.append(_run(d, get_more)))
    reader.start()
    try:
        assert gate.entered.wait(WAIT_S)
        completed = _insert_within_wait(d)
        other = threading.Thread(target=same_cursor)
        other.start()
        other.join(WAIT_S)
    finally:
        gate.open()
        reader.join()
    assert completed, "the insert waited for the getMore's batch"
    assert second and second[0]["code"] == 292 and second[0]["codeName"] == "CursorInUse"
    assert [doc["_id"] for doc in replies[0]["cursor"]["nextBatch"]] == list(range(10, 30))
    rest = _run(d, {**get_more, "batchSize": N})
    assert [doc["_id"] for doc in rest["cursor"]["nextBatch"]] == list(range(30, N))


@embedded_only
def test_a_read_can_pause_while_another_command_waits_for_a_commit(engine: Engine) -> None:
    """A command waiting for a commit (a write behind a transaction, a change stream's
    getMore) gives the lock up; whoever takes it meanwhile holds it once and may pause.
    Before, it found the waiting command's hold count: its reads could not pause at
    all, and its holds went unrecorded."""
    waiting = threading.Event()

    def wait_for_a_commit() -> None:
        with engine.locked("waiter"):
            waiting.set()
            engine.wait_changed(WAIT_S)

    waiter = threading.Thread(target=wait_for_a_commit)
    waiter.start()
    try:
        assert waiting.wait(WAIT_S)
        with engine.locked("reader"):  # taken once the waiter waits
            assert engine.yield_lock(), "a read could not pause beside a waiting command"
            engine.changed.notify_all()
    finally:
        waiter.join()
    assert "reader" in engine.lock_stats.report()["maxHoldByKind"]
