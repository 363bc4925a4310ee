"""Printing in the CLI: messages that quote any value, tables that cut none.

:class:`SafeConsole` is the console every command prints with: a message quoting a user's
value (an id, a tenant, an error) prints that value as it is, whatever it holds.

Rich fits a table to the terminal by wrapping and cutting cells ("12fa8a0e2ae4…"); an id
or a hold's value cut that way cannot be passed back to a command. Give such columns
:func:`whole`, and print with :func:`print_whole`: the other columns wrap to fit the
terminal, and when even that is too narrow the table is printed wider than the terminal,
with nothing cut.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.errors import MarkupError
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

from accord.errors import (
    ConfigurationError,
    InvalidInputError,
    MissingExtraError,
)
from accord.platform.text import surrogate_at


class SafeConsole(Console):
    """A rich console that never mangles nor fails on what a message quotes: no emoji
    codes (a thread id ``a:x:b`` stayed ``a❌b``), and a message whose quoted values are
    not valid markup (``[/red]x``) is printed as plain text instead of raising
    ``MarkupError`` (which came after a command had done its work)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("emoji", False)
        super().__init__(**kwargs)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        try:
            super().print(*objects, **kwargs)
        except MarkupError:
            super().print(*objects, **{**kwargs, "markup": False})

    def error(self, message: object, *, prefix: str = "error: ") -> None:
        """Print ``message`` as it is (``[x]`` in it is no markup tag: valid tags were
        dropped, ``'accord[export]'`` printed as ``'accord'``), after ``prefix`` in red
        (no prefix: the message in red)."""
        text = Text(prefix, style="red")
        text.append(str(message), style=None if prefix else "red")
        super().print(text, highlight=False)


#: Exit code of a command that could not run as given: a bad flag, argument, setting
#: (``MONGODB_URI``, ``ACCORD_*``) or input file, a missing extra; click's own for usage.
USAGE = 2
#: Exit code of a command that ran and failed (an unreachable server, a refusal, a conflict).
FAILED = 1


def is_usage_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the command cannot run as given (fix the flag or the
    environment and run it again), rather than that it ran and failed. (pydantic's
    ValidationError: a flag a model refused, such as ``api-key --name``.)"""
    usage = (ConfigurationError, InvalidInputError, MissingExtraError, ValidationError)
    return isinstance(exc, usage)


def fail(
    console: SafeConsole,
    exc: Exception,
    *,
    message: str | None = None,
    prefix: str = "error: ",
    failed: int = FAILED,
) -> typer.Exit:
    """Print ``exc`` (or ``message``) as one line on ``console`` (stderr) and return the
    ``typer.Exit`` to raise: :data:`USAGE` for a usage error, else ``failed``. The one
    place every command family reports an error, so a bad setting exits 2 from each of
    them (before 2026-12-07, 1 from ``runs``, ``worker``, ``threads`` and ``governance``,
    2 from the others)."""
    console.error(str(exc) if message is None else message, prefix=prefix)
    return typer.Exit(USAGE if is_usage_error(exc) else failed)


def whole(title: str, values: Iterable[str]) -> Column:
    """A column whose cells are never wrapped nor cut."""
    widest = max((len(v) for v in values), default=0)
    return Column(title, no_wrap=True, min_width=max(widest, len(title)))


def print_whole(console: Console, table: Table) -> None:
    """Print ``table`` on ``console`` with its :func:`whole` columns whole."""
    needed = Measurement.get(console, console.options.update(width=10_000), table).minimum
    if needed <= console.width:
        console.print(table)
        return
    width = console.width
    console.width = needed  # print(width=) is capped at the console's width
    try:
        console.print(table)
    finally:
        console.width = width


_DB_BAD = re.compile(r'[/\\. "$\x00]')


def database_name(value: str | None) -> str | None:
    """The ``--db`` options' check: a MongoDB database name, else exit 2 naming it
    (``a.b`` failed deep inside the driver, after some commands had written)."""
    if value is None:
        return None
    if not value or len(value) > 63 or _DB_BAD.search(value):
        raise typer.BadParameter(
            f"{value!r} is not a MongoDB database name (1 to 63 characters, none of "
            f'/ \\ . space " $ or NUL)'
        )
    return value


def text(value: Any) -> Any:
    """Typer callback of a text argument or option (or a repeatable one): refuse a value
    MongoDB cannot store, exit 2 naming it. Bytes that are not UTF-8 on the command line
    became lone surrogates, and pymongo's ``UnicodeEncodeError`` traceback came after the
    command had connected (``accord runs ls --thread $'\\xff'``)."""
    for item in value if isinstance(value, list | tuple) else [value]:
        if not isinstance(item, str):
            continue
        at = surrogate_at(item)
        if at is not None:
            raise typer.BadParameter(
                f"{item!r} is not valid UTF-8 (a byte that is not UTF-8 at character {at}); "
                f"pass the value in UTF-8"
            )
    return value


def server_uri(uri: str | None, dbpath: Path | None) -> str | None:
    """The server a command's ``--uri`` / ``--dbpath`` name, for ``connection.connect``
    or ``resolve_uri``: a flag wins over ``MONGODB_URI`` (before, ``--dbpath`` was
    ignored while ``MONGODB_URI`` was set: the command ran on another server); None when
    neither is given. Both at once, or an empty ``--uri``, is a ConfigurationError."""
    from accord.platform import connection

    if uri is not None and not uri.strip():
        raise ConfigurationError("--uri is empty; give a MongoDB URI, or leave the option out")
    if uri is not None and dbpath is not None:
        raise ConfigurationError(
            "--uri and --dbpath name two servers (a MongoDB, the embedded engine of a data "
            "directory); give one of them; nothing was done"
        )
    if dbpath is not None:
        return connection.ensure_engine(dbpath)
    return uri
