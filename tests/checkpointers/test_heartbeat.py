"""The saver's background ticker (the TTL sweeper) ends with the saver's client: at its
first use of the closed client it stops, instead of logging the same failure at every tick
for the life of the process. (The lease heartbeat is the runs service's:
tests/platform/test_leases.py.)"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from pymongo import MongoClient

from accord.checkpointers import AccordSaver


def _sweeper_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "accord-sweep" and t.is_alive()]


def test_the_heartbeat_stops_quietly_when_the_client_is_closed(
    mongo_uri: str, db_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    before = set(_sweeper_threads())
    client: MongoClient = MongoClient(mongo_uri)
    # ttl keeps the sweeper running: it ticks every second and sweeps expired threads
    # every ttl/2 s, its first use of the client after the close
    saver = AccordSaver(client, db_name=db_name, ttl=1, lease_seconds=0.6)
    saver.setup()
    mine = [t for t in _sweeper_threads() if t not in before]
    assert len(mine) == 1, "setup with ttl starts the sweeper"
    time.sleep(1.2)  # it ticks against the open client first
    with caplog.at_level(logging.WARNING, logger="accord"):
        client.close()
        mine[0].join(timeout=10)
    assert not mine[0].is_alive(), "the sweeper outlived its client"
    assert "failed" not in caplog.text
