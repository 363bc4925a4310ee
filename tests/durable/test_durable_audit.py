"""Recorded calls and bundle moves are writes like any other: through the kernel, so the
audit trail records them (an override is audited, with who gave it and why)."""

from __future__ import annotations

import uuid
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from pymongo import MongoClient

from accord.checkpointers.bundles import PinnedGraph
from accord.checkpointers.recorded import recorded
from accord.governance.audit_records import RECORDS
from accord.platform.bundles import Bundle, Override
from accord.runtime import Accord


class State(TypedDict, total=False):
    out: str


@pytest.fixture()
def db_name(client: MongoClient) -> Any:
    name = "au_" + uuid.uuid4().hex[:12]
    try:
        yield name
    finally:
        client.drop_database(name)


def test_calls_pins_and_overrides_are_in_the_audit_trail(client: MongoClient, db_name: str) -> None:
    root = Accord(client=client, db_name=db_name, audit="metadata")
    saver = root.checkpointer()
    tool = recorded(name="fake.tool")(lambda x: f"done {x}")
    g = StateGraph(State)
    g.add_node("work", lambda s: {"out": tool(1)})
    g.add_edge(START, "work")
    g.add_edge("work", END)
    graph = g.compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": "t1"}}
    PinnedGraph(graph, Bundle("v1")).invoke({"out": ""}, cfg)
    PinnedGraph(graph, Bundle("v2")).invoke(
        {"out": ""}, cfg, override=Override("hotfix", by="user:ops")
    )
    records = client[db_name][RECORDS]
    by_action = {r["action"]: r for r in records.find({"thread_id": "t1"})}
    assert {"calls.intent", "calls.result", "bundle.pin"} <= set(by_action), set(by_action)
    assert by_action["calls.intent"]["run"]["run_id"]  # recorded as the run's
    assert "recorded_call" in records.distinct("artifact", {"action": "calls.result"})
    pins = list(records.find({"action": "bundle.pin", "thread_id": "t1"}))
    # the first pin and the override: two transactions (a record per group: guard, pin)
    assert len({p["txn"] for p in pins}) == 2 and {p["artifact"] for p in pins} == {"run"}
    run_doc = client[db_name]["runs"].find_one({"thread_id": "t1"})
    assert run_doc is not None
    override = run_doc["bundle_history"][-1]
    assert (override["kind"], override["by"], override["reason"]) == ("override", "user:ops",
                                                                       "hotfix")  # fmt: skip
