"""The queue of runs and its worker, in one process (the fleet test kills real worker
processes: test_fleet.py): submit / get / list / wait / result, deduplication by
idempotency key, priorities, cancel, waiting in ``interrupt()`` and approve / reject /
resume, wait deadlines, fencing of a lost claim, forks, bad input."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from pymongo import MongoClient

from accord import runtime
from accord.checkpointers.worker import Worker
from accord.errors import InvalidInputError, RunFailed, RunStateError, RunTimeout
from accord.platform import queued_runs
from accord.platform.synchronous.run_queue import RunQueue
from accord.runtime import Accord

STEPS = "tests.durable.queue_graphs:steps"
APPROVAL = "tests.durable.queue_graphs:approval"
APPROVALS = "tests.durable.queue_graphs:approvals"
BOOM = "tests.durable.queue_graphs:boom"


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "queue_" + uuid.uuid4().hex[:12]
    try:
        yield name
    finally:
        client.drop_database(name)


@pytest.fixture()
def app(client: MongoClient, db_name: str) -> Iterator[Accord]:
    with Accord(client=client, db_name=db_name) as root:
        yield root


@pytest.fixture()
def queue(app: Accord) -> RunQueue:
    return app.runs()


def work(app: Accord, graph: str, **kwargs: Any) -> int:
    """Run a worker of ``graph`` in this process until nothing is left for it."""
    kwargs.setdefault("poll", 0.05)
    kwargs.setdefault("lease", 10.0)  # far above a loaded machine's pauses
    worker = Worker(graph, client=app.client, uow=app.uow, db=app.db_name, **kwargs)
    return worker.run(until_idle=True)


def _an_hour_passes(app: Accord, run_id: str, *fields: str) -> None:
    """Move the run's deadlines ``fields`` an hour back, as if the time had passed (no
    timer a loaded machine's slow worker could outlast)."""
    runs = app.client[app.db_name]["accord_run_queue"]
    doc = runs.find_one({"_id": run_id})
    assert doc is not None
    moved = {}
    for name in fields:
        value: Any = doc
        for part in name.split("."):
            value = value[part]
        moved[name] = value - timedelta(hours=1)
    assert runs.update_one({"_id": run_id}, {"$set": moved}).modified_count == 1


def test_submitted_runs_are_executed_and_their_results_waited_for(
    app: Accord, queue: RunQueue, client: MongoClient, db_name: str
) -> None:
    runs = [queue.submit(STEPS, {"run": f"r{i}"}) for i in range(3)]
    assert {r.status for r in runs} == {queued_runs.QUEUED}
    assert runs[0].thread_id == runs[0].run_id  # a new thread named after the run
    with pytest.raises(RunTimeout) as slow:
        queue.wait(runs[0].run_id, timeout=0.1)
    assert slow.value.status == queued_runs.QUEUED
    assert work(app, STEPS) == 3
    for i, run in enumerate(runs):
        result = queue.wait(run.run_id, timeout=5)
        assert result["done"] == ["a", "b", "c"] and result["run"] == f"r{i}"
        got = queue.get(run.run_id)
        assert got.status == queued_runs.DONE and got.attempts == 1 and got.fence == 1
        assert [e["event"] for e in got.events] == ["submitted", "claimed", "done"]
    assert client[db_name]["fleet_writes"].count_documents({}) == 9
    assert {r.run_id for r in queue.list(status="done")} == {r.run_id for r in runs}
    assert queue.list(status="queued") == []
    # the thread's checkpoints were written by the run (its id is LangGraph's run id)
    saver = app.checkpointer()
    latest = saver.get_tuple({"configurable": {"thread_id": runs[0].thread_id}})
    assert latest is not None and latest.metadata.get("run_id") == runs[0].run_id


def test_the_same_idempotency_key_starts_one_run(
    app: Accord, queue: RunQueue, client: MongoClient, db_name: str
) -> None:
    first = queue.submit(STEPS, {"run": "k"}, idempotency_key="order-42")
    again = queue.submit(STEPS, {"run": "other input"}, idempotency_key="order-42")
    assert again.run_id == first.run_id
    other_tenant = queue.submit(STEPS, {"run": "k2"}, idempotency_key="order-42",
                                tenant_id="acme")  # fmt: skip
    assert other_tenant.run_id != first.run_id  # keys are per tenant
    assert work(app, STEPS) == 2
    assert queue.submit(STEPS, {"run": "x"}, idempotency_key="order-42").status == "done"
    assert queue.wait(first.run_id)["run"] == "k"
    assert client[db_name]["fleet_writes"].count_documents({"_id": {"$regex": "^k:"}}) == 3
    with pytest.raises(RunStateError, match="exists already"):
        queue.submit(STEPS, {"run": "y"}, run_id=first.run_id)


