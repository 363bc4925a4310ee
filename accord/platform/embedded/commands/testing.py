"""Test commands (mongod's ``enableTestCommands``): served only with --enable-test-commands.

The dispatcher answers CommandNotFound for every name in ``base.TEST_COMMANDS`` unless the
engine was started with the option, as mongod does.
"""

from __future__ import annotations

from accord.platform.embedded.commands.base import Context, Doc, command
from accord.platform.embedded.errors import Code, EngineError


@command("configureFailPoint")
def cmd_configure_fail_point(ctx: Context, cmd: Doc) -> Doc:
    if ctx.db != "admin":
        raise EngineError(
            Code.Unauthorized, "configureFailPoint may only be run against the admin database."
        )
    return ctx.failpoints.configure(cmd)
