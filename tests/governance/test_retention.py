"""Retention (issue 23, item 5): ``expire_at`` stamped from the policy at write time, TTL
indexes from ``apply``, ``expire_at`` recomputed when the policy changes, and legal holds
that stop expiry while they last. The test engine's TTL monitor passes every second
(tests/conftest.py, ``ttl_interval=1.0``).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import MongoClient

from accord import runtime
from accord.governance.apply import apply, plan
from accord.governance.holding import list_holds, place, release
from accord.governance.holds import Hold
from accord.governance.loading import default_policy, parse_policy
from accord.platform.context import Principal, WriteContext
from accord.platform.plan import Group, Op, Plan

REFRESH = 0.2
ALL = '["find", "insert", "update", "remove"]'


def _orders(seconds: int | str, invoices: str = "1h") -> str:
    return (
        f'[classes."business:orders"]\nretention = {{ expire_after = "{seconds}s" }}\n'
        f"roles = {{ runtime = {ALL}, admin = {ALL} }}\n"
        f'[classes."business:invoices"]\nretention = {{ expire_after = "{invoices}" }}\n'
        f"roles = {{ runtime = {ALL}, admin = {ALL} }}\n"
    )


@pytest.fixture(autouse=True)
def _fast_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCORD_POLICY", raising=False)
    monkeypatch.setenv("ACCORD_POLICY_REFRESH", str(REFRESH))


def _admin(client: MongoClient) -> Any:
    return runtime.kernel(client, principal=Principal.os_user(), policy=default_policy())


def _apply(client: MongoClient, db: str, text: str) -> None:
    admin = _admin(client)
    apply(admin, plan(admin, db, parse_policy(text, f"{db}.toml")))


def _write(uow: Any, db: str, collection: str, tenant: str, key: str) -> None:
    uow.execute(Plan(WriteContext(tenant, operation="test"), [
        Group(collection, db, collection, "business",
              [Op("insert", doc={"_id": f"{tenant}-{key}", "tenant_id": tenant})]),
    ]))  # fmt: skip


def _ids(client: MongoClient, db: str, collection: str) -> set[str]:
    return {d["_id"] for d in client[db][collection].find({}, {"_id": 1})}


def _wait_until(condition: Any, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_each_class_expires_on_its_own_schedule(client: MongoClient, db_name: str) -> None:
    _apply(client, db_name, _orders(1))
    indexes = client[db_name].orders.index_information()
    assert indexes["retention"]["expireAfterSeconds"] == 0
    assert indexes["retention"]["key"] == [("expire_at", 1)]
    uow = runtime.kernel(client)
    before = datetime.now(UTC).replace(tzinfo=None)
    _write(uow, db_name, "orders", "acme", "1")
    _write(uow, db_name, "invoices", "acme", "1")
    order = client[db_name].orders.find_one()
    invoice = client[db_name].invoices.find_one()
    assert timedelta(0) < order["expire_at"] - before <= timedelta(seconds=2)
    assert timedelta(minutes=59) < invoice["expire_at"] - before <= timedelta(minutes=61)
    _wait_until(lambda: not _ids(client, db_name, "orders"))
    assert _ids(client, db_name, "invoices") == {"acme-1"}


def test_a_held_tenant_survives_expiry_and_expires_after_release(
    client: MongoClient, db_name: str
) -> None:
    _apply(client, db_name, _orders(1))
    uow = runtime.kernel(client)
    for tenant in ("acme", "beta"):
        _write(uow, db_name, "orders", tenant, "old")
    admin = _admin(client)
    hold = Hold("tenant", "acme", reason="litigation 2026-17")
    policy = parse_policy(_orders(1), "x")
    assert place(admin, db_name, hold, policy) == 1
    assert place(admin, db_name, hold, policy) == 0  # idempotent
    held = client[db_name].orders.find_one({"_id": "acme-old"})
    assert "expire_at" not in held and "held_expire_at" in held
    time.sleep(REFRESH * 2)  # the writer's kernel learns the hold
    _write(uow, db_name, "orders", "acme", "new")  # written while held: no expiry
    assert "expire_at" not in client[db_name].orders.find_one({"_id": "acme-new"})
    _wait_until(lambda: "beta-old" not in _ids(client, db_name, "orders"))
    time.sleep(1.5)  # a TTL pass or two more: the held ones stay
    assert _ids(client, db_name, "orders") == {"acme-old", "acme-new"}
    assert [h.id for h in list_holds(admin, db_name, policy)] == [hold.id]
    assert release(admin, db_name, hold, policy) == 2
    assert list_holds(admin, db_name, policy) == []
    _wait_until(lambda: not _ids(client, db_name, "orders"))


def test_apply_recomputes_expire_at_when_the_period_changes(
    client: MongoClient, db_name: str
) -> None:
    _apply(client, db_name, _orders(3600))
    uow = runtime.kernel(client)
    _write(uow, db_name, "orders", "acme", "1")
    first = client[db_name].orders.find_one()["expire_at"]
    _apply(client, db_name, _orders(7200))  # one hour longer: the same event, moved
    second = client[db_name].orders.find_one()["expire_at"]
    assert abs((second - first) - timedelta(hours=1)) < timedelta(milliseconds=5)
    _apply(client, db_name, "version = 1\n")  # orders kept until erased: no expiry
    assert "expire_at" not in client[db_name].orders.find_one()
    _apply(client, db_name, _orders(3600))  # expiring again: from now
    third = client[db_name].orders.find_one()["expire_at"]
    assert third - datetime.now(UTC).replace(tzinfo=None) > timedelta(minutes=59)


def test_apply_restamps_expire_at_when_the_event_changes(client: MongoClient, db_name: str) -> None:
    """From "20s after created" to "30d after updated", every order kept created+20s and
    was deleted by TTL."""
    _apply(client, db_name, _orders(20))
    uow = runtime.kernel(client)
    _write(uow, db_name, "orders", "acme", "1")
    _apply(client, db_name, _orders(20).replace('"20s" }', '"30d", after = "updated" }', 1))
    left = client[db_name].orders.find_one()["expire_at"] - datetime.now(UTC).replace(tzinfo=None)
    assert left > timedelta(days=29)


def test_an_interrupted_recompute_is_finished_by_the_next_apply_moving_each_once(
    client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The apply stops after 2 of its batches (SIGKILLed for real in
    test_governance_crash.py): the stored version says its retention is pending, plan
    shows the recompute to finish, and the next apply moves the rest, each document
    once."""
    _apply(client, db_name, _orders(3600))
    uow = runtime.kernel(client)
    for i in range(25):
        _write(uow, db_name, "orders", "acme" if i % 2 else "globex", str(i))
    orders = client[db_name].orders
    first = {d["_id"]: d["expire_at"] for d in orders.find()}
    admin = _admin(client)
    real = type(admin).execute_all
    calls = {"n": 0}

    def stops_after_two(self: Any, plans: Any) -> Any:
        if calls["n"] == 2:
            raise KeyboardInterrupt  # the process ends here
        calls["n"] += 1
        return real(self, plans)

    monkeypatch.setattr(type(admin), "execute_all", stops_after_two)
    with pytest.raises(KeyboardInterrupt):
        apply(admin, plan(admin, db_name, parse_policy(_orders(7200), "p.toml")), batch=10)
    monkeypatch.undo()
    moved = {k for k, d in ((d["_id"], d) for d in orders.find()) if d["expire_at"] != first[k]}
    assert len(moved) == 20  # two batches of 10
    stored = client[db_name].accord_policies.find_one({"_id": "v2"})
    assert stored["retention"] == "pending" and stored["recompute"]["step"] == 0
    again = plan(admin, db_name, parse_policy(_orders(7200), "p.toml"))
    assert [c.kind for c in again.changes] == ["recompute expiry"] and again.resume == 2
    apply(admin, again, batch=10)
    for d in orders.find():
        assert d["expire_at"] - first[d["_id"]] == timedelta(hours=1), d
    stored = client[db_name].accord_policies.find_one({"_id": "v2"})
    assert stored["retention"] == "done" and "recompute" not in stored
    assert not plan(admin, db_name, parse_policy(_orders(7200), "p.toml"))


