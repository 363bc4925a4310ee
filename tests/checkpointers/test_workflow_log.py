"""Shared workflow event logs: agents (threads) of one workflow append events in their
step's transaction and read them in order.

Each workflow's ``seq`` runs 1, 2, 3... in commit order, without gaps or duplicates,
whatever the concurrency; an event exists exactly when its step committed; a tenant
never reads another tenant's log.
"""

from __future__ import annotations

import asyncio
import operator
import threading
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from pymongo import AsyncMongoClient, MongoClient

from accord.checkpointers import AsyncAccordSaver, business
from accord.errors import BusinessWriteError, InvalidInputError
from accord.platform import workflow_log
from tests.checkpointers.conftest import config, make_saver


class State(TypedDict):
    log: Annotated[list[Any], operator.add]


def _graph(node: Any) -> Any:
    g = StateGraph(State)
    g.add_node("agent", node)
    g.add_edge(START, "agent")
    return g


def _seqs(client: MongoClient, db_name: str, workflow: str) -> list[int]:
    docs = client[db_name][workflow_log.COLLECTION].find({"workflow": workflow})
    return sorted(d["seq"] for d in docs)


def test_agents_append_and_read_in_order(client: MongoClient, saver: Any, db_name: str) -> None:
    """Two agents (threads) take turns: each reads what is new since the last event it
    saw, then appends; everyone sees one order, numbered from 1."""

    def agent(state: State) -> dict[str, Any]:
        seen = business.read_events("order-7", after=0)
        business.append_event("order-7", {"step": len(seen) + 1, "saw": len(seen)})
        business.append_event("order-7", {"step": len(seen) + 2, "saw": len(seen)})
        return {"log": [[e["seq"] for e in seen]]}

    graph = _graph(agent).compile(checkpointer=saver)
    first = graph.invoke({"log": []}, config("picker"))
    second = graph.invoke({"log": []}, config("packer"))
    assert first["log"] == [[]]
    assert second["log"] == [[1, 2]]
    assert _seqs(client, db_name, "order-7") == [1, 2, 3, 4]

    def reader(state: State) -> dict[str, Any]:
        page = business.read_events("order-7", after=2, limit=1)
        return {"log": [[(e["seq"], e["event"]["step"], e["thread_id"]) for e in page]]}

    out = _graph(reader).compile(checkpointer=saver).invoke({"log": []}, config("auditor"))
    assert out["log"] == [[(3, 3, "packer")]]


def test_an_event_exists_only_if_its_step_committed(
    client: MongoClient, saver: Any, db_name: str
) -> None:
    """A task whose business write is refused commits nothing: its event neither, and its
    number is not used; the resume appends it as the next one."""
    client[db_name].ledger.insert_one({"_id": "taken", "tenant_id": "default"})
    attempts = {"n": 0}

    def agent(state: State) -> dict[str, Any]:
        attempts["n"] += 1
        business.append_event("wf", {"attempt": attempts["n"]})
        if attempts["n"] == 1:
            business.insert_one("ledger", {"_id": "taken"})  # duplicate key: refused
        return {"log": ["done"]}

    graph = _graph(agent).compile(checkpointer=saver)
    with pytest.raises(BusinessWriteError):
        graph.invoke({"log": []}, config("t"))
    assert _seqs(client, db_name, "wf") == []
    graph.invoke(None, config("t"))
    events = list(client[db_name][workflow_log.COLLECTION].find({"workflow": "wf"}))
    assert [(e["seq"], e["event"]["attempt"]) for e in events] == [(1, 2)]


