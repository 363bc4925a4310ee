"""Where a key path is written in a TOML text: the line an error should name.

``tomllib`` returns plain dicts without positions, and pydantic reports an error at a key
path (``("classes", "audit", "roles", "runtime")``). :func:`key_lines` scans the text once
and maps every key path it defines (by table headers ``[a.b]``, arrays of tables
``[[a]]``, dotted keys ``a.b = 1`` and inline tables ``a = { b = 1 }``) to the 1-based line
that defines it; :func:`line_of` answers the line of the longest prefix of a path that is
written in the file, so an error about a value inside a table names the table's line when
the value itself was left out.

It is a scanner for locating, not a parser: the text has been parsed by ``tomllib``
already (a text it refuses never gets here), so only the shapes valid TOML can take need
handling, and strings are skipped so that a ``#``, ``=`` or ``[`` inside one is not
mistaken for syntax.
"""

from __future__ import annotations

from collections.abc import Sequence

KeyPath = tuple[str | int, ...]

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class _Scanner:
    """A cursor over the whole text (TOML values may span lines)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0
        self.line = 1

    def peek(self, n: int = 1) -> str:
        return self.text[self.at : self.at + n]

    def advance(self, n: int = 1) -> None:
        for _ in range(n):
            if self.at < len(self.text):
                if self.text[self.at] == "\n":
                    self.line += 1
                self.at += 1

    def done(self) -> bool:
        return self.at >= len(self.text)

    def skip_blank(self, newlines: bool) -> None:
        """Spaces, tabs, comments and (when ``newlines``) line ends."""
        while not self.done():
            c = self.peek()
            if c in " \t\r" or (newlines and c == "\n"):
                self.advance()
            elif c == "#":
                while not self.done() and self.peek() != "\n":
                    self.advance()
            else:
                return

    def skip_line(self) -> None:
        while not self.done() and self.peek() != "\n":
            self.advance()
        self.advance()

    def string(self) -> str:
        """A basic or literal string, single- or multi-line; returns its raw content
        (escapes of a basic string kept simple: ``\\"`` and ``\\\\``, enough for keys)."""
        quote = self.peek()
        if self.peek(3) == quote * 3:
            self.advance(3)
            start = self.at
            while not self.done() and self.peek(3) != quote * 3:
                self.advance(2 if quote == '"' and self.peek() == "\\" else 1)
            content = self.text[start : self.at]
            self.advance(3)
            while self.peek() == quote:  # up to two quotes may end the content
                self.advance()
            return content
        self.advance()
        out: list[str] = []
        while not self.done() and self.peek() != quote:
            if quote == '"' and self.peek() == "\\":
                out.append(self.text[self.at + 1 : self.at + 2])
                self.advance(2)
                continue
            out.append(self.peek())
            self.advance()
        self.advance()
        return "".join(out)

    def key(self) -> list[str]:
        """A dotted key: ``a.b."c d"``."""
        parts: list[str] = []
        while True:
            self.skip_blank(newlines=False)
            if self.peek() in ('"', "'"):
                parts.append(self.string())
            else:
                start = self.at
                while not self.done() and self.peek() in _BARE:
                    self.advance()
                parts.append(self.text[start : self.at])
            self.skip_blank(newlines=False)
            if self.peek() != ".":
                return parts
            self.advance()


def key_lines(text: str) -> dict[KeyPath, int]:
    """Every key path ``text`` defines -> the line defining it (1-based). Elements of an
    array of tables are numbered (``("principals", 0, "name")``)."""
    lines: dict[KeyPath, int] = {}
    counts: dict[KeyPath, int] = {}  # array-of-tables lengths
    scan = _Scanner(text)
    table: KeyPath = ()
    while True:
        scan.skip_blank(newlines=True)
        if scan.done():
            return lines
        line = scan.line
        if scan.peek() == "[":
            array = scan.peek(2) == "[["
            scan.advance(2 if array else 1)
            parts = scan.key()
            path = (*_resolved(tuple(parts[:-1]), counts), parts[-1])
            if array:
                index = counts.get(path, 0)
                counts[path] = index + 1
                lines.setdefault(path, line)
                path = (*path, index)
            for n in range(1, len(path) + 1):
                lines.setdefault(path[:n], line)
            table = path
            scan.skip_line()
            continue
        _key_value(scan, table, lines, counts)
        scan.skip_blank(newlines=False)
        if scan.peek() == "\n":
            scan.advance()


def _resolved(path: KeyPath, counts: dict[KeyPath, int]) -> KeyPath:
    """``[a.b]`` after ``[[a]]`` means the last element of ``a``: insert its index."""
    out: list[str | int] = []
    for part in path:
        out.append(part)
        length = counts.get(tuple(out))
        if length:
            out.append(length - 1)
    return tuple(out)


def _key_value(
    scan: _Scanner, table: KeyPath, lines: dict[KeyPath, int], counts: dict[KeyPath, int]
) -> None:
    line = scan.line
    path = (*table, *scan.key())
    for n in range(len(table) + 1, len(path) + 1):
        lines.setdefault(path[:n], line)
    scan.skip_blank(newlines=False)
    if scan.peek() == "=":
        scan.advance()
    _value(scan, path, lines, counts)


def _value(
    scan: _Scanner, path: KeyPath, lines: dict[KeyPath, int], counts: dict[KeyPath, int]
) -> None:
    scan.skip_blank(newlines=False)
    c = scan.peek()
    if c in ('"', "'"):
        scan.string()
    elif c == "{":  # an inline table: its keys have lines of their own
        scan.advance()
        while True:
            scan.skip_blank(newlines=True)
            if scan.peek() == "}" or scan.done():
                scan.advance()
                return
            if scan.peek() == ",":
                scan.advance()
                continue
            _key_value(scan, path, lines, counts)
    elif c == "[":  # an array: its elements are numbered
        scan.advance()
        index = 0
        while True:
            scan.skip_blank(newlines=True)
            if scan.peek() == "]" or scan.done():
                scan.advance()
                return
            if scan.peek() == ",":
                scan.advance()
                continue
            lines.setdefault((*path, index), scan.line)
            _value(scan, (*path, index), lines, counts)
            index += 1
    else:  # a number, boolean or date: up to the next delimiter
        while not scan.done() and scan.peek() not in ",]}\n#":
            scan.advance()


def line_of(lines: dict[KeyPath, int], path: Sequence[str | int]) -> int | None:
    """The line of ``path``, else of its longest prefix written in the text (None when
    not even the first key is)."""
    key = tuple(path)
    while key:
        if key in lines:
            return lines[key]
        key = key[:-1]
    return None
