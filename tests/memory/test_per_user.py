"""Long-term memory per user, gone with its thread when asked (issue 21, item 3).

Real graphs on accord's checkpointer, the aggregator and the store, wired by
``accord.runtime``: each user of a tenant keeps their own memories (the run's
``configurable.user_id`` fills the default namespace ``("memories", "{user_id}")``);
``delete_thread`` makes the aggregator forget what that thread gave (memories derived
only from it go, with their history and vectors; memories other threads stated too are
re-derived from them), unless ``keep_memories=True``; and the store a node gets from
``get_store()`` serves the run's tenant.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.config import get_store
from langgraph.graph import START, MessagesState, StateGraph
from pymongo import AsyncMongoClient, MongoClient

from accord.errors import InvalidInputError
from accord.memory import model
from accord.memory.synchronous.store import AccordStore
from accord.runtime import Accord, AsyncAccord


def _chat() -> StateGraph:
    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"Noted ({len(state['messages'])}).")]}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    return builder


def _cfg(thread: str, user: str | None = None, tenant: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread}
    if user is not None:
        conf["user_id"] = user
    if tenant is not None:
        conf["tenant_id"] = tenant
    return {"configurable": conf}


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "pu_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


def _memories(client: MongoClient, db_name: str, tenant: str = "default") -> dict[Any, Any]:
    """(namespace, key) -> memory document."""
    return {
        (tuple(d["namespace"]), d["key"]): d
        for d in client[db_name].long_term_memory.find({"tenant_id": tenant})
    }


def test_each_user_keeps_their_own_memories(client: MongoClient, db_name: str) -> None:
    """Alice's name is not replaced by Bob's: the README's setup, two users of one tenant."""
    accord = Accord(client=client, db_name=db_name)
    graph = _chat().compile(checkpointer=accord.checkpointer(), store=accord.store())
    agg = accord.aggregator()
    graph.invoke({"messages": [HumanMessage("My name is Alice. I prefer aisle seats.")]},
                 _cfg("a-1", "alice"))  # fmt: skip
    agg.drain()
    graph.invoke({"messages": [HumanMessage("My name is Bob.")]}, _cfg("b-1", "bob"))
    agg.drain()
    mem = _memories(client, db_name)
    assert mem[(("memories", "alice"), "profile:name")]["text"] == "User's name is Alice"
    assert mem[(("memories", "bob"), "profile:name")]["text"] == "User's name is Bob"
    assert mem[(("memories", "alice"), "profile:name")]["version"] == 1  # never replaced
    store = accord.store()
    found = store.search(("memories", "bob"), query="what is the user's name", limit=5)
    assert [h.value for h in found if "Alice" in str(h.value)] == []
    assert any("aisle" in str(h.value) for h in store.search(("memories", "alice"), query="seat"))
    # a run without a user_id keeps the earlier shared namespace
    graph.invoke({"messages": [HumanMessage("Remember that the office closes at 6.")]},
                 _cfg("anon-1"))  # fmt: skip
    agg.drain()
    assert any(ns == ("memories",) for ns, _ in _memories(client, db_name))


def test_async_runs_are_per_user_too(mongo_uri: str, client: MongoClient, db_name: str) -> None:
    async def main() -> None:
        aclient: AsyncMongoClient = AsyncMongoClient(mongo_uri)
        async with AsyncAccord(client=aclient, db_name=db_name) as accord:
            graph = _chat().compile(checkpointer=await accord.checkpointer())
            agg = await accord.aggregator()
            for user in ("ann", "ben"):
                await graph.ainvoke(
                    {"messages": [HumanMessage(f"My name is {user.title()}.")]},
                    _cfg(f"{user}-1", user),
                )
            await agg.drain()
        await aclient.close()

    asyncio.run(main())
    mem = _memories(client, db_name)
    assert mem[(("memories", "ann"), "profile:name")]["text"] == "User's name is Ann"
    assert mem[(("memories", "ben"), "profile:name")]["text"] == "User's name is Ben"


