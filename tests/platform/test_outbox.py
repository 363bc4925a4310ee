"""The outbox's consumer side: claim with a lease, complete in the consumer's own plan,
release with backoff, dead-letter after N attempts, fencing of a worker that lost its
lease. Sync and async (the ``runner`` fixture)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from pymongo import MongoClient

from accord.errors import LeaseLost
from accord.platform import outbox
from accord.platform.plan import Group, Op, OutboxEvent, Plan, PlanContext
from tests.platform.conftest import Runner


def enqueue(runner: Runner, db: str, n: int) -> None:
    events = [OutboxEvent(db, "outbox", "checkpoint", "t1", (f"c{i}",), {"n": i}) for i in range(n)]
    runner.execute(Plan(PlanContext("t1"), [], events))


def claim(runner: Runner, db: str, owner: str, lease: float = 30.0) -> outbox.ClaimedEvent | None:
    result = runner.execute(
        outbox.claim_plan(db, "outbox", owner=owner, lease=timedelta(seconds=lease))
    )
    doc = result.found["claim"][0]
    return None if doc is None else outbox.ClaimedEvent.from_document(doc)


def test_claim_complete_in_the_results_transaction(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    enqueue(runner, db_name, 2)
    first = claim(runner, db_name, "w1")
    assert first is not None and first.document["n"] == 0 and first.attempts == 1
    results = Group("memories", db_name, "memories", "long_term_memory",
                    [Op("insert", doc={"_id": "m0", "tenant_id": "t1"})])  # fmt: skip
    done = outbox.complete_group(db_name, "outbox", first)
    runner.execute(Plan(PlanContext("t1"), [results, done]))
    doc = client[db_name].outbox.find_one({"_id": first.id})
    assert doc["status"] == "done" and "owner" not in doc and doc["expire_at"] > doc["done_at"]
    second = claim(runner, db_name, "w1")
    assert second is not None and second.document["n"] == 1
    assert claim(runner, db_name, "w1") is None


def test_a_worker_that_lost_its_lease_commits_nothing(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    enqueue(runner, db_name, 1)
    slow = claim(runner, db_name, "slow", lease=0.05)
    assert slow is not None
    threading.Event().wait(0.1)
    fast = claim(runner, db_name, "fast")
    assert fast is not None and fast.id == slow.id and fast.attempts == 2
    late = Group("memories", db_name, "memories", "long_term_memory",
                 [Op("insert", doc={"_id": "m", "tenant_id": "t1"})])  # fmt: skip
    with pytest.raises(LeaseLost, match="another worker claimed it"):
        runner.execute(
            Plan(PlanContext("t1"), [late, outbox.complete_group(db_name, "outbox", slow)])
        )
    assert client[db_name].memories.count_documents({}) == 0
    runner.execute(Plan(PlanContext("t1"), [outbox.complete_group(db_name, "outbox", fast)]))
    assert client[db_name].outbox.find_one()["status"] == "done"


def test_release_backs_off_then_dead_letters(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    enqueue(runner, db_name, 1)
    for attempt in range(1, 4):
        event = claim(runner, db_name, "w")
        assert event is not None and event.attempts == attempt
        runner.execute(
            outbox.release_plan(
                db_name,
                "outbox",
                event,
                f"boom {attempt}",
                max_attempts=3,
                # ten minutes apart: the third failure is MIN_FAILING after the first
                at=outbox.now() - timedelta(hours=1) + (attempt - 1) * outbox.MIN_FAILING / 2,
            )  # fmt: skip
        )
    doc = client[db_name].outbox.find_one()
    assert doc["status"] == "dead" and doc["error"] == "boom 3" and doc["attempts"] == 3
    assert claim(runner, db_name, "w") is None


def test_a_released_event_waits_for_its_backoff(runner: Runner, db_name: str) -> None:
    enqueue(runner, db_name, 1)
    event = claim(runner, db_name, "w")
    assert event is not None
    runner.execute(outbox.release_plan(db_name, "outbox", event, "transient", max_attempts=5))
    assert claim(runner, db_name, "w") is None  # available again after ~1 s, not now
    assert outbox.backoff(1) == timedelta(seconds=1) and outbox.backoff(4) == timedelta(seconds=8)
    assert outbox.backoff(30) == timedelta(seconds=300)


def test_concurrent_claims_take_each_event_once(
    make_runner, client: MongoClient, db_name: str
) -> None:
    first = make_runner()
    enqueue(first, db_name, 30)
    workers = [make_runner() for _ in range(3)]
    taken: list[str] = []
    lock = threading.Lock()

    def work(r: Runner, name: str) -> None:
        while (event := claim(r, db_name, name)) is not None:
            r.execute(Plan(PlanContext("t1"), [outbox.complete_group(db_name, "outbox", event)]))
            with lock:
                taken.append(event.id)

    threads = [threading.Thread(target=work, args=(w, f"w{i}")) for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == sorted(set(taken)) and len(taken) == 30
    assert client[db_name].outbox.count_documents({"status": "done"}) == 30


def test_an_event_without_available_at_is_claimable(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    """Producers that write their own event documents (status pending, created_at, no
    available_at/attempts) are consumed like the hook's."""
    from datetime import UTC, datetime

    client[db_name].outbox.insert_one(
        {"_id": "e1", "tenant_id": "t1", "kind": "checkpoint", "status": "pending",
         "created_at": datetime.now(UTC)}
    )  # fmt: skip
    event = claim(runner, db_name, "w")
    assert event is not None and event.id == "e1" and event.attempts == 1
    runner.execute(outbox.release_plan(db_name, "outbox", event, "boom", max_attempts=5))
    assert claim(runner, db_name, "w") is None  # released with a backoff: not yet available


def test_claim_available_or_expired(runner: Runner, client: MongoClient, db_name: str) -> None:
    """``which="available"`` takes pending events in the order they became available;
    ``which="expired"`` only events whose worker's lease ran out."""
    enqueue(runner, db_name, 3)

    def take(which: str, lease: float = 30.0) -> outbox.ClaimedEvent | None:
        plan = outbox.claim_plan(db_name, "outbox", owner="w", which=which,  # type: ignore[arg-type]
                                 lease=timedelta(seconds=lease))  # fmt: skip
        doc = runner.execute(plan).found["claim"][0]
        return None if doc is None else outbox.ClaimedEvent.from_document(doc)

    assert take("expired") is None
    first = take("available", lease=0.05)
    assert first is not None and first.document["n"] == 0
    threading.Event().wait(0.1)
    second = take("available")
    assert second is not None and second.document["n"] == 1  # not the expired one
    again = take("expired")
    assert again is not None and again.id == first.id and again.attempts == 2
    assert take("expired") is None
    with pytest.raises(ValueError, match="which is"):
        take("oldest")
