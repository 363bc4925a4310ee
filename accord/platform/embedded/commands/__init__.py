"""Command handlers: what each MongoDB command does to the engine.

A handler receives a ``Context`` (engine, database, the transaction it reads and writes
through) and the command document, and returns the reply. Session and transaction
bookkeeping happens before and after, in ``dispatch``. Importing this package registers
every handler in ``COMMANDS``.
"""

from accord.platform.embedded.commands import (
    admin,
    catalog,
    explain,
    output,
    read,
    search,
    testing,
    users,
    write,
)
from accord.platform.embedded.commands.base import (
    AUTH_WRITE_COMMANDS,
    COMMANDS,
    MAX_WIRE_VERSION,
    SERVER_VERSION,
    TEST_COMMANDS,
    TXN_COMMANDS,
    WRITE_COMMANDS,
    Context,
    Handler,
    check_db_name,
    writes_output,
)

__all__ = [
    "AUTH_WRITE_COMMANDS",
    "COMMANDS",
    "MAX_WIRE_VERSION",
    "SERVER_VERSION",
    "TEST_COMMANDS",
    "TXN_COMMANDS",
    "WRITE_COMMANDS",
    "Context",
    "Handler",
    "admin",
    "catalog",
    "check_db_name",
    "explain",
    "output",
    "read",
    "search",
    "testing",
    "users",
    "write",
    "writes_output",
]