def _vectors_match(client: MongoClient, db_name: str, accord: Accord, doc: dict[str, Any]) -> None:
    vectors = list(client[db_name].memory_vectors.find({"memory_id": doc["_id"]}))
    [expected] = accord.memory().embedder.embed_documents([doc["text"]])
    assert [v["embedding"] for v in vectors] == [model.as_vector(expected)]


def test_delete_thread_forgets_what_only_that_thread_gave(
    client: MongoClient, db_name: str
) -> None:
    accord = Accord(client=client, db_name=db_name)
    saver = accord.checkpointer()
    graph = _chat().compile(checkpointer=saver)
    agg = accord.aggregator()

    def say(thread: str, text: str) -> None:
        graph.invoke({"messages": [HumanMessage(text)]}, _cfg(thread, "alice"))
        agg.drain()

    say("a-1", "My name is Alice.")
    say("a-2", "I live in Paris. Remember that I am vegetarian. Call me Al.")
    say("a-1", "I live in Oslo.")
    say("a-3", "Remember that I play chess.")
    ns = ("memories", "alice")
    mem = _memories(client, db_name)
    assert mem[(ns, "profile:name")]["text"] == "User's name is Al"
    veg = next(d for (n, _), d in mem.items() if n == ns and d["text"] == "I am vegetarian")
    history = client[db_name].memory_history

    saver.delete_thread("a-2")
    agg.drain()
    mem = _memories(client, db_name)
    # derived only from a-2: gone, with its history and its vectors
    assert veg["_id"] not in {d["_id"] for d in mem.values()}
    assert history.count_documents({"memory_id": veg["_id"]}) == 0
    assert client[db_name].memory_vectors.count_documents({"memory_id": veg["_id"]}) == 0
    assert (("episodes", "a-2"), "episode:a-2") not in mem
    # stated in a-2 last, in a-1 before: re-derived from a-1 (text, provenance, vector)
    name = mem[(ns, "profile:name")]
    assert name["text"] == "User's name is Alice"
    assert name["provenance"]["thread_id"] == "a-1" and name["version"] == 3
    _vectors_match(client, db_name, accord, name)
    # current from a-1, an older version from a-2: kept, a-2's version leaves the history
    location = mem[(ns, "profile:location")]
    assert location["text"] == "User lives in Oslo"
    assert history.count_documents({"memory_id": location["_id"]}) == 0
    # nothing anywhere still comes from a-2
    for coll in ("long_term_memory", "memory_history"):
        assert client[db_name][coll].count_documents({"provenance.thread_id": "a-2"}) == 0, coll
    assert client[db_name].outbox.count_documents({"thread_id": "a-2", "kind": "checkpoint"}) == 0
    # other threads' memories are untouched
    assert any(d["text"] == "I play chess" for d in mem.values())
    assert agg.stats().dead == 0

    # keep_memories=True: the thread goes, what it gave stays
    saver.delete_thread("a-3", keep_memories=True)
    agg.drain()
    assert any(d["text"] == "I play chess" for d in _memories(client, db_name).values())
    assert saver.get_tuple(_cfg("a-3")) is None


def test_a_thread_deleted_keeps_what_another_thread_states_too(
    client: MongoClient, db_name: str
) -> None:
    """Two threads said the same things: the second made no version (nothing new), so
    deleting the first deleted the memories, though the second still states them."""
    accord = Accord(client=client, db_name=db_name)
    saver = accord.checkpointer()
    graph = _chat().compile(checkpointer=saver)
    agg = accord.aggregator()
    for thread in ("a", "b"):
        graph.invoke({"messages": [HumanMessage("My name is Alice. I prefer window seats.")]},
                     _cfg(thread, "alice"))  # fmt: skip
        agg.drain()
    saver.delete_thread("a")
    agg.drain()
    texts = {d["text"]: d for (n, _), d in _memories(client, db_name).items()
             if n == ("memories", "alice")}  # fmt: skip
    assert {"User's name is Alice", "User prefers window seats"} <= set(texts)
    assert {d["provenance"]["thread_id"] for d in texts.values()} == {"b"}


