"""Fixtures for the checkpointer tests: a saver per test on its own database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from accord.checkpointers import AccordSaver


def unique_db() -> str:
    return "cp_" + uuid.uuid4().hex[:12]


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = unique_db()
    try:
        yield name
    finally:
        client.drop_database(name)


@pytest.fixture()
def saver(client: MongoClient, db_name: str) -> AccordSaver:
    s = AccordSaver(client, db_name=db_name)
    s.setup()
    return s


def config(thread_id: str, checkpoint_id: str | None = None, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": "", **extra}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}
