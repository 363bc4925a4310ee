"""Checkpoint schema migrations: documents of an older layout are upgraded when loaded.

The fixture is a thread whose raw documents are in an older layout: written by the
current saver, then rewritten the way a release with layout version 0 would have stored
them (a hypothetical older layout: the serialized checkpoint under ``state`` instead of
``checkpoint``, and ``schema: 0``). A new saver (nothing cached) reads them only with
the migration registered; refused, naming the document, without it; and a document
newer than this code is refused too.
"""

from __future__ import annotations

import operator
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from pymongo import MongoClient

from accord.checkpointers.schema_migrations import CURRENT_SCHEMA, MIGRATIONS, SchemaMigrations
from accord.errors import ForeignDataError
from tests.checkpointers.conftest import make_saver


class State(TypedDict):
    items: Annotated[list[str], operator.add]


def build(saver: Any) -> Any:
    g = StateGraph(State)
    g.add_node("add", lambda s: {"items": [f"item-{len(s['items'])}"]})
    g.add_edge(START, "add")
    g.add_edge("add", END)
    return g.compile(checkpointer=saver)


def to_version_0(doc: dict[str, Any]) -> dict[str, Any]:
    """How the hypothetical release with layout version 0 stored a checkpoint."""
    doc = dict(doc)
    doc["state"] = doc.pop("checkpoint")
    doc["schema"] = 0
    return doc


def from_version_0(doc: dict[str, Any]) -> dict[str, Any]:
    doc["checkpoint"] = doc.pop("state")
    return doc


@pytest.fixture()
def db_name(client: MongoClient) -> Any:
    name = "sm_" + uuid.uuid4().hex[:12]
    try:
        yield name
    finally:
        client.drop_database(name)


@pytest.fixture()
def old_thread(mongo_uri: str, client: MongoClient, db_name: str) -> dict[str, Any]:
    """A thread of two turns, its checkpoints stored in layout version 0; returns its
    state as the release that wrote it saw it."""
    cfg = {"configurable": {"thread_id": "old"}}
    with make_saver("sync", mongo_uri, db_name) as saver:
        graph = build(saver)
        graph.invoke({"items": ["a"]}, cfg)
        state = graph.invoke({"items": ["b"]}, cfg)
    coll = client[db_name]["accord_checkpoints"]
    docs = list(coll.find({"thread_id": "old"}))
    assert docs and all("schema" not in d for d in docs)  # today's layout: version 1
    for doc in docs:
        coll.replace_one({"_id": doc["_id"]}, to_version_0(doc))
    return dict(state)


def test_an_old_layout_is_refused_without_its_migration(
    old_thread: dict[str, Any], mongo_uri: str, db_name: str
) -> None:
    with (
        make_saver("sync", mongo_uri, db_name) as saver,
        pytest.raises(ForeignDataError, match="layout version 0, and no migration from"),
    ):
        build(saver).get_state({"configurable": {"thread_id": "old"}})


def test_an_old_layout_is_upgraded_on_load_and_the_thread_goes_on(
    old_thread: dict[str, Any], mongo_uri: str, client: MongoClient, db_name: str
) -> None:
    cfg = {"configurable": {"thread_id": "old"}}
    with (
        MIGRATIONS.registered("checkpoint", 0, from_version_0),
        make_saver("sync", mongo_uri, db_name) as saver,
    ):
        graph = build(saver)
        assert graph.get_state(cfg).values == old_thread
        history = list(graph.get_state_history(cfg))
        assert len(history) >= 4 and history[-1].values == {"items": []}
        state = graph.invoke({"items": ["c"]}, cfg)
    assert state["items"] == [*old_thread["items"], "c", f"item-{len(old_thread['items']) + 1}"]
    coll = client[db_name]["accord_checkpoints"]
    # the old documents stay as they were; the new ones are in today's layout
    assert coll.count_documents({"thread_id": "old", "schema": 0}) == len(history)
    assert coll.count_documents({"thread_id": "old", "schema": {"$exists": False}}) >= 2


def test_a_document_newer_than_this_code_is_refused(
    mongo_uri: str, client: MongoClient, db_name: str
) -> None:
    cfg = {"configurable": {"thread_id": "new"}}
    with make_saver("sync", mongo_uri, db_name) as saver:
        build(saver).invoke({"items": []}, cfg)
    client[db_name]["accord_checkpoints"].update_many({"thread_id": "new"}, {"$set": {"schema": 9}})
    with (
        make_saver("sync", mongo_uri, db_name) as saver,
        pytest.raises(ForeignDataError, match="newer than this accord reads"),
    ):
        build(saver).get_state(cfg)


def test_migrations_chain_and_skip_classes_that_did_not_change() -> None:
    m = SchemaMigrations(current=3)
    m.register("checkpoint", 1)(lambda d: {**d, "a": 1})
    m.register("checkpoint", 2)(lambda d: {**d, "b": 2})
    m.register("checkpoint_blob", 2)(lambda d: {**d, "c": 3})
    assert m.upgrade("checkpoint", {"_id": 1}) == {"_id": 1, "a": 1, "b": 2, "schema": 3}
    # blobs did not change from 1 to 2 (a version other classes have a step for)
    assert m.upgrade("checkpoint_blob", {"_id": 2}) == {"_id": 2, "c": 3, "schema": 3}
    current = {"_id": 3, "schema": 3}
    assert m.upgrade("checkpoint", current) is current
    assert CURRENT_SCHEMA == 1
