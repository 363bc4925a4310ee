"""Component setup and the catalog of accord-owned collections (sync and async)."""

from __future__ import annotations

import threading

import pytest
from pymongo import ASCENDING, IndexModel, MongoClient

from accord.errors import ConfigurationError, InvalidInputError
from accord.platform.artifacts import CATALOG_COLLECTION, artifact, catalog_plan
from accord.platform.asynchronous.catalog import AsyncCatalog
from accord.platform.synchronous.catalog import Catalog
from tests.platform.conftest import Runner


def catalog_of(runner: Runner, db: str):
    return (AsyncCatalog if runner.kind == "async" else Catalog)(runner.uow, db)


def test_setup_creates_indexes_and_records_ownership(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    cat = catalog_of(runner, db_name)
    idx = {"my_cps": [IndexModel([("tenant_id", ASCENDING), ("k", ASCENDING)], name="tk")]}
    runner.call(cat.setup, "checkpointer", {"my_cps": "checkpoint", "my_out": "outbox"}, idx)
    runner.call(cat.setup, "checkpointer", {"my_cps": "checkpoint", "my_out": "outbox"}, idx)
    assert "tk" in client[db_name].my_cps.index_information()
    entries = {d["_id"]: d["artifact"] for d in client[db_name][CATALOG_COLLECTION].find()}
    # the component's collections, and the ones the kernel's default hooks write
    # (the workflow log's seal hook owns accord_workflow_events, the undo log's
    # accord_business_undo)
    assert entries == {
        "my_cps": "checkpoint", "my_out": "outbox", "accord_workflow_events": "workflow_event",
        "accord_business_undo": "business_undo",
    }  # fmt: skip
    reserved = runner.call(cat.reserved, ["mine"])
    assert reserved == {
        "my_cps", "my_out", "accord_workflow_events", "accord_business_undo", "mine",
        CATALOG_COLLECTION,
    }  # fmt: skip


def test_a_second_app_sees_the_first_ones_collections(make_runner, db_name: str) -> None:
    first, second = make_runner(), make_runner()
    first.call(catalog_of(first, db_name).setup, "app-a", {"a_heads": "checkpoint_head"})
    assert "a_heads" in second.call(catalog_of(second, db_name).reserved)


def test_concurrent_setups_do_not_race(make_runner, client: MongoClient, db_name: str) -> None:
    runners = [make_runner() for _ in range(6)]
    errors: list[BaseException] = []
    idx = {"c1": [IndexModel([("tenant_id", ASCENDING)], name="t")]}

    def go(r: Runner) -> None:
        try:
            r.call(catalog_of(r, db_name).setup, "x", {"c1": "checkpoint", "c2": "outbox"}, idx)
        except BaseException as exc:  # asserted below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(r,)) for r in runners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert {"c1", "c2", CATALOG_COLLECTION} <= set(client[db_name].list_collection_names())


def test_a_conflicting_index_is_a_configuration_error(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    client[db_name].c.create_index([("tenant_id", ASCENDING)], name="t", unique=True)
    with pytest.raises(ConfigurationError, match="conflicts"):
        runner.call(
            catalog_of(runner, db_name).setup,
            "x",
            {"c": "checkpoint"},
            {"c": [IndexModel([("tenant_id", ASCENDING)], name="t")]},
        )


def test_business_collections_are_not_cataloged() -> None:
    with pytest.raises(InvalidInputError, match="belong to the application"):
        catalog_plan("db", {"orders": "business"}, "x")
    with pytest.raises(InvalidInputError, match="unknown artifact class"):
        artifact("nope")
