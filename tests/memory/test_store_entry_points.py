"""The store's entry points as LangGraph users meet them: ``from_conn_string(uri,
index=..., ttl=...)`` as a (async) context manager, like PostgresStore's, with an
``IndexConfig`` whose ``embed`` is a LangChain ``Embeddings`` or a plain function; the
store passed to ``graph.compile(store=...)`` and reached from a node with
``get_store()``; and memories an agent put next to memories the aggregator derived, in
one namespace."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, TypedDict

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from pymongo import MongoClient
from pymongo.errors import InvalidOperation

from accord.memory.aggregator import Aggregator, AggregatorConfig
from accord.memory.asynchronous.store import AsyncAccordStore
from accord.memory.embedders import HashingEmbedder
from accord.memory.synchronous.store import AccordStore
from accord.platform.synchronous.unit_of_work import UnitOfWork
from tests.memory.steps import commit_step


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "entry_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


def test_from_conn_string_with_langchain_embeddings(mongo_uri: str, db_name: str) -> None:
    embeddings = DeterministicFakeEmbedding(size=48)
    index = {"dims": 48, "embed": embeddings, "fields": ["text"]}
    with AccordStore.from_conn_string(mongo_uri, index=index, db_name=db_name,  # type: ignore[arg-type]
                                      ttl={"default_ttl": 60}) as store:  # fmt: skip
        store.setup()  # PostgresStore's users call it; here it is done already and idempotent
        store.put(("docs",), "a", {"text": "the cat sat on the mat"})
        store.put(("docs",), "b", {"text": "stock prices fell sharply"})
        item = store.get(("docs",), "a")
        assert item is not None and item.value == {"text": "the cat sat on the mat"}
        hits = store.search(("docs",), query="the cat sat on the mat", limit=2)
        # the fake embeds equal texts equally: the same text is the best match, score ~1
        assert [h.key for h in hits][0] == "a" and hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert store.service.get(("docs",), "a").expires_at is not None  # default TTL applied
    # the client is closed with the context
    with pytest.raises(InvalidOperation, match="after close"):
        store.get(("docs",), "a")


def test_from_conn_string_with_an_embedding_function(mongo_uri: str, db_name: str) -> None:
    hashing = HashingEmbedder(32)

    def embed(texts: list[str]) -> list[list[float]]:
        return hashing.embed_documents(texts)

    with AccordStore.from_conn_string(mongo_uri, index={"dims": 32, "embed": embed},
                                      db_name=db_name) as store:  # fmt: skip
        store.put(("n",), "tea", {"text": "green tea in the morning"})
        store.put(("n",), "car", {"text": "the car needs new tyres"})
        assert store.search(("n",), query="which tea?", limit=1)[0].key == "tea"


@pytest.mark.asyncio
async def test_async_from_conn_string(mongo_uri: str, db_name: str) -> None:
    index = {"dims": 48, "embed": DeterministicFakeEmbedding(size=48), "fields": ["text"]}
    async with AsyncAccordStore.from_conn_string(mongo_uri, index=index,  # type: ignore[arg-type]
                                                 db_name=db_name) as store:  # fmt: skip
        await store.aput(("docs",), "a", {"text": "hello there"})
        await store.aput(("docs",), "b", {"text": "general kenobi"})
        hits = await store.asearch(("docs",), query="hello there")
        assert hits[0].key == "a"
        assert await store.alist_namespaces() == [("docs",)]
        await store.adelete(("docs",), "a")
        assert await store.aget(("docs",), "a") is None


class State(TypedDict):
    user: str
    fact: str
    found: list[str]


def test_graph_compile_with_store_and_get_store(mongo_uri: str, client: MongoClient,
                                                db_name: str) -> None:  # fmt: skip
    """A node saves and searches through get_store(); the aggregator's memories, derived from
    a committed step of the same tenant, come back from the same namespace."""

    def remember(state: State) -> dict[str, Any]:
        store = get_store()
        store.put(("memories",), f"note-{state['user']}", {"text": state["fact"]})
        hits = store.search(("memories",), query="window seat", limit=5)
        return {"found": [h.value.get("text", h.value.get("content", "")) for h in hits]}

    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)

    with AccordStore.from_conn_string(mongo_uri, db_name=db_name, tenant_id="acme") as store:
        # a committed step in which the user states a preference, aggregated into memory
        uow = UnitOfWork(client)
        commit_step(uow, db_name, "acme", "t1", "c1",
                    [("user", "I prefer a window seat on long flights.")])  # fmt: skip
        agg = Aggregator(client, config=AggregatorConfig(db_name=db_name))
        agg.setup()
        assert agg.drain() == 1

        graph = builder.compile(store=store)
        out = graph.invoke({"user": "u1", "fact": "u1 also likes a window seat on trains",
                            "found": []})  # fmt: skip
        found = " | ".join(out["found"])
        assert "window seat on long flights" in found  # derived by the aggregator
        assert "window seat on trains" in found  # put by the node
        kinds = {m.kind for m in store.service.search(("memories",), limit=10)}
        assert kinds == {"preference", "item"}
