"""``--enable-test-commands``, ``getCmdLineOpts`` and ``getParameter``: what drivers' spec-test
runners ask the server before they run anything (pymongo's ``test/__init__.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from accord.platform.embedded import EmbeddedServer
from accord.platform.embedded.commands import COMMANDS, TEST_COMMANDS, testing
from accord.platform.embedded.commands.base import Context, Doc

pytestmark = pytest.mark.embedded_only


@pytest.fixture(params=[False, True], ids=["default", "test-commands"])
def engine_client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MongoClient]:
    server = EmbeddedServer(tmp_path / "db", port=0, sync=False, enable_test_commands=request.param)
    server.start()
    client: MongoClient = MongoClient(server.uri)
    try:
        yield client
    finally:
        client.close()
        server.stop()


def _enabled(client: MongoClient) -> bool:
    return bool(client.admin.command("getParameter", "*")["enableTestCommands"])


def test_get_parameter_star_reports_enable_test_commands(
    engine_client: MongoClient, request: pytest.FixtureRequest
) -> None:
    expected = request.node.callspec.params["engine_client"]
    reply = engine_client.admin.command("getParameter", "*")
    assert reply["enableTestCommands"] is expected
    assert reply["featureCompatibilityVersion"] == {"version": "8.0"}


def test_get_parameter_by_name(engine_client: MongoClient) -> None:
    reply = engine_client.admin.command({"getParameter": 1, "enableTestCommands": 1})
    assert "enableTestCommands" in reply
    assert "featureCompatibilityVersion" not in reply  # only what was asked for
    with pytest.raises(OperationFailure) as info:
        engine_client.admin.command({"getParameter": 1, "noSuchParameter": 1})
    assert info.value.code == 72  # InvalidOptions
    assert "noSuchParameter" in str(info.value)


def test_get_cmd_line_opts(engine_client: MongoClient) -> None:
    reply = engine_client.admin.command("getCmdLineOpts")
    assert isinstance(reply["argv"], list) and reply["argv"]
    assert "security" not in reply["parsed"]  # no auth: what pymongo's runner checks
    if _enabled(engine_client):
        assert reply["parsed"]["setParameter"] == {"enableTestCommands": "1"}
        assert "--enable-test-commands" in reply["argv"]
    else:
        assert "setParameter" not in reply["parsed"]


def test_get_cmd_line_opts_only_on_admin(engine_client: MongoClient) -> None:
    with pytest.raises(OperationFailure) as info:
        engine_client["app"].command("getCmdLineOpts")
    assert info.value.code == 13  # Unauthorized, as mongod answers


def test_test_commands_are_served_only_when_enabled(engine_client: MongoClient) -> None:
    name = "accordTestOnlyEcho"

    @testing.test_command(name)
    def echo(ctx: Context, cmd: Doc) -> Doc:
        return {"echo": cmd[name], "ok": 1.0}

    try:
        if _enabled(engine_client):
            assert engine_client.admin.command(name, 7)["echo"] == 7
        else:
            with pytest.raises(OperationFailure) as info:
                engine_client.admin.command(name, 7)
            assert info.value.code == 59  # CommandNotFound, as without enableTestCommands
    finally:
        COMMANDS.pop(name, None)
        TEST_COMMANDS.discard(name)


def test_ensure_engine_starts_one_with_test_commands(tmp_path: Path) -> None:
    from accord.platform import ensure_engine, stop_engine

    uri = ensure_engine(tmp_path / "spawned", sync=False, enable_test_commands=True)
    client: MongoClient = MongoClient(uri)
    try:
        assert _enabled(client)
        assert "--enable-test-commands" in client.admin.command("getCmdLineOpts")["argv"]
    finally:
        client.close()
        stop_engine(tmp_path / "spawned")
