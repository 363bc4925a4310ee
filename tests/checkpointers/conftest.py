"""Fixtures for the checkpointer tests: a saver per test on its own database, both twins.

``saver`` is parametrized over the two savers: ``AccordSaver`` (sync) and
``AsyncAccordSaver`` running on an event loop in a background thread, driven through
its sync methods (which run its async code on that loop), so one test body checks both.
Tests of ``ainvoke``/``astream`` paths use the async saver directly.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient, monitoring

from accord.checkpointers import AccordSaver, AsyncAccordSaver

KINDS = ["sync", "async"]


def unique_db() -> str:
    return "cp_" + uuid.uuid4().hex[:12]


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = unique_db()
    try:
        yield name
    finally:
        client.drop_database(name)


class LoopThread:
    """An event loop running in a daemon thread (the async saver's home)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@contextmanager
def make_saver(
    kind: str,
    uri: str,
    db_name: str,
    *,
    listeners: list[monitoring.CommandListener] | None = None,
    setup: bool = True,
    **kwargs: Any,
) -> Iterator[AccordSaver | AsyncAccordSaver]:
    """A saver of ``kind`` ("sync" / "async") on its own client. It writes outbox events
    (``outbox_events=True``) unless told otherwise, as if an aggregator consumed them:
    tests of what it writes check them too."""
    kwargs.setdefault("outbox_events", True)
    if kind == "sync":
        client: MongoClient = MongoClient(uri, event_listeners=listeners or [])
        try:
            saver = AccordSaver(client, db_name=db_name, **kwargs)
            if setup:
                saver.setup()
            yield saver
        finally:
            client.close()
        return
    home = LoopThread()

    async def start() -> AsyncAccordSaver:
        aclient: AsyncMongoClient = AsyncMongoClient(uri, event_listeners=listeners or [])
        s = AsyncAccordSaver(aclient, db_name=db_name, **kwargs)
        if setup:
            await s.setup()
        return s

    saver_a = home.run(start())
    try:
        yield saver_a
    finally:
        home.run(saver_a.client.close())
        home.close()


def register_consumer(client: MongoClient, db_name: str, component: str = "test") -> None:
    """Record a consumer of ``db_name``'s outbox, as the memory aggregator's setup does:
    savers set up after it write outbox events."""
    from accord.platform import outbox
    from accord.platform.synchronous.unit_of_work import UnitOfWork

    UnitOfWork(client).execute(outbox.consumer_plan(db_name, "outbox", component))


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture()
def saver(kind: str, mongo_uri: str, db_name: str) -> Iterator[Any]:
    with make_saver(kind, mongo_uri, db_name) as s:
        yield s


@pytest.fixture()
def saver_factory(kind: str, mongo_uri: str, db_name: str) -> Iterator[Callable[..., Any]]:
    """``factory(**kwargs)``: more savers of the test's kind on its database."""
    stack: list[Any] = []

    def factory(**kwargs: Any) -> Any:
        cm = make_saver(kind, mongo_uri, db_name, **kwargs)
        stack.append(cm)
        return cm.__enter__()

    try:
        yield factory
    finally:
        for cm in reversed(stack):
            cm.__exit__(None, None, None)


def config(thread_id: str, checkpoint_id: str | None = None, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": "", **extra}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}
