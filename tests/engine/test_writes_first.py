"""Writes first: a long read steps aside while a write the event loop runs is in flight
(``writes_first``), for a bounded time, and every write that starts is ended on every
path (answered, failed, waiting on its worker, unacknowledged), or reads would wait at
each of their pauses for nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import DuplicateKeyError
from pymongo.write_concern import WriteConcern

from accord.platform.embedded import writes_first

embedded_only = pytest.mark.embedded_only


@pytest.fixture()
def write_in_flight() -> Iterator[None]:
    writes_first.started()
    try:
        yield
    finally:
        writes_first.ended()


def _in_thread(fn: Callable[[], None]) -> float:
    """Seconds ``fn`` took in a fresh thread (a fresh share of waiting, too)."""
    took: list[float] = []

    def run() -> None:
        started = time.perf_counter()
        fn()
        took.append(time.perf_counter() - started)

    t = threading.Thread(target=run)
    t.start()
    t.join(5)
    assert took, "give_way never returned"
    return took[0]


def _waits() -> float:
    return writes_first.stats()["waits"]


# "No wait" is told by the wait count, not by a time bound a loaded machine's scheduler
# can overrun.
def test_no_write_in_flight_no_wait() -> None:
    assert not writes_first.in_flight()
    waits = _waits()
    _in_thread(writes_first.give_way)
    assert _waits() == waits


def test_a_read_waits_until_the_write_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    # Bounds far above the write's 8 ms, so that a loaded machine's late wake-up is not
    # taken for a wait that ended at its bound.
    monkeypatch.setattr(writes_first, "MAX_WAIT_S", 1.0)
    monkeypatch.setattr(writes_first, "WINDOW_S", 2.0)
    timeouts = writes_first.stats()["timeouts"]
    waiting = threading.Event()
    calm = writes_first._calm

    class Watched:  # the module's event, telling when the read began to wait on it
        def wait(self, timeout: float) -> bool:
            waiting.set()
            return calm.wait(timeout)

        def __getattr__(self, name: str) -> Any:
            return getattr(calm, name)

    monkeypatch.setattr(writes_first, "_calm", Watched())

    def write() -> None:  # ends 8 ms after the read began to wait, however late it began
        waiting.wait(5)
        time.sleep(0.008)
        writes_first.ended()

    writes_first.started()
    writer = threading.Thread(target=write)
    writer.start()
    try:
        took = _in_thread(writes_first.give_way)
    finally:
        writer.join()
    assert waiting.is_set(), "the read did not wait for the write in flight"
    assert 0.006 < took < 1.0, took
    assert writes_first.stats()["timeouts"] == timeouts, "it waited out its bound"
    assert not writes_first.in_flight()


def test_a_wait_is_bounded(write_in_flight: None) -> None:
    before = writes_first.stats()
    took = _in_thread(writes_first.give_way)
    after = writes_first.stats()
    # it waited once, until its bound (told by the counts: a loaded machine's scheduler
    # may wake the thread late, so the time has a lower bound only)
    # (at least: the engine's own threads give way while a write is in flight too)
    assert after["waits"] >= before["waits"] + 1
    assert after["timeouts"] >= before["timeouts"] + 1
    assert took > writes_first.MAX_WAIT_S * 0.9, took


class _FakeClock:
    """``time`` for ``writes_first``: only the reader's waits move it, by what they wait,
    so a window's share is counted without the scheduler's delays."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


