"""Forgetting a deleted thread leaves the long-term memories a legal hold covers
(docs/governance.md, "Legal holds"; accord/memory/asynchronous/forgetting.py): a hold by
class (``long_term_memory``, ``memory_history``, ``memory_vector``), by tenant, or by a
subject the memory's namespace names. Unheld memories of the thread are forgotten as
before; the event waits (pending again after ``hold_recheck``, never dead-lettered) and,
once the hold is released, forgets what it kept. A hold placed between the forgetter's
read and its commit is seen by governance's hold guard in the commit's transaction: the
forgetter decides again and leaves the memory.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph
from pymongo import MongoClient
from pymongo.monitoring import CommandListener, CommandStartedEvent

from accord import runtime
from accord.governance import subjects
from accord.governance.holding import place, release
from accord.governance.holds import Hold
from accord.memory import forgetting
from accord.memory.aggregation import AggregatorConfig
from accord.platform.context import Principal
from accord.runtime import Accord


def _chat() -> Any:
    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("Noted.")]}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    return builder


def _hold(client: MongoClient, db: str, hold: Hold) -> None:
    admin = runtime.kernel(client, principal=Principal.os_user())
    place(admin, db, hold, runtime.effective_policy(admin, db))


def _release(client: MongoClient, db: str, hold: Hold) -> None:
    admin = runtime.kernel(client, principal=Principal.os_user())
    release(admin, db, hold, runtime.effective_policy(admin, db))


#: How long a thread_deleted event waits for a hold here (the default is an hour).
RECHECK = 1.0


def _setup(client: MongoClient, db: str, on_stage: Any = None) -> tuple[Any, Any]:
    acc = Accord(client=client, db_name=db)
    saver = acc.checkpointer()
    graph = _chat().compile(checkpointer=saver)
    config = AggregatorConfig(db_name=db, hold_recheck=RECHECK)
    aggregator = acc.aggregator(config, on_stage=on_stage)
    for thread, user, text in (
        ("a-1", "alice", "Remember that I am vegetarian."),
        ("b-1", "bob", "Remember that I live in Oslo."),
    ):
        graph.invoke(
            {"messages": [HumanMessage(text)]},
            {"configurable": {"thread_id": thread, "user_id": user}},
        )
    aggregator.drain()
    return saver, aggregator


def _texts(client: MongoClient, db: str) -> set[str]:
    return {m["text"] for m in client[db].long_term_memory.find({}, {"text": 1})}


def _events(client: MongoClient, db: str) -> list[str]:
    return [e["status"] for e in client[db].outbox.find({"kind": "thread_deleted"})]


@pytest.mark.parametrize(
    "holds",
    [
        [Hold("class", "long_term_memory"), Hold("class", "memory_history")],
        [Hold("class", "long_term_memory")],
        [Hold("class", "memory_vector")],
        [Hold("tenant", "default")],
        [Hold("subject", "alice")],
    ],
    ids=["class-both", "class-memory", "class-vector", "tenant", "subject"],
)
def test_forgetting_a_deleted_thread_leaves_held_memories(
    client: MongoClient, db: Any, holds: list[Hold]
) -> None:
    saver, aggregator = _setup(client, db.name)
    before = _texts(client, db.name)
    assert "I am vegetarian" in before
    vectors = db.memory_vectors.count_documents({})
    # a hold by tenant or subject holds the thread too (its checkpoints name alice):
    # placed after its deletion; a class hold on memories does not hold the thread
    after_deletion = holds[0].kind in ("tenant", "subject")
    if not after_deletion:
        for hold in holds:
            _hold(client, db.name, hold)
    saver.delete_thread("a-1")
    if after_deletion:
        for hold in holds:
            _hold(client, db.name, hold)
    aggregator.drain()
    after = _texts(client, db.name)
    assert "I am vegetarian" in after, "a held memory was forgotten"
    if holds[0].kind == "subject":  # alice's memory is held; the thread's episode is not
        assert not any(t.startswith("Conversation a-1") for t in after)
        assert db.memory_vectors.count_documents({}) == vectors - 1
    else:
        assert after == before
        assert db.memory_vectors.count_documents({}) == vectors
    # the event waits for the hold: pending again later, never dead-lettered
    (event,) = db.outbox.find({"kind": "thread_deleted"})
    assert event["status"] == "pending" and event["held_memories"] >= 1
    time.sleep(RECHECK + 0.2)
    aggregator.drain()  # decided again, still held: waits again, attempts from 0
    (event,) = db.outbox.find({"kind": "thread_deleted"})
    assert (event["status"], event["attempts"]) == ("pending", 0)
    assert "I am vegetarian" in _texts(client, db.name)
    # released: at the next recheck what the hold kept is forgotten, and the event done
    for hold in holds:
        _release(client, db.name, hold)
    aggregator.drain()
    assert "I am vegetarian" in _texts(client, db.name)  # (not before the recheck)
    time.sleep(RECHECK + 0.2)
    aggregator.drain()
    final = _texts(client, db.name)
    assert "I am vegetarian" not in final
    assert not any(t.startswith("Conversation a-1") for t in final)
    assert "I live in Oslo" in final
    (event,) = db.outbox.find({"kind": "thread_deleted"})
    assert (event["status"], event["held_memories"]) == ("done", 0)


def test_unheld_memories_are_still_forgotten(client: MongoClient, db: Any) -> None:
    saver, aggregator = _setup(client, db.name)
    _hold(client, db.name, Hold("subject", "bob"))  # another subject
    saver.delete_thread("a-1")
    aggregator.drain()
    after = _texts(client, db.name)
    assert "I am vegetarian" not in after
    assert "I live in Oslo" in after
    assert _events(client, db.name) == ["done"]


def test_a_hold_placed_before_the_commit_is_seen_by_the_guard(client: MongoClient, db: Any) -> None:
    """The hold lands after the forgetter read the holds and decided: governance's hold
    guard reads it in the commit's transaction and refuses; the forgetter decides again."""
    placed: list[str] = []

    def stage(name: str, event: Any) -> None:
        if name == "commit" and event.kind == "thread_deleted" and not placed:
            placed.append(name)
            _hold(client, db.name, Hold("subject", "alice"))

    saver, aggregator = _setup(client, db.name, on_stage=stage)
    saver.delete_thread("a-1")
    aggregator.drain()
    assert placed
    assert "I am vegetarian" in _texts(client, db.name)
    assert _events(client, db.name) == ["pending"]  # waiting for the hold


