"""Retention of the queue of runs: a run that ended (done, failed, cancelled) gets
``expire_at`` from the policy's ``queued_run`` retention (``after = "done"``) and the TTL
index deletes it; queued, running and waiting runs never get one. The test engine's TTL
monitor passes every second (tests/conftest.py, ``ttl_interval=1.0``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import MongoClient

from accord import runtime
from accord.checkpointers.worker import Worker
from accord.errors import PolicyError
from accord.governance.apply import apply, plan
from accord.governance.loading import default_policy, parse_policy
from accord.platform.context import Principal
from accord.runtime import Accord

STEPS = "tests.durable.queue_graphs:steps"
APPROVAL = "tests.durable.queue_graphs:approval"
BOOM = "tests.durable.queue_graphs:boom"
ALL = '["find", "insert", "update", "remove"]'


def _policy(period: str) -> str:
    return (
        f'[classes.queued_run]\nretention = {{ expire_after = "{period}", after = "done" }}\n'
        f"roles = {{ runtime = {ALL}, admin = {ALL} }}\n"
    )


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "qret_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client[name].command("dropAllRolesFromDatabase")
        client.drop_database(name)


@pytest.fixture(autouse=True)
def _no_policy_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCORD_POLICY", raising=False)
    monkeypatch.setenv("ACCORD_POLICY_REFRESH", "0.2")


def _work(app: Accord, graph: str) -> int:
    worker = Worker(graph, client=app.client, uow=app.uow, db=app.db_name, poll=0.05, lease=10.0)
    return worker.run(until_idle=True)


def _docs(client: MongoClient, db: str) -> dict[str, dict[str, Any]]:
    return {d["_id"]: d for d in client[db]["accord_run_queue"].find({})}


def _wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_ended_runs_get_the_default_expiry_and_the_others_none(
    client: MongoClient, db_name: str
) -> None:
    with Accord(client=client, db_name=db_name, policy=default_policy()) as app:
        queue = app.runs()
        done = queue.submit(STEPS, {"run": "done"})
        failed = queue.submit(BOOM, {"run": "failed"})
        waiting = queue.submit(APPROVAL, {"run": "waiting"})
        cancelled = queue.submit(STEPS, {"run": "cancelled"}, tenant_id="t2")
        queued = queue.submit("tests.durable.queue_graphs:unserved", {"run": "queued"})
        queue.cancel(cancelled.run_id, tenant_id="t2")
        before = datetime.now(UTC).replace(tzinfo=None)
        for graph in (STEPS, BOOM, APPROVAL):
            _work(app, graph)
        docs = _docs(client, db_name)
        assert docs[done.run_id]["status"] == "done"
        assert docs[failed.run_id]["status"] == "failed"
        assert docs[waiting.run_id]["status"] == "waiting"
        for run in (done, failed, cancelled):
            left = docs[run.run_id]["expire_at"] - before
            assert timedelta(days=29, hours=23) < left <= timedelta(days=30, minutes=1)
        assert "expire_at" not in docs[waiting.run_id]
        assert docs[queued.run_id]["status"] == "queued" and "expire_at" not in docs[queued.run_id]
        # the queue's own TTL index (the one `accord governance apply` makes)
        index = client[db_name]["accord_run_queue"].index_information()["retention"]
        assert index["key"] == [("expire_at", 1)] and index["expireAfterSeconds"] == 0
        # a waiting run resumed and finished gets one when it ends
        queue.approve(waiting.run_id)
        assert "expire_at" not in _docs(client, db_name)[waiting.run_id]  # queued again
        _work(app, APPROVAL)
        assert _docs(client, db_name)[waiting.run_id]["status"] == "done"
        assert "expire_at" in _docs(client, db_name)[waiting.run_id]


def test_ended_runs_are_deleted_and_their_key_submits_a_new_run(
    client: MongoClient, db_name: str
) -> None:
    admin = runtime.kernel(client, principal=Principal.os_user(), policy=default_policy())
    policy = parse_policy(_policy("1s"), "queue.toml")
    apply(admin, plan(admin, db_name, policy))
    with Accord(client=client, db_name=db_name, policy=policy) as app:
        queue = app.runs()
        first = queue.submit(STEPS, {"run": "k1"}, idempotency_key="order-1")
        waiting = queue.submit(APPROVAL, {"run": "w"})
        kept = queue.submit("tests.durable.queue_graphs:unserved", {"run": "q"})
        _work(app, APPROVAL)
        assert queue.get(waiting.run_id).status == "waiting"
        _work(app, STEPS)
        assert queue.get(first.run_id).status == "done"
        assert queue.get(kept.run_id).status == "queued"
        _wait_until(lambda: first.run_id not in _docs(client, db_name))
        time.sleep(2.5)  # two more TTL passes: runs that did not end stay
        docs = _docs(client, db_name)
        assert {waiting.run_id, kept.run_id} <= set(docs)
        assert "expire_at" not in docs[waiting.run_id] and "expire_at" not in docs[kept.run_id]
        # the key's run is gone: the same key queues a new run (same id, new submission)
        again = queue.submit(STEPS, {"run": "k2"}, idempotency_key="order-1")
        assert again.run_id == first.run_id and again.status == "queued"
        assert queue.get(again.run_id).attempts == 0


def test_queued_run_retention_must_start_when_a_run_ended() -> None:
    assert parse_policy(_policy("30d"), "ok.toml").classes["queued_run"].retention.after == "done"
    for after in ("created", "updated"):
        text = _policy("30d").replace('after = "done"', f'after = "{after}"')
        with pytest.raises(PolicyError, match="queued runs expire only once they ended"):
            parse_policy(text, "bad.toml")
    text = '[classes.long_term_memory]\nretention = { expire_after = "1d", after = "done" }\n'
    with pytest.raises(PolicyError, match="only outbox events and queued runs are 'done'"):
        parse_policy(text, "bad.toml")


def test_holds_and_policy_changes_reach_ended_runs(client: MongoClient, db_name: str) -> None:
    """A held tenant's runs get no expiry, and get it back on release; a policy that
    starts expiring runs stamps those that ended already (every ended status), not the
    others."""
    from accord.governance.holding import place, release
    from accord.governance.holds import Hold

    admin = runtime.kernel(client, principal=Principal.os_user(), policy=default_policy())
    kept = parse_policy(_policy("1h"), "k.toml")
    none = parse_policy(
        f'[classes.queued_run]\nretention = "none"\nroles = {{ runtime = {ALL}, admin = {ALL} }}\n',
        "none.toml",
    )
    apply(admin, plan(admin, db_name, none))
    with Accord(client=client, db_name=db_name, policy=none) as app:
        queue = app.runs()
        ended = [queue.submit(STEPS, {"run": f"e{i}"}, tenant_id="acme") for i in range(2)]
        queue.cancel(ended[1].run_id, tenant_id="acme")
        waiting = queue.submit("tests.durable.queue_graphs:unserved", {"run": "w"},
                               tenant_id="acme")  # fmt: skip
        _work(app, STEPS)
    docs = _docs(client, db_name)
    assert all("expire_at" not in d for d in docs.values())  # kept: no expiry
    apply(admin, plan(admin, db_name, kept))  # from now on runs expire 1h after they end
    docs = _docs(client, db_name)
    assert {r.run_id for r in ended} == {i for i, d in docs.items() if "expire_at" in d}
    hold = Hold("tenant", "acme", reason="audit 2026-3")
    assert place(admin, db_name, hold, kept) >= 2  # and the threads' registry documents
    assert all("expire_at" not in d for d in _docs(client, db_name).values())
    with Accord(client=client, db_name=db_name, policy=kept) as app:
        late = app.runs().submit(STEPS, {"run": "late"}, tenant_id="acme")
        time.sleep(0.5)  # the kernel sees the hold
        _work(app, STEPS)
    assert "expire_at" not in _docs(client, db_name)[late.run_id]  # ended while held
    assert release(admin, db_name, hold, kept) >= 3
    docs = _docs(client, db_name)
    assert {i for i, d in docs.items() if "expire_at" in d} == {
        *(r.run_id for r in ended),
        late.run_id,
    }
    assert "expire_at" not in docs[waiting.run_id]