def test_a_thread_deleted_never_brings_back_a_memory_the_user_deleted(
    client: MongoClient, db_name: str
) -> None:
    """B's name was deleted by the user, then A stated another: deleting A restored B's
    (the history's highest version, across the deletion)."""
    accord = Accord(client=client, db_name=db_name)
    saver = accord.checkpointer()
    graph = _chat().compile(checkpointer=saver)
    agg = accord.aggregator()
    ns = ("memories", "alice")
    graph.invoke({"messages": [HumanMessage("My name is Bob.")]}, _cfg("b", "alice"))
    agg.drain()
    assert accord.memory("default").delete(ns, "profile:name")  # the user deletes it
    graph.invoke({"messages": [HumanMessage("My name is Alice.")]}, _cfg("a", "alice"))
    agg.drain()
    assert _memories(client, db_name)[(ns, "profile:name")]["text"] == "User's name is Alice"
    saver.delete_thread("a")
    agg.drain()
    assert (ns, "profile:name") not in _memories(client, db_name)


def test_async_saver_and_aggregator_forget_a_thread(
    mongo_uri: str, client: MongoClient, db_name: str
) -> None:
    async def main() -> None:
        aclient: AsyncMongoClient = AsyncMongoClient(mongo_uri)
        async with AsyncAccord(client=aclient, db_name=db_name) as accord:
            saver = await accord.checkpointer()
            graph = _chat().compile(checkpointer=saver)
            agg = await accord.aggregator()
            for thread, text in (("t-1", "My name is Dana."), ("t-2", "Call me Dee.")):
                await graph.ainvoke({"messages": [HumanMessage(text)]}, _cfg(thread, "dana"))
                await agg.drain()
            await saver.adelete_thread("t-2")
            await agg.drain()
        await aclient.close()

    asyncio.run(main())
    mem = _memories(client, db_name)
    assert mem[(("memories", "dana"), "profile:name")]["text"] == "User's name is Dana"


def test_the_store_in_a_node_serves_the_runs_tenant(client: MongoClient, db_name: str) -> None:
    accord = Accord(client=client, db_name=db_name)

    def remember(state: MessagesState) -> dict[str, Any]:
        store = get_store()
        store.put(("notes",), "last", {"text": state["messages"][-1].content})
        hits = store.search(("notes",), query="note")
        return {"messages": [AIMessage(f"{len(hits)} note(s)")]}

    builder = StateGraph(MessagesState)
    builder.add_node("remember", remember)
    builder.add_edge(START, "remember")
    graph = builder.compile(checkpointer=accord.checkpointer(), store=accord.store())
    out = graph.invoke({"messages": [HumanMessage("acme's note")]}, _cfg("t", tenant="acme"))
    assert out["messages"][-1].content == "1 note(s)"
    acme = accord.memory("acme").get(("notes",), "last")
    assert acme is not None and acme.value == {"text": "acme's note"}
    assert accord.memory("default").get(("notes",), "last") is None
    graph.invoke({"messages": [HumanMessage("globex's note")]}, _cfg("t", tenant="globex"))
    assert accord.memory("globex").get(("notes",), "last").value == {"text": "globex's note"}
    assert accord.memory("acme").get(("notes",), "last").value == {"text": "acme's note"}

    # a store pinned to one tenant refuses a run of another
    pinned = AccordStore(client, db_name=db_name, tenant_id="acme")
    graph = builder.compile(checkpointer=accord.checkpointer(), store=pinned)
    graph.invoke({"messages": [HumanMessage("ok")]}, _cfg("t2", tenant="acme"))
    with pytest.raises(InvalidInputError, match="serves tenant 'acme' only"):
        graph.invoke({"messages": [HumanMessage("no")]}, _cfg("t3", tenant="globex"))
    assert accord.memory("globex").get(("notes",), "last").value == {"text": "globex's note"}
