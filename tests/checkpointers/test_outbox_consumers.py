"""The outbox only when something consumes it (issue 21, item 4).

A checkpointer used alone writes no outbox events (they would pile up forever: nothing
completes them). Once a consumer (the memory aggregator) is set up on the database, savers
write them: at once when they are set up after it, or built by the same ``Accord`` root,
and within the gate's re-check interval otherwise. The README's examples use one database
throughout.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph
from pymongo import MongoClient

from accord.checkpointers import AccordSaver
from accord.checkpointers.asynchronous import outbox_gate
from accord.checkpointers.synchronous import outbox_gate as sync_gate
from accord.memory.aggregator import Aggregator, AggregatorConfig
from accord.runtime import Accord
from tests.checkpointers.conftest import config, make_saver


def _chat() -> Any:
    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("ok")]}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    return builder


def _talk(saver: Any, thread: str, turns: int) -> None:
    graph = _chat().compile(checkpointer=saver)
    for i in range(turns):
        graph.invoke({"messages": [HumanMessage(f"turn {i}")]}, config(thread))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_checkpointer_used_alone_writes_no_outbox_events(
    client: MongoClient, mongo_uri: str, db_name: str, kind: str
) -> None:
    with make_saver(kind, mongo_uri, db_name, outbox_events=None) as saver:
        _talk(saver, "alone", 50)
        saver.delete_thread("alone")
        _talk(saver, "alone-2", 3)
    assert client[db_name].outbox.count_documents({}) == 0
    assert client[db_name].short_term_memory.count_documents({"thread_id": "alone-2"}) == 6


def test_savers_write_events_once_an_aggregator_is_set_up(
    client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync_gate, "RECHECK", 0.2)  # 5 s by default
    monkeypatch.setattr(outbox_gate, "RECHECK", 0.2)
    early = AccordSaver(client, db_name=db_name)  # set up before any consumer exists
    early.setup()
    _talk(early, "before", 2)
    assert client[db_name].outbox.count_documents({}) == 0
    time.sleep(0.3)
    agg = Aggregator(client, config=AggregatorConfig(db_name=db_name))
    agg.setup()
    later = AccordSaver(client, db_name=db_name)  # set up after it: writes events at once
    later.setup()
    _talk(later, "after", 1)
    _talk(early, "before", 1)  # sees the consumer at its next re-check
    outbox = client[db_name].outbox
    assert outbox.count_documents({"thread_id": "after", "kind": "checkpoint"}) >= 1
    assert outbox.count_documents({"thread_id": "before", "kind": "checkpoint"}) >= 1
    agg.drain()
    assert agg.stats().backlog == 0


def test_the_root_tells_its_savers_when_it_sets_up_an_aggregator(
    client: MongoClient, db_name: str
) -> None:
    """The README's order: the checkpointer first, then the aggregator, then the steps;
    every step is aggregated."""
    accord = Accord(client=client, db_name=db_name)
    saver = accord.checkpointer()
    with accord.background_aggregator() as worker:
        _talk(saver, "t", 1)
        assert worker.wait_idle(30)
    found = accord.store().search(("memories",), limit=10)
    assert client[db_name].outbox.count_documents({"kind": "checkpoint"}) >= 1
    assert found or client[db_name].long_term_memory.count_documents({}) >= 1  # the episode


def test_forced_either_way(client: MongoClient, mongo_uri: str, db_name: str) -> None:
    with make_saver("sync", mongo_uri, db_name, outbox_events=True) as saver:
        _talk(saver, "on", 1)
    assert client[db_name].outbox.count_documents({"thread_id": "on"}) >= 1
    Aggregator(client, config=AggregatorConfig(db_name=db_name)).setup()
    with make_saver("sync", mongo_uri, db_name, outbox_events=False) as saver:
        _talk(saver, "off", 1)
    assert client[db_name].outbox.count_documents({"thread_id": "off"}) == 0


def test_the_readme_uses_one_database_throughout() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = "\n".join(re.findall(r"```(?:python|sh)\n(.*?)```", readme, re.DOTALL))
    names = set(re.findall(r"db_name=\"([^\"]+)\"", code))  # accord's, wherever it is built
    names |= set(
        re.findall(r"--to-db(?:=| )(\S+)", code)
    )  # (--db of a migration is MongoDBSaver's)
    assert names <= {"accord"}, f"the README's examples name databases {names}"
