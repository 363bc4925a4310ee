"""``AsyncWorker``: graphs with async nodes only, executed from the queue on asyncio:
runs done with their business writes, a wait in ``interrupt()`` approved and resumed, a
cancel, a failure, and the sync ``Worker`` failing such a graph (what it is for)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from pymongo import MongoClient

from accord.checkpointers.async_worker import AsyncWorker
from accord.errors import InvalidInputError, RunFailed
from accord.platform import queued_runs
from accord.runtime import AsyncAccord

STEPS = "tests.durable.queue_graphs:async_steps"
APPROVAL = "tests.durable.queue_graphs:async_approval"
BOOM = "tests.durable.queue_graphs:boom"


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "aw_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


def _worker(app: AsyncAccord, graph: str, **kwargs: object) -> AsyncWorker:
    kwargs.setdefault("poll", 0.05)
    kwargs.setdefault("lease", 10.0)  # far above a loaded machine's pauses
    return AsyncWorker(graph, client=app.client, uow=app.uow, db=app.db_name, **kwargs)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_async_graphs_run_from_the_queue(
    mongo_uri: str, db_name: str, client: MongoClient
) -> None:
    async with AsyncAccord(mongo_uri, db_name=db_name) as app:
        queue = await app.runs()
        runs = [
            await queue.submit(STEPS, {"run": f"r{i}"}, tenant_id=f"t{i % 2}") for i in range(6)
        ]
        assert await _worker(app, STEPS, concurrency=3, tenant_limit=2).run(until_idle=True) == 6
        for i, run in enumerate(runs):
            result = await queue.wait(run.run_id, tenant_id=run.tenant_id, timeout=5)
            assert result["done"] == ["a", "b", "c"] and result["run"] == f"r{i}"
            got = await queue.get(run.run_id, tenant_id=run.tenant_id)
            assert got.status == queued_runs.DONE and got.attempts == 1
        assert client[db_name]["fleet_writes"].count_documents({}) == 18
        # the sync worker cannot run async nodes: the run fails, saying why
        from accord.checkpointers.worker import Worker
        from accord.runtime import Accord

        failed = await queue.submit(STEPS, {"run": "sync"})
        with Accord(client=client, db_name=db_name) as sync_app:
            Worker(STEPS, client=client, uow=sync_app.uow, db=db_name, poll=0.05).run(
                until_idle=True
            )
        with pytest.raises(RunFailed, match="No synchronous function provided"):
            await queue.wait(failed.run_id, timeout=5)


@pytest.mark.asyncio
async def test_a_wait_approved_then_resumed_by_an_async_worker(
    mongo_uri: str, db_name: str, client: MongoClient
) -> None:
    async with AsyncAccord(mongo_uri, db_name=db_name) as app:
        queue = await app.runs()
        run = await queue.submit(APPROVAL, {"run": "w"})
        assert await _worker(app, APPROVAL).run(until_idle=True) == 1
        waiting = await queue.get(run.run_id)
        assert waiting.status == queued_runs.WAITING
        assert waiting.wait["interrupts"][0]["value"]["question"] == "wire the money?"
        await queue.approve(run.run_id, by="user:ops")
        assert await _worker(app, APPROVAL).run(until_idle=True) == 1  # another worker
        result = await queue.wait(run.run_id, timeout=5)
        assert result["acted"] == "wired"
        assert client[db_name]["approvals"].count_documents({}) == 1
        # cancelled while queued; a failing graph fails its run
        cancelled = await queue.submit(APPROVAL, {"run": "c"})
        await queue.cancel(cancelled.run_id)
        boom = await queue.submit(BOOM, {"run": "b"})
        assert await _worker(app, BOOM).run(until_idle=True) == 1
        with pytest.raises(RunFailed, match="the tool is down"):
            await queue.wait(boom.run_id, timeout=5)
        with pytest.raises(RunFailed, match="cancelled"):
            await queue.wait(cancelled.run_id, timeout=5)


@pytest.mark.asyncio
async def test_bad_arguments_are_refused(mongo_uri: str, db_name: str) -> None:
    async with AsyncAccord(mongo_uri, db_name=db_name) as app:
        with pytest.raises(InvalidInputError, match="concurrency"):
            _worker(app, STEPS, concurrency=0)
        with pytest.raises(InvalidInputError, match="tenant_limit"):
            _worker(app, STEPS, tenant_limit=-1)


@pytest.mark.asyncio
async def test_a_run_given_back_during_a_claim_is_not_claimed_again(
    mongo_uri: str, db_name: str
) -> None:
    """As for ``Worker`` (test_run_queue.py): a claim under way while a run is given back
    (refused by its bundle pin) does not take the run again."""
    import asyncio
    from typing import Any

    from accord.checkpointers.bundles import PinnedGraph
    from accord.platform.bundles import Bundle
    from tests.durable import queue_graphs

    def on(version: str) -> Any:
        return lambda saver: PinnedGraph(
            queue_graphs.async_approval.compile(checkpointer=saver), Bundle(version, code=version)
        )

    async with AsyncAccord(mongo_uri, db_name=db_name) as app:
        queue = await app.runs()
        run = await queue.submit(APPROVAL, {"run": "raced"})
        assert await _worker(app, APPROVAL, graph_object=on("v1")).run(until_idle=True) == 1
        await queue.approve(run.run_id)
        v2 = _worker(app, APPROVAL, graph_object=on("v2"))
        claim = v2.queue.claim

        async def slow_claim(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0.3)  # the give-back of the run just claimed lands in here
            return await claim(*args, **kwargs)

        v2.queue.claim = slow_claim  # type: ignore[method-assign]
        assert await v2.run(until_idle=True) == 1
        given_back = await queue.get(run.run_id)
        assert given_back.status == queued_runs.QUEUED
        assert "BundleMismatch" in given_back.events[-1]["reason"]
        assert [e["event"] for e in given_back.events].count("claimed") == 2


@pytest.mark.asyncio
async def test_until_idle_is_not_fooled_by_a_run_ending_during_a_refused_claim(
    mongo_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for ``Worker`` (test_run_queue.py): a run that ends while a claim is refused for
    its tenant's limit leaves the worker work to claim, not idle."""
    import asyncio
    import threading
    import time
    from typing import Any

    from tests.durable import queue_graphs

    gate = threading.Event()  # a-0 runs until a later claim was refused for it
    monkeypatch.setitem(queue_graphs.GATES, "a", gate)
    async with AsyncAccord(mongo_uri, db_name=db_name) as app:
        queue = await app.runs()
        for i in range(2):
            await queue.submit(STEPS, {"run": f"a-{i}"}, tenant_id="a")
        worker = _worker(app, STEPS, concurrency=2, tenant_limit=1)
        claim, refused = worker.queue.claim, []

        async def claim_then_let_the_run_end(*args: Any, **kwargs: Any) -> Any:
            doc = await claim(*args, **kwargs)
            if doc is None:
                refused.append(True)
                if len(refused) == 2:  # the loop's next look, a-0 still running: it ends
                    gate.set()
                    deadline = time.monotonic() + 30
                    while worker._active and time.monotonic() < deadline:
                        await asyncio.sleep(0.01)
            return doc

        worker.queue.claim = claim_then_let_the_run_end  # type: ignore[method-assign]
        try:
            assert await worker.run(until_idle=True) == 2
        finally:
            gate.set()
        runs = await queue.list(tenant_id="a")
        assert {r.status for r in runs} == {queued_runs.DONE}


