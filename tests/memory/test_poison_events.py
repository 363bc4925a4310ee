"""What a producer writes into the outbox can never stop the aggregator (issue 22, items 1
and 2): malformed events are refused at insert by the outbox's validator; those that got in
all the same (written before it, or where it could not be applied) are dead-lettered with a
readable reason while every good event around them is aggregated once; a message that
cannot be read is skipped with its reason; the worker (in process, in the background, and
the real ``accord memory worker``) never exits; a lease is heartbeated while a slow
extraction runs, and an event whose workers keep losing it is dead-lettered once it has
been claimed ``max_attempts`` times.

Every aggregator test runs on both twins (the ``make`` and ``twins`` fixtures,
tests/memory/conftest.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import WriteError

from accord.memory.extraction import Change, Conversation
from accord.platform import codes
from accord.platform.ids import doc_id
from accord.platform.synchronous.unit_of_work import UnitOfWork
from tests.memory.steps import commit_step

ACCORD = [sys.executable, "-m", "accord.platform.cli"]


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "poison_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


def _event(_id: str, **fields: Any) -> dict[str, Any]:
    now = datetime.now(UTC)
    doc = {"_id": _id, "tenant_id": "acme", "kind": "checkpoint", "status": "pending",
           "created_at": now, "available_at": now, "attempts": 0}  # fmt: skip
    doc.update(fields)
    return {k: v for k, v in doc.items() if v is not ...}


#: Events no aggregator can process, each with what its dead letter must say. ``...``
#: removes a field. (The issue's repros, and their neighbours.)
POISON: dict[str, tuple[dict[str, Any], str]] = {
    "p-no-tenant": (_event("p-no-tenant", tenant_id=...), "tenant_id is missing"),
    "p-empty-tenant": (_event("p-empty-tenant", tenant_id=""), "tenant_id is str ''"),
    "p-no-created": (_event("p-no-created", created_at=...), "created_at is missing"),
    "p-created-text": (_event("p-created-text", created_at="yesterday"),
                       "created_at is str 'yesterday', not a date"),
    "p-attempts-abc": (_event("p-attempts-abc", attempts="abc",
                              created_at=datetime(2000, 1, 1, tzinfo=UTC),
                              available_at=datetime(2000, 1, 1, tzinfo=UTC)),
                       "attempts is str 'abc', not a count"),
    "p-attempts-nan": (_event("p-attempts-nan", attempts=float("nan")),
                       "attempts is float nan, not a count"),
    "p-messages-text": (_event("p-messages-text", thread_id="t", messages="not-a-list"),
                        "messages is a str, not a list of message keys"),
    "p-no-thread": (_event("p-no-thread", messages=["k1"]), "no thread_id string"),
    "p-lease-text": (_event("p-lease-text", status="claimed", lease_until="never",
                            owner="ghost", claim_id="c"),
                     "lease_until str 'never', not a date"),
    # (2026-12-07) never claimed and invisible to status; retried 5 times before
    "p-kind-int": (_event("p-kind-int", kind=7), "kind is int 7, not a string"),
    "p-deleted-no-thread": (_event("p-deleted-no-thread", kind="thread_deleted"),
                            "names no thread_id string"),
}  # fmt: skip


def drop_validator(client: MongoClient, db: str) -> None:
    """The outbox as it is where the validator was never applied (created before it, or
    by a user without the collMod privilege)."""
    client[db].command({"collMod": "outbox", "validator": {}, "validationLevel": "off"})


def bad_message_steps(client: MongoClient, uow: UnitOfWork, db: str) -> dict[str, str]:
    """Two events whose events are fine but one of whose messages is not: a key that is an
    object (not a key), a stored message whose created_at is text. Returns event id ->
    what its ``skipped`` must say."""
    commit_step(uow, db, "acme", "tm1", "c1", [("human", "I prefer oolong tea.")])
    event = doc_id("o", "checkpoint", "acme", "tm1", "", "c1")
    client[db].outbox.update_one({"_id": event}, {"$push": {"messages": {
        "$each": [{"$gt": ""}], "$position": 0}}})  # fmt: skip
    commit_step(uow, db, "acme", "tm2", "c1",
                [("human", "I like sailing."), ("human", "Remember that the key is blue.")])  # fmt: skip
    bad = client[db].short_term_memory.find_one({"thread_id": "tm2", "text": "I like sailing."})
    client[db].short_term_memory.update_one({"_id": bad["_id"]},
                                            {"$set": {"created_at": "2020-01-01"}})  # fmt: skip
    return {
        event: "messages[0] is dict {'$gt': ''}, not a message key",
        doc_id("o", "checkpoint", "acme", "tm2", "", "c1"): "created_at is str '2020-01-01'",
    }


GOOD = [("tg1", "My name is Ada."), ("tg2", "I prefer window seats."),
        ("tg3", "Remember that the gate code is 4412."), ("tg4", "I live in Oslo.")]  # fmt: skip
GOOD_TEXTS = {"User's name is Ada", "User prefers window seats", "The gate code is 4412",
              "User lives in Oslo", "User prefers oolong tea", "The key is blue"}  # fmt: skip


def poison_stream(client: MongoClient, db: str) -> dict[str, str]:
    """Good steps interleaved with every poison event and the two bad-message events, on
    an outbox without its validator. Returns event id -> expected reason fragment (dead
    letters and skipped messages)."""
    uow = UnitOfWork(client)
    drop_validator(client, db)
    expected = {}
    for i, (_id, (doc, fragment)) in enumerate(POISON.items()):
        client[db].outbox.insert_one(doc)
        expected[_id] = fragment
        if i < len(GOOD):
            thread, text = GOOD[i]
            commit_step(uow, db, "acme", thread, "c1", [("human", text)])
    expected.update(bad_message_steps(client, uow, db))
    return expected


def check_outcome(client: MongoClient, db: str, expected: dict[str, str], later: int = 0) -> None:
    """Every good event (and ``later`` more) done and aggregated once; every poison one
    dead with its reason; every bad message skipped with its reason."""
    events = {d["_id"]: d for d in client[db].outbox.find()}
    for _id in POISON:
        assert events[_id]["status"] == "dead", events[_id]
        assert expected[_id] in events[_id]["error"], events[_id]["error"]
        assert "dead-lettered without processing" in events[_id]["error"]
    good = [e for _id, e in events.items() if _id not in POISON]
    assert len(good) == len(GOOD) + 2 + later and {e["status"] for e in good} == {"done"}
    for _id, e in events.items():
        if _id not in POISON and _id in expected:
            (reason,) = e["skipped"]
            assert expected[_id] in reason
    memories = list(client[db].long_term_memory.find({}, {"text": 1, "version": 1, "key": 1}))
    assert {m["text"] for m in memories} >= GOOD_TEXTS
    assert all(m["version"] == 1 for m in memories), memories  # each event once
    assert "User likes sailing" not in {m["text"] for m in memories}  # the skipped message


def test_the_outbox_validator_refuses_malformed_events(
    client: MongoClient, db_name: str, make: Callable[..., Any]
) -> None:
    make(db_name)  # setup applies the validator
    for _id, (doc, _) in POISON.items():
        if _id == "p-deleted-no-thread":  # an outbox event; the aggregator's contract says no
            continue
        with pytest.raises(WriteError) as refused:
            client[db_name].outbox.insert_one(doc)
        assert refused.value.code == codes.DOCUMENT_VALIDATION_FAILURE
    client[db_name].outbox.insert_one(_event("fine", thread_id="t", messages=["k"]))
    assert client[db_name].outbox.count_documents({}) == 1


def test_poison_events_are_dead_lettered_and_good_ones_aggregated(
    client: MongoClient, db_name: str, make: Callable[..., Any]
) -> None:
    agg = make(db_name, max_attempts=3)
    expected = poison_stream(client, db_name)
    agg.drain()
    check_outcome(client, db_name, expected)
    stats = agg.stats()
    assert stats.backlog == 0 and stats.dead == len(POISON)


def test_the_background_aggregator_keeps_going_through_poison(
    client: MongoClient, db_name: str, make: Callable[..., Any], twins: Any
) -> None:
    agg = make(db_name, poll_interval=0.02)
    uow = UnitOfWork(client)
    with twins.background(agg) as bg:
        expected = poison_stream(client, db_name)
        assert bg.wait_idle(60)
        for i in range(5):  # events after the poison ones (the issue: 0 of 5 aggregated)
            commit_step(uow, db_name, "acme", f"later{i}", "c1", [("human", f"I like topic{i}.")])
        assert bg.wait_idle(60)
    check_outcome(client, db_name, expected, later=5)
    texts = {m["text"] for m in client[db_name].long_term_memory.find()}
    assert {f"User likes topic{i}" for i in range(5)} <= texts


def test_the_worker_process_never_exits_on_poison(
    mongo_uri: str, client: MongoClient, db_name: str
) -> None:
    """The real ``accord memory worker``: the poison stream is written before it starts
    (no validator yet; the worker's setup applies it, and it does not touch events that
    were there before); the worker dead-letters the poison, aggregates the rest, keeps
    running, aggregates what comes later, and stops cleanly on SIGTERM."""
    client[db_name].create_collection("outbox")
    expected = poison_stream(client, db_name)
    env = {**os.environ, "MONGODB_URI": mongo_uri, "ACCORD_DATABASE": db_name}
    proc = subprocess.Popen([*ACCORD, "memory", "worker", "--poll", "0.05"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(lambda: _settled(client, db_name), proc)
        assert proc.poll() is None
        uow = UnitOfWork(client)
        commit_step(uow, db_name, "acme", "after", "c1", [("human", "I prefer jazz.")])
        wait_for(lambda: client[db_name].outbox.count_documents({"status": "done"})
                 == len(GOOD) + 3, proc)  # fmt: skip
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    check_outcome(client, db_name, expected, later=1)
    for fragment in ("tenant_id is missing", "attempts is str 'abc'", "skipped messages[0]"):
        assert fragment in err, err  # one WARNING line per problem, readable
    assert "Traceback" not in err


def _settled(client: MongoClient, db: str) -> bool:
    return client[db].outbox.count_documents({"status": {"$in": ["pending", "claimed"]}}) == 0


def wait_for(
    condition: Callable[[], bool], proc: subprocess.Popen[str], timeout: float = 90
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


# -- leases (item 2) ----------------------------------------------------------------------------


class SlowExtractor:
    """An extractor slower than the lease (a model call), counting its calls; it runs
    until ``release`` is set (at most ``seconds``)."""

    name = "slow"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0
        self.release = threading.Event()

    def extract(self, conversation: Conversation, recall: Any) -> list[Change]:
        self.calls += 1
        self.release.wait(self.seconds)
        return [Change("add", "User prefers slow food", "preference")]


def test_a_slow_extraction_keeps_its_lease(
    client: MongoClient, db_name: str, make: Callable[..., Any]
) -> None:
    """The issue's repro: an extraction outlasting its lease, a second worker claiming
    all the while. The first worker's heartbeat keeps the event: one claim, one
    extraction, done. The extraction lasts until its lease was renewed past two leases
    from the claim (told by the event's ``lease_until``, not by a timer a loaded machine
    can overrun); the lease is long enough that a heartbeat late by 2 s still renews it."""
    lease = 3.0
    slow = SlowExtractor(60.0)
    a = make(db_name, lease=lease, extractor=slow)
    b = make(db_name, lease=lease, extractor=slow)
    commit_step(UnitOfWork(client), db_name, "acme", "t1", "c1", [("human", "Hello.")])
    outcome: list[Any] = []
    claimed = a.claim()
    assert claimed is not None
    first = client[db_name].outbox.find_one()["lease_until"]
    worker = threading.Thread(target=lambda: outcome.append(a.process(claimed)))
    worker.start()
    deadline = time.monotonic() + 30
    try:
        while client[db_name].outbox.find_one()["lease_until"] <= first + timedelta(seconds=lease):
            assert b.run_once() is None  # never takes the event over
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.05)
        assert b.run_once() is None
    finally:
        slow.release.set()
        worker.join(30)
    assert outcome[0].status == "done", outcome
    event = client[db_name].outbox.find_one()
    assert (event["status"], event["attempts"], slow.calls) == ("done", 1, 1)


def test_lost_leases_count_as_attempts(
    client: MongoClient, db_name: str, make: Callable[..., Any]
) -> None:
    """Workers that claim the event and die (or stop) before finishing use up its
    attempts: the claim after ``max_attempts`` of them dead-letters it, with no extraction
    (with an LLM extractor, each would cost a model call)."""
    slow = SlowExtractor(0.0)
    agg = make(db_name, lease=0.05, max_attempts=2, extractor=slow)
    commit_step(UnitOfWork(client), db_name, "acme", "t1", "c1", [("human", "Hello.")])
    for _ in range(2):  # two workers claim it and vanish
        assert agg.claim() is not None
        time.sleep(0.1)
    outcome = agg.run_once()
    assert outcome is not None and outcome.status == "dead"
    event = client[db_name].outbox.find_one()
    assert event["status"] == "dead" and event["attempts"] == 3 and slow.calls == 0
    assert "claimed 3 times (max_attempts 2) without completing" in event["error"]


def test_a_heartbeat_that_finds_the_lease_lost_stops(
    client: MongoClient, db_name: str, make: Callable[..., Any]
) -> None:
    """A worker stopped past its lease (SIGSTOP, a long GC pause) cannot renew a lease
    another worker took over: its commit writes nothing (LeaseLost), as before."""
    slow = SlowExtractor(0.0)
    agg = make(db_name, lease=0.05, extractor=slow)
    other = make(db_name, lease=30)
    commit_step(UnitOfWork(client), db_name, "acme", "t1", "c1", [("human", "Hi.")])
    claimed = agg.claim()
    time.sleep(0.1)
    assert other.run_once().status == "done"  # type: ignore[union-attr]
    assert agg.process(claimed).status == "lost"
    assert client[db_name].outbox.find_one()["attempts"] == 2
    assert client[db_name].long_term_memory.count_documents({"text": "User prefers slow food"}) == 0


def test_renewal_extends_only_a_held_lease(client: MongoClient, db_name: str) -> None:
    from accord.platform import outbox

    uow = UnitOfWork(client)
    commit_step(uow, db_name, "acme", "t1", "c1", [])
    doc = uow.execute(outbox.claim_plan(db_name, "outbox", owner="w", lease=timedelta(seconds=1)))
    event = outbox.ClaimedEvent.from_document(doc.found["claim"][0])
    before = client[db_name].outbox.find_one()["lease_until"]
    renewed = uow.execute(outbox.renew_plan(db_name, "outbox", event, timedelta(minutes=5)))
    assert renewed["outbox:renew"].matched == 1
    assert client[db_name].outbox.find_one()["lease_until"] > before + timedelta(minutes=4)
    stale = outbox.ClaimedEvent.from_document({**event.document, "claim_id": "someone-else"})
    assert (
        uow.execute(outbox.renew_plan(db_name, "outbox", stale, timedelta(minutes=5)))[
            "outbox:renew"
        ].matched
        == 0
    )


def test_an_error_text_that_cannot_be_stored_still_releases_the_event(
    client: MongoClient, db_name: str, make: Callable[..., Any]
) -> None:
    """An extractor's exception whose text holds a lone surrogate: the event is released
    with the text escaped (BSON cannot store the surrogate), not left claimed."""

    class Garbled:
        name = "garbled"

        def extract(self, conversation: Conversation, recall: Any) -> list[Change]:
            raise RuntimeError("model said \ud800")

    agg = make(db_name, extractor=Garbled(), max_attempts=1)
    commit_step(UnitOfWork(client), db_name, "acme", "t1", "c1", [("human", "Hi.")])
    assert agg.run_once().status == "retry"  # type: ignore[union-attr]
    event = client[db_name].outbox.find_one()
    assert event["status"] == "pending" and "model said \\ud800" in event["error"]
