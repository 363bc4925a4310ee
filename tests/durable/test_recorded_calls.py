"""Recorded calls in one process: replay after an interrupt and after a retry, the
position counter, divergence, fencing, reconciliation by a human, misuse errors.
(The crash tests are in test_recorded_crash.py.)"""

from __future__ import annotations

import logging
import random
import uuid
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt
from pymongo import MongoClient

from accord.checkpointers import AccordSaver
from accord.checkpointers.recorded import (
    DIVERGENCES,
    recorded,
    recorded_call,
    resolve_call,
    unsettled_calls,
)
from accord.errors import (
    ConcurrentRunError,
    ConfigurationError,
    InvalidInputError,
    LeaseLost,
    NeedsReconciliation,
)
from accord.platform import calls, runs
from tests.checkpointers.conftest import make_saver

CALLS = "accord_recorded_calls"


class State(TypedDict, total=False):
    out: list[Any]


class FakeCounter:
    """A fake external service that counts how often it is really called."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> str:
        self.calls.append(args)
        return f"r{len(self.calls)}"


@pytest.fixture()
def db_name(client: MongoClient) -> Any:
    name = "rc_" + uuid.uuid4().hex[:12]
    try:
        yield name
    finally:
        client.drop_database(name)


@pytest.fixture()
def saver(mongo_uri: str, db_name: str) -> Any:
    with make_saver("sync", mongo_uri, db_name) as s:
        yield s


def one_node(saver: AccordSaver, node: Any, **kwargs: Any) -> Any:
    g = StateGraph(State)
    g.add_node("work", node, **kwargs)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g.compile(checkpointer=saver)


def cfg(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


def test_a_task_resumed_after_an_interrupt_replays_its_calls(saver: AccordSaver) -> None:
    fake = FakeCounter()
    tool = recorded(name="fake.tool")(fake)

    def node(state: State) -> State:
        first = tool("a")
        answer = interrupt("approve?")
        second = tool("b", answer)
        return {"out": [first, second]}

    graph = one_node(saver, node)
    graph.invoke({"out": []}, cfg("t1"))
    assert fake.calls == [("a",)]
    result = graph.invoke(Command(resume="yes"), cfg("t1"))
    # the node ran again from its start: position 0 replayed, position 1 made once
    assert fake.calls == [("a",), ("b", "yes")]
    assert result["out"] == ["r1", "r2"]


def test_a_retried_attempt_counts_positions_from_zero_and_logs_divergence(
    saver: AccordSaver, client: MongoClient, db_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeCounter()
    attempts: list[int] = []

    @recorded(name="fake.pay")
    def pay(amount: int) -> str:
        return fake(amount)

    def node(state: State) -> State:
        attempts.append(1)
        receipt = pay(random.randint(1, 10**9))  # re-synthesized: other arguments
        if len(attempts) == 1:
            raise ConnectionError("flaky after the call")
        return {"out": [receipt]}

    graph = one_node(saver, node, retry_policy=RetryPolicy(max_attempts=2, initial_interval=0.01))
    before = DIVERGENCES["fake.pay"]
    with caplog.at_level(logging.WARNING, logger="accord.durable"):
        result = graph.invoke({"out": []}, cfg("t2"))
    assert len(attempts) == 2 and len(fake.calls) == 1  # the retry replayed position 0
    assert result["out"] == ["r1"]
    assert DIVERGENCES["fake.pay"] == before + 1
    lines = [r for r in caplog.records if "diverged" in r.getMessage()]
    assert len(lines) == 1 and "fake.pay" in lines[0].getMessage()
    doc = client[db_name][CALLS].find_one({"name": "fake.pay"})
    assert doc is not None and doc["divergences"] == 1 and doc["position"] == 0


def test_the_key_comes_from_the_call_site_never_from_the_arguments(
    saver: AccordSaver, client: MongoClient, db_name: str
) -> None:
    keys: list[str] = []

    @recorded(name="fake.idem", idempotent=True)
    def idem(x: int, *, idempotency_key: str) -> int:
        keys.append(idempotency_key)
        return x

    def node(state: State) -> State:
        return {"out": [idem(random.random()), idem(random.random())]}

    one_node(saver, node).invoke({"out": []}, cfg("t3"))
    docs = list(client[db_name][CALLS].find({}, sort=[("position", 1)]))
    assert [d["_id"] for d in docs] == keys and len(set(keys)) == 2
    site = calls.CallSite(
        docs[0]["tenant_id"], "t3", docs[0]["checkpoint_ns"], docs[0]["checkpoint_id"],
        docs[0]["task_id"], 0,
    )  # fmt: skip
    assert site.key == keys[0]
    assert docs[0]["checkpoint_ns"].endswith(":" + docs[0]["task_id"])


def test_a_call_raising_is_parked_then_settled_by_a_human(
    saver: AccordSaver, client: MongoClient, db_name: str
) -> None:
    fake = FakeCounter()
    fail = [True]

    @recorded(name="fake.transfer")
    def transfer(cents: int) -> str:
        fake(cents)
        if fail[0]:
            raise TimeoutError("the provider did not answer")
        return "ok"

    graph = one_node(saver, lambda s: {"out": [transfer(500)]})
    with pytest.raises(TimeoutError):
        graph.invoke({"out": []}, cfg("t4"))
    fail[0] = False
    with pytest.raises(NeedsReconciliation) as refused:
        graph.invoke(None, cfg("t4"))
    assert len(fake.calls) == 1  # never made twice blindly
    err = refused.value
    assert err.name == "fake.transfer" and err.position == 0 and err.thread_id == "t4"
    assert "not declared idempotent" in str(err) and err.key in str(err)
    listed = unsettled_calls(saver, thread_id="t4")
    assert [(c["_id"], c["status"]) for c in listed] == [(err.key, calls.PARKED)]
    run_doc = client[db_name]["runs"].find_one({"_id": runs.run_doc_id(saver.tenant_id, "t4")})
    assert run_doc is not None and run_doc["parked"]["call"] == err.key
    assert run_doc["parked"]["name"] == "fake.transfer"
    resolve_call(saver, "t4", err.key, "receipt-from-the-bank", by="user:ops")
    result = graph.invoke(None, cfg("t4"))
    assert result["out"] == ["receipt-from-the-bank"] and len(fake.calls) == 1
    doc = client[db_name][CALLS].find_one({"_id": err.key})
    assert doc is not None and doc["status"] == calls.DONE and doc["resolved_by"] == "user:ops"
    assert unsettled_calls(saver, thread_id="t4") == []
    run_doc = client[db_name]["runs"].find_one({"_id": runs.run_doc_id(saver.tenant_id, "t4")})
    assert run_doc is not None and "parked" not in run_doc


def test_a_run_that_lost_its_lease_cannot_record_or_make_a_call(
    saver: AccordSaver, client: MongoClient, db_name: str
) -> None:
    fake = FakeCounter()
    tool = recorded(name="fake.tool")(fake)

    def node(state: State) -> State:
        # another worker takes the thread over (the fence moves on) while this one works
        client[db_name]["runs"].update_one(
            {"_id": runs.run_doc_id(saver.tenant_id, "t5")}, {"$inc": {"fence": 1}}
        )
        return {"out": [tool("x")]}

    with pytest.raises(LeaseLost, match="no longer holds thread 't5'"):
        # "sync" durability: the task's checkpoint is saved before the node runs (with
        # "async" its queued save is refused by the same fence first: TaskWriteError)
        one_node(saver, node).invoke({"out": []}, cfg("t5"), durability="sync")
    assert fake.calls == []
    assert client[db_name][CALLS].count_documents({}) == 0


def test_misuse_is_named(saver: AccordSaver, mongo_uri: str, db_name: str) -> None:
    tool = recorded(FakeCounter())
    with pytest.raises(ConfigurationError, match="outside a running LangGraph node"):
        tool("x")
    graph = one_node(saver, lambda s: {"out": [tool("y")]})
    with pytest.raises(ConfigurationError, match="durability='sync' or 'async'"):
        graph.invoke({"out": []}, cfg("t9"), durability="exit")
    with make_saver("async", mongo_uri, db_name) as async_saver:
        graph = one_node(async_saver, lambda s: {"out": [recorded_call(FakeCounter(), 1)]})
        with pytest.raises(ConfigurationError, match="sync but the graph's saver is Async"):
            graph.invoke({"out": []}, cfg("t6"))


def test_calls_in_a_subgraph_are_recorded_and_replayed(
    saver: AccordSaver, client: MongoClient, db_name: str
) -> None:
    fake = FakeCounter()
    tool = recorded(name="fake.inner")(fake)

    def inner(state: State) -> State:
        first = tool("in")
        interrupt("approve?")
        return {"out": [first]}

    sub = StateGraph(State)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)
    g = StateGraph(State)
    g.add_node("sub", sub.compile())
    g.add_edge(START, "sub")
    g.add_edge("sub", END)
    graph = g.compile(checkpointer=saver)
    graph.invoke({"out": []}, cfg("t7"))
    result = graph.invoke(Command(resume="ok"), cfg("t7"))
    assert fake.calls == [("in",)] and result["out"] == ["r1"]
    doc = client[db_name][CALLS].find_one({"name": "fake.inner"})
    assert doc is not None and "|inner:" in doc["checkpoint_ns"]


def test_a_call_that_interrupts_is_made_again_on_resume(
    saver: AccordSaver, client: MongoClient, db_name: str
) -> None:
    asked: list[str] = []

    @recorded(name="fake.approval")
    def approval(what: str) -> str:
        asked.append(what)
        return str(interrupt(f"approve {what}?"))  # LangGraph re-runs it on resume

    graph = one_node(saver, lambda s: {"out": [approval("wire")]})
    graph.invoke({"out": []}, cfg("t8"))
    assert client[db_name][CALLS].count_documents({}) == 0  # withdrawn, not failed
    result = graph.invoke(Command(resume="yes"), cfg("t8"))
    assert result["out"] == ["yes"] and asked == ["wire", "wire"]
    doc = client[db_name][CALLS].find_one({"name": "fake.approval"})
    assert doc is not None and doc["status"] == calls.DONE


def test_a_call_is_settled_only_in_its_own_tenant_and_thread(
    saver: AccordSaver, client: MongoClient, db_name: str
) -> None:
    """The key reaches a human through an error message or a form: before, resolving it
    under another tenant or thread (or passing an operator as the key) settled the call,
    writing that tenant's result into it."""

    @recorded(name="fake.transfer")
    def transfer(cents: int) -> str:
        raise TimeoutError("the provider did not answer")

    graph = one_node(saver, lambda s: {"out": [transfer(500)]})
    beta = {"configurable": {"thread_id": "t9", "tenant_id": "beta"}}
    with pytest.raises(TimeoutError):
        graph.invoke({"out": []}, beta)
    with pytest.raises(NeedsReconciliation) as refused:
        graph.invoke(None, beta)
    key = refused.value.key
    # the command it gives names the tenant (without it, `accord runs resolve` looks in
    # the default tenant and finds no such call)
    assert f"accord runs resolve t9 {key} --result JSON --tenant beta`" in str(refused.value)
    for tenant, thread, named in (("acme", "t9", key), ("beta", "other", key),
                                  (None, "t9", key)):  # fmt: skip
        with pytest.raises(ConcurrentRunError, match="is not unsettled"):
            resolve_call(saver, thread, named, "forged", by="user:mallory", tenant_id=tenant)
    for bad in ({"$ne": None}, ["k"], ""):
        with pytest.raises(InvalidInputError, match="key must be"):
            resolve_call(saver, "t9", bad, "forged", by="user:mallory", tenant_id="beta")
    with pytest.raises(InvalidInputError, match="thread_id must be"):
        unsettled_calls(saver, tenant_id="beta", thread_id={"$ne": None})
    doc = client[db_name][CALLS].find_one({"_id": key})
    assert doc is not None and doc["status"] == calls.PARKED and "result" not in doc
    resolve_call(saver, "t9", key, "receipt", by="user:ops", tenant_id="beta")
    assert client[db_name][CALLS].find_one({"_id": key})["status"] == calls.DONE
