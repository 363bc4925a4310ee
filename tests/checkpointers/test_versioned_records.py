"""Versioned business records: agents sharing one record never overwrite each other.

Every business write keeps ``_version`` on its record; a write staged with
``expect_version=n`` commits only while the record is still at version ``n``. When
another agent changed it first, the task's transaction fails with
:class:`~accord.errors.VersionConflict` (nothing of the task is committed) and resuming
the thread re-runs the task on the record as it is now.
"""

from __future__ import annotations

import operator
import threading
from datetime import datetime
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from pymongo import MongoClient

from accord.checkpointers import business
from accord.errors import BusinessWriteError, InvalidInputError, VersionConflict
from tests.checkpointers.conftest import config, make_saver


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(node: Any) -> StateGraph:
    g = StateGraph(State)
    g.add_node("work", node)
    g.add_edge(START, "work")
    return g


def _doc(client: MongoClient, db_name: str, _id: str) -> dict[str, Any]:
    found = client[db_name].accounts.find_one({"_id": _id})
    assert found is not None
    return found


def test_every_write_keeps_the_version(client: MongoClient, saver: Any, db_name: str) -> None:
    """An insert sets 1, an update adds 1 (operators and pipelines), a replacement with
    ``expect_version=n`` sets n + 1, one without a value no earlier version had; a
    delete with the right version deletes."""
    steps: list[Any] = [
        lambda: business.insert_one("accounts", {"_id": "a", "balance": 10}),
        lambda: business.update_one("accounts", {"_id": "a"}, {"$inc": {"balance": 5}}),
        lambda: business.update_one(
            "accounts",
            {"_id": "a"},
            [{"$set": {"balance": {"$add": ["$balance", 1]}}}],
            expect_version=2,
        ),  # fmt: skip
        lambda: business.replace_one("accounts", {"_id": "a"}, {"balance": 0}, expect_version=3),
        lambda: business.replace_one("accounts", {"_id": "a"}, {"balance": 1}),
    ]
    seen: list[tuple[int, int]] = []
    for i, step in enumerate(steps):

        def node(state: State, step: Any = step) -> dict[str, Any]:
            step()
            return {"log": ["x"]}

        _graph(node).compile(checkpointer=saver).invoke({"log": []}, config(f"v{i}"))
        doc = _doc(client, db_name, "a")
        seen.append((doc["balance"], doc["_version"]))
    assert seen[:4] == [(10, 1), (15, 2), (16, 3), (0, 4)]
    assert seen[4][0] == 1 and seen[4][1] not in (1, 2, 3, 4)

    version = seen[4][1]

    def delete(state: State) -> dict[str, Any]:
        business.delete_one("accounts", {"_id": "a"}, expect_version=version)
        return {"log": ["deleted"]}

    _graph(delete).compile(checkpointer=saver).invoke({"log": []}, config("del"))
    assert client[db_name].accounts.find_one({"_id": "a"}) is None


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_a_stale_version_fails_the_task_and_a_resume_reruns_it(
    client: MongoClient, saver: Any, db_name: str, durability: str
) -> None:
    """The node read version 1; another agent moved the record to 2 before the task
    committed: VersionConflict names the record's collection and the version, nothing of
    the task is committed (its other business write neither), and the resume reads the
    record again and commits."""
    accounts = client[db_name].accounts
    accounts.insert_one({"_id": "acct", "tenant_id": "default", "balance": 100, "_version": 1})
    runs = {"n": 0}

    def withdraw(state: State) -> dict[str, Any]:
        runs["n"] += 1
        doc = accounts.find_one({"_id": "acct"})
        assert doc is not None
        if runs["n"] == 1:  # another agent writes between this read and the commit
            accounts.update_one({"_id": "acct"}, {"$inc": {"balance": -30, "_version": 1}})
        business.insert_one("ledger", {"_id": f"w-{runs['n']}", "amount": 10})
        business.update_one(
            "accounts", {"_id": "acct"}, {"$set": {"balance": doc["balance"] - 10}},
            expect_version=doc["_version"],
        )  # fmt: skip
        return {"log": [f"withdrew from {doc['balance']}"]}

    graph = _graph(withdraw).compile(checkpointer=saver)
    cfg = config("shared")
    with pytest.raises(VersionConflict) as caught:
        graph.invoke({"log": []}, cfg, durability=durability)
    err = caught.value
    assert isinstance(err, BusinessWriteError)
    assert err.collection == "accounts" and err.expected == 1 and err.node == "work"
    assert "version 1" in str(err) and "graph.invoke(None, config)" in str(err)
    assert client[db_name].ledger.count_documents({}) == 0  # the task's other write too
    assert _doc(client, db_name, "acct")["balance"] == 70

    out = graph.invoke(None, cfg, durability=durability)
    assert out["log"] == ["withdrew from 70"]
    assert _doc(client, db_name, "acct")["balance"] == 60
    assert _doc(client, db_name, "acct")["_version"] == 3
    assert [d["_id"] for d in client[db_name].ledger.find()] == ["w-2"]


