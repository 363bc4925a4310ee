"""``accord governance sweep`` (issue 23, item 5): keep-latest-N leaves every thread
restorable, expired threads are deleted whole, and a held thread survives until released.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from pymongo import MongoClient
from typer.testing import CliRunner

from accord import runtime
from accord.checkpointers import AccordSaver
from accord.governance.apply import apply, plan
from accord.governance.loading import default_policy, parse_policy
from accord.platform.cli import app as cli
from accord.platform.context import Principal
from tests.test_kernel_doors import _graph


@pytest.fixture(autouse=True)
def _fast_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCORD_POLICY", raising=False)
    monkeypatch.setenv("ACCORD_POLICY_REFRESH", "0.2")


def _apply(client: MongoClient, db: str, text: str) -> None:
    admin = runtime.kernel(client, principal=Principal.os_user(), policy=default_policy())
    apply(admin, plan(admin, db, parse_policy(text, f"{db}.toml")))


def _config(thread: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _turns(graph: Any, thread: str, n: int) -> None:
    for i in range(n):
        graph.invoke({"messages": [HumanMessage(f"turn {i}", id=uuid.uuid4().hex)], "log": []},
                     _config(thread))  # fmt: skip


def _checkpoints(client: MongoClient, db: str, thread: str) -> int:
    return client[db].accord_checkpoints.count_documents({"thread_id": thread})


def test_keep_latest_n_leaves_every_thread_restorable(client: MongoClient, db_name: str) -> None:
    _apply(client, db_name, "[classes.checkpoint]\nretention = { keep_latest = 3 }\n")
    saver = AccordSaver(client, db_name=db_name)
    saver.setup()
    graph = _graph(saver)
    before: dict[str, dict[str, Any]] = {}
    for thread in ("t-1", "t-2"):
        _turns(graph, thread, 4)
        assert _checkpoints(client, db_name, thread) > 3
        for snapshot in graph.get_state_history(_config(thread)):
            before[snapshot.config["configurable"]["checkpoint_id"]] = snapshot.values
    report = runtime.sweep(client, db_name)
    assert report.pruned_threads == 2 and report.held_skipped == 0
    for thread in ("t-1", "t-2"):
        assert _checkpoints(client, db_name, thread) == 3
        history = list(graph.get_state_history(_config(thread)))
        assert len(history) == 3
        for snapshot in history:  # each kept checkpoint restores exactly as before
            checkpoint_id = snapshot.config["configurable"]["checkpoint_id"]
            assert snapshot.values == before[checkpoint_id]
            state = graph.get_state(_config(thread, checkpoint_id))
            assert state.values == before[checkpoint_id]
        latest = graph.get_state(_config(thread))
        assert len(latest.values["messages"]) == 8  # 4 turns, every message kept
    # the thread goes on from its latest checkpoint
    _turns(graph, "t-1", 1)
    assert len(graph.get_state(_config("t-1")).values["messages"]) == 10
    assert runtime.sweep(client, db_name).pruned_threads == 1


def test_a_held_thread_survives_the_sweep_and_expires_after_release(
    client: MongoClient, db_name: str
) -> None:
    _apply(client, db_name, '[classes.checkpoint]\nretention = { expire_after = "1s", '
                            'after = "last_activity" }\n')  # fmt: skip
    saver = AccordSaver(client, db_name=db_name)
    saver.setup()
    graph = _graph(saver)
    _turns(graph, "t-held", 1)
    _turns(graph, "t-free", 1)
    runner = CliRunner()
    placed = runner.invoke(cli, ["governance", "hold", "t-held", "--by", "thread",
                                 "--tenant", "default", "--reason", "case 17", "--db", db_name],
                           env={"MONGODB_URI": _uri(client)})  # fmt: skip
    assert placed.exit_code == 0, placed.output
    long = "business:orders_of_the_northern_warehouse_2026"
    placed = runner.invoke(cli, ["governance", "hold", long, "--by", "class", "--db", db_name],
                           env={"MONGODB_URI": _uri(client)})  # fmt: skip
    assert placed.exit_code == 0, placed.output
    listed = runner.invoke(cli, ["governance", "holds", "--db", db_name],
                           env={"MONGODB_URI": _uri(client)})  # fmt: skip
    assert "t-held" in listed.output and "case 17" in listed.output
    assert long in listed.output  # whole, to release it by value (it was cut at 80 columns)
    released = runner.invoke(cli, ["governance", "release", long, "--by", "class", "--db",
                                   db_name], env={"MONGODB_URI": _uri(client)})  # fmt: skip
    assert released.exit_code == 0, released.output
    time.sleep(1.2)
    report = runtime.sweep(client, db_name)
    assert report.expired_threads == 1
    assert _checkpoints(client, db_name, "t-free") == 0
    assert _checkpoints(client, db_name, "t-held") > 0
    assert graph.get_state(_config("t-held")).values["messages"]
    released = runner.invoke(cli, ["governance", "release", "t-held", "--by", "thread",
                                   "--tenant", "default", "--db", db_name],
                             env={"MONGODB_URI": _uri(client)})  # fmt: skip
    assert released.exit_code == 0, released.output
    swept = runner.invoke(cli, ["governance", "sweep", "--db", db_name],
                          env={"MONGODB_URI": _uri(client)})  # fmt: skip
    assert swept.exit_code == 0, swept.output
    assert "deleted 1 expired threads" in swept.output
    assert _checkpoints(client, db_name, "t-held") == 0


def test_an_expired_thread_over_keep_latest_is_deleted_by_one_sweep(
    client: MongoClient, db_name: str
) -> None:
    """Keep-latest does not prune an expired thread first: its prune would be a commit
    on the thread, stamping its expiry again (it outlived its period until 2026-12-06)."""
    _apply(client, db_name, '[classes.checkpoint]\nretention = { keep_latest = 2, '
                            'expire_after = "1h", after = "last_activity" }\n')  # fmt: skip
    saver = AccordSaver(client, db_name=db_name)
    saver.setup()
    graph = _graph(saver)
    _turns(graph, "t-old", 2)
    _turns(graph, "t-new", 2)
    assert _checkpoints(client, db_name, "t-old") > 2
    # the hour passes for t-old (moved, not waited: t-new stays an hour from its turn
    # however slow this machine is)
    past = datetime.now(UTC) - timedelta(minutes=1)
    client[db_name].runs.update_one({"thread_id": "t-old"}, {"$set": {"expire_at": past}})
    _turns(graph, "t-new", 1)  # t-new is active again
    report = runtime.sweep(client, db_name)
    assert report.expired_threads == 1 and report.pruned_threads == 1
    assert _checkpoints(client, db_name, "t-old") == 0
    assert _checkpoints(client, db_name, "t-new") == 2


def test_a_prune_stopped_before_its_values_went_is_finished_by_the_next_sweep(
    client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies after the prune's checkpoints went, before their values were
    collected: the thread has 2 checkpoints, so no prune would look at it again; its
    mark makes the next sweep collect them (SIGKILLed for real in
    test_governance_crash.py)."""
    _apply(client, db_name, "[classes.checkpoint]\nretention = { keep_latest = 2 }\n")
    saver = AccordSaver(client, db_name=db_name)
    saver.setup()
    graph = _graph(saver)
    _turns(graph, "t-1", 3)
    blobs = client[db_name].accord_checkpoint_blobs
    before = blobs.count_documents({})

    def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # the process ends here

    monkeypatch.setattr(AccordSaver, "_collect_values", killed)
    with pytest.raises(KeyboardInterrupt):
        saver.prune(["t-1"], keep=2)
    monkeypatch.undo()
    assert _checkpoints(client, db_name, "t-1") == 2
    assert blobs.count_documents({}) == before  # the values of the pruned ones are left
    assert saver.pending_collection() == [("default", "t-1")]
    report = runtime.sweep(client, db_name)
    assert report.collected_threads == 1 and report.pruned_threads == 0
    assert "whose prune was interrupted" in report.describe()
    after = blobs.count_documents({})
    assert after < before and saver.pending_collection() == []
    saver.prune(["t-1"], keep=2)  # nothing left for a prune to collect
    assert blobs.count_documents({}) == after
    assert len(graph.get_state(_config("t-1")).values["messages"]) == 6