def test_higher_priority_is_claimed_first_and_tenants_are_isolated(queue: RunQueue) -> None:
    low = queue.submit(STEPS, {"run": "low"}, priority=-5)
    high = queue.submit(STEPS, {"run": "high"}, priority=7)
    mid = queue.submit(STEPS, {"run": "mid"})
    order = [queue.claim([STEPS], "w", lease_seconds=5)["_id"] for _ in range(3)]
    assert order == [high.run_id, mid.run_id, low.run_id]
    assert queue.claim([STEPS], "w") is None
    with pytest.raises(RunStateError, match="no run"):
        queue.get(high.run_id, tenant_id="acme")  # another tenant's run is not there
    assert queue.list(tenant_id="acme") == []


def test_a_lost_claim_changes_nothing_after_a_takeover(queue: RunQueue) -> None:
    queue.submit(STEPS, {"run": "z"})
    first = queue.claim([STEPS], "w1", lease_seconds=0.05)
    assert first is not None
    time.sleep(0.1)  # w1 paused past its lease
    second = queue.claim([STEPS], "w2", lease_seconds=5)
    assert second is not None and second["_id"] == first["_id"]
    assert second["fence"] == first["fence"] + 1 and second["attempts"] == 2
    assert queue.renew(first) is None  # the zombie's heartbeat finds it lost
    assert queue.finished(first, {"stale": True}) is False
    assert queue.failed(first, "stale") is False
    assert queue.get(first["_id"]).status == queued_runs.RUNNING
    assert queue.finished(second, {"n": 3}) is True
    assert queue.result(first["_id"]) == {"n": 3}


def test_cancel(app: Accord, queue: RunQueue) -> None:
    run = queue.submit(STEPS, {"run": "c"})
    cancelled = queue.cancel(run.run_id, by="user:ops")
    assert cancelled.status == queued_runs.CANCELLED
    with pytest.raises(RunFailed) as failed:
        queue.wait(run.run_id)
    assert failed.value.status == "cancelled" and "user:ops" in str(failed.value)
    with pytest.raises(RunStateError, match="already ended"):
        queue.cancel(run.run_id)
    assert work(app, STEPS) == 0  # nothing left to run
    # a running run is asked to stop; its worker stops it at the next step
    running = queue.submit(STEPS, {"run": "c2"})
    claim = queue.claim([STEPS], "w", lease_seconds=5)
    assert claim is not None and claim["_id"] == running.run_id
    assert queue.cancel(running.run_id).cancel_requested
    assert queue.renew(claim)["cancel_requested"] is True


def test_a_run_waits_in_interrupt_without_a_worker_and_is_approved_or_rejected(
    app: Accord, queue: RunQueue, client: MongoClient, db_name: str
) -> None:
    yes = queue.submit(APPROVAL, {"run": "yes"})
    no = queue.submit(APPROVAL, {"run": "no"})
    assert work(app, APPROVAL) == 2  # the worker is idle again: nothing holds it
    for run in (yes, no):
        waiting = queue.get(run.run_id)
        assert waiting.status == queued_runs.WAITING and waiting.lease_expires is None
        assert waiting.wait["interrupts"][0]["value"]["question"] == "wire the money?"
    with pytest.raises(RunTimeout):
        queue.wait(yes.run_id, timeout=0.2)  # a waiting run has not ended
    queue.approve(yes.run_id, by="user:ana")
    queue.reject(no.run_id, by="user:bo")
    with pytest.raises(RunStateError, match="not waiting"):
        queue.approve(no.run_id)  # queued again already
    assert work(app, APPROVAL) == 2
    assert queue.wait(yes.run_id)["acted"] == "wired"
    assert queue.wait(no.run_id)["acted"] == "stopped"
    decisions = {d["_id"]: d["decision"] for d in client[db_name]["approvals"].find()}
    assert decisions == {"yes:True": True, "no:False": False}
    events = [e["event"] for e in queue.get(yes.run_id).events]
    assert events == ["submitted", "claimed", "waiting", "approved", "claimed", "done"]
    assert [e.get("by") for e in queue.get(no.run_id).events if e["event"] == "rejected"] == [
        "user:bo"
    ]


def test_a_resume_value_and_a_second_wait(app: Accord, queue: RunQueue) -> None:
    run = queue.submit(APPROVAL, {"run": "v"})
    work(app, APPROVAL)
    queue.resume(run.run_id, {"amount": 120})
    work(app, APPROVAL)
    assert queue.wait(run.run_id)["decision"] == {"amount": 120}


@pytest.mark.parametrize("action", ["fail", "cancel", "resume"])
def test_a_wait_past_its_deadline_takes_its_timeout_action(
    app: Accord, queue: RunQueue, action: str
) -> None:
    value = True if action == "resume" else None  # only a resume has a value
    run = queue.submit(APPROVAL, {"run": action}, wait_timeout=3600, on_timeout=action,
                       timeout_value=value)  # fmt: skip
    work(app, APPROVAL)
    assert queue.get(run.run_id).wait["deadline"] is not None
    assert queue.expire_waits() == 0  # not yet
    _an_hour_passes(app, run.run_id, "wait.deadline")
    work(app, APPROVAL)  # the worker applies due deadlines as it polls
    if action == "resume":
        assert queue.wait(run.run_id)["acted"] == "wired"
        assert queue.get(run.run_id).events[-3]["by"] == "deadline"
        return
    with pytest.raises(RunFailed) as ended:
        queue.wait(run.run_id)
    assert ended.value.status == ("failed" if action == "fail" else "cancelled")
    assert "deadline" in str(ended.value)


