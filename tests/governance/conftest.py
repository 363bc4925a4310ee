"""Fixtures shared by the governance tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from pymongo import MongoClient


@pytest.fixture()
def db_name(client: MongoClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database named after the test module, dropped afterwards with the roles
    ``apply`` created in it."""
    prefix = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")[:12]
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    yield name
    client[name].command("dropAllRolesFromDatabase")
    client.drop_database(name)