def test_an_expired_memory_leaves_vector_search_with_its_vectors(
    client: MongoClient, db_name: str
) -> None:
    _apply(client, db_name, '[classes.long_term_memory]\nretention = { expire_after = "1s" }\n')
    assert "retention" in client[db_name].memory_vectors.index_information()
    app = runtime.Accord(client=client, db_name=db_name)
    memory = app.memory("acme")
    memory.put(("u-1",), "tea", {"text": "drinks green tea every morning"})
    memory.put(("u-1",), "dog", {"text": "has a dog called Rex"})
    stamps = {d["expire_at"] for d in client[db_name].long_term_memory.find()}
    vectors = list(client[db_name].memory_vectors.find())
    assert vectors and {v["expire_at"] for v in vectors} <= stamps  # with their memory
    hits = memory.search(("u-1",), query="green tea", include_unscored=False)
    assert [h.key for h in hits][:1] == ["tea"]
    _wait_until(lambda: client[db_name].memory_vectors.count_documents({}) == 0)
    assert client[db_name].long_term_memory.count_documents({}) == 0
    assert memory.search(("u-1",), query="green tea", include_unscored=False) == []


def test_a_held_subjects_memories_keep_their_vectors_until_release(
    client: MongoClient, db_name: str
) -> None:
    _apply(client, db_name, '[classes.long_term_memory]\nretention = { expire_after = "1s" }\n')
    policy = parse_policy('[classes.long_term_memory]\nretention = { expire_after = "1s" }\n', "x")
    admin = _admin(client)
    hold = Hold("subject", "u-1", reason="subject access request")
    place(admin, db_name, hold, policy)
    time.sleep(REFRESH * 2)
    app = runtime.Accord(client=client, db_name=db_name)
    memory = app.memory("acme")
    memory.put(("u-1",), "tea", {"text": "drinks green tea"})  # held: written without expiry
    memory.put(("u-2",), "tea", {"text": "drinks green tea"})
    db = client[db_name]

    def keys() -> set[tuple[str, ...]]:
        return {tuple(d["namespace"]) for d in db.long_term_memory.find()}

    _wait_until(lambda: keys() == {("u-1",)})
    time.sleep(1.5)
    assert keys() == {("u-1",)}
    assert (
        db.memory_vectors.count_documents({})
        == db.memory_vectors.count_documents({"memory_id": db.long_term_memory.find_one()["_id"]})
        > 0
    )  # the held memory's vectors stayed with it
    assert [h.namespace for h in memory.search((), query="green tea")] == [("u-1",)]
    assert release(admin, db_name, hold, policy) >= 2  # the memory and its vectors
    _wait_until(lambda: db.memory_vectors.count_documents({}) == 0 and not keys())