def _uri(client: MongoClient) -> str:
    host, port = client.address  # type: ignore[misc]
    return f"mongodb://{host}:{port}/?directConnection=true"


_THREAD_DATA = ("accord_checkpoints", "accord_checkpoint_blobs", "accord_checkpoint_writes",
                "short_term_memory", "accord_recorded_calls")  # fmt: skip


def _left(client: MongoClient, db: str, thread: str) -> int:
    return sum(client[db][c].count_documents({"thread_id": thread}) for c in _THREAD_DATA)


def test_a_big_expired_thread_killed_between_batches_is_finished_by_the_next_sweep(
    client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread with more than BATCH (1,000) documents in a collection is deleted in
    several transactions: a sweep killed after the first (its checkpoints gone) leaves the
    thread expired, so the next sweep finds it and deletes the rest (before 2026-12-07
    the first transaction took its expiry off: 1,101 messages stayed forever)."""
    from accord.checkpointers.synchronous.saver_maintenance import SaverMaintenance

    _apply(client, db_name, '[classes.checkpoint]\nretention = { expire_after = "1h", '
                            'after = "last_activity" }\n')  # fmt: skip
    saver = AccordSaver(client, db_name=db_name)
    graph = _graph(saver)
    graph.invoke({"messages": [HumanMessage(f"m{i}", id=uuid.uuid4().hex) for i in range(1100)],
                  "log": []}, _config("big"))  # fmt: skip
    assert client[db_name].short_term_memory.count_documents({"thread_id": "big"}) > 1000
    past = datetime.now(UTC) - timedelta(minutes=1)
    client[db_name].runs.update_one({"thread_id": "big"}, {"$set": {"expire_at": past}})

    class Killed(BaseException):  # (a SIGKILL: nothing catches it)
        pass

    original = SaverMaintenance._delete_in_batches
    calls: list[str] = []

    def killed_after_one_batch(self: Any, scope: Any, key: str, *args: Any, **kw: Any) -> int:
        calls.append(key)
        if len(calls) > 1:
            raise Killed(key)
        return original(self, scope, key, *args, **kw)

    monkeypatch.setattr(SaverMaintenance, "_delete_in_batches", killed_after_one_batch)
    with pytest.raises(Killed):
        runtime.sweep(client, db_name)
    monkeypatch.setattr(SaverMaintenance, "_delete_in_batches", original)
    assert _checkpoints(client, db_name, "big") == 0  # the thread reads as empty
    assert _left(client, db_name, "big") > 1000
    registry = client[db_name].runs.find_one({"thread_id": "big"})
    assert registry is not None and registry.get("expire_at") is not None  # still expired

    report = runtime.sweep(client, db_name)
    assert report.expired_threads == 1
    assert _left(client, db_name, "big") == 0
    registry = client[db_name].runs.find_one({"thread_id": "big"})
    assert registry is not None and "expire_at" not in registry  # gone: not found again
    assert runtime.sweep(client, db_name).expired_threads == 0
