"""Ownership across processes: two worker processes on one thread.

* **Simultaneous starts** (``kill_worker.py race``): two workers wait at a file barrier
  right before LangGraph loads the thread, so both claim it at the same moment. Exactly
  one runs; the other gets :class:`~accord.errors.ConcurrentRunError` naming the thread
  and saying what to do, *before running any node*. Rounds start a new thread, add a turn
  to a finished one, and resume a thread stopped mid-turn, under both durability modes.
* **A live owner**: the first worker holds its first node; a second worker started then
  is refused before any node runs; the first finishes.
* **A stale owner**: the first worker (lease 1 s) is SIGSTOPped inside a node, longer than
  its lease; a second worker takes the thread and finishes the turn; the first is
  SIGCONTed and its next commit is refused by the fence: nothing of it is written.

After each: the thread's history is one chain (one checkpoint per step, no fork, nothing
orphaned) and business writes exist exactly once.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from pymongo import MongoClient

from accord.checkpointers import AccordSaver, CollectionNames
from tests.checkpointers import kill_worker
from tests.checkpointers.conftest import register_consumer
from tests.checkpointers.kill_worker import (
    STEPS_PER_TURN,
    FakeChatModel,
    build_graph,
    finished,
    human,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORKER = Path(__file__).with_name("kill_worker.py")
ROOT = Path(__file__).resolve().parents[2]
NAMES = CollectionNames()

#: (turn, durabilities of the two writers): both start a brand-new thread, then both add
#: a turn to the finished thread
NEW_RUN_ROUNDS: list[tuple[int, tuple[str, str]]] = [
    (1, ("sync", "async")),
    (2, ("async", "async")),
    (3, ("sync", "sync")),
    (4, ("async", "sync")),
]
#: durabilities of the two writers that resume a thread stopped mid-turn
RESUME_ROUNDS: list[tuple[str, str]] = [("sync", "sync"), ("async", "async"), ("sync", "async")]


def spawn(uri: str, db_name: str, thread: str, turn: int, durability: str, workdir: Path,
          role: str, *, barrier: bool = True, hold: Path | None = None,
          lease: float = 30.0, saver: str = "sync") -> subprocess.Popen[str]:  # fmt: skip
    args = [
        "race", "--uri", uri, "--db", db_name, "--thread", thread,
        "--durability", durability, "--turn", str(turn), "--role", role,
        "--result", str(workdir / f"result-{role}.json"), "--lease", str(lease),
        "--saver", saver,
    ]  # fmt: skip
    if barrier:
        args += ["--barrier", str(workdir / "barrier")]
    if hold is not None:
        args += ["--hold", str(hold)]
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def collect(procs: dict[str, subprocess.Popen[str]], workdir: Path) -> list[dict[str, Any]]:
    results = []
    try:
        for role, proc in procs.items():
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"writer {role} crashed:\n{err}"
            results.append(json.loads((workdir / f"result-{role}.json").read_text()))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def race(uri: str, db_name: str, thread: str, turn: int, durabilities: tuple[str, str],
         workdir: Path, savers: tuple[str, str] = ("sync", "async"),
         ) -> list[dict[str, Any]]:  # fmt: skip
    """Run two writers on ``thread`` at once (``turn`` 0: resume with ``invoke(None)``),
    ``a`` on the first of ``savers``, ``b`` on the second (AccordSaver / AsyncAccordSaver)."""
    (workdir / "barrier").mkdir(parents=True)
    procs = {
        role: spawn(uri, db_name, thread, turn, durability, workdir, role, saver=kind)
        for role, durability, kind in zip("ab", durabilities, savers, strict=True)
    }
    return collect(procs, workdir)


def check_thread(client: MongoClient, saver: AccordSaver, thread: str) -> list[Any]:
    """One chain, one checkpoint per step, nothing orphaned, no duplicated side effect."""
    db = client[saver.db_name]
    cfg: RunnableConfig = {"configurable": {"thread_id": thread}}
    history = list(reversed(list(saver.list(cfg))))  # oldest first
    assert history and history[0].parent_config is None
    for older, newer in zip(history, history[1:], strict=False):
        assert newer.parent_config is not None, "a second root"
        assert (
            newer.parent_config["configurable"]["checkpoint_id"]
            == older.config["configurable"]["checkpoint_id"]
        ), "the history forked"
        assert newer.metadata["step"] == older.metadata["step"] + 1, "two checkpoints per step"
    ids = sorted(t.config["configurable"]["checkpoint_id"] for t in history)
    for coll in (NAMES.writes, NAMES.outbox):
        stray = db[coll].distinct(
            "checkpoint_id", {"thread_id": thread, "checkpoint_id": {"$nin": ids}}
        )
        assert not stray, f"{coll} of checkpoints that were never saved: {stray}"
    messages = history[-1].checkpoint["channel_values"]["messages"]
    ai = [m for m in messages if isinstance(m, AIMessage)]
    assert [m.id for m in ai] == [f"ai-{n}" for n in range(1, len(ai) + 1)]
    stored = Counter(
        d["message_id"] for d in db[NAMES.messages].find({"thread_id": thread, "chunk": 0})
    )
    assert stored == Counter(m.id for m in messages), "short-term memory differs from the state"
    # every step's business writes exactly once: the ledger insert and the $inc/$push
    steps = sorted(d["step"] for d in db.ledger.find({"thread": thread}))
    pending = {m.id for _, ch, v in history[-1].pending_writes or [] if ch == "messages" for m in v}
    expected = len(ai) + (f"ai-{len(ai) + 1}" in pending)
    assert steps == list(range(1, expected + 1)), steps
    counter = db.counters.find_one({"_id": thread})
    assert counter is not None and counter["n"] == expected and counter["steps"] == steps
    return history


def check_round(
    client: MongoClient, saver: AccordSaver, thread: str, results: list[dict[str, Any]],
    where: str, turns: int, *, loser_nodes: int = 0,
) -> None:  # fmt: skip
    where = f"{where}: {results}"
    outcomes = sorted(r["outcome"] for r in results)
    assert outcomes == ["error", "finished"], where
    loser = next(r for r in results if r["outcome"] == "error")
    assert loser["concurrent"], f"{where}\n{loser.get('traceback')}"
    assert loser["nodes"] == loser_nodes, f"the loser ran nodes: {where}"
    message = loser["message"]
    assert repr(thread) in message, f"the error should name the thread: {message}"
    assert re.search(r"reload the thread's latest state", message) and "retry" in message, (
        f"the error should say what to do: {message}"
    )
    check_thread(client, saver, thread)
    graph = build_graph(FakeChatModel()).compile(checkpointer=saver)
    state = graph.get_state({"configurable": {"thread_id": thread}})
    assert finished(state), where
    ai = [m for m in state.values["messages"] if isinstance(m, AIMessage)]
    assert len(ai) == turns * STEPS_PER_TURN, where


@pytest.fixture()
def race_db(client: MongoClient) -> Iterator[str]:
    name = "race_" + uuid.uuid4().hex[:10]
    register_consumer(client, name)  # the workers' savers write outbox events (checked)
    AccordSaver(client, db_name=name).setup()
    try:
        yield name
    finally:
        client.drop_database(name)


def test_two_processes_start_or_extend_the_same_thread(
    mongo_uri: str, client: MongoClient, race_db: str, tmp_path: Path
) -> None:
    """Both writers load the same head (none, then a finished turn) and start a run."""
    saver = AccordSaver(client, db_name=race_db)
    thread = f"race-{uuid.uuid4().hex[:6]}"
    for i, (turn, durabilities) in enumerate(NEW_RUN_ROUNDS):
        savers = ("sync", "async") if i % 2 == 0 else ("async", "sync")
        results = race(mongo_uri, race_db, thread, turn, durabilities, tmp_path / f"r{i}", savers)
        check_round(client, saver, thread, results, f"round {i} {durabilities} {savers}", i + 1)


def test_two_processes_resume_the_same_interrupted_thread(
    mongo_uri: str, client: MongoClient, race_db: str, tmp_path: Path
) -> None:
    """Both writers resume a thread stopped mid-turn at the same moment: one runs the
    rest of the turn, the other is refused before running anything."""
    saver = AccordSaver(client, db_name=race_db)
    graph = build_graph(FakeChatModel()).compile(checkpointer=saver)
    thread = f"resume-{uuid.uuid4().hex[:6]}"
    cfg: RunnableConfig = {"configurable": {"thread_id": thread}}
    for i, durabilities in enumerate(RESUME_ROUNDS):
        # a new turn stopped after its first step
        graph.invoke({"messages": [human(i + 1)]}, cfg, interrupt_after=["model"])
        assert not finished(graph.get_state(cfg))
        savers = ("async", "sync") if i % 2 == 0 else ("sync", "async")
        results = race(mongo_uri, race_db, thread, 0, durabilities, tmp_path / f"r{i}", savers)
        check_round(client, saver, thread, results, f"round {i} {durabilities} {savers}", i + 1)


@pytest.mark.parametrize("first_saver", ["sync", "async"])
def test_a_second_process_is_refused_while_the_first_runs(
    mongo_uri: str, client: MongoClient, race_db: str, tmp_path: Path, first_saver: str
) -> None:
    """The first worker is inside its first node; a second worker (on the other saver)
    started now is refused before it runs any node; then the first finishes the turn."""
    saver = AccordSaver(client, db_name=race_db)
    thread = f"live-{uuid.uuid4().hex[:6]}"
    hold = tmp_path / "go"
    second_saver = "async" if first_saver == "sync" else "sync"
    first = spawn(
        mongo_uri, race_db, thread, 1, "async", tmp_path, "a", barrier=False, hold=hold,
        saver=first_saver,
    )  # fmt: skip
    kill_worker.wait_for(tmp_path, "go.a.in-node", timeout=60)
    second = spawn(
        mongo_uri, race_db, thread, 1, "sync", tmp_path, "b", barrier=False, saver=second_saver
    )
    [late] = collect({"b": second}, tmp_path)
    hold.touch()
    [done] = collect({"a": first}, tmp_path)
    check_round(client, saver, thread, [done, late], "second while first runs", 1)
    assert "being run by run" in late["message"], late["message"]


@pytest.mark.parametrize("stale_saver", ["sync", "async"])
def test_a_stale_owner_paused_past_its_lease_is_refused_at_commit(
    mongo_uri: str, client: MongoClient, race_db: str, tmp_path: Path, stale_saver: str
) -> None:
    """SIGSTOP the owner inside a node for longer than its lease (1 s); another worker
    takes the thread over and finishes the turn; SIGCONT: the paused worker's next
    commit is refused by the fence and nothing of it is written."""
    saver = AccordSaver(client, db_name=race_db)
    thread = f"stale-{uuid.uuid4().hex[:6]}"
    hold = tmp_path / "go"
    stale = spawn(
        mongo_uri, race_db, thread, 1, "sync", tmp_path, "a", barrier=False, hold=hold,
        lease=1.0, saver=stale_saver,
    )  # fmt: skip
    kill_worker.wait_for(tmp_path, "go.a.in-node", timeout=60)  # inside its first node
    # its saves before the node are committed (two checkpoints, the input task's two
    # writes, which LangGraph may still be saving while the node begins): a worker
    # paused in the middle of a commit would hold its transaction's locks until the
    # server's transaction lifetime ends
    db = client[race_db]
    deadline = time.monotonic() + 60
    while (db[NAMES.checkpoints].count_documents({"thread_id": thread}) < 2
           or db[NAMES.writes].count_documents({"thread_id": thread}) < 2):  # fmt: skip
        assert time.monotonic() < deadline, "the worker's first saves never came"
        time.sleep(0.01)
    stale.send_signal(signal.SIGSTOP)  # the whole process, its lease heartbeat included
    try:
        time.sleep(2.0)  # past the lease
        fresh = spawn(mongo_uri, race_db, thread, 0, "sync", tmp_path, "b", barrier=False)
        [winner] = collect({"b": fresh}, tmp_path)
        assert winner["outcome"] == "finished", winner
        before = check_thread(client, saver, thread)
    finally:
        hold.touch()  # when it wakes up, its node returns at once
        stale.send_signal(signal.SIGCONT)
    [loser] = collect({"a": stale}, tmp_path)
    assert loser["outcome"] == "error" and loser["concurrent"], loser
    assert "lost thread" in loser["message"] and "lease expired" in loser["message"], loser
    after = check_thread(client, saver, thread)
    assert [t.config for t in after] == [t.config for t in before]  # nothing of it written
    graph = build_graph(FakeChatModel()).compile(checkpointer=saver)
    state = graph.get_state({"configurable": {"thread_id": thread}})
    assert finished(state)
    assert len([m for m in state.values["messages"] if isinstance(m, AIMessage)]) == STEPS_PER_TURN
