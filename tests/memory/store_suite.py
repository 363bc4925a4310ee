"""LangGraph's own store tests (``tests/test_store.py`` of the installed
langgraph-checkpoint's source distribution) with ``InMemoryStore`` swapped for accord's.

The sdist is fetched for exactly the installed version by the project's shared fetcher
(:func:`tests.external.sdist.fetch_sdist`: ``pip download --no-binary`` once, cached under
``.accord/external/``), so the tests are the ones the installed code was released with.

Tests excluded, each with the reason (also listed in docs/memory.md):
"""

from __future__ import annotations

import inspect
import sys
import types
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.external.sdist import fetch_sdist

PACKAGE = "langgraph-checkpoint"

#: name -> why it is not run against accord's store.
EXCLUDED = {
    "test_dedupe_ops_maps_repeated_reads_and_puts_to_one_op": "tests langgraph's batching helper, no store",
    "test_get_text_at_path": "tests langgraph's text extraction helper, no store",
    "test_get_text_at_path_with_non_dict_mapping": "tests langgraph's text extraction helper, no store",
    "test_async_batch_store": "tests AsyncBatchedBaseStore with a mock store, no InMemoryStore",
    "test_async_batch_store_handles_cancellation": "tests AsyncBatchedBaseStore with a mock store",
    "test_validate_op_namespace_rejects_invalid_labels": "tests langgraph's validate_op_namespace only",
    "test_validate_op_namespace_allows_empty_prefix_and_wildcards": "tests langgraph's validate_op_namespace only",
}


def sdist_tests() -> Path:
    """The ``tests`` directory of the installed langgraph-checkpoint's sdist."""
    return fetch_sdist(PACKAGE) / "tests"


#: The server the stores use: set by tests/memory/conftest.py's session fixture.
SERVER: dict[str, str] = {}


def load(store_class: type) -> dict[str, Any]:
    """The suite's tests, with ``InMemoryStore`` bound to a subclass of ``store_class`` whose
    every instance lives in a fresh database on ``uri``."""
    tests = sdist_tests()
    embed_utils = types.ModuleType("accord_suite_embed_test_utils")
    exec(compile((tests / "embed_test_utils.py").read_text(), str(tests / "embed_test_utils.py"),
                 "exec"), embed_utils.__dict__)  # fmt: skip
    sys.modules["accord_suite_embed_test_utils"] = embed_utils
    source = (tests / "test_store.py").read_text()
    source = source.replace("from langgraph.store.memory import InMemoryStore\n", "")
    source = source.replace("from tests.embed_test_utils import",
                            "from accord_suite_embed_test_utils import")  # fmt: skip
    module = types.ModuleType(f"accord_store_suite_{store_class.__name__}")
    module.__dict__["InMemoryStore"] = make_store_class(store_class)
    exec(compile(source, str(tests / "test_store.py"), "exec"), module.__dict__)
    out: dict[str, Any] = {}
    for name, obj in vars(module).items():
        if name.startswith("test_") and callable(obj) and name not in EXCLUDED:
            if inspect.iscoroutinefunction(obj):
                obj = pytest.mark.asyncio(obj)
            out[name] = obj
        elif name == "fake_embeddings":
            out[name] = obj
    return out


def make_store_class(store_class: type) -> type:
    """``InMemoryStore(index=..., ttl=...)`` -> accord's store on a fresh database."""

    def __init__(self: Any, *, index: Any = None, ttl: Any = None) -> None:
        uri = SERVER["uri"]
        db_name = "suite_" + uuid.uuid4().hex[:12]
        if store_class.__name__.startswith("Async"):
            from pymongo import AsyncMongoClient

            client: Any = AsyncMongoClient(uri)
        else:
            from pymongo import MongoClient

            client = MongoClient(uri)
        store_class.__init__(self, client, index=index, ttl=ttl, db_name=db_name,
                             conn_string=uri)  # fmt: skip
        _setup(self)

    return type("InMemoryStore", (store_class,), {"__init__": __init__})


def _setup(store: Any) -> None:
    """Set the store up with a sync client (constructors are sync in the suite)."""
    from pymongo import MongoClient

    from accord.memory.synchronous.service import MemoryService

    uri = store.conn_string
    client: Any = MongoClient(uri)
    try:
        MemoryService(client, tenant_id=store.service.tenant_id, db_name=store.service.db_name,
                      embedder=store.service.embedder, dims=store.service.dims).setup()  # fmt: skip
    finally:
        client.close()
