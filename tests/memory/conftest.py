"""Memory tests share the session's server (embedded engine, or MONGODB_URI)."""

from __future__ import annotations

import pytest

from tests.memory import store_suite


@pytest.fixture(scope="session", autouse=True)
def _store_suite_server(mongo_uri: str) -> None:
    store_suite.SERVER["uri"] = mongo_uri
