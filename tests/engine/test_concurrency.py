"""Concurrent transactions: the bank-transfer invariant under 16 threads."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

from pymongo import MongoClient
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

ACCOUNTS = 20
INITIAL = 1_000
THREADS = 16
TRANSFERS = 1_000
SNAPSHOT = ReadConcern("snapshot")
MAJORITY = WriteConcern("majority")


def test_bank_transfers_keep_the_total(client: MongoClient, db) -> None:
    db.accounts.insert_many([{"_id": i, "bal": INITIAL} for i in range(ACCOUNTS)])
    total = ACCOUNTS * INITIAL
    attempts = Counter()
    failures: list[BaseException] = []
    violations: list[str] = []
    stop = threading.Event()
    per_thread = [
        TRANSFERS // THREADS + (1 if t < TRANSFERS % THREADS else 0) for t in range(THREADS)
    ]
    assert sum(per_thread) == TRANSFERS

    def transfer(session, transfer_id: str, src: int, dst: int, amount: int) -> None:
        attempts[transfer_id] += 1
        doc = db.accounts.find_one({"_id": src}, session=session)
        moved = amount if doc["bal"] >= amount else 0
        if moved:
            db.accounts.update_one({"_id": src}, {"$inc": {"bal": -moved}}, session=session)
            db.accounts.update_one({"_id": dst}, {"$inc": {"bal": moved}}, session=session)
        db.ledger.insert_one(
            {"_id": transfer_id, "src": src, "dst": dst, "amount": moved}, session=session
        )

    def worker(index: int) -> None:
        rng = random.Random(index)
        try:
            with client.start_session() as session:
                for n in range(per_thread[index]):
                    src, dst = rng.sample(range(ACCOUNTS), 2)
                    amount = rng.randint(1, 300)
                    tid = f"{index}-{n}"
                    session.with_transaction(
                        lambda s, tid=tid, src=src, dst=dst, amount=amount: transfer(
                            s, tid, src, dst, amount
                        ),
                        read_concern=SNAPSHOT,
                        write_concern=MAJORITY,
                    )
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    def monitor() -> None:
        """Snapshot reads must never see a transfer half applied."""
        try:
            with client.start_session() as session:
                while not stop.is_set():
                    with session.start_transaction(read_concern=SNAPSHOT):
                        balances = [d["bal"] for d in db.accounts.find({}, session=session)]
                        ledger = db.ledger.count_documents({}, session=session)
                    if len(balances) != ACCOUNTS or sum(balances) != total:
                        violations.append(f"sum {sum(balances)} over {len(balances)} accounts")
                    if min(balances) < 0:
                        violations.append(f"negative balance {min(balances)}")
                    if ledger > TRANSFERS:
                        violations.append(f"{ledger} ledger entries")
                    time.sleep(0.02)
        except BaseException as exc:
            failures.append(exc)

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(THREADS)]
    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stop.set()
    watcher.join(timeout=30)
    elapsed = time.monotonic() - started

    assert not any(t.is_alive() for t in threads), "workers did not finish"
    assert not failures, failures[:3]
    assert not violations, violations[:5]

    balances = {d["_id"]: d["bal"] for d in db.accounts.find()}
    assert sum(balances.values()) == total
    assert min(balances.values()) >= 0
    # Every transfer committed exactly once, and the balances are exactly what applying the
    # committed ledger in any serial order gives.
    ledger = list(db.ledger.find())
    assert len(ledger) == TRANSFERS
    expected = dict.fromkeys(range(ACCOUNTS), INITIAL)
    for entry in ledger:
        expected[entry["src"]] -= entry["amount"]
        expected[entry["dst"]] += entry["amount"]
    assert balances == expected
    retried = sum(1 for n in attempts.values() if n > 1)
    print(f"\n{TRANSFERS} transfers in {elapsed:.1f}s, {retried} retried after conflicts")
    assert elapsed < 90
