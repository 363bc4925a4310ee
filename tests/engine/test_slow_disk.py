"""A slow disk delays commits, never the reads beside them.

The engine's event loop writes its connections' commits itself while that is quick
(netloop.py, ``GroupCommitter.write_queued``); once the disk's writes are slow it leaves
them to the group committer's writer thread, so the loop goes on framing other
connections' reads instead of waiting out each fsync. Engine-only: the slow disk is
``Storage.apply`` made to sleep.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import pytest
from pymongo import MongoClient

from accord.platform.embedded.server import EmbeddedServer
from accord.platform.embedded.storage import Storage

# One write to disk on the slow disk.
SLOW_WRITE_S = 0.2
WRITERS = 4


def test_reads_do_not_wait_for_a_slow_disks_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Storage.apply

    def slow_apply(self: Storage, batches: list) -> None:  # type: ignore[type-arg]
        time.sleep(SLOW_WRITE_S)
        original(self, batches)

    monkeypatch.setattr(Storage, "apply", slow_apply)
    with EmbeddedServer(tmp_path, port=0, sync=False) as server:
        reader: MongoClient = MongoClient(server.uri)
        reader.db.r.insert_one({"_id": 1})  # the engine learns that the disk is slow
        # Writers enough that a commit is always waiting for the disk.
        writers = [MongoClient(server.uri) for _ in range(WRITERS)]
        busy = threading.Event()
        busy.set()
        writes: list[float] = []

        def write_all_along(client: MongoClient) -> None:
            while busy.is_set():
                started = time.perf_counter()
                client.db.w.insert_one({"at": started})
                writes.append(time.perf_counter() - started)

        threads = [threading.Thread(target=write_all_along, args=(w,)) for w in writers]
        try:
            for thread in threads:
                thread.start()
            time.sleep(SLOW_WRITE_S)
            reads = []
            for _ in range(20):
                started = time.perf_counter()
                assert reader.db.r.find_one({"_id": 1}) == {"_id": 1}
                reads.append(time.perf_counter() - started)
        finally:
            busy.clear()
            for thread in threads:
                thread.join()
            for client in [reader, *writers]:
                client.close()
    assert len(writes) >= 2 and min(writes) >= SLOW_WRITE_S, "the disk was not slow"
    # A read that waited for the fsync in progress would wait half of one on average.
    assert statistics.median(reads) < SLOW_WRITE_S / 4, f"reads took {sorted(reads)}"