def _async_approval_on(version: str) -> object:
    """The async approval graph on bundle ``version``, with a migration v1 -> v2."""
    from accord.checkpointers.bundles import PinnedGraph
    from accord.platform.bundles import Bundle, Migrations
    from tests.durable import queue_graphs

    migrations = Migrations()
    migrations.register("v1", "v2")(lambda values: {"n": values.get("n", 0) + 100})
    return lambda saver: PinnedGraph(queue_graphs.async_approval.compile(checkpointer=saver),
                                     Bundle(version, code=version), migrations=migrations)  # fmt: skip


@pytest.mark.asyncio
async def test_an_approval_survives_an_async_worker_that_died_right_after_migrating(
    mongo_uri: str, db_name: str
) -> None:
    """As test_run_queue's test of the sync worker: the thread migrated (a state update
    after the checkpoint the run waited at) by a worker that died before resuming it is
    still resumed with the human's value, not sent back to wait for a second approval."""
    import asyncio

    async with AsyncAccord(mongo_uri, db_name=db_name) as app:
        queue = await app.runs()
        run = await queue.submit(APPROVAL, {"run": "mig"})
        v1 = _worker(app, APPROVAL, graph_object=_async_approval_on("v1"))
        assert await v1.run(until_idle=True) == 1
        await queue.approve(run.run_id, by="user:ops")
        claim = await queue.claim([APPROVAL], "doomed", lease_seconds=0.05)
        assert claim is not None and claim["_id"] == run.run_id
        v2 = _worker(app, APPROVAL, graph_object=_async_approval_on("v2"))
        config = {"configurable": {"thread_id": run.thread_id, "tenant_id": "default"},
                  "metadata": {"run_id": run.run_id}}  # fmt: skip
        assert await v2.graph.aprepare(config) == "migrated"
        await asyncio.sleep(0.1)  # its lease runs out
        assert await v2.run(until_idle=True) == 1
        got = await queue.get(run.run_id)
        assert got.status == queued_runs.DONE, (got.status, got.wait)
        assert (await queue.result(run.run_id))["acted"] == "wired"
