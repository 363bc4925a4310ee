"""The composition root: one unit of work for every part, and hooks that see all of them."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from pymongo import MongoClient

from accord.errors import AccordError
from accord.memory.aggregator import AggregatorConfig
from accord.platform.plan import Plan
from accord.runtime import Accord, AsyncAccord


class RecordingHook:
    """A stand-in for governance's audit hook: records the operation of every plan."""

    name = "recording"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def check(self, plan: Plan) -> None:
        self.seen.append(plan.context.operation)


class RefusingHook:
    """A stand-in for a policy hook that refuses one operation."""

    name = "refusing"

    def __init__(self, operation: str) -> None:
        self.operation = operation

    def check(self, plan: Plan) -> None:
        if plan.context.operation == self.operation:
            raise AccordError(f"policy: {self.operation} refused")


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _chat_graph(accord: Accord) -> Any:
    def answer(state: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage("Noted.", id=f"ai-{len(state['messages'])}")]}

    builder = StateGraph(Chat)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    return builder.compile(checkpointer=accord.checkpointer(), store=accord.store())


@pytest.fixture()
def db_name(client: MongoClient) -> Any:
    name = "rt_" + uuid.uuid4().hex[:10]
    yield name
    client.drop_database(name)


def test_every_part_writes_through_the_one_unit_of_work(client: MongoClient, db_name: str) -> None:
    hook = RecordingHook()
    accord = Accord(client=client, db_name=db_name, hooks=[hook])
    graph = _chat_graph(accord)
    config = {"configurable": {"thread_id": "t1"}}
    with accord.background_aggregator() as worker:
        graph.invoke({"messages": [HumanMessage("I prefer aisle seats.", id="h1")]}, config)
        assert worker.wait_idle(timeout=30)
    accord.store().put(("notes",), "n1", {"text": "a note"})

    # the checkpointer's steps, the aggregator's memories, the store's put: one hook saw all
    assert {"checkpoint.put", "checkpoint.put_writes", "memory.aggregate", "store.put"} <= set(
        hook.seen
    ), hook.seen

    # and the aggregator derived the preference, searchable through the store
    found = accord.store().search(("memories",), query="seat preference", limit=5)
    texts = [str(item.value) for item in found]
    assert any("aisle seats" in t for t in texts), texts
    accord.close()  # a client it did not open stays open
    assert client.admin.command("ping")["ok"] == 1


def test_a_refusing_hook_stops_the_write_of_every_part_it_names(
    client: MongoClient, db_name: str
) -> None:
    accord = Accord(client=client, db_name=db_name, hooks=[RefusingHook("store.put")])
    store = accord.store()
    with pytest.raises(AccordError, match="policy: store.put refused"):
        store.put(("notes",), "n1", {"text": "refused"})
    assert store.get(("notes",), "n1") is None
    # other parts are not refused by it
    graph = _chat_graph(accord)
    graph.invoke(
        {"messages": [HumanMessage("hello", id="h1")]}, {"configurable": {"thread_id": "t"}}
    )


def test_the_database_defaults_to_accord_database(
    client: MongoClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/platform.md: ``ACCORD_DATABASE`` is the database of ``Accord()`` (it was
    ignored: always ``accord``); an explicit ``db_name`` wins."""
    monkeypatch.delenv("ACCORD_DATABASE", raising=False)
    assert Accord(client=client).db_name == "accord"
    monkeypatch.setenv("ACCORD_DATABASE", "from_env")
    assert Accord(client=client).db_name == "from_env"
    assert Accord(client=client, db_name="given").db_name == "given"


def test_bad_database_names_are_refused(client: MongoClient) -> None:
    for bad in ("", "a.b", "$x"):
        with pytest.raises(ValueError, match="db_name"):
            Accord(client=client, db_name=bad)


@pytest.mark.asyncio
async def test_the_async_root_shares_its_unit_of_work(mongo_uri: str, db_name: str) -> None:
    hook = RecordingHook()
    async with AsyncAccord(mongo_uri, db_name=db_name, hooks=[hook]) as accord:
        saver = await accord.checkpointer()
        store = await accord.store()
        assert saver.uow is accord.uow and (await accord.memory()).uow is accord.uow
        await store.aput(("notes",), "n1", {"text": "async note"})
        assert (await store.aget(("notes",), "n1")).value == {"text": "async note"}
    assert "store.put" in hook.seen


@pytest.mark.asyncio
async def test_the_async_root_aggregates_on_its_loop(mongo_uri: str, db_name: str) -> None:
    """AsyncAccord's aggregator is the async one, on the same unit of work: a background
    task on this loop turns the async checkpointer's steps into memories."""
    hook = RecordingHook()
    async with AsyncAccord(mongo_uri, db_name=db_name, hooks=[hook]) as accord:

        async def answer(state: Chat) -> dict[str, Any]:
            return {"messages": [AIMessage("Noted.", id=f"ai-{len(state['messages'])}")]}

        builder = StateGraph(Chat)
        builder.add_node("answer", answer)
        builder.add_edge(START, "answer")
        graph = builder.compile(
            checkpointer=await accord.checkpointer(), store=await accord.store()
        )
        config = {"configurable": {"thread_id": "t1"}}
        async with await accord.background_aggregator() as worker:
            await graph.ainvoke(
                {"messages": [HumanMessage("I prefer aisle seats.", id="h1")]}, config
            )
            assert await worker.wait_idle(timeout=30)
        assert worker.aggregator.uow.hooks is accord.uow.hooks  # its view, as aggregator
        assert [o.status for o in worker.outcomes].count("done") >= 1
        found = await (await accord.store()).asearch(("memories",), query="seat preference")
        assert any("aisle seats" in str(item.value) for item in found), found
        with pytest.raises(ValueError, match="one database"):
            await accord.aggregator(AggregatorConfig(db_name="elsewhere"))
    assert {"checkpoint.put", "memory.aggregate"} <= set(hook.seen), hook.seen
