"""langgraph-checkpoint-conformance must report FULL for both savers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.report import CapabilityReport
from pymongo import AsyncMongoClient, MongoClient

from accord.checkpointers import AccordSaver, AsyncAccordSaver
from tests.checkpointers.conftest import unique_db


class SyncDriven(AccordSaver):
    """The conformance suite awaits the a-methods; this drives them through the sync ones,
    so it is the sync code path that gets validated."""

    async def aput(self, *args: Any, **kwargs: Any) -> Any:
        return self.put(*args, **kwargs)

    async def aput_writes(self, *args: Any, **kwargs: Any) -> None:
        self.put_writes(*args, **kwargs)

    async def aget_tuple(self, config: Any) -> Any:
        return self.get_tuple(config)

    async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        for tup in self.list(config, **kwargs):
            yield tup

    async def adelete_thread(self, thread_id: str) -> None:  # type: ignore[override]
        self.delete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Any) -> None:  # type: ignore[override]
        self.delete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:  # type: ignore[override]
        self.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Any, *, strategy: str = "keep_latest") -> None:  # type: ignore[override]
        self.prune(thread_ids, strategy=strategy)


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
    """``detect`` uses MongoDB 8.0's client-level bulkWrite when the server has it;
    ``per-collection`` forces the fallback for older servers."""
    dbs: list[str] = []

    @checkpointer_test(name="AccordSaver")
    async def factory() -> AsyncIterator[AccordSaver]:
        name = unique_db()
        dbs.append(name)
        saver = SyncDriven(client, db_name=name, client_bulk=client_bulk)
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
