"""A failure the caller is handed and handles (a refused business write, a denied
permission) is logged by accord as one line at WARNING; its traceback only at DEBUG."""

from __future__ import annotations

import logging
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from pymongo import MongoClient

from accord.checkpointers import AccordSaver, business
from accord.errors import BusinessWriteError, PermissionDenied, TaskWriteError
from accord.platform.plan import Plan
from accord.platform.synchronous.unit_of_work import UnitOfWork
from accord.platform.transaction import default_hooks


class State(TypedDict):
    n: int


def _graph(saver: AccordSaver) -> Any:
    def order(state: State) -> dict[str, int]:
        business.insert_one("orders", {"_id": "same-order"})
        return {"n": state["n"] + 1}

    builder = StateGraph(State)
    builder.add_node("order", order)
    builder.add_edge(START, "order")
    builder.add_edge("order", END)
    return builder.compile(checkpointer=saver)


class DenyOrders:
    """A policy hook (as governance's): refuses any plan that writes to ``orders``."""

    name = "deny-orders"

    def check(self, plan: Plan) -> None:
        if any(g.collection == "orders" for g in plan.writes()):
            raise PermissionDenied("this principal may not write orders")


def _accord_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("accord") and r.levelno >= level]


def _assert_one_line_each(caplog: pytest.LogCaptureFixture) -> None:
    loud = _accord_records(caplog, logging.WARNING)
    for record in loud:
        assert record.exc_info is None, f"a traceback at {record.levelname}: {record.msg}"
        assert "\n" not in record.getMessage()
    assert len(loud) <= 1, [r.getMessage()[:120] for r in loud]


def test_a_caught_business_write_error_is_one_warning_line(
    client: MongoClient, db_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    graph = _graph(AccordSaver(client, db_name=db_name))
    graph.invoke({"n": 0}, {"configurable": {"thread_id": "first"}})
    with caplog.at_level(logging.DEBUG, logger="accord"), pytest.raises(BusinessWriteError):
        graph.invoke({"n": 0}, {"configurable": {"thread_id": "second"}})
    _assert_one_line_each(caplog)
    # the traceback is still there for whoever turns DEBUG on
    assert any(r.exc_info for r in _accord_records(caplog, logging.DEBUG))


def test_a_caught_permission_denied_is_one_warning_line(
    client: MongoClient, db_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    uow = UnitOfWork(client, hooks=[*default_hooks(), DenyOrders()])
    graph = _graph(AccordSaver(client, db_name=db_name, uow=uow))
    denied = pytest.raises((PermissionDenied, TaskWriteError))
    with caplog.at_level(logging.DEBUG, logger="accord"), denied:
        graph.invoke({"n": 0}, {"configurable": {"thread_id": "denied"}})
    _assert_one_line_each(caplog)