def test_concurrent_agents_never_lose_an_update(
    client: MongoClient, mongo_uri: str, db_name: str
) -> None:
    """Three agents (threads of their own, each with its own saver and client) add 1 to
    one record 15 times each by read-modify-write with ``expect_version``; on a conflict
    they resume. The record ends at 45, with 45 ledger lines: no update lost, none
    applied twice."""
    client[db_name].accounts.insert_one(
        {"_id": "shared", "tenant_id": "default", "count": 0, "_version": 1}
    )
    per_agent, agents = 15, 3
    conflicts: list[int] = []
    errors: list[BaseException] = []

    def agent(i: int) -> None:
        reader = MongoClient(mongo_uri)
        try:
            with make_saver("sync", mongo_uri, db_name) as saver:

                def add(state: State) -> dict[str, Any]:
                    doc = reader[db_name].accounts.find_one({"_id": "shared"})
                    assert doc is not None
                    business.update_one(
                        "accounts", {"_id": "shared"}, {"$set": {"count": doc["count"] + 1}},
                        expect_version=doc["_version"],
                    )  # fmt: skip
                    business.insert_one("ledger", {"by": i, "saw": doc["count"]})
                    return {"log": ["+1"]}

                graph = _graph(add).compile(checkpointer=saver)
                for turn in range(per_agent):
                    cfg = config(f"agent-{i}-{turn}")
                    payload: Any = {"log": []}
                    while True:
                        try:
                            graph.invoke(payload, cfg)
                            break
                        except VersionConflict:
                            conflicts.append(i)
                            payload = None  # resume: the task runs again on fresh data
        except BaseException as exc:
            errors.append(exc)
        finally:
            reader.close()

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors
    assert _doc(client, db_name, "shared")["count"] == per_agent * agents
    saw = sorted(d["saw"] for d in client[db_name].ledger.find())
    assert saw == list(range(per_agent * agents))  # each value read and moved on once
    assert conflicts, "the agents never raced: the test proves nothing"


@pytest.mark.parametrize(
    ("stage", "problem"),
    [
        (lambda: business.update_one("a", {"_id": 1}, {"$set": {"x": 1}}, expect_version=-1),
         "non-negative int"),
        (lambda: business.update_one("a", {"_id": 1}, {"$set": {"x": 1}}, expect_version=True),
         "non-negative int"),
        (lambda: business.delete_one("a", {"_id": 1}, expect_version="3"), "non-negative int"),
        (lambda: business.update_one("a", {"_id": 1}, {"$set": {"x": 1}}, upsert=True,
                                     expect_version=1), "upsert"),
        (lambda: business.insert_one("a", {"_id": 1, "_version": 9}), "_version"),
        (lambda: business.update_one("a", {"_id": 1}, {"$set": {"_version": 9}}), "_version"),
        (lambda: business.update_one("a", {"_id": 1}, {"$inc": {"_version.x": 1}}), "_version"),
        (lambda: business.update_one("a", {"_id": 1}, {"$rename": {"x": "_version"}}),
         "_version"),
        (lambda: business.update_one("a", {"_id": 1}, [{"$unset": "_version"}]), "_version"),
        (lambda: business.update_one("a", {"_id": 1}, [{"$set": {"_version": 1}}]), "_version"),
        (lambda: business.replace_one("a", {"_id": 1}, {"_version": 2}), "_version"),
        (lambda: business.update_one("a", {"_id": 1, "_version": 2}, {"$set": {"x": 1}},
                                     expect_version=2), "beside expect_version"),
        # the expiry a legal hold set aside: moving it back lifted the hold
        (lambda: business.update_one("a", {"_id": 1}, {"$unset": {"held_expire_at": ""}}),
         "held_expire_at"),
        (lambda: business.update_one("a", {"_id": 1}, {"$rename": {"held_expire_at": "x"}}),
         "held_expire_at"),
        (lambda: business.insert_one("a", {"_id": 1, "held_expire_at": None}), "held_expire_at"),
    ],
)  # fmt: skip
def test_bad_versioned_writes_are_refused_in_the_node(
    client: MongoClient, saver: Any, db_name: str, stage: Any, problem: str
) -> None:
    """Refused when staged, naming the problem; nothing is written."""

    def node(state: State) -> dict[str, Any]:
        stage()
        return {"log": ["x"]}

    with pytest.raises(InvalidInputError, match=problem):
        _graph(node).compile(checkpointer=saver).invoke({"log": []}, config("bad"))
    assert client[db_name].a.count_documents({}) == 0