def test_an_approval_after_the_deadline_is_refused_and_the_timeout_action_applies(
    app: Accord, queue: RunQueue, client: MongoClient, db_name: str
) -> None:
    run = queue.submit(APPROVAL, {"run": "late"}, wait_timeout=3600, on_timeout="fail")
    work(app, APPROVAL)
    _an_hour_passes(app, run.run_id, "wait.deadline")  # no worker polled since
    with pytest.raises(RunStateError, match="past its deadline") as late:
        queue.approve(run.run_id)
    assert late.value.status == queued_runs.FAILED
    assert queue.get(run.run_id).status == queued_runs.FAILED
    work(app, APPROVAL)
    assert client[db_name]["approvals"].count_documents({}) == 0  # nothing acted


def test_a_run_that_waits_for_more_decisions_than_max_attempts_is_not_failed(
    app: Accord, queue: RunQueue
) -> None:
    run = queue.submit(APPROVALS, {"run": "many", "n": 0})
    for _ in range(7):
        work(app, APPROVALS, max_attempts=2)
        assert queue.get(run.run_id).status == queued_runs.WAITING
        assert queue.get(run.run_id).attempts == 0  # a wait is not a dying worker
        queue.approve(run.run_id)
    work(app, APPROVALS, max_attempts=2)
    assert queue.wait(run.run_id)["n"] == 7


def test_a_cancel_asked_while_it_runs_ends_it_when_it_comes_to_wait(
    app: Accord, queue: RunQueue
) -> None:
    run = queue.submit(APPROVAL, {"run": "c"})
    doc = queue.claim([APPROVAL], "tester")
    assert doc is not None and doc["_id"] == run.run_id
    assert queue.cancel(run.run_id).cancel_requested  # running: at its next boundary
    queue.waiting(doc, [{"id": None, "value": "wire the money?"}], None)
    ended = queue.get(run.run_id)
    assert ended.status == queued_runs.CANCELLED, ended.events
    with pytest.raises(RunStateError):
        queue.approve(run.run_id)


def test_a_cancel_asked_while_its_worker_was_gone_ends_it_before_it_runs_again(
    app: Accord, queue: RunQueue, client: MongoClient, db_name: str
) -> None:
    run = queue.submit(STEPS, {"run": "orphan"})
    assert queue.claim([STEPS], "a worker that dies") is not None
    queue.cancel(run.run_id)
    _an_hour_passes(app, run.run_id, "lease_expires")  # its lease ran out
    work(app, STEPS)
    assert queue.get(run.run_id).status == queued_runs.CANCELLED
    assert client[db_name]["fleet_writes"].count_documents({}) == 0  # no step ran


def test_a_failing_graph_fails_its_run(app: Accord, queue: RunQueue) -> None:
    run = queue.submit(BOOM, {"run": "b"})
    work(app, BOOM)
    with pytest.raises(RunFailed, match="RuntimeError: the tool is down") as failed:
        queue.wait(run.run_id)
    assert failed.value.error is not None and queue.get(run.run_id).status == "failed"
    with pytest.raises(RunFailed):
        queue.result(run.run_id)
    pending = queue.submit(BOOM, {"run": "p"})
    with pytest.raises(RunStateError, match="has not ended"):
        queue.result(pending.run_id)


def test_a_fork_continues_from_a_checkpoint_on_a_new_thread(
    app: Accord, queue: RunQueue, client: MongoClient, db_name: str
) -> None:
    run = queue.submit(APPROVAL, {"run": "f"})
    work(app, APPROVAL)
    saver = app.checkpointer()
    paused = saver.get_tuple({"configurable": {"thread_id": run.thread_id}})
    assert paused is not None
    queue.approve(run.run_id)
    work(app, APPROVAL)
    assert queue.wait(run.run_id)["acted"] == "wired"
    history = list(saver.list({"configurable": {"thread_id": run.thread_id}}))
    # fork from the checkpoint where the run waited: the fork waits there too
    fork = queue.fork(run.run_id, checkpoint_id=paused.config["configurable"]["checkpoint_id"])
    assert fork.thread_id != run.thread_id and fork.document["fork"]["run_id"] == run.run_id
    work(app, APPROVAL)
    assert queue.get(fork.run_id).status == queued_runs.WAITING
    queue.reject(fork.run_id)
    work(app, APPROVAL)
    assert queue.wait(fork.run_id)["acted"] == "stopped"
    # the original thread and its history are untouched
    assert list(saver.list({"configurable": {"thread_id": run.thread_id}})) == history
    with pytest.raises(InvalidInputError, match="new thread"):
        queue.fork(run.run_id, thread_id=run.thread_id)
    # a checkpoint the source thread does not have: the fork fails naming it (it failed
    # with LangGraph's "EmptyInputError: Received no input for __start__")
    bogus = queue.fork(run.run_id, checkpoint_id="no-such-checkpoint")
    work(app, APPROVAL)
    with pytest.raises(RunFailed, match="has no checkpoint 'no-such-checkpoint'"):
        queue.wait(bogus.run_id)


