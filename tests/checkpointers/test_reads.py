"""Read path: constant queries for get_tuple on long threads, no N+1 in list."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import bson
import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from pymongo import MongoClient, monitoring

from accord.checkpointers import AccordSaver, storage
from accord.checkpointers.storage import Scope
from accord.platform.plan import Op
from tests.checkpointers.conftest import KINDS, config, make_saver

#: the collections governance's refresh phase re-reads every few seconds, whatever the
#: saver does (the stored policy and legal holds; docs/governance.md): not counted here
GOVERNANCE_REFRESH = ("accord_policies", "accord_holds")
_IGNORED = ("hello", "isMaster", "ismaster", "endSessions")


class Recorder(monitoring.CommandListener):
    """Commands the saver sent (name, command) and the bytes of their replies."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, dict[str, Any]]] = []
        self.reply_bytes = 0
        self._skipped: set[int] = set()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command.get(event.command_name) in GOVERNANCE_REFRESH:
            self._skipped.add(event.request_id)
        elif event.command_name not in _IGNORED:
            self.commands.append((event.command_name, dict(event.command)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.request_id in self._skipped:
            self._skipped.discard(event.request_id)
        elif event.command_name not in _IGNORED:
            self.reply_bytes += len(bson.encode(event.reply))

    def failed(self, event: Any) -> None: ...


def _seed_thread(saver: AccordSaver, thread: str, n: int) -> list[str]:
    """Write ``n`` chained checkpoints straight into the collections (fast), exactly as
    ``put`` would lay them out, each with a new message and one pending write."""
    scope = Scope(saver.tenant_id, thread, "")
    docs: dict[str, list[dict[str, Any]]] = {
        "checkpoints": [],
        "blobs": [],
        "messages": [],
        "writes": [],
    }
    ids: list[str] = []
    msgs: list[Any] = []
    counter_v: Any = None
    parent: Any = None

    def raw(op: Op) -> dict[str, Any]:
        assert op.filter is not None and op.doc is not None
        body = op.doc.get("$setOnInsert", op.doc)  # type: ignore[union-attr]
        return {"_id": op.filter["_id"], **body}

    for i in range(n):
        msgs = [*msgs, HumanMessage(f"m{i}", id=f"m{i}")]
        counter_v = saver.get_next_version(counter_v, None)
        versions = {"messages": counter_v, "counter": counter_v}
        cp = generate_checkpoint(
            channel_values={"messages": msgs, "counter": i}, channel_versions=versions
        )
        put = storage.build_put(
            scope,
            cp,
            generate_metadata(step=i),
            versions,
            ids[-1] if ids else None,
            serde=saver.serde,
            chunk_size=saver.chunk_size,
            message_channels=saver.message_channels,
            parent=parent,
        )
        parent = put.entry
        docs["checkpoints"].append(raw(put.checkpoint))
        docs["blobs"].extend(raw(op) for op in put.blobs)
        docs["messages"].extend(raw(op) for op in put.messages)
        writes = storage.build_writes(
            scope,
            cp["id"],
            [("counter", i)],
            "task",
            "",
            serde=saver.serde,
            chunk_size=saver.chunk_size,
            failed=False,
        )
        docs["writes"].extend(raw(op) for op in writes.ops)
        ids.append(cp["id"])
    for key, batch in docs.items():
        coll = saver.client[saver.db_name][getattr(saver.collections, key)]
        # small batches: the embedded engine checks unique indexes within one insert
        # batch in quadratic time (reported to the engine's owner)
        for i in range(0, len(batch), 100):
            coll.insert_many(batch[i : i + 100])
    return ids


class Chat(TypedDict):
    messages: Annotated[list, add_messages]
    counter: int


def _turn(state: Chat) -> dict[str, Any]:
    return {"counter": state["counter"] + 1}


def _read(rec: Recorder, saver: Any, cfg: Any) -> tuple[Any, list[str], int]:
    rec.commands.clear()
    rec.reply_bytes = 0
    tup = saver.get_tuple(cfg)
    return tup, [name for name, _ in rec.commands], rec.reply_bytes


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_get_tuple_constant_queries_on_2000_checkpoints(
    client: MongoClient, mongo_uri: str, db_name: str, kind: str
) -> None:
    seeder = AccordSaver(client, db_name=db_name)
    seeder.setup()
    _seed_thread(seeder, "long", 2000)
    _seed_thread(seeder, "short", 3)
    rec = Recorder()
    with make_saver(kind, mongo_uri, db_name, listeners=[rec]) as saver:
        # cold: the saver never saw these threads (they were written behind its back)
        counts = {}
        for thread in ("long", "short"):
            tup, counts[thread], _ = _read(rec, saver, config(thread))
            assert tup is not None
        n = len(counts["long"])
        assert counts["long"] == counts["short"] == ["find"] * n  # no getMore either
        # the thread's registry version, checkpoint, blobs, message-ref chain, writes,
        # messages
        assert n <= 6
        assert len(tup.checkpoint["channel_values"]["messages"]) == 3
        long_tup = saver.get_tuple(config("long"))
        assert long_tup is not None
        assert len(long_tup.checkpoint["channel_values"]["messages"]) == 2000
        assert long_tup.pending_writes == [("task", "counter", 1999)]

        # every data query is an equality/range on a tenant-led index
        rec.commands.clear()
        saver.get_tuple(config("long"))
        for _, cmd in rec.commands:
            if cmd["find"] == "runs":
                assert set(cmd["filter"]) == {"_id"}
                continue
            assert cmd["filter"]["tenant_id"] == saver.tenant_id
            assert cmd["filter"]["thread_id"] == "long"

        # warm: after a run of this saver, the latest checkpoint is served from memory
        # once one small indexed read shows nobody wrote since: the same reads and bytes
        # for 3 and 2,000 checkpoints
        graph = _graph().compile(checkpointer=saver)
        warm = {}
        for thread in ("long", "short"):
            graph.invoke({"messages": [HumanMessage("more", id=f"more-{thread}")]}, config(thread))
            tup, names, size = _read(rec, saver, config(thread))
            assert tup is not None and tup.checkpoint["channel_values"]["counter"] in (2000, 3)
            warm[thread] = (names, size)
        assert warm["long"][0] == warm["short"][0] == ["find"]
        assert warm["long"][1] == warm["short"][1] < 1024

        # list pages: 3 hydration queries per 100 checkpoints, never one per checkpoint
        rec.commands.clear()
        assert len(list(saver.list(config("long"), limit=10))) == 10
        finds = [c for name, c in rec.commands if name == "find"]
        assert len(finds) <= 5
        rec.commands.clear()
        before = config("long", long_tup.config["configurable"]["checkpoint_id"])
        assert len(list(saver.list(config("long"), before=before, limit=250))) == 250
        assert len([1 for name, _ in rec.commands if name in ("find", "getMore")]) <= 3 * 5


def _graph() -> StateGraph:
    g = StateGraph(Chat)
    g.add_node("turn", _turn)
    g.add_edge(START, "turn")
    return g
