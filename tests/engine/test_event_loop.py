"""What a client relies on when other clients' commands are slow.

The embedded engine reads every connection on one event loop and runs writes there
(netloop.py); a command that may take long or wait runs on its connection's worker. These
tests hold that to its promise: a long read, or a write waiting for a transaction, holds
up no other connection's writes. Through pymongo only, so they run against MongoDB too.
"""

from __future__ import annotations

import os
import threading
import time

from pymongo import MongoClient

# Far below the slow command's duration: a loop held up by it would show as one insert
# waiting for all of it.
MAX_INSERT_S = 0.5


def _writes_while(client: MongoClient, db_name: str, busy: threading.Event) -> list[float]:
    """Insert one document at a time while ``busy`` is set; each insert's latency."""
    coll = client[db_name]["beside"]
    latencies: list[float] = []
    while busy.is_set():
        started = time.perf_counter()
        coll.insert_one({"at": started})
        latencies.append(time.perf_counter() - started)
    return latencies


def test_a_long_read_holds_up_no_other_connections_writes(
    client: MongoClient, db, mongo_uri: str
) -> None:
    db.slow.insert_many([{"i": i, "s": "x" * 200} for i in range(60_000)])
    busy = threading.Event()
    busy.set()
    writer = MongoClient(mongo_uri)
    results: list[float] = []
    thread = threading.Thread(target=lambda: results.extend(_writes_while(writer, db.name, busy)))
    try:
        thread.start()
        started = time.perf_counter()
        # A scan of every document (on the engine most of a second; sliced, so the engine
        # lock is let go between slices and only the connection model can hold writes up).
        assert list(db.slow.find({"s": {"$regex": "y"}})) == []
        read_s = time.perf_counter() - started
    finally:
        busy.clear()
        thread.join()
        writer.close()
    if not os.environ.get("MONGODB_URI"):
        assert read_s > 0.3, "the read was not slow: the test proves nothing"
    assert len(results) > 5
    # Held up by the read, one insert would wait about as long as all of it.
    bound = max(read_s / 2, MAX_INSERT_S) if os.environ.get("MONGODB_URI") else read_s / 2
    assert max(results) < bound, f"an insert waited {max(results):.2f}s behind the read"


def test_a_write_waiting_for_a_transaction_holds_up_no_other_connection(
    client: MongoClient, db, mongo_uri: str
) -> None:
    db.held.insert_one({"_id": 1, "n": 0})
    waiting = MongoClient(mongo_uri)
    other = MongoClient(mongo_uri)
    done = threading.Event()
    errors: list[BaseException] = []

    def blocked_update() -> None:
        try:
            waiting[db.name].held.update_one({"_id": 1}, {"$inc": {"n": 10}})
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    try:
        with client.start_session() as session:
            session.start_transaction()
            db.held.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=session)
            thread = threading.Thread(target=blocked_update)
            thread.start()
            time.sleep(0.3)
            assert not done.is_set(), "the write did not wait for the transaction"
            # Meanwhile every other connection's writes and reads go on.
            for i in range(20):
                started = time.perf_counter()
                other[db.name].beside.insert_one({"i": i})
                assert time.perf_counter() - started < MAX_INSERT_S
            assert other[db.name].beside.count_documents({}) == 20
            assert not done.is_set()
            session.commit_transaction()
        assert done.wait(20)
        thread.join()
    finally:
        waiting.close()
        other.close()
    assert not errors
    assert db.held.find_one({"_id": 1}) == {"_id": 1, "n": 11}
