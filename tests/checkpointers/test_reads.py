"""Read path: constant queries for get_tuple on long threads, no N+1 in list."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from pymongo import MongoClient, monitoring

from accord.checkpointers import AccordSaver, storage
from accord.checkpointers.ops import Op
from accord.checkpointers.storage import Scope
from tests.checkpointers.conftest import config


class Recorder(monitoring.CommandListener):
    def __init__(self) -> None:
        self.commands: list[tuple[str, dict[str, Any]]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name not in ("hello", "isMaster", "ismaster", "endSessions"):
            self.commands.append((event.command_name, dict(event.command)))

    def succeeded(self, event: Any) -> None: ...
    def failed(self, event: Any) -> None: ...


@pytest.fixture()
def recorded(mongo_uri: str) -> Iterator[tuple[MongoClient, Recorder]]:
    rec = Recorder()
    c: MongoClient = MongoClient(mongo_uri, event_listeners=[rec])
    try:
        yield c, rec
    finally:
        c.close()


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
    known: Any = None

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
            known_messages={"messages": known} if known else {},
            revisions=saver._revisions,
        )
        known = put.message_refs["messages"]
        assert put.checkpoint is not None
        docs["checkpoints"].append(raw(put.checkpoint))
        docs["blobs"].extend(raw(op) for op in put.blobs)
        docs["messages"].extend(raw(op) for op in put.messages)
        ops, _, _ = storage.build_writes(
            scope,
            cp["id"],
            [("counter", i)],
            "task",
            "",
            serde=saver.serde,
            chunk_size=saver.chunk_size,
            failed=False,
        )
        docs["writes"].extend(raw(op) for op in ops)
        ids.append(cp["id"])
    for key, batch in docs.items():
        coll = saver.db[getattr(saver.collections, key)]
        # small batches: the embedded engine checks unique indexes within one insert
        # batch in quadratic time (reported to the engine's owner)
        for i in range(0, len(batch), 100):
            coll.insert_many(batch[i : i + 100])
    return ids


def test_get_tuple_constant_queries_on_2000_checkpoints(
    client: MongoClient, db_name: str, recorded: tuple[MongoClient, Recorder]
) -> None:
    seeder = AccordSaver(client, db_name=db_name)
    seeder.setup()
    _seed_thread(seeder, "long", 2000)
    _seed_thread(seeder, "short", 3)
    mon_client, rec = recorded
    saver = AccordSaver(mon_client, db_name=db_name)

    counts = {}
    for thread in ("long", "short"):
        rec.commands.clear()
        tup = saver.get_tuple(config(thread))
        assert tup is not None
        counts[thread] = [name for name, _ in rec.commands]
    n = len(counts["long"])
    assert counts["long"] == counts["short"] == ["find"] * n  # no getMore either
    assert n <= 5  # checkpoint, blobs, base snapshot of message refs, writes, messages
    assert len(tup.checkpoint["channel_values"]["messages"]) == 3
    long_tup = saver.get_tuple(config("long"))
    assert long_tup is not None and len(long_tup.checkpoint["channel_values"]["messages"]) == 2000
    assert long_tup.pending_writes == [("task", "counter", 1999)]

    # every query is an equality/range on a tenant-led index
    rec.commands.clear()
    saver.get_tuple(config("long"))
    for _, cmd in rec.commands:
        assert cmd["filter"]["tenant_id"] == saver.tenant_id
        assert cmd["filter"]["thread_id"] == "long"

    # list pages: 3 hydration queries per 100 checkpoints, never one per checkpoint
    rec.commands.clear()
    assert len(list(saver.list(config("long"), limit=10))) == 10
    finds = [c for name, c in rec.commands if name == "find"]
    assert len(finds) <= 5
    rec.commands.clear()
    assert (
        len(
            list(
                saver.list(
                    config("long"),
                    before=config("long", long_tup.config["configurable"]["checkpoint_id"]),
                    limit=250,
                )
            )
        )
        == 250
    )
    assert len([1 for name, _ in rec.commands if name in ("find", "getMore")]) <= 1 + 3 * 4 + 3
