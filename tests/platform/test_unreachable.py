"""An unreachable MongoDB fails in seconds, with an accord error that names the host (never
the password) and says what to check: through connect(), the checkpointer and the demo."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from pymongo import AsyncMongoClient, MongoClient

from accord.checkpointers import AccordSaver, AsyncAccordSaver
from accord.errors import ConfigurationError, DatabaseUnreachable
from accord.platform import connect
from accord.platform.reachability import redact

PASSWORD = "s3cret-Pa55"


@pytest.fixture()
def dead_uri() -> str:
    """A URI with credentials on a local port nothing listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"mongodb://alice:{PASSWORD}@127.0.0.1:{port}/?replicaSet=rs0"


def _host(uri: str) -> str:
    return uri.split("@", 1)[1].split("/", 1)[0]


def _check(exc: BaseException, uri: str) -> None:
    message = str(exc)
    assert _host(uri) in message, message
    assert PASSWORD not in message and PASSWORD not in repr(exc.__cause__), message
    assert "MONGODB_URI" in message and "serverSelectionTimeoutMS" in message


def test_connect_fails_within_the_server_selection_timeout(
    dead_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCORD_SERVER_SELECTION_TIMEOUT", "1.5")
    started = time.monotonic()
    with pytest.raises(DatabaseUnreachable) as caught:
        connect(dead_uri)
    elapsed = time.monotonic() - started
    assert 1.0 < elapsed < 6, f"took {elapsed:.1f}s; the bound is 1.5s"
    _check(caught.value, dead_uri)
    assert "1.5s" in str(caught.value)


def test_connect_defaults_to_a_few_seconds_not_pymongos_thirty(dead_uri: str) -> None:
    started = time.monotonic()
    with pytest.raises(DatabaseUnreachable):
        connect(dead_uri)
    assert time.monotonic() - started < 10


def test_a_uris_own_server_selection_timeout_wins(dead_uri: str) -> None:
    started = time.monotonic()
    with pytest.raises(DatabaseUnreachable):
        connect(dead_uri + "&serverSelectionTimeoutMS=700")
    assert time.monotonic() - started < 4


class State(TypedDict):
    n: int


def _graph(saver: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("step", lambda s: {"n": s["n"] + 1})
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=saver)


def test_the_saver_fails_within_the_clients_timeout_not_its_30s_bound(dead_uri: str) -> None:
    client: MongoClient = MongoClient(dead_uri, serverSelectionTimeoutMS=1000)
    graph = _graph(AccordSaver(client, db_name="app"))
    started = time.monotonic()
    with pytest.raises(DatabaseUnreachable) as caught:
        graph.invoke({"n": 0}, {"configurable": {"thread_id": "t"}})
    elapsed = time.monotonic() - started
    client.close()
    assert elapsed < 6, f"took {elapsed:.1f}s (the saver's own bound is 30s)"
    _check(caught.value, dead_uri)


def test_the_async_saver_too(dead_uri: str) -> None:
    async def main() -> tuple[BaseException, float]:
        client: AsyncMongoClient = AsyncMongoClient(dead_uri, serverSelectionTimeoutMS=1000)
        graph = _graph(AsyncAccordSaver(client, db_name="app"))
        started = time.monotonic()
        try:
            await graph.ainvoke({"n": 0}, {"configurable": {"thread_id": "t"}})
        except DatabaseUnreachable as exc:
            return exc, time.monotonic() - started
        finally:
            await client.close()
        raise AssertionError("no DatabaseUnreachable")

    exc, elapsed = asyncio.run(main())
    assert elapsed < 6, f"took {elapsed:.1f}s"
    _check(exc, dead_uri)


def test_the_demo_says_what_to_do_without_a_traceback(dead_uri: str) -> None:
    env = dict(os.environ, MONGODB_URI=dead_uri, ACCORD_SERVER_SELECTION_TIMEOUT="1")
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "accord.demo"], capture_output=True, text=True, env=env, timeout=60
    )
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert elapsed < 20, f"took {elapsed:.1f}s"
    assert "Traceback" not in output and PASSWORD not in output
    assert _host(dead_uri) in output and "no server answered within 1s" in output


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("mongodb://u:p%40ss@h:1/?x=1", "mongodb://u:***@h:1/?x=1"),
        ("mongodb+srv://u:pw@cluster.example.net/db", "mongodb+srv://u:***@cluster.example.net/db"),
        ("mongodb://token@h", "mongodb://***@h"),
        ("mongodb://h:1,h:2/?replicaSet=rs", "mongodb://h:1,h:2/?replicaSet=rs"),
    ],
)
def test_uris_are_shown_without_their_password(uri: str, shown: str) -> None:
    assert redact(uri) == shown


@pytest.mark.parametrize(
    "uri", ["mongodb://127.0.0.1:99999/", "mongodb://127.0.0.1/?serverSelectionTimeoutMS=x"]
)
def test_a_uri_pymongo_cannot_use_is_a_configuration_error(uri: str) -> None:
    # a port past 65535 was pymongo's raw ValueError (the CLI's traceback)
    with pytest.raises(ConfigurationError, match="cannot use the MongoDB URI"):
        connect(uri)
