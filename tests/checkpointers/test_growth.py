"""Storage and write volume over a long conversation grow linearly, not quadratically.

A 200-turn chat (one HumanMessage in, one AIMessage out per turn, ``graph.invoke`` per
turn, LangGraph's default durability). A save must send only what is new: the number of
write operations per ``invoke`` (ops in the bulkWrite/insert/update/delete commands, seen
through pymongo command monitoring; the run registry's lease ops aside) does not grow with the turn number, and the bytes
stored in each of the checkpointer's collections at 200 turns stay within ~2.3x of the
bytes at 100 turns (2x is linear; 4x would be quadratic).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
from collections import Counter
from typing import Annotated, Any, TypedDict

import pytest
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pymongo import AsyncMongoClient, MongoClient, monitoring

from accord.checkpointers import AccordSaver, AsyncAccordSaver, CollectionNames
from tests.checkpointers.conftest import unique_db

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TURNS = 200
EARLY = range(15, 26)  # turns around 20
LATE = range(175, 186)  # turns around 180
#: bytes at 200 turns / bytes at 100 turns, per collection: linear growth gives ~2
MAX_GROWTH = 2.3
_WRITE_DOCS = {"insert": "documents", "update": "updates", "delete": "deletes"}
_READS = {"find", "getMore", "aggregate", "count"}
#: The run registry: its ops (the lease guard leading each transaction, the claim and the
#: release) are not counted: how many transactions a run's queued "async"-durability
#: saves share depends on timing, not on the history.
_RUNS = CollectionNames().runs


def _target(op: Any) -> int:
    """The ``nsInfo`` index a client bulkWrite op writes to."""
    return next(op[k] for k in ("insert", "update", "delete") if k in op)


class WriteOps(monitoring.CommandListener):
    """Counts write operations (and commands) sent while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.ops = 0
        self.commands: Counter[str] = Counter()
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if not self.on:
            return
        cmd = event.command
        if event.command_name == "bulkWrite":
            registry = {
                i for i, ns in enumerate(cmd.get("nsInfo", ())) if ns["ns"].endswith(f".{_RUNS}")
            }
            n = sum(1 for op in cmd.get("ops", ()) if _target(op) not in registry)
        elif event.command_name in _WRITE_DOCS and cmd.get(event.command_name) != _RUNS:
            n = len(cmd.get(_WRITE_DOCS[event.command_name], ()))
        else:
            n = 0
        with self._lock:
            self.ops += n
            self.commands[event.command_name] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def split(self) -> tuple[int, int]:
        """(read commands, write commands) sent since the last reset."""
        with self._lock:
            reads = sum(n for name, n in self.commands.items() if name in _READS)
            return reads, sum(self.commands.values()) - reads

    def reset(self) -> None:
        with self._lock:
            self.ops = 0
            self.commands.clear()


class Chat(TypedDict):
    messages: Annotated[list, add_messages]


def model(state: Chat) -> dict[str, Any]:
    n = len(state["messages"]) // 2 + 1
    return {"messages": [AIMessage(f"reply {n}: " + "lorem ipsum " * 15, id=f"ai-{n}")]}


def chat_graph() -> StateGraph:
    g = StateGraph(Chat)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g


def human(n: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(f"question {n}: what next?", id=f"h-{n}")]}


def collection_bytes(client: MongoClient, db_name: str) -> dict[str, int]:
    db = client.get_database(db_name, codec_options=CodecOptions(document_class=RawBSONDocument))
    return {
        name: sum(len(d.raw) for d in db[name].find({}, batch_size=10_000))
        for name in CollectionNames().all().values()
    }


def check(
    ops: dict[int, int],
    commands: dict[int, tuple[int, int]],
    sizes: dict[int, dict[str, int]],
) -> None:
    """``commands``: (reads, writes) per turn."""
    early = statistics.mean(ops[n] for n in EARLY)
    late = statistics.mean(ops[n] for n in LATE)
    assert late <= early, f"write ops per invoke grew: ~{early} at turn 20, ~{late} at 180"
    assert max(ops[n] for n in range(10, TURNS + 1)) == min(ops[n] for n in range(10, TURNS + 1))
    # commands: reads the same count, give or take a timing-dependent extra one (one
    # put_writes may find its checkpoint's put still in flight under "async" durability);
    # writes at most one transaction per save (3 puts, 2 put_writes) plus the claim and
    # the release: fewer when the run's queued saves share transactions, which depends on
    # timing, not on the history
    assert (
        statistics.mean(commands[n][0] for n in LATE)
        <= statistics.mean(commands[n][0] for n in EARLY) + 1
    )
    assert max(commands[n][1] for n in range(1, TURNS + 1)) <= 2 * (3 + 2) + 2
    for name, at100 in sizes[100].items():
        at200 = sizes[200][name]
        assert at200 <= MAX_GROWTH * max(at100, 1), (name, at100, at200, at200 / max(at100, 1))
    total = {n: sum(s.values()) for n, s in sizes.items()}
    assert total[200] <= MAX_GROWTH * total[100], total


def test_sync_saver_grows_linearly(mongo_uri: str, client: MongoClient, db_name: str) -> None:
    listener = WriteOps()
    counted: MongoClient = MongoClient(mongo_uri, event_listeners=[listener])
    try:
        saver = AccordSaver(counted, db_name=db_name)
        saver.setup()
        graph = chat_graph().compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "long"}}
        ops: dict[int, int] = {}
        commands: dict[int, tuple[int, int]] = {}
        sizes: dict[int, dict[str, int]] = {}
        for n in range(1, TURNS + 1):
            listener.reset()
            listener.on = True
            out = graph.invoke(human(n), cfg)
            listener.on = False
            ops[n], commands[n] = listener.ops, listener.split()
            if n in (100, 200):
                assert len(out["messages"]) == 2 * n
                sizes[n] = collection_bytes(client, db_name)
        check(ops, commands, sizes)
    finally:
        counted.close()


def test_async_saver_grows_linearly(mongo_uri: str, client: MongoClient) -> None:
    listener = WriteOps()
    name = unique_db()
    ops: dict[int, int] = {}
    commands: dict[int, tuple[int, int]] = {}
    sizes: dict[int, dict[str, int]] = {}

    async def main() -> None:
        counted: AsyncMongoClient = AsyncMongoClient(mongo_uri, event_listeners=[listener])
        try:
            saver = AsyncAccordSaver(counted, db_name=name)
            await saver.setup()
            graph = chat_graph().compile(checkpointer=saver)
            cfg = {"configurable": {"thread_id": "long"}}
            for n in range(1, TURNS + 1):
                listener.reset()
                listener.on = True
                await graph.ainvoke(human(n), cfg)
                listener.on = False
                ops[n], commands[n] = listener.ops, listener.split()
                if n in (100, 200):
                    sizes[n] = collection_bytes(client, name)
        finally:
            await counted.close()

    try:
        asyncio.run(main())
        check(ops, commands, sizes)
    finally:
        client.drop_database(name)
