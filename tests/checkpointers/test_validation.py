"""Bad input: clear InvalidInputError before any query, nothing written."""

from __future__ import annotations

import re
from typing import Any

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from pymongo import MongoClient

from accord.checkpointers.storage import BUSINESS_CHANNEL
from accord.errors import InvalidInputError
from tests.checkpointers.conftest import config

BAD_IDS: list[Any] = [1, None, {"$ne": ""}, ["t"], b"t", "", "a\x00b", "x" * 2000]


def _total(client: MongoClient, db_name: str) -> int:
    """Documents of the database, but the catalog ``setup()`` wrote."""
    db = client[db_name]
    return sum(
        db[c].count_documents({}) for c in db.list_collection_names() if c != "accord_catalog"
    )


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_bad_thread_ids(client: MongoClient, saver: Any, bad: Any) -> None:
    cfg = {"configurable": {"thread_id": bad, "checkpoint_ns": ""}}
    cp = generate_checkpoint(channel_values={"v": 1}, channel_versions={"v": "1"})
    for call in (
        lambda: saver.put(cfg, cp, generate_metadata(), {"v": "1"}),
        lambda: saver.put_writes(
            {"configurable": {**cfg["configurable"], "checkpoint_id": "c"}}, [("v", 1)], "t"
        ),
        lambda: saver.get_tuple(cfg),
        lambda: list(saver.list(cfg)),
        lambda: saver.delete_thread(bad),
        lambda: saver.copy_thread(bad, "x"),
        lambda: saver.copy_thread("x", bad),
        lambda: saver.prune([bad]),
    ):
        with pytest.raises(InvalidInputError):
            call()
    assert _total(client, saver.db_name) == 0


def test_operator_shaped_identifiers_never_widen_a_query(saver: Any) -> None:
    cp = generate_checkpoint(channel_values={"v": 1}, channel_versions={"v": "1"})
    stored = saver.put(config("real"), cp, generate_metadata(), {"v": "1"})
    for conf in (
        {"thread_id": {"$ne": ""}},
        {"thread_id": "real", "checkpoint_ns": {"$exists": True}},
        {"thread_id": "real", "checkpoint_ns": "", "checkpoint_id": {"$gt": ""}},
        {"thread_id": "real", "checkpoint_ns": "", "tenant_id": {"$ne": "x"}},
    ):
        with pytest.raises(InvalidInputError, match="must be a string"):
            saver.get_tuple({"configurable": conf})
    with pytest.raises(InvalidInputError):
        list(saver.list(config("real"), before={"configurable": {"checkpoint_id": {"$gt": ""}}}))
    assert saver.get_tuple(stored) is not None


@pytest.mark.parametrize(
    "bad_filter",
    [
        {"$where": "1"},
        {"source": {"$ne": "input"}},
        {"a.b": 1},
        {"": 1},
        {1: "x"},
        {"step": {"$gt": 1}},
        {"nested": {"ok": {"$in": [1]}}},
        {"source": object()},
        "source=input",
    ],
    # repr, but the same in every process (pytest-xdist workers must collect equal ids)
    ids=lambda v: re.sub(r" at 0x[0-9a-f]+", "", repr(v)),
)
def test_metadata_filters_reject_operators(saver: Any, bad_filter: Any) -> None:
    with pytest.raises(InvalidInputError):
        list(saver.list(None, filter=bad_filter))


def test_nested_metadata_filters_match_by_containment(saver: Any) -> None:
    cp = generate_checkpoint()
    saver.put(config("n"), cp, generate_metadata(custom={"a": 1, "b": 2}), {})
    assert len(list(saver.list(None, filter={"custom": {"a": 1}}))) == 1
    assert len(list(saver.list(None, filter={"custom": {"a": 2}}))) == 0


def test_other_bad_inputs(client: MongoClient, saver: Any) -> None:
    for limit in (-1, "10", 1.5, True):
        with pytest.raises(InvalidInputError, match="limit"):
            list(saver.list(config("t"), limit=limit))
    with pytest.raises(InvalidInputError, match="run_ids"):
        saver.delete_for_runs("run-1")
    with pytest.raises(InvalidInputError, match="strategy"):
        saver.prune(["t"], strategy="everything")
    cp = generate_checkpoint()
    with pytest.raises(InvalidInputError, match="task_id"):
        saver.put_writes(config("t", "c"), [("v", 1)], {"$ne": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="channel"):
        saver.put_writes(config("t", "c"), [(1, 1)], "task")  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match="thread_id"):
        saver.put({"configurable": {}}, cp, generate_metadata(), {})
    with pytest.raises(InvalidInputError, match="checkpoint_id"):
        saver.put_writes(config("t"), [("v", 1)], "task")
    bad_cp = {**cp, "id": {"$gt": ""}}
    with pytest.raises(InvalidInputError):
        saver.put(config("t"), bad_cp, generate_metadata(), {})  # type: ignore[arg-type]
    assert _total(client, saver.db_name) == 0


def test_business_writes_cannot_target_checkpointer_collections(
    client: MongoClient, saver: Any
) -> None:
    from langgraph.graph import START, StateGraph

    from accord.checkpointers import business

    def node(state: dict[str, Any]) -> dict[str, Any]:
        business.insert_one("accord_checkpoints", {"x": 1})
        return {"n": 1}

    g = StateGraph(dict)
    g.add_node("node", node)
    g.add_edge(START, "node")
    with pytest.raises(InvalidInputError, match="one of accord's own collections"):
        g.compile(checkpointer=saver).invoke({"n": 0}, config("biz"))
    assert (
        client[saver.db_name].accord_checkpoints.count_documents({"thread_id": "biz", "x": 1}) == 0
    )


def test_a_task_recorded_twice_applies_its_business_writes_once(
    client: MongoClient, saver: Any, saver_factory: Any
) -> None:
    other = saver_factory(setup=False)  # another worker ran the same task
    cp = generate_checkpoint()
    stored = saver.put(config("twice"), cp, generate_metadata(), {})
    op = {
        "op": "insert_one",
        "collection": "orders",
        "document": {"_id": "o-1", "tenant_id": "default"},
    }
    writes = [(BUSINESS_CHANNEL, op), ("v", 1)]
    saver.put_writes(stored, writes, "task-1")
    other.put_writes(stored, writes, "task-1")  # no duplicate-key error, no second insert
    assert client[saver.db_name].orders.count_documents({}) == 1
    tup = saver.get_tuple(stored)
    assert tup is not None and [(w[1]) for w in tup.pending_writes] == [BUSINESS_CHANNEL, "v"]
