"""Explicit ownership: one run writes a thread at a time (run registry, lease, fence).

Every test runs for both savers (``kind``). Two processes on one thread are in
``test_two_writers.py``; here two runs race in threads of one process, on two saver
instances (two workers) or one.
"""

from __future__ import annotations

import threading
import time
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from langgraph.graph import START, StateGraph
from pymongo import MongoClient

from accord.errors import ConcurrentRunError
from accord.platform import runs
from tests.checkpointers.conftest import config


class S(TypedDict):
    n: int


class Gate:
    """A node that signals it started, then waits until released."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, state: S) -> dict[str, Any]:
        self.calls += 1
        self.started.set()
        assert self.release.wait(60)
        return {"n": state["n"] + 1}


def _graph(node: Any) -> StateGraph:
    g = StateGraph(S)
    g.add_node("step", node)
    g.add_edge(START, "step")
    return g


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _says_what_and_what_to_do(exc: BaseException, thread: str) -> None:
    message = str(exc)
    assert repr(thread) in message, message
    assert "nothing of" in message, message
    assert "Only one run may write a thread at a time" in message, message
    assert "reload the thread's latest state" in message and "retry" in message, message


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_a_second_run_is_refused_before_it_runs_any_node(
    client: MongoClient, saver: Any, saver_factory: Any, durability: str
) -> None:
    """Two workers (saver instances) on one thread: while the first run works, the second
    is refused when LangGraph loads the thread, before any of its nodes runs, and
    nothing of it is written; once the first run ends, the thread is free again."""
    first, second = Gate(), Gate()
    second.release.set()
    other = saver_factory()
    cfg = {"configurable": {"thread_id": "busy"}}
    t, out = _in_thread(
        lambda: (
            _graph(first).compile(checkpointer=saver).invoke({"n": 0}, cfg, durability=durability)
        )
    )
    assert first.started.wait(30)
    with pytest.raises(ConcurrentRunError) as info:
        _graph(second).compile(checkpointer=other).invoke({"n": 100}, cfg, durability=durability)
    assert second.calls == 0  # refused before running any node
    _says_what_and_what_to_do(info.value, "busy")
    assert "being run by run" in str(info.value) and "held by" in str(info.value)
    # the same worker cannot start a second run on it either
    with pytest.raises(ConcurrentRunError):
        _graph(second).compile(checkpointer=saver).invoke({"n": 100}, cfg, durability=durability)
    first.release.set()
    t.join(30)
    assert out == [{"n": 1}]
    # released at the end of the run: the other worker continues the thread
    assert _graph(second).compile(checkpointer=other).invoke(None, cfg) == {"n": 1}
    assert _graph(second).compile(checkpointer=other).invoke({"n": 5}, cfg) == {"n": 6}
    assert second.calls == 1
    # nothing of the refused runs (input n=100) was ever written
    history = list(_graph(second).compile(checkpointer=other).get_state_history(cfg))
    assert history and all(s.values.get("n") != 100 for s in history)


def test_writes_that_belong_to_no_run_wait_for_the_run(
    client: MongoClient, saver: Any, saver_factory: Any
) -> None:
    """While a run holds the thread, ``update_state`` or a direct ``put`` (which belong to
    no run) are refused; reads work; after the run, both work."""
    gate = Gate()
    cfg = {"configurable": {"thread_id": "adhoc"}}
    graph = _graph(gate).compile(checkpointer=saver)
    gate.release.set()
    graph.invoke({"n": 0}, cfg, durability="sync")  # a first turn
    gate.release.clear()
    gate.started.clear()
    t, out = _in_thread(lambda: graph.invoke({"n": 10}, cfg, durability="sync"))
    assert gate.started.wait(30)
    other = saver_factory()
    other_graph = _graph(gate).compile(checkpointer=other)
    assert other_graph.get_state(cfg).values == {"n": 10}  # reads are never refused
    # (the run's own START task may still be recording its writes in the background:
    # what the refused calls would have written is looked for by what it is)
    with pytest.raises(ConcurrentRunError) as info:
        other_graph.update_state(cfg, {"n": 99})
    _says_what_and_what_to_do(info.value, "adhoc")
    cp = generate_checkpoint(channel_values={"n": 1}, channel_versions={"n": "1"})
    with pytest.raises(ConcurrentRunError):
        other.put(config("adhoc"), cp, generate_metadata(), {"n": "1"})
    with pytest.raises(ConcurrentRunError):
        other.put_writes(config("adhoc", cp["id"]), [("n", 1)], "task")
    for strategy in ("keep_latest", "delete"):  # "delete" took the thread over before
        with pytest.raises(ConcurrentRunError, match="prune"):
            other.prune(["adhoc"], strategy=strategy)
    db = client[saver.db_name]
    assert db.checkpoints.count_documents({"checkpoint_id": cp["id"]}) == 0
    assert db.checkpoint_writes.count_documents({"task_id": "task"}) == 0
    assert db.checkpoints.count_documents({"thread_id": "adhoc", "source": "update"}) == 0
    gate.release.set()
    t.join(30)
    assert out == [{"n": 11}]
    other_graph.update_state(cfg, {"n": 99})
    assert other_graph.get_state(cfg).values == {"n": 99}


def test_a_stale_owner_is_refused_at_commit(
    client: MongoClient, saver_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose worker stops renewing (paused past its lease) loses the thread to the
    next run; when it wakes up, its commits are refused by the fence: nothing of it is
    written after the takeover."""
    stale = saver_factory(lease_seconds=1.0)
    # the paused worker's heartbeat is paused too
    monkeypatch.setattr(stale.leases, "heartbeat", _no_heartbeat(stale))
    gate = Gate()
    cfg = {"configurable": {"thread_id": "stale"}}
    t, out = _in_thread(
        lambda: _graph(gate).compile(checkpointer=stale).invoke({"n": 0}, cfg, durability="sync")
    )
    assert gate.started.wait(30)
    time.sleep(1.5)  # past the lease
    fresh = saver_factory()
    new = Gate()
    new.release.set()
    assert _graph(new).compile(checkpointer=fresh).invoke({"n": 50}, cfg) == {"n": 51}
    history = [s.values for s in _graph(new).compile(checkpointer=fresh).get_state_history(cfg)]
    gate.release.set()  # the stale run wakes up and tries to record its step
    t.join(30)
    assert len(out) == 1 and isinstance(out[0], ConcurrentRunError), out
    message = str(out[0])
    assert "lost thread 'stale'" in message and "lease expired" in message, message
    _says_what_and_what_to_do(out[0], "stale")
    graph = _graph(new).compile(checkpointer=fresh)
    assert graph.get_state(cfg).values == {"n": 51}
    assert [s.values for s in graph.get_state_history(cfg)] == history


