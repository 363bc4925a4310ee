"""Test-only commands (mongod's ``enableTestCommands``).

Commands registered here with :func:`test_command` are served only when the engine runs
with ``--enable-test-commands`` (``accord engine start --enable-test-commands``,
``ensure_engine(..., enable_test_commands=True)``); otherwise the dispatcher answers
CommandNotFound, as mongod does. Drivers' spec-test runners need them (``configureFailPoint``
and friends); nothing in accord's product uses them.
"""

from __future__ import annotations

from collections.abc import Callable

from accord.platform.embedded.commands.base import TEST_COMMANDS, Context, Doc, Handler, command
from accord.platform.embedded.errors import Code, EngineError


def test_command(*names: str) -> Callable[[Handler], Handler]:
    """Register a handler as a test command: gated by ``--enable-test-commands``."""

    def register(fn: Handler) -> Handler:
        TEST_COMMANDS.update(names)
        return command(*names)(fn)

    return register


@test_command("configureFailPoint")
def cmd_configure_fail_point(ctx: Context, cmd: Doc) -> Doc:
    """mongod's configureFailPoint (see ``failpoints``): admin database only."""
    if ctx.db != "admin":
        raise EngineError(
            Code.Unauthorized, "configureFailPoint may only be run against the admin database."
        )
    return ctx.failpoints.configure(cmd)