def test_concurrent_agents_get_one_gap_free_order(mongo_uri: str, db_name: str) -> None:
    """Three agents, each on its own saver and thread, append 10 events each at once:
    seq is 1..30, no duplicates, and each agent's events keep their own order."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with make_saver("sync", mongo_uri, db_name) as saver:

                def agent(state: State) -> dict[str, Any]:
                    business.append_event("race", {"agent": i, "n": len(state["log"])})
                    return {"log": ["x"]}

                graph = _graph(agent).compile(checkpointer=saver)
                for turn in range(10):
                    graph.invoke({"log": []}, config(f"agent-{i}"))
                    del turn
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors
    reader = MongoClient(mongo_uri)
    try:
        events = list(
            reader[db_name][workflow_log.COLLECTION].find({"workflow": "race"}).sort("seq", 1)
        )
    finally:
        reader.close()
    assert [e["seq"] for e in events] == list(range(1, 31))
    for i in range(3):
        mine = [e["event"]["n"] for e in events if e["event"]["agent"] == i]
        assert mine == sorted(mine) and len(mine) == 10


def test_a_tenant_never_reads_another_tenants_log(
    client: MongoClient, mongo_uri: str, db_name: str
) -> None:
    with make_saver("sync", mongo_uri, db_name) as saver:

        def agent(state: State) -> dict[str, Any]:
            seen = business.read_events("shared-name")
            business.append_event("shared-name", {"secret": "of this tenant"})
            return {"log": [len(seen)]}

        graph = _graph(agent).compile(checkpointer=saver)
        a = graph.invoke({"log": []}, config("t", tenant_id="acme"))
        b = graph.invoke({"log": []}, config("t", tenant_id="globex"))
        again = graph.invoke({"log": []}, config("t2", tenant_id="acme"))
    assert (a["log"], b["log"], again["log"]) == ([0], [0], [1])
    tenants = {
        (d["tenant_id"], d["seq"])
        for d in client[db_name][workflow_log.COLLECTION].find({"workflow": "shared-name"})
    }
    assert tenants == {("acme", 1), ("acme", 2), ("globex", 1)}


@pytest.mark.parametrize(
    ("stage", "problem"),
    [
        (lambda: business.append_event("", {"a": 1}), "workflow must be"),
        (lambda: business.append_event(7, {"a": 1}), "workflow must be"),
        (lambda: business.append_event("w" * 201, {"a": 1}), "workflow must be"),
        (lambda: business.append_event("w\x00", {"a": 1}), "workflow must be"),
        (lambda: business.append_event("w", ["not", "a", "dict"]), "event must be a dict"),
        (lambda: business.append_event("w", {"blob": "x" * 70_000}), "at most 65536 bytes"),
        (lambda: business.read_events("w", after=-1), "after must be"),
        # before: a raw OverflowError from the driver
        (lambda: business.read_events("w", after=2**70), "at most 64 bits"),
        (lambda: business.read_events("w", after=2**63), "at most 64 bits"),
        (lambda: business.read_events("w", after=10**5000), "an int of 16610 bits"),
        # before: a raw UnicodeEncodeError (a lone surrogate is no UTF-8)
        (lambda: business.read_events("w\ud800"), "lone surrogate"),
        (lambda: business.append_event("w\ud800", {"a": 1}), "lone surrogate"),
        (lambda: business.append_event("w", {"a": "\ud800"}), "lone surrogate"),
        (lambda: business.read_events("w", limit=0), "limit must be"),
        (lambda: business.read_events("w", limit=5000), "limit must be"),
    ],
)
def test_bad_input_is_refused_in_the_node(
    client: MongoClient, saver: Any, db_name: str, stage: Any, problem: str
) -> None:
    def agent(state: State) -> dict[str, Any]:
        stage()
        return {"log": ["x"]}

    with pytest.raises(InvalidInputError, match=problem):
        _graph(agent).compile(checkpointer=saver).invoke({"log": []}, config("bad"))
    assert client[db_name][workflow_log.COLLECTION].count_documents({}) == 0


def test_business_writes_cannot_forge_events(client: MongoClient, saver: Any, db_name: str) -> None:
    """The log is accord's collection: a plain business write to it is refused."""

    def agent(state: State) -> dict[str, Any]:
        business.insert_one(workflow_log.COLLECTION, {"workflow": "wf", "seq": 1})
        return {"log": ["x"]}

    with pytest.raises(InvalidInputError):
        _graph(agent).compile(checkpointer=saver).invoke({"log": []}, config("forge"))
    assert client[db_name][workflow_log.COLLECTION].count_documents({}) == 0


def test_events_run_on_the_async_saver(mongo_uri: str, db_name: str) -> None:
    """The async saver: an async node reads with ``aread_events``; a sync node of the
    same graph kind with ``read_events`` (answered on the saver's loop from LangGraph's
    worker thread)."""

    async def async_agent(state: State) -> dict[str, Any]:
        seen = await business.aread_events("wf-a")
        business.append_event("wf-a", {"n": len(seen)})
        return {"log": [len(seen)]}

    def sync_agent(state: State) -> dict[str, Any]:
        seen = business.read_events("wf-a")
        business.append_event("wf-a", {"n": len(seen)})
        return {"log": [len(seen)]}

    async def main() -> list[Any]:
        aclient: AsyncMongoClient[Any] = AsyncMongoClient(mongo_uri)
        try:
            saver = AsyncAccordSaver(aclient, db_name=db_name)
            await saver.setup()
            first = (
                await _graph(async_agent)
                .compile(checkpointer=saver)
                .ainvoke({"log": []}, config("x1"))
            )
            second = (
                await _graph(sync_agent)
                .compile(checkpointer=saver)
                .ainvoke({"log": []}, config("x2"))
            )
            return [first["log"], second["log"]]
        finally:
            await aclient.close()

    assert asyncio.run(main()) == [[0], [1]]