def test_holds_of_two_tenants_never_become_one(client: MongoClient, db_name: str) -> None:
    """Thread 't1' of tenant 'org:acme' and thread 'acme:t1' of tenant 'org' (and a subject
    held in tenant '*' vs in every tenant) had one hold id: the second hold was not
    recorded (its data lost its expiry, but nothing refused deleting it), and releasing
    one tenant's hold released the other's."""
    admin = _admin(client)
    policy = default_policy()
    first, second = Hold("thread", "t1", "org:acme"), Hold("thread", "acme:t1", "org")
    every, star = Hold("subject", "u-1"), Hold("subject", "u-1", "*")
    for hold in (first, second, every, star):
        place(admin, db_name, hold, policy)

    def held() -> set[tuple[str, str, str | None]]:
        return {(h.kind, h.value, h.tenant_id) for h in list_holds(admin, db_name, policy)}

    assert held() == {("thread", "t1", "org:acme"), ("thread", "acme:t1", "org"),
                      ("subject", "u-1", None), ("subject", "u-1", "*")}  # fmt: skip
    release(admin, db_name, second, policy)
    release(admin, db_name, star, policy)
    assert held() == {("thread", "t1", "org:acme"), ("subject", "u-1", None)}
    # a tenant without ':' keeps the id it always had (holds placed before still match)
    assert Hold("thread", "a:b", "acme").id == "thread:acme:a:b"


def test_a_hold_placed_under_the_older_id_is_released(client: MongoClient, db_name: str) -> None:
    admin = _admin(client)
    policy = default_policy()
    hold = Hold("thread", "t1", "org:acme")
    client[db_name].accord_holds.insert_one({**hold.document(), "_id": "thread:org:acme:t1"})
    assert [h.tenant_id for h in list_holds(admin, db_name, policy)] == ["org:acme"]
    release(admin, db_name, hold, policy)
    assert list_holds(admin, db_name, policy) == []
