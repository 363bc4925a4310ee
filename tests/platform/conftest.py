"""Fixtures for the platform tests: a unit of work, sync or async, on a fresh database."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient

from accord.platform.asynchronous.unit_of_work import AsyncUnitOfWork
from accord.platform.plan import Plan, PlanResult
from accord.platform.synchronous.unit_of_work import UnitOfWork


class Runner:
    """One API over the sync and the async unit of work, for tests that run on both."""

    def __init__(
        self, kind: str, uri: str, *, client_options: dict[str, Any] | None = None, **options: Any
    ) -> None:
        self.kind = kind
        self.loop: asyncio.AbstractEventLoop | None = None
        if kind == "async":
            self.loop = asyncio.new_event_loop()
            self.aclient: AsyncMongoClient[Any] = AsyncMongoClient(uri, **(client_options or {}))
            self.uow: Any = AsyncUnitOfWork(self.aclient, **options)
        else:
            self.sclient: MongoClient[Any] = MongoClient(uri, **(client_options or {}))
            self.uow = UnitOfWork(self.sclient, **options)

    def execute(self, plan: Plan) -> PlanResult:
        return self.call(self.uow.execute, plan)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call a method of an async or sync platform object the same way."""
        result = fn(*args, **kwargs)
        if self.loop is not None:
            return self.loop.run_until_complete(result)
        return result

    def close(self) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(self.aclient.close())
            self.loop.close()
        else:
            self.sclient.close()


@pytest.fixture(params=["sync", "async"])
def make_runner(request: pytest.FixtureRequest, mongo_uri: str) -> Iterator[Callable[..., Runner]]:
    made: list[Runner] = []

    def make(uri: str | None = None, **options: Any) -> Runner:
        runner = Runner(request.param, uri or mongo_uri, **options)
        made.append(runner)
        return runner

    try:
        yield make
    finally:
        for r in made:
            r.close()


@pytest.fixture()
def runner(make_runner: Callable[..., Runner]) -> Runner:
    return make_runner()


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "p_" + uuid.uuid4().hex[:12]
    try:
        yield name
    finally:
        client.drop_database(name)