def _no_heartbeat(saver: Any) -> Any:
    if hasattr(saver, "_on_loop"):  # AsyncAccordSaver

        async def nothing() -> None:
            return None

        return nothing
    return lambda: None


def test_the_lease_is_renewed_while_a_long_step_runs(saver_factory: Any) -> None:
    """A step longer than the lease: the heartbeat keeps the thread held, so another
    worker is still refused after several lease periods, and the run completes."""
    long = saver_factory(lease_seconds=2.0)  # renewed every 0.67 s: a 1.3 s stall is borne
    other = saver_factory()
    gate = Gate()
    cfg = {"configurable": {"thread_id": "long"}}
    t, out = _in_thread(
        lambda: _graph(gate).compile(checkpointer=long).invoke({"n": 0}, cfg, durability="sync")
    )
    assert gate.started.wait(30)
    time.sleep(5.0)  # 2.5 lease periods without a commit
    idle = Gate()
    idle.release.set()
    with pytest.raises(ConcurrentRunError):
        _graph(idle).compile(checkpointer=other).invoke({"n": 100}, cfg)
    assert idle.calls == 0
    gate.release.set()
    t.join(30)
    assert out == [{"n": 1}]


def test_one_saver_serves_many_threads_and_sequential_runs(saver: Any) -> None:
    """Runs on different threads never block each other; consecutive runs on one thread
    (the normal case) never see a previous run as a live owner."""
    cfgs = [{"configurable": {"thread_id": f"t{i}"}} for i in range(3)]
    gates = [Gate() for _ in cfgs]
    started = [
        _in_thread(lambda g=g, c=c: _graph(g).compile(checkpointer=saver).invoke({"n": 0}, c))
        for g, c in zip(gates, cfgs, strict=True)
    ]
    for g in gates:
        assert g.started.wait(30)
        g.release.set()
    for t, out in started:
        t.join(30)
        assert out == [{"n": 1}]
    free = Gate()
    free.release.set()
    graph = _graph(free).compile(checkpointer=saver)
    for i in range(5):
        assert graph.invoke({"n": i}, cfgs[0]) == {"n": i + 1}


def test_returned_configs_are_exactly_langgraphs(saver: Any) -> None:
    """No extra keys in any config accord hands back (state, history, tuples, put)."""
    free = Gate()
    free.release.set()
    graph = _graph(free).compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": "cfg"}}
    graph.invoke({"n": 0}, cfg)
    keys = {"thread_id", "checkpoint_ns", "checkpoint_id"}
    state = graph.get_state(cfg)
    assert set(state.config["configurable"]) == keys
    for snap in graph.get_state_history(cfg):
        assert set(snap.config["configurable"]) == keys
        if snap.parent_config:
            assert set(snap.parent_config["configurable"]) == keys
    tup = saver.get_tuple(cfg)
    assert set(tup.config["configurable"]) == keys
    cp = generate_checkpoint(channel_values={"n": 1}, channel_versions={"n": "1"})
    assert set(saver.put(cfg, cp, generate_metadata(), {"n": "1"})["configurable"]) == keys


def test_run_registry_document(client: MongoClient, saver: Any) -> None:
    """The registry records the run, its fence and lease; a released lease has no expiry."""
    free = Gate()
    free.release.set()
    graph = _graph(free).compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": "reg"}}
    run_id = "11111111-1111-1111-1111-111111111111"
    graph.invoke({"n": 0}, {**cfg, "run_id": run_id})
    doc = client[saver.db_name].runs.find_one({"_id": runs.run_doc_id("default", "reg")})
    assert doc is not None and doc["run_id"] == run_id  # LangGraph's run id when given
    graph.invoke({"n": 0}, cfg)
    doc = client[saver.db_name].runs.find_one({"_id": runs.run_doc_id("default", "reg")})
    assert doc is not None and doc["fence"] == 2 and doc["lease_expires"] is None
    assert doc["run_id"].startswith("accord-")  # minted: the second run gave no run_id
    assert doc["thread_id"] == "reg" and doc["tenant_id"] == "default"


def test_concurrent_run_errors_are_built_in_one_place() -> None:
    """Every ConcurrentRunError of the checkpointer comes from ownership.py's builders (whose
    messages the tests above check) or repeats one of their messages (failures.py)."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "accord" / "checkpointers"
    sites = {
        p.relative_to(root).as_posix(): p.read_text().count("ConcurrentRunError(")
        for p in root.rglob("*.py")
        if "ConcurrentRunError(" in p.read_text()
    }
    assert sites == {"ownership.py": 5, "failures.py": 1}, sites
