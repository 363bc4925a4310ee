"""The line locator against generated TOML: random nested tables written in the shapes a
policy file uses (table headers, dotted keys, inline tables, multi-line arrays, quoted keys,
strings holding ``#``, ``=``, ``[``, quotes and newlines), each key's line recorded while
writing; every key path must be found on its line. ``tomllib`` parses every text first, so
only valid TOML is located."""

from __future__ import annotations

import json
import tomllib
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from accord.governance.toml_lines import KeyPath, key_lines

BARE = st.from_regex(r"[a-z][a-z0-9_-]{0,6}", fullmatch=True)
QUOTED = st.text(alphabet='ab .:#=[]"\\', min_size=1, max_size=6)
KEYS = st.one_of(BARE, QUOTED)
STRINGS = st.text(alphabet='ab #=[]{}"\\\n,', max_size=8)
SCALARS = st.one_of(st.integers(-5, 5), st.booleans(), STRINGS)
LEAF = st.one_of(SCALARS, st.lists(SCALARS, max_size=3))
TREES = st.recursive(
    st.dictionaries(KEYS, LEAF, max_size=3),
    lambda inner: st.dictionaries(KEYS, st.one_of(LEAF, inner), max_size=3),
    max_leaves=12,
)


def _key(k: str) -> str:
    return k if k and all(c.isalnum() or c in "_-" for c in k) and k.isascii() else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string (JSON's escapes are TOML's)
    return "[" + ", ".join(_value(x) for x in v) + "]"


class Writer:
    """Writes a tree, choosing a shape per table from ``style``; records lines."""

    def __init__(self, style: list[int]) -> None:
        self.lines: list[str] = []
        self.expected: dict[KeyPath, int] = {}
        self.style = style
        self.n = 0

    def pick(self) -> int:
        self.n += 1
        return self.style[self.n % len(self.style)] if self.style else 0

    def emit(self, text: str) -> int:
        self.lines.extend(text.split("\n"))
        return len(self.lines) - text.count("\n")

    def table(self, path: KeyPath, tree: dict[str, Any]) -> None:
        leaves = {k: v for k, v in tree.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in tree.items() if isinstance(v, dict)}
        if path:
            self.emit("# a comment = [not.a.table]")
            self.expected[path] = self.emit("[" + ".".join(_key(str(p)) for p in path) + "]")
        for k, v in leaves.items():
            if isinstance(v, list) and v and self.pick() % 2:  # a multi-line array
                at = self.emit(f"{_key(k)} = [")
                self.expected[(*path, k)] = at
                for i, x in enumerate(v):
                    self.expected[(*path, k, i)] = self.emit(f"  {_value(x)},")
                self.emit("]")
            else:
                self.expected[(*path, k)] = self.emit(f"{_key(k)} = {_value(v)}  # after")
        for k, sub in tables.items():
            shape = self.pick() % 3
            flat = all(not isinstance(v, dict) for v in sub.values())
            if shape == 1 and flat and not path:  # an inline table on one line
                body = ", ".join(f"{_key(sk)} = {_value(sv)}" for sk, sv in sub.items())
                at = self.emit(f"{_key(k)} = {{ {body} }}")
                self.expected[(*path, k)] = at
                for sk in sub:
                    self.expected[(*path, k, sk)] = at
            elif shape == 2 and flat and not path and sub:  # dotted keys
                for sk, sv in sub.items():
                    at = self.emit(f"{_key(k)}.{_key(sk)} = {_value(sv)}")
                    self.expected.setdefault((*path, k), at)
                    self.expected[(*path, k, sk)] = at
            else:
                self.deferred.append(((*path, k), sub))

    def write(self, tree: dict[str, Any]) -> str:
        self.deferred: list[tuple[KeyPath, dict[str, Any]]] = []
        self.table((), tree)
        while self.deferred:
            path, sub = self.deferred.pop(0)
            self.table(path, sub)
        return "\n".join(self.lines) + "\n"


@given(TREES, st.lists(st.integers(0, 5), max_size=6))
def test_every_key_is_found_on_its_line(tree: dict[str, Any], style: list[int]) -> None:
    writer = Writer(style)
    text = writer.write(tree)
    assert tomllib.loads(text) == tree  # the writer wrote what it meant
    found = key_lines(text)
    for path, line in writer.expected.items():
        assert found.get(path) == line, (path, line, text)
