"""Fail points for tests: make the server fail, drop or delay the next commands.

The same helper works on the embedded engine (the test session's engine runs with
``--enable-test-commands``) and on a real MongoDB started with
``--setParameter enableTestCommands=1``; on a server without test commands the test is
skipped with that reason, since nothing can be injected there.

    from tests.failpoints import fail_command

    with fail_command(client, ["commitTransaction"], close_connection=True):
        ...  # the next commitTransaction gets no reply: the connection drops

Each context manager turns its fail point off on exit, also when the block fails, so one
test's fault never leaks into the next.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pymongo import MongoClient


def require_test_commands(client: MongoClient) -> None:
    """Skip the calling test unless the server accepts configureFailPoint."""
    params = client.admin.command("getParameter", "*")
    if not params.get("enableTestCommands"):
        pytest.skip("the server runs without test commands (enableTestCommands), no fail points")


@contextmanager
def fail_point(
    client: MongoClient, name: str, mode: Any = None, data: dict[str, Any] | None = None
) -> Iterator[dict[str, Any]]:
    """Configure fail point ``name`` (mode: ``{"times": n}`` by default with n=1,
    ``{"skip": n}``, ``"alwaysOn"``) for the block; yields the server's reply."""
    require_test_commands(client)
    cmd: dict[str, Any] = {"configureFailPoint": name, "mode": mode or {"times": 1}}
    if data is not None:
        cmd["data"] = data
    reply = client.admin.command(cmd)
    try:
        yield reply
    finally:
        client.admin.command({"configureFailPoint": name, "mode": "off"})


@contextmanager
def fail_command(
    client: MongoClient,
    commands: list[str],
    *,
    times: int | None = 1,
    error_code: int | None = None,
    error_labels: list[str] | None = None,
    close_connection: bool = False,
    block_ms: int | None = None,
    write_concern_error: dict[str, Any] | None = None,
    app_name: str | None = None,
) -> Iterator[None]:
    """mongod's ``failCommand`` fail point on ``commands`` for the next ``times`` of them
    (``times=None``: all of them until the block ends)."""
    data: dict[str, Any] = {"failCommands": commands}
    if error_code is not None:
        data["errorCode"] = error_code
    if error_labels is not None:
        data["errorLabels"] = error_labels
    if close_connection:
        data["closeConnection"] = True
    if block_ms is not None:
        data["blockConnection"] = True
        data["blockTimeMS"] = block_ms
    if write_concern_error is not None:
        data["writeConcernError"] = write_concern_error
    if app_name is not None:
        data["appName"] = app_name
    mode: Any = "alwaysOn" if times is None else {"times": times}
    with fail_point(client, "failCommand", mode, data):
        yield
