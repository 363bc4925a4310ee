"""Aggregator crash suite: workers SIGKILLed anywhere, two competing, nothing lost or doubled.

Steps of several threads of two tenants are committed as the checkpointer commits them
(messages + outbox event, one transaction; tests/memory/steps.py), plus events with no
messages and poison events whose extraction always fails. Then two aggregator worker
processes (``agg_crash_worker.py``; one the sync ``Aggregator``, the other the async
``AsyncAggregator`` its code is generated from) compete for them, and keep being SIGKILLed: by
themselves at named points (after the claim, before extraction, before embedding, before
the commit, inside the commit transaction when its writes are sent, when its
``commitTransaction`` is sent, right after it committed) and by the parent at random
moments. A dead worker is replaced at once. When every event is done or dead:

- every event is ``done``, except the poison ones, which are ``dead`` with their error;
- every fact stated is one memory, exactly once; nothing of a poison event exists;
- each tenant's name slot was changed once per event that stated a name: its version
  equals that count and its history holds each earlier version once (a change applied
  twice would add a version; one lost would miss one);
- each thread's episode holds every message of the thread exactly once, with one version
  per event that brought messages;
- every memory's vectors exist once in ``memory_vectors``.

The numbers (kills per point, events, outcomes) are printed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from accord.memory.aggregator import Aggregator, AggregatorConfig
from accord.platform.synchronous.unit_of_work import UnitOfWork
from tests.memory.agg_crash_worker import DIMS, KILL_POINTS
from tests.memory.steps import commit_step

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WORKER = Path(__file__).with_name("agg_crash_worker.py")
ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("ACCORD_KILL_SEED", "8"))
MIN_KILLS = 24
TENANTS = ("acme", "globex")
THREADS_PER_TENANT = 4
STEPS_PER_THREAD = 8
POISON = 3
DEADLINE = 600.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server of its own: MONGODB_URI, or an engine process whose abandoned
    transactions (a worker killed mid-commit) are aborted after 3 s instead of 60 s."""
    if os.environ.get("MONGODB_URI"):
        yield os.environ["MONGODB_URI"]
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dbpath = tmp_path_factory.mktemp("agg-crash")
    proc = subprocess.Popen(
        [sys.executable, "-m", "accord.platform.embedded", "--dbpath", str(dbpath),
         "--port", str(port), "--no-sync", "--transaction-lifetime", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert "listening" in line, line
    try:
        yield f"mongodb://127.0.0.1:{port}/?directConnection=true"
    finally:
        proc.terminate()
        proc.wait(30)


class Workload:
    """What was committed, to check the memories against."""

    def __init__(self, rng: random.Random) -> None:
        self.facts: dict[str, set[str]] = {t: set() for t in TENANTS}
        self.names: Counter[str] = Counter()
        self.thread_messages: dict[tuple[str, str], list[str]] = {}
        self.thread_events: Counter[tuple[str, str]] = Counter()
        self.poison: list[str] = []
        self.rng = rng
        self.rounds = 0

    def commit(self, uow: UnitOfWork, db: str) -> int:
        """One round of work: new threads, facts, names, writes events, poison."""
        r, events = self.rounds, 0
        self.rounds += 1
        for step in range(STEPS_PER_THREAD):
            for tenant in TENANTS:
                for t in range(THREADS_PER_TENANT):
                    thread = f"{tenant}-r{r}-t{t}"
                    fact = f"Locker {self.rng.getrandbits(24):06x} holds parcel {self.rng.getrandbits(24):06x}"
                    said = f"Remember that {fact.lower()}."
                    if step % 3 == 1:
                        said += f" My name is N{self.rng.getrandbits(24):06x}."
                        self.names[tenant] += 1
                    msgs = [("human", said), ("ai", f"Noted ({step}).")]
                    commit_step(uow, db, tenant, thread, f"c{step}", msgs)
                    self.facts[tenant].add(fact[0].upper() + fact[1:])
                    ids = [f"{thread}/c{step}/{i}" for i in range(len(msgs))]
                    self.thread_messages.setdefault((tenant, thread), []).extend(ids)
                    self.thread_events[(tenant, thread)] += 1
                    events += 1
            # events without messages (a task's writes), completed with nothing to do
            commit_step(uow, db, TENANTS[step % 2], f"w-{r}-{step}", "c0", [], kind="writes")
            events += 1
        for i in range(POISON):
            tenant = TENANTS[i % 2]
            commit_step(uow, db, tenant, f"poison-{r}-{i}", "c0",
                        [("human", f"POISON. Remember that poisoned fact {i} exists.")])  # fmt: skip
            self.poison.append(f"poison-{r}-{i}")
            events += 1
        return events


FLAVORS = ("sync", "async")  # worker slot 0 runs the sync aggregator, slot 1 the async one


def spawn(
    uri: str, db: str, rng: random.Random, kill: bool, flavor: str
) -> tuple[subprocess.Popen[str], str]:
    """A worker that will kill itself at the next kill point in turn (every point is hit)."""
    point = ""
    if kill:
        spawn.turn = getattr(spawn, "turn", rng.randrange(len(KILL_POINTS))) + 1  # type: ignore[attr-defined]
        point = KILL_POINTS[spawn.turn % len(KILL_POINTS)]  # type: ignore[attr-defined]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ACCORD_KILL_AT": point,
           "ACCORD_KILL_NTH": str(rng.randint(1, 3)), "ACCORD_AGG_FLAVOR": flavor}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), uri, db], env=env, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc, point


