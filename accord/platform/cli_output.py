"""Printing tables in the CLI without cutting what a user copies from them.

Rich fits a table to the terminal by wrapping and cutting cells ("12fa8a0e2ae4…"); an id
or a hold's value cut that way cannot be passed back to a command. Give such columns
:func:`whole`, and print with :func:`print_whole`: the other columns wrap to fit the
terminal, and when even that is too narrow the table is printed wider than the terminal,
with nothing cut.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from rich.measure import Measurement
from rich.table import Column, Table


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
