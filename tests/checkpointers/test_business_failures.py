"""A business write the database refuses (here: a duplicate ``_id``) fails its task.

Nothing of the task is recorded (neither its business writes nor its pending writes), no
later checkpoint is saved on top of the checkpoint it ran from, the run raises
:class:`~accord.errors.BusinessWriteError` naming the node, the collection and the
reason, and once the data is fixed a resume re-runs the task. This must hold under both
LangGraph durability modes: under ``"async"`` the task's ``put_writes`` runs in the
background, concurrently with the ``put`` of the next checkpoint.
"""

from __future__ import annotations

import asyncio
import operator
import time
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import ClientBulkWriteException, OperationFailure, PyMongoError

from accord.checkpointers import AccordSaver, AsyncAccordSaver, business
from accord.errors import AccordError, BusinessWriteError, TaskWriteError
from tests.checkpointers.conftest import make_saver, unique_db


class State(TypedDict):
    messages: Annotated[list, add_messages]
    log: Annotated[list[str], operator.add]


def a(state: State) -> dict[str, Any]:
    # the update comes first: it must be rolled back with the failing insert
    business.update_one("counters", {"_id": "a"}, {"$inc": {"v": 1}}, upsert=True)
    business.insert_one("ledger", {"_id": "taken", "by": "a"})  # "taken" exists already
    return {"messages": [AIMessage("a done", id="a")], "log": ["a"]}


def b(state: State) -> dict[str, Any]:
    business.insert_one("ledger", {"_id": "b"})
    return {"messages": [AIMessage("b done", id="b")], "log": ["b"]}


def chain() -> StateGraph:
    """START -> a -> b -> END."""
    g = StateGraph(State)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g


INPUT = {"messages": [HumanMessage("hi", id="h")], "log": []}


def check_error(err: BaseException) -> None:
    assert isinstance(err, BusinessWriteError) and isinstance(err, TaskWriteError)
    assert isinstance(err, AccordError) and not isinstance(err, PyMongoError)
    assert err.node == "a" and err.collection == "ledger" and err.operation == "insert_one"
    assert err.code == 11000 and err.key_value == {"_id": "taken"}
    assert err.thread_id == "t"
    message = str(err)
    for part in ("node 'a'", "'ledger'", "duplicate key", "'taken'", "thread 't'", "resume"):
        assert part in message, (part, message)
    assert err.checkpoint_id is not None and repr(err.checkpoint_id) in message


def check_stopped(db: Any, state: Any, history: list[Any]) -> None:
    """The thread stays at the checkpoint task ``a`` ran from; nothing of ``a`` exists."""
    assert [m.id for m in state.values["messages"]] == ["h"]
    assert state.next == ("a",)
    assert [s.metadata["step"] for s in history] == [0, -1]  # nothing after step 0
    task_a = state.tasks[0].id
    assert db.accord_checkpoint_writes.count_documents({"task_id": task_a}) == 0
    assert db.outbox.count_documents({"kind": "writes", "task_id": task_a}) == 0
    assert db.counters.count_documents({}) == 0  # rolled back with the failed insert
    assert list(db.ledger.find({}, {"_id": 1, "by": 1})) == [{"_id": "taken"}]


def check_resumed(db: Any, out: dict[str, Any]) -> None:
    assert [m.id for m in out["messages"]] == ["h", "a", "b"]
    assert out["log"] == ["a", "b"]
    assert sorted(d["_id"] for d in db.ledger.find()) == ["b", "taken"]
    assert db.ledger.find_one({"_id": "taken"})["by"] == "a"
    assert db.counters.find_one({"_id": "a"})["v"] == 1  # exactly once


