"""One test body for both aggregator twins.

The sync ``Aggregator`` is used as it is. The async one (``AsyncAggregator`` on an
``AsyncMongoClient``) runs on an event loop of its own in a daemon thread, and the test
body drives it through :class:`Blocking`, which turns each of its coroutine methods into
a call that waits for the result: the aggregator's own code runs on its loop exactly as
in an asyncio application (claims, reads, the extractor in a worker thread, the commit),
while the test reads like the sync one. Each async aggregator gets its own loop, so one
aggregator's callback may drive another (the race test) without waiting on itself.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any

from pymongo import AsyncMongoClient, MongoClient

from accord.memory.aggregator import (
    Aggregator,
    AggregatorConfig,
    AsyncAggregator,
    AsyncBackgroundAggregator,
    BackgroundAggregator,
)

FLAVORS = ["sync", "async"]


class Blocking:
    """An async object's coroutine methods as blocking calls, run on ``loop`` (a loop
    running in another thread); other attributes pass through."""

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.target = target
        self.loop = loop

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.target, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *args, **kwargs: self.call(attr(*args, **kwargs))
        return attr

    def __enter__(self) -> Blocking:
        self.call(self.target.__aenter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self.call(self.target.__aexit__(*exc))


class Twins:
    """Makes aggregators of one flavour (``sync`` or ``async``) and cleans up after them."""

    def __init__(self, flavor: str, uri: str, client: MongoClient[Any]) -> None:
        self.flavor = flavor
        self.uri = uri
        self.client = client
        self._loops: list[tuple[asyncio.AbstractEventLoop, threading.Thread]] = []
        self._clients: list[tuple[asyncio.AbstractEventLoop, AsyncMongoClient[Any]]] = []

    def aggregator(self, config: AggregatorConfig, **kwargs: Any) -> Any:
        """An aggregator, set up: ``Aggregator``, or a blocking ``AsyncAggregator``."""
        if self.flavor == "sync":
            agg = Aggregator(self.client, config=config, **kwargs)
            agg.setup()
            return agg
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="twins-loop", daemon=True)
        thread.start()
        self._loops.append((loop, thread))

        async def make() -> AsyncAggregator:
            aclient: AsyncMongoClient[Any] = AsyncMongoClient(self.uri)
            self._clients.append((loop, aclient))
            agg = AsyncAggregator(aclient, config=config, **kwargs)
            await agg.setup()
            return agg

        return Blocking(asyncio.run_coroutine_threadsafe(make(), loop).result(60), loop)

    def background(self, agg: Any) -> Any:
        """The aggregator's background runner: a thread, or a task on its loop."""
        if isinstance(agg, Blocking):
            return Blocking(AsyncBackgroundAggregator(agg.target), agg.loop)
        return BackgroundAggregator(agg)

    def close(self) -> None:
        for loop, aclient in self._clients:
            asyncio.run_coroutine_threadsafe(aclient.close(), loop).result(30)
        for loop, thread in self._loops:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
