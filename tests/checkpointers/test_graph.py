"""A real LangGraph StateGraph on the accord savers: messages, business writes, resume."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt
from pymongo import AsyncMongoClient, MongoClient

from accord.checkpointers import AsyncAccordSaver, business
from accord.errors import ConfigurationError
from tests.checkpointers.conftest import unique_db


class State(TypedDict):
    messages: Annotated[list, add_messages]
    log: Annotated[list[str], operator.add]


def build(*, approve: bool = True) -> StateGraph:
    def agent(state: State) -> dict[str, Any]:
        n = len(state["messages"])
        business.insert_one("orders", {"order": f"order-{n}", "n": n})
        return {"messages": [AIMessage(f"reply {n}", id=f"ai-{n}")], "log": ["agent"]}

    def audit_a(state: State) -> dict[str, Any]:
        business.update_one("counters", {"_id": "a"}, {"$inc": {"v": 1}}, upsert=True)
        return {"log": ["a"]}

    async def audit_b(state: State) -> dict[str, Any]:  # async node in a sync-compatible graph
        business.update_one("counters", {"_id": "b"}, {"$inc": {"v": 1}}, upsert=True)
        return {"log": ["b"]}

    def review(state: State) -> dict[str, Any]:
        answer = interrupt("approve?") if approve else "yes"
        business.insert_one("approvals", {"answer": answer, "n": len(state["messages"])})
        return {"log": [f"review:{answer}"]}

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_node("audit_a", audit_a)
    g.add_node("audit_b", audit_b)
    g.add_node("review", review)
    g.add_edge(START, "agent")
    g.add_edge("agent", "audit_a")
    g.add_edge("agent", "audit_b")
    g.add_edge(["audit_a", "audit_b"], "review")
    g.add_edge("review", END)
    return g


def _sync_build() -> StateGraph:
    """``build()`` with a sync twin of the async node (sync graphs can't run async nodes)."""
    g = build()

    def audit_b(state: State) -> dict[str, Any]:
        business.update_one("counters", {"_id": "b"}, {"$inc": {"v": 1}}, upsert=True)
        return {"log": ["b"]}

    g2 = StateGraph(State)
    for name in ("agent", "audit_a", "review"):
        g2.add_node(name, g.nodes[name].runnable)
    g2.add_node("audit_b", audit_b)
    g2.add_edge(START, "agent")
    g2.add_edge("agent", "audit_a")
    g2.add_edge("agent", "audit_b")
    g2.add_edge(["audit_a", "audit_b"], "review")
    g2.add_edge("review", END)
    return g2


@pytest.mark.parametrize(
    ("durability", "client_bulk"), [("sync", None), ("async", None), ("async", False)]
)
def test_sync_graph_business_writes_and_resume(
    client: MongoClient, saver_factory: Any, durability: str, client_bulk: bool | None
) -> None:
    saver = saver_factory(client_bulk=client_bulk)
    graph = _sync_build().compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": "t1"}}
    db = client[saver.db_name]

    out = graph.invoke({"messages": [HumanMessage("hi", id="h-1")]}, cfg, durability=durability)
    assert "__interrupt__" in out
    # parallel tasks committed their business writes with their task records
    assert db.orders.count_documents({}) == 1
    assert db.counters.find_one({"_id": "a"})["v"] == 1
    assert db.counters.find_one({"_id": "b"})["v"] == 1
    assert db.approvals.count_documents({}) == 0  # interrupted task commits nothing

    out = graph.invoke(Command(resume="yes"), cfg, durability=durability)
    assert out["log"] == ["agent", "a", "b", "review:yes"]
    # the resumed run did not re-apply the finished tasks' business writes
    assert db.orders.count_documents({}) == 1
    assert db.counters.find_one({"_id": "a"})["v"] == 1
    assert db.approvals.count_documents({"answer": "yes", "tenant_id": "default"}) == 1

    # second turn on the same thread
    graph.invoke({"messages": [HumanMessage("again", id="h-2")]}, cfg, durability=durability)
    graph.invoke(Command(resume="no"), cfg, durability=durability)
    state = graph.get_state(cfg)
    assert [m.id for m in state.values["messages"]] == ["h-1", "ai-1", "h-2", "ai-3"]
    assert db.orders.count_documents({}) == 2
    assert db.counters.find_one({"_id": "a"})["v"] == 2
    # every message stored once, however many checkpoints contain it
    assert db.short_term_memory.count_documents({"thread_id": "t1"}) == 4
    # outbox events were appended in the step transactions
    assert (
        db.outbox.count_documents({"thread_id": "t1", "kind": "checkpoint", "status": "pending"})
        >= 4
    )
    assert db.outbox.count_documents({"thread_id": "t1", "kind": "writes"}) >= 4


def test_message_edits_and_removals_round_trip(saver: Any, saver_factory: Any) -> None:
    def step(state: State) -> dict[str, Any]:
        last = state["messages"][-1].content
        if last == "edit":
            return {"messages": [AIMessage("edited first", id="ai-0")]}
        if last == "remove":
            return {"messages": [RemoveMessage(id="ai-0")]}
        return {"messages": [AIMessage(f"re: {last}", id=f"ai-{len(state['messages']) - 1}")]}

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    graph = g.compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": "edits"}}
    expected_history = []
    for i, text in enumerate(["hello", "edit", "remove", "bye"]):
        graph.invoke({"messages": [HumanMessage(text, id=f"h-{i}")]}, cfg)
        expected_history.append(
            [(m.id, m.content) for m in graph.get_state(cfg).values["messages"]]
        )
    assert expected_history[1][0] == ("ai-0", "edited first") or expected_history[1][1] == (
        "ai-0",
        "edited first",
    )
    assert all(mid != "ai-0" for mid, _ in expected_history[2])
    # every historic checkpoint reassembles exactly its own version of the channel
    fresh = saver_factory(setup=False)
    history = list(g.compile(checkpointer=fresh).get_state_history(cfg))
    seen = {tuple((m.id, m.content) for m in s.values.get("messages", [])) for s in history}
    for snapshot in expected_history:
        assert tuple(snapshot) in seen


def test_time_travel_fork_and_update_state(saver: Any) -> None:
    graph = _sync_build().compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": "tt"}}
    graph.invoke({"messages": [HumanMessage("hi", id="h-1")]}, cfg)
    graph.invoke(Command(resume="yes"), cfg)
    history = list(graph.get_state_history(cfg))
    first_agent = next(s for s in reversed(history) if s.next == ("agent",))
    # fork: re-run from an old checkpoint; the old branch's writer is not "another worker"
    out = graph.invoke(None, first_agent.config)
    assert "__interrupt__" in out
    graph.invoke(Command(resume="fork"), cfg)
    assert graph.get_state(cfg).values["log"][-1] == "review:fork"
    # update_state on an old checkpoint creates a branch too
    new_cfg = graph.update_state(first_agent.config, {"log": ["manual"]})
    assert graph.get_state(new_cfg).values["log"] == ["manual"]


def test_business_writes_need_accord_saver_and_durability() -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    def node(state: State) -> dict[str, Any]:
        business.insert_one("orders", {"x": 1})
        return {"log": ["x"]}

    g = StateGraph(State)
    g.add_node("node", node)
    g.add_edge(START, "node")
    with pytest.raises(ConfigurationError, match="AccordSaver"):
        g.compile(checkpointer=InMemorySaver()).invoke(
            {"messages": []}, {"configurable": {"thread_id": "x"}}
        )
    with pytest.raises(ConfigurationError, match="inside a running LangGraph node"):
        business.insert_one("orders", {"x": 1})


def test_exit_durability_refuses_business_writes(saver: Any) -> None:
    graph = _sync_build().compile(checkpointer=saver)
    with pytest.raises(ConfigurationError, match="durability"):
        graph.invoke(
            {"messages": [HumanMessage("hi", id="h")]},
            {"configurable": {"thread_id": "e"}},
            durability="exit",
        )


def test_failed_task_commits_no_business_writes(client: MongoClient, saver: Any) -> None:
    attempts = {"n": 0}

    def flaky(state: State) -> dict[str, Any]:
        attempts["n"] += 1
        business.insert_one("orders", {"_id": f"attempt-{attempts['n']}"})
        if attempts["n"] == 1:
            raise RuntimeError("boom")
        return {"log": ["ok"]}

    g = StateGraph(State)
    g.add_node("flaky", flaky)
    g.add_edge(START, "flaky")
    graph = g.compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": "f"}}
    with pytest.raises(RuntimeError):
        graph.invoke({"messages": []}, cfg)
    db = client[saver.db_name]
    assert db.orders.count_documents({}) == 0
    graph.invoke(None, cfg)  # resume re-runs the failed task
    assert [d["_id"] for d in db.orders.find()] == ["attempt-2"]


def test_async_graph(mongo_uri: str) -> None:
    async def main() -> None:
        aclient: AsyncMongoClient = AsyncMongoClient(mongo_uri)
        name = unique_db()
        try:
            saver = AsyncAccordSaver(aclient, db_name=name)
            await saver.setup()
            graph = build().compile(checkpointer=saver)
            cfg = {"configurable": {"thread_id": "a1", "tenant_id": "acme"}}
            out = await graph.ainvoke({"messages": [HumanMessage("hi", id="h-1")]}, cfg)
            assert "__interrupt__" in out
            out = await graph.ainvoke(Command(resume="ok"), cfg)
            assert out["log"] == ["agent", "a", "b", "review:ok"]
            db = aclient[name]
            assert await db.orders.count_documents({"tenant_id": "acme"}) == 1
            assert await db.counters.count_documents({"tenant_id": "acme"}) == 2
            assert await db.accord_checkpoints.count_documents({"tenant_id": {"$ne": "acme"}}) == 0
            state = await graph.aget_state(cfg)
            assert [m.id for m in state.values["messages"]] == ["h-1", "ai-1"]
            # other tenants see nothing
            assert await saver.aget_tuple({"configurable": {"thread_id": "a1"}}) is None
        finally:
            await aclient.drop_database(name)
            await aclient.close()

    asyncio.run(main())


def _concat(state: list[str], writes: Any) -> list[str]:
    out = list(state or [])
    for w in writes:
        out.extend(w)
    return out


class D(TypedDict):
    items: Annotated[list[str], DeltaChannel(_concat, snapshot_frequency=3)]


def test_delta_channel_graph_matches_in_memory_saver(saver: Any) -> None:
    """LangGraph's DeltaChannel (beta) rebuilds state from ancestor writes through
    get_delta_channel_history: the result must match InMemorySaver's, and prune must not
    cut the history it depends on."""
    from langgraph.checkpoint.memory import InMemorySaver

    def add(state: D) -> dict[str, Any]:
        return {"items": [f"i{len(state['items'])}"]}

    g = StateGraph(D)
    g.add_node("add", add)
    g.add_edge(START, "add")
    results = []
    for checkpointer in (InMemorySaver(), saver):
        graph = g.compile(checkpointer=checkpointer)
        cfg = {"configurable": {"thread_id": "delta"}}
        for i in range(7):
            graph.invoke({"items": [f"in{i}"]}, cfg)
        results.append(graph.get_state(cfg).values["items"])
    assert results[0] == results[1] and len(results[0]) == 14
    saver.prune(["delta"])  # skipped: the thread's state needs its ancestors
    assert (
        g.compile(checkpointer=saver)
        .get_state({"configurable": {"thread_id": "delta"}})
        .values["items"]
        == results[0]
    )


def test_business_writes_in_a_delta_channel_graph_are_refused(
    client: MongoClient, saver: Any
) -> None:
    """LangGraph records a DeltaChannel graph's task writes before their checkpoint is
    saved, so staged business writes could not be exactly once there: refused, clearly."""

    def add(state: D) -> dict[str, Any]:
        business.insert_one("orders", {"_id": "o"})
        return {"items": ["x"]}

    g = StateGraph(D)
    g.add_node("add", add)
    g.add_edge(START, "add")
    with pytest.raises(ConfigurationError, match="DeltaChannel"):
        g.compile(checkpointer=saver).invoke({"items": []}, {"configurable": {"thread_id": "dz"}})
    assert client[saver.db_name].orders.count_documents({}) == 0
