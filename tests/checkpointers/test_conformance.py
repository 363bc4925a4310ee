"""langgraph-checkpoint-conformance must report FULL for both savers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.report import CapabilityReport
from pymongo import AsyncMongoClient, MongoClient

from accord.checkpointers import AccordSaver, AsyncAccordSaver
from tests.checkpointers.conftest import unique_db


def _assert_full(report: CapabilityReport) -> None:
    report.print_report()
    failures = {name: r.failures for name, r in report.results.items() if r.failures}
    assert not failures, failures
    assert {c.value for c in ALL_CAPABILITIES} <= {
        n for n, r in report.results.items() if r.detected
    }
    assert report.conformance_level() == "FULL"


@pytest.mark.parametrize("client_bulk", [None, False], ids=["detect", "per-collection"])
def test_sync_saver_conformance_full(client: MongoClient, client_bulk: bool | None) -> None:
    """The suite awaits the a-methods: ``AccordSaver`` answers them by running its sync
    methods in worker threads, so it is the sync code that gets validated. ``detect``
    uses MongoDB 8.0's client-level bulkWrite when the server has it; ``per-collection``
    forces the fallback for older servers."""
    dbs: list[str] = []

    @checkpointer_test(name="AccordSaver")
    async def factory() -> AsyncIterator[AccordSaver]:
        name = unique_db()
        dbs.append(name)
        saver = AccordSaver(client, db_name=name, client_bulk=client_bulk)
        saver.setup()
        yield saver

    try:
        _assert_full(asyncio.run(validate(factory)))
    finally:
        for name in dbs:
            client.drop_database(name)


def test_async_saver_conformance_full(mongo_uri: str) -> None:
    async def main() -> CapabilityReport:
        aclient: AsyncMongoClient = AsyncMongoClient(mongo_uri)
        dbs: list[str] = []

        @checkpointer_test(name="AsyncAccordSaver")
        async def factory() -> AsyncIterator[AsyncAccordSaver]:
            name = unique_db()
            dbs.append(name)
            saver = AsyncAccordSaver(aclient, db_name=name)
            await saver.setup()
            yield saver

        try:
            return await validate(factory)
        finally:
            for name in dbs:
                await aclient.drop_database(name)
            await aclient.close()

    _assert_full(asyncio.run(main()))