class TopLevelErrors:
    """A client whose client-level bulkWrite reports a failed write as a top-level error
    of the command (the shape an engine may use inside a transaction) instead of
    ``writeErrors``."""

    def __init__(self, client: MongoClient) -> None:
        self._client = client
        self.raised = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def __getitem__(self, name: str) -> Any:
        return self._client[name]

    def bulk_write(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._client.bulk_write(*args, **kwargs)
        except ClientBulkWriteException as exc:
            if not exc.write_errors:
                raise
            we = dict(exc.details["writeErrors"][0])
            details = {k: we[k] for k in ("code", "errmsg", "keyPattern", "keyValue") if k in we}
            top = OperationFailure(we["errmsg"], we["code"], details)
            self.raised += 1
            raise ClientBulkWriteException(
                {"error": top, "writeErrors": [], "writeConcernErrors": [], "nInserted": 0},
                True,
            ) from None


@pytest.mark.parametrize(
    ("kind", "durability", "mode"),
    [
        ("sync", "sync", "client"),
        ("sync", "async", "client"),
        ("sync", "sync", "collection"),
        ("sync", "async", "top-level"),
        ("async", "sync", "client"),
        ("async", "async", "client"),
        ("async", "async", "collection"),
    ],
)
def test_failed_business_write_records_nothing_and_resume_reruns_the_task(
    client: MongoClient, mongo_uri: str, db_name: str, kind: str, durability: str, mode: str
) -> None:
    """Both savers (the async one driven by sync graphs through its sync methods)."""
    db = client[db_name]
    db.ledger.insert_one({"_id": "taken", "tenant_id": "default"})
    proxy = TopLevelErrors(client)
    if mode == "top-level":
        saver: Any = AccordSaver(proxy, db_name=db_name, outbox_events=True)  # type: ignore[arg-type]
        saver.setup()
        _run_failure(db, saver, durability, proxy)
        return
    with make_saver(
        kind, mongo_uri, db_name, client_bulk=False if mode == "collection" else None
    ) as saver:
        _run_failure(db, saver, durability, proxy)


def _run_failure(db: Any, saver: Any, durability: str, proxy: TopLevelErrors) -> None:
    mode = "top-level" if isinstance(saver.client, TopLevelErrors) else "other"
    graph = chain().compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": "t"}}

    with pytest.raises(BusinessWriteError) as info:
        graph.invoke(INPUT, cfg, durability=durability)
    check_error(info.value)
    # (once, or twice when "async" durability committed it with other saves first)
    assert (proxy.raised >= 1) if mode == "top-level" else proxy.raised == 0
    history = list(graph.get_state_history(cfg))
    check_stopped(db, graph.get_state(cfg), history)
    assert info.value.checkpoint_id == history[0].config["configurable"]["checkpoint_id"]

    # resuming without fixing the data fails the same way, and still records nothing
    with pytest.raises(BusinessWriteError):
        graph.invoke(None, cfg, durability=durability)
    check_stopped(db, graph.get_state(cfg), list(graph.get_state_history(cfg)))

    db.ledger.delete_one({"_id": "taken"})  # the user fixes the data
    check_resumed(db, graph.invoke(None, cfg, durability=durability))
    assert [s.metadata["step"] for s in graph.get_state_history(cfg)] == [2, 1, 0, -1]


def test_a_sibling_task_that_succeeded_is_not_rerun(client: MongoClient, saver: Any) -> None:
    """Parallel tasks: ``a`` fails, ``c`` (same step) commits; the resume runs only ``a``."""

    db = client[saver.db_name]

    def c(state: State) -> dict[str, Any]:
        business.update_one("counters", {"_id": "c"}, {"$inc": {"v": 1}}, upsert=True)
        return {"log": ["c"]}

    def a_after_c(state: State) -> dict[str, Any]:
        # LangGraph cancels a sibling not yet started once a task fails: on a loaded
        # machine ``a`` failed before ``c``'s thread began (CI saw ``next == ("a", "c")``,
        # nothing of ``c`` committed), so ``a`` fails only once ``c`` has committed
        deadline = time.monotonic() + 30
        while db.counters.find_one({"_id": "c"}) is None:
            assert time.monotonic() < deadline, "task c never committed"
            time.sleep(0.01)
        return a(state)

    g = StateGraph(State)
    g.add_node("a", a_after_c)
    g.add_node("c", c)
    g.add_edge(START, "a")
    g.add_edge(START, "c")
    g.add_edge("a", END)
    g.add_edge("c", END)
    db.ledger.insert_one({"_id": "taken", "tenant_id": "default"})
    graph = g.compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": "par"}}
    with pytest.raises(BusinessWriteError, match="node 'a'"):
        graph.invoke(INPUT, cfg)
    state = graph.get_state(cfg)
    assert state.next == ("a",)
    assert db.counters.find_one({"_id": "c"})["v"] == 1
    assert db.counters.find_one({"_id": "a"}) is None
    db.ledger.delete_one({"_id": "taken"})
    out = graph.invoke(None, cfg)
    assert sorted(out["log"]) == ["a", "c"]
    assert db.counters.find_one({"_id": "c"})["v"] == 1  # c was not re-run
    assert db.counters.find_one({"_id": "a"})["v"] == 1


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_async_saver_failed_business_write(
    mongo_uri: str, client: MongoClient, durability: str
) -> None:
    name = unique_db()
    db = client[name]
    db.ledger.insert_one({"_id": "taken", "tenant_id": "default"})

    async def main() -> None:
        aclient: AsyncMongoClient = AsyncMongoClient(mongo_uri)
        try:
            saver = AsyncAccordSaver(aclient, db_name=name, outbox_events=True)
            await saver.setup()
            graph = chain().compile(checkpointer=saver)
            cfg = {"configurable": {"thread_id": "t"}}
            with pytest.raises(BusinessWriteError) as info:
                await graph.ainvoke(INPUT, cfg, durability=durability)
            check_error(info.value)
            history = [s async for s in graph.aget_state_history(cfg)]
            check_stopped(db, await graph.aget_state(cfg), history)
            db.ledger.delete_one({"_id": "taken"})
            check_resumed(db, await graph.ainvoke(None, cfg, durability=durability))
        finally:
            await aclient.close()

    try:
        asyncio.run(main())
    finally:
        client.drop_database(name)