_HELD = datetime(2099, 1, 1)


@pytest.mark.parametrize(
    "stage",
    [
        lambda: business.update_one("a", {"_id": "n", "_version": 999}, {"$set": {"x": 1}},
                                    upsert=True),
        lambda: business.update_one("a", {"_id": "n", "$and": [{"_version": 41}]},
                                    {"$set": {"x": 1}}, upsert=True),
        lambda: business.update_one("a", {"$or": [{"$and": [{"_version.x": 1}]}]},
                                    {"$set": {"x": 1}}, upsert=True),
        lambda: business.update_one("a", {"$nor": [{"_version": {"$gt": 1}}]},
                                    [{"$set": {"x": 1}}], upsert=True),
        lambda: business.update_one("a", {"_id": "n", "held_expire_at": _HELD},
                                    {"$set": {"x": 1}}, upsert=True),
        lambda: business.replace_one("a", {"_id": "n", "_version": 5}, {"x": 1}, upsert=True),
    ],
    ids=["version", "version-in-and", "nested-or-and", "nor-pipeline", "held", "replace"],
)  # fmt: skip
def test_an_upsert_filter_may_not_set_bookkeeping_fields(
    client: MongoClient, saver: Any, db_name: str, stage: Any
) -> None:
    """An upsert copies its filter's equalities into the record it creates: before, a
    filter with ``_version: 999`` created the record at version 1000 (so the thread's
    rollback was refused as if another writer had changed it), and one with
    ``held_expire_at`` set the hold's field."""

    def node(state: State) -> dict[str, Any]:
        stage()
        return {"log": ["x"]}

    with pytest.raises(InvalidInputError, match="the filter of an upsert names"):
        _graph(node).compile(checkpointer=saver).invoke({"log": []}, config("bad"))
    assert client[db_name].a.count_documents({}) == 0


def test_put_writes_refuses_an_upsert_filter_setting_the_version(
    client: MongoClient, saver: Any, db_name: str
) -> None:
    """The same rule where staged writes arrive without ``business.*`` (put_writes)."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

    from accord.checkpointers.storage import BUSINESS_CHANNEL

    stored = saver.put(config("pw"), generate_checkpoint(), generate_metadata(), {})
    forged = {
        "op": "update_one", "collection": "a", "update": {"$set": {"x": 1}}, "upsert": True,
        "filter": {"_id": "n", "tenant_id": "default", "$and": [{"_version": 41}]},
    }  # fmt: skip
    with pytest.raises(InvalidInputError, match="the filter of an upsert names '_version'"):
        saver.put_writes(stored, [(BUSINESS_CHANNEL, forged)], "task-1")
    assert client[db_name].a.count_documents({}) == 0


def test_a_filter_on_bookkeeping_fields_without_upsert_still_matches(
    client: MongoClient, saver: Any, db_name: str
) -> None:
    """Only an upsert is refused: a plain update may select records by them."""
    client[db_name].a.insert_one(
        {"_id": "n", "tenant_id": "default", "_version": 3, "held_expire_at": _HELD}
    )

    def node(state: State) -> dict[str, Any]:
        business.update_one("a", {"_id": "n", "_version": 3, "held_expire_at": _HELD},
                            {"$set": {"x": 1}})  # fmt: skip
        return {"log": ["x"]}

    _graph(node).compile(checkpointer=saver).invoke({"log": []}, config("ok"))
    assert client[db_name].a.find_one({"_id": "n"}) == {
        "_id": "n", "tenant_id": "default", "_version": 4, "held_expire_at": _HELD, "x": 1,
    }  # fmt: skip