class _InLists(CommandListener):
    """The length of every ``$in`` list on a memory or event id (``_id``, ``memory_id``)
    in a command's filters."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def started(self, event: CommandStartedEvent) -> None:
        self.lengths += _id_lists(dict(event.command))

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        pass


def _id_lists(value: Any) -> list[int]:
    if isinstance(value, Mapping):
        found = []
        for key, item in value.items():
            if key in ("_id", "memory_id") and isinstance(item, Mapping):
                listed = item.get("$in")
                if isinstance(listed, list):
                    found.append(len(listed))
            found += _id_lists(item)
        return found
    if isinstance(value, list | tuple):
        return [n for item in value for n in _id_lists(item)]
    return []


def test_no_command_of_forgetting_lists_more_than_a_page(
    mongo_uri: str, client: MongoClient, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread with more derived memories than a page, some held: every ``$in`` list of
    memory or event ids in the forgetter's commands (its reads of the memories, their
    history and what the holds cover, and its plan) holds at most a page, and the held
    memories are still found exactly (every page is read). A page of 2 stands for the
    1,000 of production. Before 2026-12-08 ``_held`` and ``_decide_all`` read every memory
    of the thread in one ``$in``."""
    monkeypatch.setattr(forgetting, "PAGE", 2)
    monkeypatch.setattr(subjects, "PAGE", 2)  # (governance's hold guard, same commands)
    listener = _InLists()
    watched: MongoClient = MongoClient(mongo_uri, event_listeners=[listener])
    try:
        acc = Accord(client=watched, db_name=db.name)
        saver = acc.checkpointer()
        graph = _chat().compile(checkpointer=saver)
        aggregator = acc.aggregator(AggregatorConfig(db_name=db.name, hold_recheck=RECHECK))
        facts = [f"I like colour {n}" for n in range(5)]
        for thread, user, texts in (("a-1", "alice", facts),
                                    ("b-1", "bob", ["I live in Oslo"])):  # fmt: skip
            for text in texts:
                graph.invoke(
                    {"messages": [HumanMessage(f"Remember that {text}.")]},
                    {"configurable": {"thread_id": thread, "user_id": user}},
                )
        aggregator.drain()
        before = _texts(client, db.name)
        assert set(facts) <= before
        mine = db.long_term_memory.count_documents({"provenance.thread_id": "a-1"})
        assert mine > len(facts) > 2
        saver.delete_thread("a-1")
        _hold(client, db.name, Hold("subject", "alice"))  # (it would refuse the deletion)
        listener.lengths.clear()
        aggregator.drain()
        assert listener.lengths, "no list of ids was read"
        assert max(listener.lengths) <= 2, listener.lengths
    finally:
        watched.close()
    after = _texts(client, db.name)
    assert after == before - {t for t in before if t.startswith("Conversation a-1")}
    assert set(facts) <= after and "I live in Oslo" in after
    (event,) = db.outbox.find({"kind": "thread_deleted"})
    assert (event["status"], event["held_memories"]) == ("pending", len(facts))


def test_forgetting_writes_list_at_most_a_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forgetting plan's ``delete_many`` of history versions and the fence on the
    thread's other events are split into operations of a page each (one group: one
    transaction, the counts summed), and together still name every id."""
    monkeypatch.setattr(forgetting, "PAGE", 2)

    def mem(i: int) -> dict[str, Any]:
        return {"_id": f"m{i}", "version": 1, "updated_at": None}

    decided = forgetting.Forgetting(
        delete=[mem(i) for i in range(5)],
        restore=[(mem(i), {"_id": f"h{i}"}) for i in range(5, 8)],
        prune=["m8", "m9"],
    )
    groups = forgetting.groups("t", "default", decided, {}, db="d", memories="m", history="h")
    (old,) = [g for g in groups if g.name == "forget:history"]
    many = [(op.filter or {})["memory_id"]["$in"] for op in old.ops if op.kind == "delete_many"]
    assert all(len(ids) <= 2 for ids in many), many
    assert sorted(i for ids in many for i in ids) == sorted(f"m{i}" for i in range(10))
    fence = forgetting.not_yet_done_guard("d", "outbox", [f"e{i}" for i in range(5)])
    lists = [(op.filter or {})["_id"]["$in"] for op in fence.ops]
    assert all(len(ids) <= 2 for ids in lists) and sum(lists, []) == [f"e{i}" for i in range(5)]
    assert fence.expect is not None and fence.expect.matched == 0