def test_workers_killed_anywhere_lose_and_duplicate_nothing(server: str) -> None:
    rng = random.Random(SEED)
    client: MongoClient[Any] = MongoClient(server)
    db = "aggcrash_" + uuid.uuid4().hex[:8]
    Aggregator(client, dims=DIMS, config=AggregatorConfig(db_name=db)).setup()
    work = Workload(rng)
    total = work.commit(UnitOfWork(client), db)
    outbox = client[db].outbox
    assert outbox.count_documents({}) == total

    kills: Counter[str] = Counter()
    kills_of: Counter[str] = Counter()  # per flavour
    exits: Counter[str] = Counter()

    def enough() -> bool:
        return (
            sum(kills.values()) >= MIN_KILLS
            and all(kills[p] for p in KILL_POINTS)
            and all(kills_of[f] >= MIN_KILLS // 4 for f in FLAVORS)
        )

    workers = [spawn(server, db, rng, kill=True, flavor=f) for f in FLAVORS]
    started = time.monotonic()
    next_random_kill = started + rng.uniform(1.0, 3.0)
    try:
        while True:
            for i, (proc, point) in enumerate(workers):
                code = proc.poll()
                if code is None:
                    continue
                if code == -signal.SIGKILL:
                    kills[point or "parent"] += 1
                    kills_of[FLAVORS[i]] += 1
                else:
                    exits[f"exit {code}"] += 1
                    print(proc.stderr.read() if proc.stderr else "")  # a crash we did not cause
                workers[i] = spawn(server, db, rng, kill=not enough(), flavor=FLAVORS[i])
            now = time.monotonic()
            if now >= next_random_kill and not enough():
                i = rng.randrange(len(workers))
                proc, point = workers[i]
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    kills["parent"] += 1
                    kills_of[FLAVORS[i]] += 1
                    workers[i] = spawn(server, db, rng, kill=not enough(), flavor=FLAVORS[i])
                next_random_kill = now + rng.uniform(2.0, 6.0)
            open_events = outbox.count_documents({"status": {"$nin": ["done", "dead"]}})
            if open_events == 0 and enough():
                break
            if open_events == 0:  # all aggregated before enough kills: add work, keep killing
                total += work.commit(UnitOfWork(client), db)
            assert now - started < DEADLINE, f"{open_events} events still open; kills {dict(kills)}"
            time.sleep(0.1)
    finally:
        for proc, _ in workers:
            proc.kill()
            proc.wait()
    elapsed = time.monotonic() - started

    statuses = Counter(d["status"] for d in outbox.find())
    attempts = Counter(d["attempts"] for d in outbox.find())
    print(f"\naggregator crash suite: {total} events, {sum(kills.values())} kills "
          f"{dict(sorted(kills.items()))} {dict(kills_of)}, unexpected exits {dict(exits)}, outcomes "
          f"{dict(statuses)}, claims per event {dict(sorted(attempts.items()))}, "
          f"{elapsed:.1f}s")  # fmt: skip
    assert not exits
    assert enough(), (kills, kills_of)
    assert statuses == Counter({"done": total - len(work.poison), "dead": len(work.poison)})
    for d in outbox.find({"status": "dead"}):
        assert d["thread_id"] in work.poison and "POISON" in d["error"]

    mem = client[db].long_term_memory
    for tenant in TENANTS:
        facts = Counter(d["text"] for d in mem.find({"tenant_id": tenant, "kind": "fact",
                                                      "key": {"$regex": "^fact:"}}))  # fmt: skip
        assert set(facts) == work.facts[tenant], tenant
        assert max(facts.values()) == 1
        name = mem.find_one({"tenant_id": tenant, "key": "profile:name"})
        assert name is not None and name["version"] == work.names[tenant]
        versions = [h["version"] for h in client[db].memory_history.find(
            {"tenant_id": tenant, "key": "profile:name"})]  # fmt: skip
        assert sorted(versions) == list(range(1, work.names[tenant]))
    for (tenant, thread), ids in work.thread_messages.items():
        episode = mem.find_one({"tenant_id": tenant, "key": f"episode:{thread}"})
        assert episode is not None, thread
        turns = [t["message_id"] for t in episode["value"]["turns"]]
        assert sorted(turns) == sorted(ids) and len(set(turns)) == len(turns), thread
        assert episode["version"] == work.thread_events[(tenant, thread)]
        history = client[db].memory_history.count_documents({"memory_id": episode["_id"]})
        assert history == episode["version"] - 1
    assert mem.count_documents({"text": {"$regex": "oisoned"}}) == 0
    for p in work.poison:
        assert mem.count_documents({"key": f"episode:{p}"}) == 0
    memories = mem.count_documents({"embedding": {"$exists": True}})
    assert client[db].memory_vectors.count_documents({}) == memories
    client.drop_database(db)
    client.close()