def test_a_read_waits_at_most_its_share_of_a_window(
    write_in_flight: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _FakeClock()
    monkeypatch.setattr(writes_first, "time", clock)
    # powers of two: the shares add up exactly
    monkeypatch.setattr(writes_first, "MAX_WAIT_S", 0.25)
    monkeypatch.setattr(writes_first, "WINDOW_S", 1.0)
    monkeypatch.setattr(writes_first, "SHARE", 0.75)
    calm = writes_first._calm
    waits: list[float] = []

    class NeverCalm:  # the reader's every wait lasts its whole bound
        def wait(self, timeout: float) -> bool:
            if threading.current_thread().name != "reader":  # the engine's own threads
                return calm.wait(timeout)
            clock.now += timeout
            waits.append(timeout)
            return False

    monkeypatch.setattr(writes_first, "_calm", NeverCalm())

    def reader() -> None:
        for _ in range(20):  # 20 waits would take 20 x MAX_WAIT_S ...
            writes_first.give_way()
        clock.now += 1.0  # ... a new window gives a new share
        for _ in range(20):
            writes_first.give_way()

    t = threading.Thread(target=reader, name="reader")
    t.start()
    t.join(5)
    # the share stops them at SHARE x WINDOW_S: 0.75 / 0.25 = 3 waits per window
    assert waits == [0.25] * 6


def test_step_aside_only_without_the_engine_lock(write_in_flight: None) -> None:
    # Outside an ``unlocked`` block the caller may hold the engine lock: no wait.
    waits = _waits()
    _in_thread(writes_first.step_aside)
    assert _waits() == waits

    def unlocked() -> None:
        with writes_first.unlocked():
            writes_first.step_aside()

    assert _in_thread(unlocked) > writes_first.MAX_WAIT_S * 0.9


def _settled() -> bool:
    deadline = time.monotonic() + 5
    while writes_first.in_flight() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not writes_first.in_flight()


@embedded_only
def test_every_write_the_loop_starts_ends(client: MongoClient, db, mongo_uri: str) -> None:
    coll = db.wf
    coll.insert_one({"_id": 1})
    with pytest.raises(DuplicateKeyError):
        coll.insert_one({"_id": 1})  # an error reply
    coll.update_one({"_id": 1}, {"$set": {"a": 1}})
    coll.delete_many({"none": True})
    coll.with_options(write_concern=WriteConcern(w=0)).insert_one({"_id": 2})  # no reply
    # A write that finds its document held by a transaction waits on its worker.
    with client.start_session() as s, s.start_transaction():
        coll.update_one({"_id": 1}, {"$set": {"a": 2}}, session=s)
        other = MongoClient(mongo_uri, retryWrites=False)
        try:
            waiting = threading.Thread(
                target=lambda: other[db.name].wf.update_one({"_id": 1}, {"$set": {"a": 3}})
            )
            waiting.start()
            time.sleep(0.2)
            # The waiting write is not in flight: reads are not held up for it.
            assert not writes_first.in_flight()
        finally:
            s.abort_transaction()
            waiting.join(10)
            other.close()
    assert coll.find_one({"_id": 1}) == {"_id": 1, "a": 3}
    assert _settled(), "a write was never ended: every read would wait at each pause"


@embedded_only
def test_a_scan_gives_way_to_inserts(client: MongoClient, db, mongo_uri: str) -> None:
    db.wide.insert_many([{"i": i, "s": "x" * 100} for i in range(30_000)])
    before = client.admin.command("serverStatus")["accordEngine"]["writesFirst"]["waits"]
    busy = threading.Event()
    busy.set()
    inserting = threading.Event()
    writer = MongoClient(mongo_uri)

    def inserts() -> None:
        while busy.is_set():
            writer[db.name].beside.insert_one({"at": time.time()})
            inserting.set()

    thread = threading.Thread(target=inserts)
    thread.start()
    try:
        # The scan starts once inserts flow (a loaded machine may take longer to connect
        # the writer than to scan); it is repeated a few times because whether a pause
        # point meets an insert in flight is up to the scheduler.
        assert inserting.wait(30), "the writer never inserted"
        after = before
        for _ in range(5):
            assert list(db.wide.find({"s": {"$regex": "y"}})) == []
            after = client.admin.command("serverStatus")["accordEngine"]["writesFirst"]["waits"]
            if after > before:
                break
    finally:
        busy.clear()
        thread.join()
        writer.close()
    assert after > before, "the scan never stepped aside for an insert"
    assert _settled()
