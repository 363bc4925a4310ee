"""Write ownership across processes: two workers drive the same thread at the same time.

Each round starts two worker processes (``kill_worker.py race``) on the same graph and
thread; both wait at a file barrier right after LangGraph loaded the thread's head, so
both start from the same checkpoint. Exactly one finishes; the other gets
:class:`~accord.errors.ConcurrentRunError` naming the thread and saying what to do. The
thread's history stays one chain (every checkpoint's parent is the previous one, one
checkpoint per step, no fork left by the loser), nothing of the loser is half-written, and
business writes are never duplicated. Rounds cover starting a new thread, a new turn on a
finished thread, and resuming a thread stopped mid-turn (both writers then run the same
task), with both durability modes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
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


def race(uri: str, db_name: str, thread: str, turn: int, durabilities: tuple[str, str],
         workdir: Path, *, writes: str = "free") -> list[dict[str, Any]]:  # fmt: skip
    """Run two writers on ``thread`` at once (``turn`` 0: resume with ``invoke(None)``)."""
    barrier = workdir / "barrier"
    barrier.mkdir(parents=True)
    procs = []
    for role, durability in zip("ab", durabilities, strict=True):
        args = [
            "race", "--uri", uri, "--db", db_name, "--thread", thread,
            "--durability", durability, "--turn", str(turn), "--writes", writes,
            "--barrier", str(barrier), "--role", role,
            "--result", str(workdir / f"result-{role}.json"),
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
        )
    results = []
    try:
        for role, proc in zip("ab", procs, strict=True):
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"writer {role} crashed:\n{err}"
            results.append(json.loads((workdir / f"result-{role}.json").read_text()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


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
    where: str, turns: int,
) -> None:  # fmt: skip
    where = f"{where}: {results}"
    outcomes = sorted(r["outcome"] for r in results)
    assert outcomes == ["error", "finished"], where
    loser = next(r for r in results if r["outcome"] == "error")
    assert loser["concurrent"], f"{where}\n{loser.get('traceback')}"
    message = loser["message"]
    assert repr(thread) in message, f"the error should name the thread: {message}"
    assert re.search(r"reload the thread|only one worker may run a thread", message, re.I), (
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
        results = race(mongo_uri, race_db, thread, turn, durabilities, tmp_path / f"r{i}")
        check_round(client, saver, thread, results, f"round {i} {durabilities}", i + 1)


def test_two_processes_resume_the_same_interrupted_thread(
    mongo_uri: str, client: MongoClient, race_db: str, tmp_path: Path
) -> None:
    """Both writers resume a thread stopped mid-turn: both run the same task, both try
    to record it (a barrier makes sure), then race for the next checkpoint."""
    saver = AccordSaver(client, db_name=race_db)
    graph = build_graph(FakeChatModel()).compile(checkpointer=saver)
    thread = f"resume-{uuid.uuid4().hex[:6]}"
    cfg: RunnableConfig = {"configurable": {"thread_id": thread}}
    for i, durabilities in enumerate(RESUME_ROUNDS):
        # a new turn stopped after its first step
        graph.invoke({"messages": [human(i + 1)]}, cfg, interrupt_after=["model"])
        assert not finished(graph.get_state(cfg))
        results = race(
            mongo_uri, race_db, thread, 0, durabilities, tmp_path / f"r{i}", writes="together"
        )
        check_round(client, saver, thread, results, f"round {i} {durabilities}", i + 1)


def test_a_task_both_writers_ran_is_recorded_once(
    mongo_uri: str, client: MongoClient, race_db: str, tmp_path: Path
) -> None:
    """Both writers resume the same checkpoint and run the same task; ``a`` records it
    first, then ``b`` records the same task and saves the next checkpoint, then ``a`` tries.

    ``b``'s ``put_writes`` must not apply the task's business writes again (the task is
    already recorded), nor fail with a duplicate-key error from re-inserting the ledger
    document. Either it is a no-op and ``b`` wins the next checkpoint (``a`` gets
    ConcurrentRunError), or ``b`` is refused and then must not save a checkpoint built on
    the refused task (``a`` wins). Either way exactly one writer finishes.
    """
    saver = AccordSaver(client, db_name=race_db)
    graph = build_graph(FakeChatModel()).compile(checkpointer=saver)
    thread = f"same-task-{uuid.uuid4().hex[:6]}"
    cfg: RunnableConfig = {"configurable": {"thread_id": thread}}
    graph.invoke({"messages": [human(1)]}, cfg, interrupt_after=["model"])
    results = race(
        mongo_uri, race_db, thread, 0, ("sync", "sync"), tmp_path / "r", writes="a_first"
    )
    check_round(client, saver, thread, results, "a records first, then b", 1)
