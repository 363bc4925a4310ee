"""Queued saves under LangGraph's "async" durability.

A run's puts, and the writes of its tasks that staged no business writes, are queued and
committed in order by one drainer; the saves queued together share one transaction, and
the run's last one gives the lease back. These tests check what that must not change:
the stored history is InMemorySaver's, a task's business writes still commit in their
own transaction before the next checkpoint, a stale owner's queued saves are refused
and the refusal reaches the caller, and the drainer's batching never takes the run's
mutex twice (the hang of an earlier attempt).
"""

from __future__ import annotations

import operator
import threading
import time
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from pymongo import MongoClient, monitoring

from accord.checkpointers import business
from accord.checkpointers.asynchronous import saver_queue as saver_queue_async
from accord.checkpointers.ownership import ActiveRun, FailedTask
from accord.checkpointers.synchronous import saver_queue as saver_queue_sync
from accord.errors import ConcurrentRunError
from accord.platform import runs
from tests.checkpointers.conftest import KINDS, make_saver
from tests.checkpointers.test_ownership import Gate, _graph, _in_thread, _no_heartbeat


class Fan(TypedDict):
    log: Annotated[list[str], operator.add]


def _fan_graph(with_business: bool) -> StateGraph:
    """``START -> a -> (b, c, d) -> join``: parallel tasks, one of them (``c``) staging a
    business write when ``with_business``."""

    def node(name: str) -> Any:
        def run(state: Fan) -> dict[str, Any]:
            if with_business and name == "c":
                business.insert_one("orders", {"_id": f"order-{len(state['log'])}"})
            return {"log": [name]}

        return run

    g = StateGraph(Fan)
    for name in ("a", "b", "c", "d", "join"):
        g.add_node(name, node(name))
    g.add_edge(START, "a")
    for name in ("b", "c", "d"):
        g.add_edge("a", name)
    g.add_edge(["b", "c", "d"], "join")
    return g


