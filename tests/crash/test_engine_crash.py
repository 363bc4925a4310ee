"""Crash safety of the embedded engine, tested by crashing it.

An engine process (fsync on, as in production use) is SIGKILLed at random moments while a
client commits transactions. After every restart: every acknowledged commit is present,
no transaction is partially visible, and the counter equals the number of transactions.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pymongo import MongoClient

# Each kill starts two Python processes (an engine and a driver): about 3 s on an idle
# 2-core machine, several times that when the machine is shared, hence the time limit.
pytestmark = [pytest.mark.embedded_only, pytest.mark.slow, pytest.mark.timeout(1800)]

KILLS = 32
# How long a driver may take to get its first commit acknowledged by a fresh engine.
FIRST_ACK_S = 60.0
DRIVER = Path(__file__).with_name("crash_driver.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_engine(dbpath: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "accord.platform.embedded", "--dbpath", str(dbpath), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert "listening" in line, line
    return proc


def committed_state(uri: str) -> tuple[dict[int, set[str]], int]:
    """Transactions present (number -> its document ids) and the sum of the counters."""
    client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=5000)
    try:
        parts: dict[int, set[str]] = {}
        for coll in ("a", "b"):
            for doc in client.crash[coll].find({}, {"txn": 1}):
                parts.setdefault(doc["txn"], set()).add(doc["_id"])
        counter = sum(d.get("n", 0) for d in client.crash.counter.find())
        return parts, counter
    finally:
        client.close()


def check_invariants(uri: str, acked: set[int]) -> int:
    parts, counter = committed_state(uri)
    missing = acked - set(parts)
    assert not missing, f"acknowledged commits lost: {sorted(missing)[:10]}"
    partial = {n: p for n, p in parts.items() if p != {f"{n}-0", f"{n}-1", f"{n}-2"}}
    assert not partial, f"partially visible transactions: {partial}"
    assert counter == len(parts), f"counter {counter} != {len(parts)} committed transactions"
    return len(parts)


def read_acks(path: Path) -> set[int]:
    if not path.exists():
        return set()
    return {int(line) for line in path.read_text().split() if line.strip()}


def start_driver(uri: str, ack_path: Path, first: int, threads: int) -> subprocess.Popen[bytes]:
    """Start the committing client and wait until it has reached the engine."""
    driver = subprocess.Popen(
        [sys.executable, str(DRIVER), uri, str(ack_path), str(first), str(threads)],
        stdout=subprocess.PIPE,
    )
    assert driver.stdout is not None
    assert driver.stdout.readline().strip() == b"ready", "the driver could not reach the engine"
    return driver


def wait_for_ack(ack_path: Path, had: int, driver: subprocess.Popen[bytes]) -> None:
    """Wait until the driver has recorded a commit beyond the ``had`` it started with, so
    the random kill that follows lands among commits however slow the machine is."""
    deadline = time.monotonic() + FIRST_ACK_S
    while len(read_acks(ack_path)) <= had:
        assert driver.poll() is None, "the driver exited before its first commit"
        assert time.monotonic() < deadline, (
            f"no commit acknowledged within {FIRST_ACK_S:.0f} s of the driver reaching the engine"
        )
        time.sleep(0.01)


def group_commit_stats(uri: str) -> dict:
    client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=2000)
    try:
        return dict(client.admin.command("serverStatus")["accordEngine"]["groupCommit"])
    finally:
        client.close()


def kill_loop(
    tmp_path: Path, *, kills: int, threads: int, seed: int
) -> tuple[set[int], list[dict]]:
    """Start the engine, commit from ``threads`` client threads, SIGKILL the engine at a
    random moment after its first acknowledged commit, check every invariant after each
    restart; ``kills`` times."""
    rng = random.Random(seed)
    dbpath, ack_path = tmp_path / "db", tmp_path / "acks.txt"
    port = free_port()
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    next_txn = 0
    stats = []
    for _ in range(kills):
        engine = start_engine(dbpath, port)
        try:
            had = len(read_acks(ack_path))
            check_invariants(uri, read_acks(ack_path))
            driver = start_driver(uri, ack_path, next_txn, threads)
            wait_for_ack(ack_path, had, driver)
            time.sleep(rng.uniform(0.0, 0.5))
            if threads > 1:
                stats.append(group_commit_stats(uri))
        finally:
            engine.send_signal(signal.SIGKILL)
            engine.wait()
        driver.wait(timeout=60)
        next_txn = max(read_acks(ack_path), default=next_txn) + 100_000  # never reuse an _id
    engine = start_engine(dbpath, port)
    try:
        total = check_invariants(uri, read_acks(ack_path))
    finally:
        engine.send_signal(signal.SIGKILL)
        engine.wait()
    acks = read_acks(ack_path)
    assert total >= len(acks)
    return acks, stats


def test_sigkill_at_random_moments_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    acks, _ = kill_loop(
        tmp_path, kills=KILLS, threads=1, seed=int(os.environ.get("ACCORD_CRASH_SEED", "7"))
    )
    assert len(acks) >= KILLS, "every engine life should have acknowledged commits"


def test_sigkill_during_group_commit_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    """Eight clients commit at once, so commits are made durable in groups (one SQLite
    transaction and one fsync for many): a kill during a group's write loses none of the
    acknowledged ones and leaves none half applied."""
    acks, stats = kill_loop(
        tmp_path, kills=KILLS // 2, threads=8, seed=int(os.environ.get("ACCORD_CRASH_SEED", "7"))
    )
    assert len(acks) >= KILLS // 2, "every engine life should have acknowledged commits"
    assert max(s["largestBatch"] for s in stats) > 1, f"no commit was ever grouped: {stats}"


def test_torn_wal_tail_recovers_a_prefix_of_whole_transactions(tmp_path: Path) -> None:
    """Cut the journal (SQLite WAL) at arbitrary bytes: recovery keeps whole commits only."""
    dbpath = tmp_path / "db"
    port = free_port()
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    engine = start_engine(dbpath, port)
    client: MongoClient = MongoClient(uri)
    order = []
    for n in range(150):
        with client.start_session() as session, session.start_transaction():
            client.crash.a.insert_many(
                [{"_id": f"{n}-0", "txn": n, "pad": "y" * 500}, {"_id": f"{n}-1", "txn": n}],
                session=session,
            )
            client.crash.b.insert_one({"_id": f"{n}-2", "txn": n}, session=session)
            client.crash.counter.update_one(
                {"_id": "c"}, {"$inc": {"n": 1}}, upsert=True, session=session
            )
        order.append(n)
    client.close()
    engine.send_signal(signal.SIGKILL)  # leaves the WAL un-checkpointed, as a crash does
    engine.wait()
    wal = dbpath / "accord-engine.sqlite3-wal"
    assert wal.exists() and wal.stat().st_size > 0
    size = wal.stat().st_size
    rng = random.Random(3)
    cuts = sorted({rng.randrange(32, size) for _ in range(6)} | {size - 1, size // 2})
    seen_counts = []
    for cut in cuts:
        copy = tmp_path / f"cut-{cut}"
        shutil.copytree(dbpath, copy)
        (copy / "mongod.lock").unlink(missing_ok=True)
        with open(copy / "accord-engine.sqlite3-wal", "r+b") as f:
            f.truncate(cut)
        engine = start_engine(copy, port)
        try:
            parts, counter = committed_state(uri)
            for n, p in parts.items():
                assert p == {f"{n}-0", f"{n}-1", f"{n}-2"}, f"torn transaction {n} at cut {cut}"
            present = sorted(parts)
            assert present == order[: len(present)], "recovered commits must be a prefix"
            assert counter == len(present)
            seen_counts.append(len(present))
        finally:
            engine.send_signal(signal.SIGKILL)
            engine.wait()
    assert seen_counts == sorted(seen_counts), "a longer journal never recovers fewer commits"
    assert seen_counts[-1] >= seen_counts[0]
