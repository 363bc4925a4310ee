"""Rollback and its undo log under hostile or unlucky input: record ids Python takes for
equal (``True`` and ``1``), two steps committed within one millisecond (``at`` ties)."""

from __future__ import annotations

import operator
from datetime import UTC, datetime
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from pymongo import MongoClient

from accord.checkpointers import business
from accord.platform import undo_log
from tests.checkpointers import conftest as checkpointer_fixtures
from tests.checkpointers.conftest import config

# the checkpointer tests' fixtures: a saver of each kind on a database of its own
kind = checkpointer_fixtures.kind
saver = checkpointer_fixtures.saver
db_name = checkpointer_fixtures.db_name


class State(TypedDict):
    n: Annotated[int, operator.add]


def _graph(saver: Any, work: Any) -> Any:
    g = StateGraph(State)
    g.add_node("work", work)
    g.add_edge(START, "work")
    return g.compile(checkpointer=saver)


def _first(graph: Any, thread: str) -> str:
    history = list(graph.get_state_history(config(thread)))
    return str(history[-1].config["configurable"]["checkpoint_id"])


def test_ids_true_and_1_are_two_records(client: MongoClient, saver: Any, db_name: str) -> None:
    """Before 2026-12-07 the undo log and the rollback keyed records by Python equality:
    ``_id: True`` was taken for ``_id: 1`` (its before-image unknown), and the rollback
    of the step was refused, or restored one record for both."""
    items = client[db_name].items
    items.insert_many([{"_id": 1, "tenant_id": "default", "v": "int"},
                       {"_id": True, "tenant_id": "default", "v": "bool"}])  # fmt: skip
    before = sorted(items.find(), key=repr)

    def work(state: State) -> dict[str, Any]:
        business.update_one("items", {"_id": 1}, {"$set": {"v": "int2"}})
        business.update_one("items", {"_id": True}, {"$set": {"v": "bool2"}})
        return {"n": 1}

    graph = _graph(saver, work)
    graph.invoke({"n": 0}, config("ids"))
    entries = list(client[db_name][undo_log.COLLECTION].find())
    assert all(e["before_known"] for e in entries) and len(entries) == 2
    done = saver.rollback(config("ids"), to=_first(graph, "ids"))
    assert (done.records_restored, done.writes_undone) == (2, 2)
    assert sorted(items.find(), key=repr) == before


class _FrozenClock(datetime):
    """Every ``now`` in one millisecond: steps committed that close together."""

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return datetime(2026, 12, 7, 12, 0, 0, 500, tzinfo=UTC)


def test_steps_in_one_millisecond_undo_in_order(
    client: MongoClient, saver: Any, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The undo entries of two steps that committed in the same millisecond (BSON times
    keep milliseconds) sort in commit order: before 2026-12-07 they sorted by (``at``,
    position in the batch), so the second step's write to a record could come first,
    its before-image was taken for the record's, and the rollback was refused as if
    another writer had changed the record."""
    monkeypatch.setattr(undo_log, "datetime", _FrozenClock)
    client[db_name].stock.insert_many([{"_id": "a", "tenant_id": "default", "q": 0},
                                       {"_id": "b", "tenant_id": "default", "q": 0}])  # fmt: skip
    before = sorted(client[db_name].stock.find(), key=repr)

    def work(state: State) -> dict[str, Any]:
        if state["n"] == 0:  # the first step: "b" first, "a" second in its batch
            business.update_one("stock", {"_id": "b"}, {"$inc": {"q": 1}})
        business.update_one("stock", {"_id": "a"}, {"$inc": {"q": 1}})
        return {"n": 1}

    graph = _graph(saver, work)
    graph.invoke({"n": 0}, config("ms"))
    graph.invoke({"n": 0}, config("ms"))
    assert (client[db_name].stock.find_one({"_id": "a"}) or {}).get("q") == 2
    done = saver.rollback(config("ms"), to=_first(graph, "ms"))
    assert done.writes_undone == 3
    assert sorted(client[db_name].stock.find(), key=repr) == before
