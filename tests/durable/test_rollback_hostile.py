"""Rollback and its undo log under hostile or unlucky input: record ids Python takes for
equal (``True`` and ``1``), two steps committed within one millisecond (``at`` ties),
writers whose clocks disagree (a takeover by a machine whose clock is behind)."""

from __future__ import annotations

import operator
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from pymongo import MongoClient, monitoring

from accord.checkpointers import business
from accord.platform import undo_log
from tests.checkpointers import conftest as checkpointer_fixtures
from tests.checkpointers.conftest import config

# the checkpointer tests' fixtures: a saver of each kind on a database of its own
kind = checkpointer_fixtures.kind
saver = checkpointer_fixtures.saver
saver_factory = checkpointer_fixtures.saver_factory
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


class _LateClock(datetime):
    """The clock of a machine an hour behind the others."""

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return datetime.now(tz) - timedelta(hours=1)


def _bump(state: State) -> dict[str, Any]:
    """One step: the shared record ``x`` moves on by one."""
    business.update_one("stock", {"_id": "x"}, {"$inc": {"q": 1}})
    return {"n": 1}


def test_a_takeover_by_a_machine_whose_clock_is_behind_undoes_in_commit_order(
    client: MongoClient,
    saver: Any,
    saver_factory: Any,
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two writers (their own kernels, as two machines) take turns on a thread; the
    second's clock is an hour behind. Before 2026-12-07 the undo entries sorted by the
    writers' clocks (``at``), so the second writer's entry came first, its before-image
    was taken for the record's, and the rollback "succeeded" leaving the record as the
    first step had left it (``q`` 1, not 0). Now they sort by the thread's sequence,
    assigned in each step's transaction: commit order whatever the clocks say."""
    client[db_name].stock.insert_one({"_id": "x", "tenant_id": "default", "q": 0})
    before = list(client[db_name].stock.find())
    late = saver_factory()
    graph = _graph(saver, _bump)
    graph.invoke({"n": 0}, config("skew"))
    with monkeypatch.context() as m:
        m.setattr(undo_log, "datetime", _LateClock)
        _graph(late, _bump).invoke({"n": 0}, config("skew"))  # the takeover
    graph.invoke({"n": 0}, config("skew"))  # and back
    assert (client[db_name].stock.find_one({"_id": "x"}) or {}).get("q") == 3
    entries = list(client[db_name][undo_log.COLLECTION].find().sort(undo_log.SORT))
    done = saver.rollback(config("skew"), to=_first(graph, "skew"))
    assert done.writes_undone == 3
    assert list(client[db_name].stock.find()) == before
    # the log's order is the commits': the before-images 0, 1, 2, one sequence number each
    assert [undo_log.decode(e["before"])["q"] for e in entries] == [0, 1, 2]  # type: ignore[index]
    seqs = [e.get("seq") for e in entries]
    assert all(isinstance(s, int) for s in seqs) and seqs == sorted(set(seqs))


def test_entries_without_a_sequence_undo_first_in_clock_order(
    client: MongoClient, saver: Any, db_name: str
) -> None:
    """Entries written before 2026-12-07 have no ``seq``: they sort before the sequenced
    ones, among themselves by (``at``, ``order``, position) as they did."""
    client[db_name].stock.insert_one({"_id": "x", "tenant_id": "default", "q": 0})
    before = list(client[db_name].stock.find())
    graph = _graph(saver, _bump)
    graph.invoke({"n": 0}, config("old"))
    graph.invoke({"n": 0}, config("old"))
    log = client[db_name][undo_log.COLLECTION]
    log.update_many({}, {"$unset": {"seq": ""}})  # as an older release wrote them
    graph.invoke({"n": 0}, config("old"))
    assert log.count_documents({"seq": {"$exists": True}}) == 1
    done = saver.rollback(config("old"), to=_first(graph, "old"))
    assert done.writes_undone == 3
    assert list(client[db_name].stock.find()) == before


class _Txns(monitoring.CommandListener):
    """The commands of each transaction, by (session, transaction number)."""

    def __init__(self) -> None:
        self.txns: dict[Any, list[str]] = defaultdict(list)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        cmd = event.command
        if "txnNumber" in cmd:
            self.txns[str(cmd.get("lsid")), cmd["txnNumber"]].append(event.command_name)

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        pass


def test_the_sequence_costs_no_command(kind: str, mongo_uri: str, db_name: str) -> None:
    """A business insert's step is still one ``bulkWrite`` and its commit: the
    sequence's compare-and-set on the run-registry document rides in the same
    ``bulkWrite``, and no read is needed (the first step of a thread included)."""
    listener = _Txns()
    with checkpointer_fixtures.make_saver(kind, mongo_uri, db_name, listeners=[listener]) as s:

        def add(state: State) -> dict[str, Any]:
            business.insert_one("ledger", {"n": state["n"]})
            return {"n": 1}

        graph = _graph(s, add)
        for _ in range(3):
            graph.invoke({"n": 0}, config("cost"))
    steps = [names for names in listener.txns.values() if "bulkWrite" in names]
    assert steps and all(names == ["bulkWrite", "commitTransaction"] for names in steps), steps
