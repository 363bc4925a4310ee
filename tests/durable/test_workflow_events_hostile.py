"""Workflow events staged by a hostile ``put_writes`` caller (it is public: a direct call,
a migration replaying another saver's writes): an event is refused unless it says who
wrote it and when as ``business.append_event`` does."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from pymongo import MongoClient

from accord.checkpointers.storage import BUSINESS_CHANNEL
from accord.errors import InvalidInputError
from accord.platform import workflow_log
from tests.checkpointers import conftest as checkpointer_fixtures
from tests.checkpointers.conftest import config

# the checkpointer tests' fixtures: a saver of each kind on a database of its own
kind = checkpointer_fixtures.kind
saver = checkpointer_fixtures.saver
db_name = checkpointer_fixtures.db_name


class State(TypedDict):
    log: Annotated[list[Any], operator.add]


def _thread_config(saver: Any, thread: str) -> dict[str, Any]:
    """The config of ``thread``'s latest checkpoint (one step run), with its tenant."""

    def agent(state: State) -> dict[str, Any]:
        return {"log": [1]}

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    graph: Any = g.compile(checkpointer=saver)
    graph.invoke({"log": []}, config(thread))
    conf = dict(saver.get_tuple(config(thread)).config["configurable"])
    return {"configurable": {**conf, "tenant_id": "default"}}


def _event(thread: str | None, **fields: Any) -> dict[str, Any]:
    doc = workflow_log.event_doc("default", "wf", {"step": 1}, thread_id=thread, node="agent")
    return {**doc, **fields}


@pytest.mark.parametrize(
    ("forge", "problem"),
    [
        ({"thread_id": None}, "is not the run's thread"),  # before: logged anonymously
        ({"thread_id": "someone-else"}, "is not the run's thread"),
        ({"node": {"$ne": None}}, "is not the staging node"),  # before: stored as is
        ({"node": "another-node"}, "is not the staging node"),
        ({"at": "1999-01-01"}, "the time it was staged"),  # before: stored as is
        ({"at": None}, "the time it was staged"),
    ],
)
def test_a_forged_attribution_is_refused(
    client: MongoClient, saver: Any, db_name: str, forge: dict[str, Any], problem: str
) -> None:
    cfg = _thread_config(saver, "t")
    doc = _event("t", **forge)
    op = {"op": "append_event", "collection": workflow_log.COLLECTION, "document": doc,
          "node": "agent"}  # fmt: skip
    with pytest.raises(InvalidInputError, match=problem):
        saver.put_writes(cfg, [(BUSINESS_CHANNEL, op)], "task-1")
    assert client[db_name][workflow_log.COLLECTION].count_documents({}) == 0


def test_an_event_as_append_event_stages_it_is_numbered(
    client: MongoClient, saver: Any, db_name: str
) -> None:
    cfg = _thread_config(saver, "t")
    op = {"op": "append_event", "collection": workflow_log.COLLECTION,
          "document": _event("t"), "node": "agent"}  # fmt: skip
    saver.put_writes(cfg, [(BUSINESS_CHANNEL, op)], "task-1")
    [stored] = client[db_name][workflow_log.COLLECTION].find({"workflow": "wf"})
    assert (stored["seq"], stored["thread_id"], stored["node"]) == (1, "t", "agent")