def test_a_fork_whose_copy_was_cut_short_finishes_the_copy(
    app: Accord, queue: RunQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accord.checkpointers import maintenance

    run = queue.submit(APPROVAL, {"run": "f"})
    work(app, APPROVAL)
    saver = app.checkpointer()
    paused = saver.get_tuple({"configurable": {"thread_id": run.thread_id}})
    assert paused is not None
    queue.approve(run.run_id)
    work(app, APPROVAL)
    fork = queue.fork(run.run_id, checkpoint_id=paused.config["configurable"]["checkpoint_id"])
    # a worker copied part of the source's checkpoints, then died (one per transaction)
    real, copied = maintenance.rekey, []

    def rekey(kind: str, doc: Any, thread_id: str) -> Any:
        if kind == "checkpoints":
            if len(copied) == 2:
                raise SystemExit("killed mid-copy")
            copied.append(doc["_id"])
        return real(kind, doc, thread_id)

    monkeypatch.setattr(maintenance, "BATCH", 1)
    monkeypatch.setattr(maintenance, "rekey", rekey)
    with pytest.raises(SystemExit):
        saver.copy_thread(run.thread_id, fork.thread_id)
    monkeypatch.undo()
    assert saver.get_tuple({"configurable": {"thread_id": fork.thread_id}}) is not None
    work(app, APPROVAL)  # finishes the copy, then runs the fork from the checkpoint
    assert queue.get(fork.run_id).status == queued_runs.WAITING, queue.get(fork.run_id).error
    source = [t.config for t in saver.list({"configurable": {"thread_id": run.thread_id}})]
    copy = [t.config for t in saver.list({"configurable": {"thread_id": fork.thread_id}})]
    assert {c["configurable"]["checkpoint_id"] for c in source} <= {
        c["configurable"]["checkpoint_id"] for c in copy
    }


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda q: q.submit("no-colon", {}), "module.path:attribute"),
        (lambda q: q.submit(STEPS, {}, priority=True), "priority"),
        (lambda q: q.submit(STEPS, {}, priority=10**9), "priority"),
        (lambda q: q.submit(STEPS, {}, wait_timeout=-1), "wait_timeout"),
        (lambda q: q.submit(STEPS, {}, wait_timeout=float("nan")), "wait_timeout"),
        (lambda q: q.submit(STEPS, {}, on_timeout="explode"), "on_timeout"),
        (lambda q: q.submit(STEPS, {}, wait_timeout=1e12), "at most"),
        (lambda q: q.submit(STEPS, {}, on_timeout="cancel"), "give wait_timeout"),
        (lambda q: q.submit(STEPS, {}, wait_timeout=60, timeout_value=1), "on_timeout is 'fail'"),
        (lambda q: q.submit(STEPS, {}, tenant_id={"$ne": ""}), "tenant_id"),
        (lambda q: q.submit(STEPS, {}, thread_id=""), "thread_id"),
        (lambda q: q.submit(STEPS, {}, idempotency_key=""), "idempotency_key"),
        (lambda q: q.submit(STEPS, {}, idempotency_key="k", run_id="r"), "not both"),
        (lambda q: q.get({"$gt": ""}), "run_id"),
        (lambda q: q.list(status={"$ne": "done"}), "status"),
        (lambda q: q.list(limit=0), "limit"),
        (lambda q: q.wait("x", timeout=0), "timeout"),
        (lambda q: q.resume("x", decision="maybe"), "decision"),
        # a lone surrogate (a non-UTF-8 byte a command line became): pymongo's traceback
        (lambda q: q.submit(STEPS, {}, thread_id="t\udcff"), "thread_id is not valid Unicode"),
        (lambda q: q.get("r\udcff"), "run_id is not valid Unicode"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(
    queue: RunQueue, client: MongoClient, db_name: str, call: Any, message: str
) -> None:
    with pytest.raises((InvalidInputError, RunStateError), match=message):
        call(queue)
    assert client[db_name]["accord_run_queue"].count_documents({}) == 0


def test_without_a_codec_values_must_be_plain(app: Accord, client: MongoClient) -> None:
    plain = RunQueue(runtime.kernel(client), app.db_name)
    with pytest.raises(InvalidInputError, match="cannot be stored without a codec"):
        plain.submit(STEPS, {"run": object()})
    run = plain.submit(STEPS, {"run": "plain"})
    assert run.document["input"] == {"plain": {"run": "plain"}}


def _spans(log: Any) -> dict[str, tuple[float, float]]:
    """Each run's first start and last end, from the steps' log."""
    import json

    spans: dict[str, tuple[float, float]] = {}
    for line in log.read_text().splitlines():
        e = json.loads(line)
        start, end = spans.get(e["run"], (e["start"], e.get("end", e["start"])))
        spans[e["run"]] = (min(start, e["start"]), max(end, e.get("end", e["start"])))
    return spans


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, step in points:
        now += step
        most = max(most, now)
    return most


def test_per_tenant_and_per_worker_limits(
    app: Accord, queue: RunQueue, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv("ACCORD_TEST_LOG", str(log))
    monkeypatch.setenv("ACCORD_TEST_STEP_S", "0.1")
    for i in range(3):
        queue.submit(STEPS, {"run": f"a-{i}"}, tenant_id="a")
    for i in range(3):
        queue.submit(STEPS, {"run": f"b-{i}"}, tenant_id="b")
    for i in range(3):
        queue.submit(STEPS, {"run": f"c-{i}"}, tenant_id="c")
    # a lease far above a loaded machine's pauses: one that ran out mid-run would let a
    # second run of its tenant be claimed (the limit counts live leases)
    assert work(app, STEPS, concurrency=2, tenant_limit=1, lease=10.0) == 9
    spans = _spans(log)
    for tenant in "abc":
        assert _most_at_once([v for k, v in spans.items() if k.startswith(tenant)]) == 1
    assert _most_at_once(list(spans.values())) == 2  # the worker's own limit, reached
    for tenant in "abc":
        assert {r.status for r in queue.list(tenant_id=tenant)} == {"done"}


def test_until_idle_is_not_fooled_by_a_run_ending_during_a_refused_claim(
    app: Accord, queue: RunQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim refused for the tenant's limit while the tenant's run ends: the worker is
    not idle (the second run became claimable), it goes on (it stopped with the second
    run queued, once, under load)."""
    import threading

    from tests.durable import queue_graphs

    gate = threading.Event()  # a-0 runs until a later claim was refused for it
    monkeypatch.setitem(queue_graphs.GATES, "a", gate)
    for i in range(2):
        queue.submit(STEPS, {"run": f"a-{i}"}, tenant_id="a")
    worker = Worker(STEPS, client=app.client, uow=app.uow, db=app.db_name, poll=0.05,
                    lease=10.0, concurrency=2, tenant_limit=1)  # fmt: skip
    claim, refused = worker.queue.claim, []

    def claim_then_let_the_run_end(*args: Any, **kwargs: Any) -> Any:
        doc = claim(*args, **kwargs)
        if doc is None:
            refused.append(True)
            if len(refused) == 2:  # the loop's next look, a-0 still running: it ends now
                gate.set()
                deadline = time.monotonic() + 30
                while worker._running() and time.monotonic() < deadline:
                    time.sleep(0.01)
        return doc

    worker.queue.claim = claim_then_let_the_run_end  # type: ignore[method-assign]
    try:
        assert worker.run(until_idle=True) == 2
    finally:
        gate.set()
    assert {r.status for r in queue.list(tenant_id="a")} == {queued_runs.DONE}


def test_a_running_run_is_cancelled_at_its_next_step(
    app: Accord, queue: RunQueue, client: MongoClient, db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import threading

    from tests.durable import queue_graphs

    gate = threading.Event()  # step a runs until the worker has seen the cancel request
    monkeypatch.setitem(queue_graphs.GATES, "a", gate)
    run = queue.submit(STEPS, {"run": "long"})
    worker = Worker(STEPS, client=app.client, uow=app.uow, db=app.db_name, poll=0.05, lease=10)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while queue.get(run.run_id).status != queued_runs.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        queue.cancel(run.run_id, by="user:ops")
        leased = queue.get(run.run_id).lease_expires
        assert leased is not None
        # the heartbeat sees the request when it renews the lease (every lease / 3)
        deadline = time.monotonic() + 30
        while (queue.get(run.run_id).lease_expires or leased) <= leased:
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.05)
        gate.set()
        with pytest.raises(RunFailed) as stopped:
            queue.wait(run.run_id, timeout=30)
        assert stopped.value.status == "cancelled"
    finally:
        gate.set()
        worker.stop()
        runner.join(timeout=30)
    # it stopped at a step boundary: not every step ran
    assert client[db_name]["fleet_writes"].count_documents({}) < 3
    events = [e["event"] for e in queue.get(run.run_id).events]
    assert events == ["submitted", "claimed", "cancel_requested", "cancelled"]


def test_a_compiled_graph_is_run_on_the_workers_saver(app: Accord, queue: RunQueue) -> None:
    name = "tests.durable.queue_graphs:compiled_steps"
    run = queue.submit(name, {"run": "compiled"})
    assert work(app, name) == 1
    assert queue.wait(run.run_id)["done"] == ["a", "b", "c"]
    saver = app.checkpointer()
    assert saver.get_tuple({"configurable": {"thread_id": run.thread_id}}) is not None


@pytest.mark.asyncio
async def test_the_async_queue(mongo_uri: str, db_name: str) -> None:
    from accord.runtime import AsyncAccord

    async with AsyncAccord(mongo_uri, db_name=db_name) as root:
        queue = await root.runs()
        first = await queue.submit(STEPS, {"run": "async"}, idempotency_key="a-1")
        again = await queue.submit(STEPS, {"run": "ignored"}, idempotency_key="a-1")
        assert again.run_id == first.run_id
        assert [r.run_id for r in await queue.list(status="queued")] == [first.run_id]
        with pytest.raises(RunTimeout):
            await queue.wait(first.run_id, timeout=0.1)
        await queue.cancel(first.run_id, by="user:async")
        with pytest.raises(RunFailed, match="cancelled by user:async"):
            await queue.wait(first.run_id)


def test_credentials_that_expired_during_a_wait_block_the_resume_until_refreshed(
    app: Accord, queue: RunQueue
) -> None:
    from datetime import UTC, datetime, timedelta

    from accord.errors import CredentialsExpired

    soon = datetime.now(UTC) + timedelta(minutes=30)
    later = datetime.now(UTC) + timedelta(hours=2)
    run = queue.submit(APPROVAL, {"run": "cred"}, credentials={"bank_token": soon,
                                                                 "crm": later})  # fmt: skip
    work(app, APPROVAL)
    assert queue.get(run.run_id).status == queued_runs.WAITING
    _an_hour_passes(app, run.run_id, "credentials.bank_token")  # it expires in the pause
    with pytest.raises(CredentialsExpired, match="bank_token") as refused:
        queue.approve(run.run_id, by="user:ana")
    assert set(refused.value.expired) == {"bank_token"}  # crm is still valid
    assert queue.get(run.run_id).status == queued_runs.WAITING  # nothing changed
    queue.refresh_credentials(run.run_id, {"bank_token": later}, by="user:ana")
    queue.approve(run.run_id, by="user:ana")
    work(app, APPROVAL)
    assert queue.wait(run.run_id)["acted"] == "wired"
    with pytest.raises(RunStateError, match="already ended"):
        queue.refresh_credentials(run.run_id, {"bank_token": later})


def test_refreshing_a_credential_the_run_does_not_hold_is_refused_by_name(
    queue: RunQueue,
) -> None:
    from datetime import UTC, datetime, timedelta

    later = datetime.now(UTC) + timedelta(hours=1)
    bare = queue.submit(APPROVAL, {"run": "bare"})  # submitted without credentials
    with pytest.raises(InvalidInputError, match="no credential named bank.*holds: none"):
        queue.refresh_credentials(bare.run_id, {"bank": later})
    held = queue.submit(APPROVAL, {"run": "held"}, credentials={"bank_token": later})
    with pytest.raises(InvalidInputError, match="no credential named bank .*holds: bank_token"):
        queue.refresh_credentials(held.run_id, {"bank": later})
    assert set(queue.get(held.run_id).document["credentials"]) == {"bank_token"}  # unchanged


def test_a_deadline_resume_with_expired_credentials_waits_for_a_human(
    app: Accord, queue: RunQueue
) -> None:
    from datetime import UTC, datetime, timedelta

    soon = datetime.now(UTC) + timedelta(minutes=30)
    run = queue.submit(APPROVAL, {"run": "dl"}, wait_timeout=3600, on_timeout="resume",
                       timeout_value=True, credentials={"bank_token": soon})  # fmt: skip
    work(app, APPROVAL)
    _an_hour_passes(app, run.run_id, "wait.deadline", "credentials.bank_token")
    work(app, APPROVAL)  # the deadline resumes it; the worker finds the token expired
    waiting = queue.get(run.run_id)
    assert waiting.status == queued_runs.WAITING, waiting.events
    assert waiting.wait["expired"] == ["bank_token"] and waiting.wait["deadline"] is None
    assert waiting.events[-1]["event"] == "credentials_expired"
    work(app, APPROVAL)  # no churn: nothing resumes it again by itself
    assert queue.get(run.run_id).status == queued_runs.WAITING


@pytest.mark.parametrize(
    "credentials",
    [{"a.b": None}, {"tok": "2026-01-01"}, {"tok": __import__("datetime").datetime(2030, 1, 1)},
     ["tok"], {"$where": None}],
)  # fmt: skip
def test_bad_credentials_are_refused(queue: RunQueue, credentials: Any) -> None:
    with pytest.raises(InvalidInputError, match="credential"):
        queue.submit(STEPS, {"run": "x"}, credentials=credentials)


def _on(version: str) -> Any:
    """A worker's ``graph_object``: the approval graph on bundle ``version``."""
    from accord.checkpointers.bundles import PinnedGraph
    from accord.platform.bundles import Bundle
    from tests.durable import queue_graphs

    return lambda saver: PinnedGraph(queue_graphs.approval.compile(checkpointer=saver),
                                     Bundle(version, code=version))  # fmt: skip


def test_a_run_pinned_to_another_bundle_is_left_to_a_worker_on_its_bundle(
    app: Accord, queue: RunQueue
) -> None:
    run = queue.submit(APPROVAL, {"run": "pinned"})
    assert work(app, APPROVAL, graph_object=_on("v1")) == 1  # pinned to v1, waits
    queue.approve(run.run_id)
    v2 = Worker(APPROVAL, client=app.client, uow=app.uow, db=app.db_name, poll=0.05,
                graph_object=_on("v2"))  # fmt: skip
    assert v2.run(until_idle=True) == 1  # claimed, refused by the pin, given back
    given_back = queue.get(run.run_id)
    assert given_back.status == queued_runs.QUEUED
    reason = given_back.events[-1]
    assert reason["event"] == "released" and "BundleMismatch" in reason["reason"]
    assert "'v1'" in reason["reason"] and "'v2'" in reason["reason"]
    assert v2.run(until_idle=True) == 0  # it does not take it again at once
    assert work(app, APPROVAL, graph_object=_on("v1")) == 1
    assert queue.wait(run.run_id)["acted"] == "wired"


def test_a_run_given_back_during_a_claim_is_not_claimed_again(app: Accord, queue: RunQueue) -> None:
    """The worker's next claim can be under way (its skip list read) while a run is given
    back: that claim must not take the run again (it would spend an attempt)."""
    run = queue.submit(APPROVAL, {"run": "raced"})
    assert work(app, APPROVAL, graph_object=_on("v1")) == 1
    queue.approve(run.run_id)
    v2 = Worker(APPROVAL, client=app.client, uow=app.uow, db=app.db_name, poll=0.05,
                graph_object=_on("v2"))  # fmt: skip
    claim = v2.queue.claim

    def slow_claim(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)  # the give-back of the run just claimed lands in here
        return claim(*args, **kwargs)

    v2.queue.claim = slow_claim  # type: ignore[method-assign]
    assert v2.run(until_idle=True) == 1
    events = [e["event"] for e in queue.get(run.run_id).events]
    assert events.count("claimed") == 2 and events[-1] == "released"  # v1's, then v2's


def test_a_run_whose_workers_keep_dying_is_failed_after_max_attempts(
    app: Accord, queue: RunQueue, client: MongoClient, db_name: str
) -> None:
    run = queue.submit(STEPS, {"run": "poison"})
    for _ in range(2):  # two workers died holding it (their leases ran out)
        assert queue.claim([STEPS], "doomed", lease_seconds=0.01) is not None
        time.sleep(0.02)
    assert work(app, STEPS, max_attempts=2) == 1
    with pytest.raises(RunFailed, match="claimed 3 times without ending"):
        queue.wait(run.run_id)
    assert client[db_name]["fleet_writes"].count_documents({}) == 0  # not executed again
    with pytest.raises(InvalidInputError, match="max_attempts"):
        Worker(STEPS, client=app.client, uow=app.uow, db=app.db_name, max_attempts=0)


def test_a_retried_run_does_not_take_another_runs_checkpoints_for_its_progress(
    app: Accord, queue: RunQueue
) -> None:
    first = queue.submit(STEPS, {"run": "first"}, thread_id="shared")
    claim = queue.claim([STEPS], "doomed", lease_seconds=0.05)
    assert claim is not None and claim["_id"] == first.run_id
    assert queue.started(claim, None)  # it began on a new thread, then its worker died
    second = queue.submit(STEPS, {"run": "second"}, thread_id="shared", priority=9)
    time.sleep(0.1)
    assert work(app, STEPS, concurrency=1) == 2  # the second first (priority), then the first
    assert queue.wait(second.run_id)["done"] == ["a", "b", "c"]
    again = queue.wait(first.run_id)  # its input ran, after the second run's turn
    assert again["run"] == "first" and again["done"] == ["a", "b", "c"] * 2


def test_a_worker_given_a_graph_object_for_its_name_says_where_it_goes(app: Accord) -> None:
    """The docs showed Worker(graph, ...): the message was only "graph must name a graph
    as 'module.path:attribute'"."""
    from tests.durable.queue_graphs import compiled_steps, steps

    for graph in (steps, compiled_steps):
        with pytest.raises(InvalidInputError, match="graph_object="):
            Worker(graph, client=app.client, uow=app.uow, db=app.db_name)


def _pinned_on(graph_name: str, version: str) -> Any:
    """A worker's ``graph_object``: ``queue_graphs``' graph ``graph_name`` on bundle
    ``version``, with a migration v1 -> v2 (it counts the migration in the state)."""
    from accord.checkpointers.bundles import PinnedGraph
    from accord.platform.bundles import Bundle, Migrations
    from tests.durable import queue_graphs

    migrations = Migrations()

    @migrations.register("v1", "v2")
    def bump(values: dict[str, Any]) -> dict[str, Any]:
        return {"n": values.get("n", 0) + 100}

    graph = getattr(queue_graphs, graph_name)
    return lambda saver: PinnedGraph(graph.compile(checkpointer=saver),
                                     Bundle(version, code=version), migrations=migrations)  # fmt: skip


def _steps_on(version: str) -> Any:
    return _pinned_on("steps", version)


def test_a_run_whose_worker_died_right_after_migrating_its_thread_still_runs_its_input(
    app: Accord, queue: RunQueue, client: MongoClient, db_name: str
) -> None:
    """A new turn on a thread pinned to v1, taken by a worker on v2: PinnedGraph migrates
    the thread (a state update: a new checkpoint) before LangGraph runs the input. The
    worker died there. The run's next worker must run its input, not take the
    migration's checkpoint for the run's own progress (before 2026-12-07 it continued
    from it with no input: the run ended `done` without its input ever running)."""
    first = queue.submit(STEPS, {"run": "first"}, thread_id="chat")
    assert work(app, STEPS, graph_object=_steps_on("v1")) == 1
    assert queue.wait(first.run_id)["done"] == ["a", "b", "c"]
    second = queue.submit(STEPS, {"run": "second"}, thread_id="chat")
    # a worker on v2 claims it and gets as far as the migration, then dies
    claim = queue.claim([STEPS], "doomed", lease_seconds=0.05)
    assert claim is not None and claim["_id"] == second.run_id
    saver = app.checkpointer()
    config = {"configurable": {"thread_id": "chat", "tenant_id": "default"},
              "metadata": {"run_id": second.run_id}}  # fmt: skip
    latest = saver.get_tuple(config)
    assert latest is not None and queue.started(
        claim, latest.config["configurable"]["checkpoint_id"]
    )
    assert _steps_on("v2")(saver).prepare(config) == "migrated"
    time.sleep(0.1)  # its lease runs out
    assert work(app, STEPS, graph_object=_steps_on("v2")) == 1
    result = queue.wait(second.run_id, timeout=5)
    assert result["done"] == ["a", "b", "c"] * 2 and result["run"] == "second"
    assert result["n"] == 106  # three steps, the migration, three steps
    assert client[db_name]["fleet_writes"].count_documents({"_id": {"$regex": "^second:"}}) == 3


def _approval_on(version: str) -> Any:
    return _pinned_on("approval", version)


def test_an_approval_survives_a_worker_that_died_right_after_migrating_the_thread(
    app: Accord, queue: RunQueue, client: MongoClient, db_name: str
) -> None:
    """A run waiting in interrupt() on v1 is approved; a worker on v2 migrates its thread
    (a new checkpoint after the one it waited at) and dies before it resumed the graph.
    The next worker must still resume it with the human's value (before 2026-12-07 it
    took the migration's checkpoint for "the resume was applied", ran the paused task
    with no value, and the run waited for a second approval)."""
    run = queue.submit(APPROVAL, {"run": "mig"})
    assert work(app, APPROVAL, graph_object=_approval_on("v1")) == 1
    assert queue.get(run.run_id).status == queued_runs.WAITING
    queue.approve(run.run_id, by="user:ops")
    claim = queue.claim([APPROVAL], "doomed", lease_seconds=0.05)
    assert claim is not None and claim["_id"] == run.run_id
    saver = app.checkpointer()
    config = {"configurable": {"thread_id": run.thread_id, "tenant_id": "default"},
              "metadata": {"run_id": run.run_id}}  # fmt: skip
    assert _approval_on("v2")(saver).prepare(config) == "migrated"
    time.sleep(0.1)  # its lease runs out
    assert work(app, APPROVAL, graph_object=_approval_on("v2")) == 1
    got = queue.get(run.run_id)
    assert got.status == queued_runs.DONE, (got.status, got.wait)
    assert queue.result(run.run_id)["acted"] == "wired"


def test_a_cancel_that_comes_during_the_last_step_does_not_call_a_finished_run_cancelled(
    app: Accord, queue: RunQueue, client: MongoClient, db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The cancel request is seen while the last step runs: there is no step boundary
    left to stop at, the graph ends and every write of it is committed. The run is done
    with its result (before 2026-12-07 it was recorded `cancelled`, its result dropped:
    a caller resubmitting "the cancelled run" would have done it all twice)."""
    import threading

    from tests.durable import queue_graphs

    gate = threading.Event()  # step c runs until the worker has seen the cancel request
    monkeypatch.setitem(queue_graphs.GATES, "c", gate)
    run = queue.submit(STEPS, {"run": "late"})
    worker = Worker(STEPS, client=app.client, uow=app.uow, db=app.db_name, poll=0.05, lease=10)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while client[db_name]["fleet_writes"].count_documents({}) < 2:  # a and b committed
            assert time.monotonic() < deadline
            time.sleep(0.02)
        queue.cancel(run.run_id, by="user:ops")
        leased = queue.get(run.run_id).lease_expires
        assert leased is not None
        deadline = time.monotonic() + 30
        while (queue.get(run.run_id).lease_expires or leased) <= leased:
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.05)
        gate.set()
        result = queue.wait(run.run_id, timeout=30)
    finally:
        gate.set()
        worker.stop()
        runner.join(timeout=30)
    assert result["done"] == ["a", "b", "c"]
    assert client[db_name]["fleet_writes"].count_documents({}) == 3
    events = [e["event"] for e in queue.get(run.run_id).events]
    assert events == ["submitted", "claimed", "cancel_requested", "done"]
