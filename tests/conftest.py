"""Shared fixtures: one MongoDB for the whole session.

When ``MONGODB_URI`` is set the tests run against that server (a real replica set, Atlas,
Atlas Local). Otherwise they start accord's embedded engine in this process on a temporary
data directory, so every test drives a server through the real pymongo driver either way.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from pymongo import MongoClient

REAL_URI = os.environ.get("MONGODB_URI")

# Property tests assert behaviour, not speed: on a shared 2-core machine (and under
# `make test`'s two workers) Hypothesis's per-example deadline and its "too slow to
# generate" health check fail tests whose every assertion held. Speed is measured in
# benchmarks/. A test's own @settings still overrides these.
settings.register_profile("accord", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("accord")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not REAL_URI:
        return
    skip = pytest.mark.skip(
        reason="needs the embedded engine's own files/process; MONGODB_URI is set"
    )
    for item in items:
        if "embedded_only" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def mongo_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if REAL_URI:
        yield REAL_URI
        return
    from accord.platform.embedded import EmbeddedServer

    dbpath: Path = tmp_path_factory.mktemp("engine")
    # Test commands on, as in mongod test deployments: tests may use fail points
    # (tests/failpoints.py); each one clears what it sets.
    server = EmbeddedServer(
        dbpath=dbpath, port=0, sync=False, ttl_interval=1.0, enable_test_commands=True
    )
    server.start()
    try:
        yield server.uri
    finally:
        server.stop()


@pytest.fixture(scope="session")
def client(mongo_uri: str) -> Iterator[MongoClient]:
    c: MongoClient = MongoClient(mongo_uri)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture()
def db(client: MongoClient):
    """A fresh database per test, dropped afterwards."""
    name = "t_" + uuid.uuid4().hex[:12]
    try:
        yield client[name]
    finally:
        client.drop_database(name)