def _history(graph: Any, cfg: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Each checkpoint's values, next nodes, step and pending writes (ids aside)."""
    return [
        (
            s.values,
            s.next,
            s.metadata.get("step") if s.metadata else None,
            sorted((t.name, tuple(sorted(map(str, t.result or {})))) for t in s.tasks),
        )
        for s in graph.get_state_history(cfg)
    ]


@pytest.mark.parametrize("with_business", [False, True])
def test_history_is_inmemorysavers(client: MongoClient, saver: Any, with_business: bool) -> None:
    """Three turns of a fan-out/fan-in graph under "async" durability store the history
    InMemorySaver stores, and each business write is applied once."""
    cfg = {"configurable": {"thread_id": "fan"}}
    ours = _fan_graph(with_business).compile(checkpointer=saver)
    reference = _fan_graph(False).compile(checkpointer=InMemorySaver())
    for _ in range(3):
        out = ours.invoke({"log": ["in"]}, cfg, durability="async")
        assert out == reference.invoke({"log": ["in"]}, cfg, durability="async")
    assert _history(ours, cfg) == _history(reference, cfg)
    orders = client[saver.business_db]["orders"].count_documents({})
    assert orders == (3 if with_business else 0)
    doc = client[saver.db_name].runs.find_one({"_id": runs.run_doc_id("default", "fan")})
    assert doc is not None and doc["lease_expires"] is None  # released at the end


def test_a_stale_owners_queued_saves_are_refused(
    client: MongoClient, saver_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under "async" durability a run that lost its lease while a node ran gets
    ConcurrentRunError from ``invoke`` (its queued saves were refused), and nothing of
    it is written after the takeover."""
    stale = saver_factory(lease_seconds=1.0)
    monkeypatch.setattr(stale.leases, "heartbeat", _no_heartbeat(stale))
    gate = Gate()
    cfg = {"configurable": {"thread_id": "stale-async"}}
    t, out = _in_thread(
        lambda: _graph(gate).compile(checkpointer=stale).invoke({"n": 0}, cfg, durability="async")
    )
    assert gate.started.wait(30)
    time.sleep(1.5)  # past the lease
    fresh = saver_factory()
    new = Gate()
    new.release.set()
    graph = _graph(new).compile(checkpointer=fresh)
    assert graph.invoke({"n": 50}, cfg) == {"n": 51}
    history = [s.values for s in graph.get_state_history(cfg)]
    gate.release.set()
    t.join(30)
    assert len(out) == 1 and isinstance(out[0], ConcurrentRunError), out
    assert "lost thread 'stale-async'" in str(out[0]), out[0]
    assert graph.get_state(cfg).values == {"n": 51}
    assert [s.values for s in graph.get_state_history(cfg)] == history


def test_taking_more_jobs_asks_about_tasks_without_the_mutex() -> None:
    """The drainer decides whether the next queued put joins its batch by asking the run
    about the parent's tasks (which takes the run's mutex): ``more_jobs`` must not hold
    the mutex meanwhile (it is not reentrant; an earlier attempt hung there)."""
    lease = runs.Lease("t", "th", "r", 1, "h", runs.now(), None)
    run = ActiveRun(lease, object(), threading.Lock())
    run.task_failed("", "c1", FailedTask("task", "node", RuntimeError("x")), "task")
    for job in ("j1", "j2", "j3"):
        run.enqueue(job)
    assert run.next_job() == "j1"
    taken: list[Any] = []

    def take() -> None:
        taken.append(run.more_jobs(lambda j: run.failed_task_of("", "c1") is not None, 5))

    worker = threading.Thread(target=take, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "more_jobs deadlocked on the run's mutex"
    assert taken == [["j2", "j3"]]
    assert not run.last_batch()  # the loop has not exited
    run.releasing = True
    assert run.last_batch()  # ... now it has, and nothing is queued behind the batch


def test_writes_queued_before_their_put_move_behind_it() -> None:
    """A task's writes can reach the queue before the put of their checkpoint (LangGraph
    hands the put over in another thread): the drainer moves them right behind that put,
    so they join its batch instead of stopping it (under load that cost a second
    transaction per invoke). Writes whose put is not queued stay where they are."""
    from types import SimpleNamespace as NS

    def put(cp: str) -> Any:
        return NS(task_id=None, checkpoint_id=cp, scope=NS(checkpoint_ns=""))

    def writes(cp: str, task: str) -> Any:
        return NS(task_id=task, checkpoint_id=cp, scope=NS(checkpoint_ns=""))

    lease = runs.Lease("t", "th", "r", 1, "h", runs.now(), None)
    run = ActiveRun(lease, object(), threading.Lock())
    w1, w2, p1, p2 = writes("c1", "t1"), writes("c1", "t2"), put("c1"), put("c2")
    for job in (w1, w2, p1, p2):
        run.enqueue(job)
    run.writes_behind_their_puts()
    assert list(run.jobs) == [p1, w1, w2, p2]
    run.writes_behind_their_puts()  # nothing left to move
    assert list(run.jobs) == [p1, w1, w2, p2]
    lone = ActiveRun(lease, object(), threading.Lock())
    w3 = writes("c9", "t3")
    for job in (w3, p2):
        lone.enqueue(job)
    lone.writes_behind_their_puts()
    assert list(lone.jobs) == [w3, p2]  # its put is not queued: _before_its_put waits


class _Commands(monitoring.CommandListener):
    """Counts the commands sent, by name."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.mark.parametrize("kind", KINDS)
def test_a_quick_invokes_saves_and_release_share_one_transaction(
    kind: str, mongo_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the loop runs tasks the drainer waits for the run's next save (here as long
    as it likes: 5 s), and the loop's exit ends the wait at once: an invoke's three puts,
    its tasks' writes and the lease's release commit in one transaction, with no
    separate release, and the invoke does not wait out the linger. (``START -> a``: five
    saves, within a transaction's limit of 8.)"""
    monkeypatch.setattr(saver_queue_async, "_LINGER", 5.0)
    monkeypatch.setattr(saver_queue_async, "_LINGER_MAX", 5.0)
    monkeypatch.setattr(saver_queue_sync, "_LINGER", 5.0)
    monkeypatch.setattr(saver_queue_sync, "_LINGER_MAX", 5.0)
    seen = _Commands()
    with make_saver(kind, mongo_uri, db_name, listeners=[seen], outbox_events=False) as saver:
        one = StateGraph(Fan)
        one.add_node("a", lambda state: {"log": ["a"]})
        one.add_edge(START, "a")
        graph = one.compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "quick"}}
        graph.invoke({"log": ["warm"]}, cfg, durability="async")
        seen.names.clear()
        started = time.monotonic()
        out = graph.invoke({"log": ["in"]}, cfg, durability="async")
        took = time.monotonic() - started
    assert out["log"] == ["warm", "a", "in", "a"]
    assert took < 2.5, f"the invoke waited out the linger ({took:.1f} s)"
    assert seen.names.count("commitTransaction") == 1, seen.names
    assert seen.names.count("bulkWrite") == 1, seen.names
    assert "update" not in seen.names, seen.names  # the release rode in the transaction
