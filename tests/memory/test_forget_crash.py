"""Forgetting deleted threads survives workers SIGKILLed anywhere (issue 21, item 3).

Per round, one user states their name in thread A, another name in thread B (which
replaces it), and a fact only in thread C; then B and C are deleted (``thread_deleted``
events, as ``delete_thread`` writes them). An aggregator process
(``agg_crash_worker.py``) is SIGKILLed while it forgets them, at each kill point in turn:
after its claim, before reading, before embedding, before its commit, inside the commit
transaction (``bulkWrite`` sent, ``commitTransaction`` sent) and right after it. A clean
worker then finishes. Every round must end exactly as without crashes: the name
re-derived from A once (version 3, not 4), B's and C's memories, history and vectors
gone, no event left open.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from accord.checkpointers import events
from accord.memory.aggregator import Aggregator, AggregatorConfig
from accord.platform.ids import doc_id
from accord.platform.plan import Group, OutboxEvent, Plan, PlanContext, insert_once
from accord.platform.synchronous.unit_of_work import UnitOfWork
from tests.memory.agg_crash_worker import DIMS, KILL_POINTS, LEASE
from tests.memory.test_aggregator_crash import server  # noqa: F401 - the module's server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("agg_crash_worker.py")
TENANT = "acme"


def _step(db: str, user: str, thread: str, text: str) -> Plan:
    """A step as the checkpointer commits it: one message, its ``checkpoint`` event with
    the run's ``configurable`` (the user)."""
    key = doc_id("msg", TENANT, thread, text)
    message = insert_once({
        "_id": doc_id("stm", TENANT, thread, key, 0), "tenant_id": TENANT, "thread_id": thread,
        "checkpoint_ns": "", "key": key, "chunk": 0, "message_id": f"{thread}/m",
        "role": "human", "text": text, "checkpoint_id": "c1", "created_at": datetime.now(UTC),
    })  # fmt: skip
    fields = {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": "c1",
              "messages": [key], events.CONFIGURABLE: {"user_id": user}}  # fmt: skip
    event = OutboxEvent(db, "outbox", events.CHECKPOINT, TENANT, (thread, "", "c1"), fields)
    group = Group("messages", db, "short_term_memory", "short_term_memory", [message])
    return Plan(PlanContext(TENANT, thread, operation="test.step"), [group], [event])


def _deleted(db: str, thread: str) -> Plan:
    event = OutboxEvent(db, "outbox", events.THREAD_DELETED, TENANT, (thread, "v1"),
                        {"thread_id": thread, "checkpoint_ns": ""})  # fmt: skip
    return Plan(PlanContext(TENANT, thread, operation="test.delete"), [], [event])


def _round(uow: UnitOfWork, agg: Aggregator, db: str, r: int) -> None:
    user = f"u{r}"
    uow.execute(_step(db, user, f"a{r}", "My name is Ann."))
    agg.drain()
    uow.execute(_step(db, user, f"b{r}", "Call me Bea."))
    uow.execute(_step(db, user, f"c{r}", f"Remember that locker {r} is blue."))
    agg.drain()
    uow.execute(_deleted(db, f"b{r}"))
    uow.execute(_deleted(db, f"c{r}"))


def _worker(uri: str, db: str, point: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ACCORD_KILL_AT": point,
           "ACCORD_KILL_NTH": "1", "ACCORD_AGG_FLAVOR": "sync" if len(point) % 2 else "async"}  # fmt: skip
    return subprocess.Popen([sys.executable, str(WORKER), uri, db], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip


@pytest.fixture()
def db(server: str) -> Iterator[str]:  # noqa: F811
    name = "forget_" + uuid.uuid4().hex[:8]
    yield name
    MongoClient(server).drop_database(name)


def test_forgetting_killed_anywhere_ends_as_without_crashes(server: str, db: str) -> None:  # noqa: F811
    client: MongoClient[Any] = MongoClient(server)
    uow = UnitOfWork(client)
    agg = Aggregator(client, dims=DIMS, config=AggregatorConfig(db_name=db, lease=LEASE))
    agg.setup()
    killed = []
    for r, point in enumerate(KILL_POINTS):
        _round(uow, agg, db, r)
        proc = _worker(server, db, point)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # its kill point was never reached
            proc.kill()
            proc.wait()
        if proc.returncode == -9:
            killed.append(point)
    assert len(killed) >= len(KILL_POINTS) - 1, killed
    time.sleep(LEASE + 0.5)  # the killed workers' claims expire
    agg.drain()
    assert agg.drain() == 0 and agg.stats().backlog == 0 and agg.stats().dead == 0

    memories = client[db].long_term_memory
    history = client[db].memory_history
    for r in range(len(KILL_POINTS)):
        ns = ["memories", f"u{r}"]
        name = memories.find_one({"namespace": ns, "key": "profile:name"})
        assert name is not None, r
        assert (name["text"], name["version"]) == ("User's name is Ann", 3), (r, killed)
        assert name["provenance"]["thread_id"] == f"a{r}"
        assert history.count_documents({"memory_id": name["_id"]}) == 0  # Ann current again
        for thread in (f"b{r}", f"c{r}"):
            for coll in (memories, history):
                assert coll.count_documents({"provenance.thread_id": thread}) == 0, (thread, killed)
        assert memories.count_documents({"namespace": ns, "text": {"$regex": "locker"}}) == 0
    ids = {d["_id"] for d in memories.find({}, {"_id": 1})}
    vectors = {d["memory_id"] for d in client[db].memory_vectors.find({}, {"memory_id": 1})}
    assert vectors == ids  # every memory has its vector; no vector of a forgotten one
    assert client[db].outbox.count_documents({"status": {"$ne": "done"}}) == 0
