"""Field paths inside documents: parsing, reading and creating them as mongod's update does.

A path is a tuple of parts (``("a", "0", "b")`` for ``a.0.b``); a numeric part indexes
an array. ``MISSING`` stands for "nothing there", which is not the same as a stored null.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.values import format_value

__all__ = [
    "MAX_BACKFILL",
    "MISSING",
    "array_index",
    "assign",
    "dotted",
    "get_path",
    "is_array_marker",
    "locate",
    "locate_creating",
    "lookup",
    "parse_path",
]

MISSING: Any = object()  # a path that leads nowhere (distinct from a stored null)
MAX_BACKFILL = 1_500_000  # mongod refuses to pad an array by more than this


def dotted(path: Sequence[str]) -> str:
    return ".".join(path)


def array_index(part: str) -> int | None:
    return int(part) if part.isascii() and part.isdigit() else None


def is_array_marker(part: str) -> bool:
    """``$[]`` or ``$[ident]``."""
    return len(part) >= 3 and part.startswith("$[") and part.endswith("]")


@lru_cache(maxsize=4096)
def parse_path(field_name: str) -> tuple[str, ...]:
    """Split and check an update path the way mongod's field checker does (cached:
    the same few field names come with every update of an application)."""
    if "$" not in field_name and field_name and "." not in field_name:
        return (field_name,)  # one plain field name: nothing to check
    if field_name == "":
        raise EngineError(Code.EmptyFieldName, "An empty update path is not valid.")
    parts = tuple(field_name.split("."))
    if any(p == "" for p in parts):
        raise EngineError(
            Code.EmptyFieldName,
            f"The update path '{field_name}' contains an empty field name, which is not allowed.",
        )
    positional = [i for i, p in enumerate(parts) if p == "$"]
    if len(positional) > 1:
        raise EngineError(
            Code.BadValue, f"Too many positional (i.e. '$') elements found in path '{field_name}'"
        )
    if positional and positional[0] == 0:
        raise EngineError(
            Code.BadValue,
            "Cannot have positional (i.e. '$') element in the first position in path "
            f"'{field_name}'",
        )
    if is_array_marker(parts[0]):
        raise EngineError(
            Code.BadValue,
            "Cannot have array filter identifier (i.e. '$[<id>]') element in the first "
            f"position in path '{field_name}'",
        )
    for part in parts:
        if part.startswith("$") and part != "$" and not is_array_marker(part):
            raise EngineError(
                Code.DollarPrefixedFieldName,
                f"The dollar ($) prefixed field '{part}' in '{field_name}' is not valid for storage.",
            )
    return parts


def lookup(container: Any, key: Any) -> Any:
    if isinstance(container, dict):
        return container.get(key, MISSING)
    if isinstance(container, list) and isinstance(key, int) and key < len(container):
        return container[key]
    return MISSING


def get_path(doc: Any, path: Sequence[str]) -> Any:
    """The value at a literal path (array indexes allowed), or ``MISSING``."""
    cur = doc
    for part in path:
        if isinstance(cur, list):
            idx = array_index(part)
            cur = MISSING if idx is None else lookup(cur, idx)
        else:
            cur = lookup(cur, part)
        if cur is MISSING:
            return MISSING
    return cur


def assign(container: Any, key: Any, value: Any) -> None:
    if isinstance(container, dict):
        container[key] = value
        return
    if key < len(container):
        container[key] = value
        return
    if key - len(container) > MAX_BACKFILL:
        raise EngineError(
            Code.BadValue, f"can't backfill array to larger than {MAX_BACKFILL} elements"
        )
    container.extend([None] * (key - len(container)))  # mongod pads the gap with nulls
    container.append(value)


def _not_viable(part: str, parent_name: str, parent: Any) -> EngineError:
    return EngineError(
        Code.PathNotViable,
        f"Cannot create field '{part}' in element {{{parent_name}: {format_value(parent)}}}",
    )


def locate(doc: dict, path: Sequence[str], *, create: bool) -> tuple[Any, Any] | None:
    """Find the container and key that ``path`` ends at.

    With ``create``, missing intermediate fields become subdocuments (mongod's
    path-creating behaviour) and a path through a scalar is a PathNotViable error;
    without it, such paths yield ``None``. List keys are returned as ints.
    """
    cur: Any = doc
    name = ""
    last = len(path) - 1
    for i, part in enumerate(path):
        key: Any
        if isinstance(cur, dict):
            key = part
        elif isinstance(cur, list):
            key = array_index(part)
            if key is None:
                if create:
                    raise _not_viable(part, name, cur)
                return None
        else:
            if create:
                raise _not_viable(part, name, cur)
            return None
        if i == last:
            return cur, key
        nxt = lookup(cur, key)
        if nxt is MISSING:
            if not create:
                return None
            nxt = {}
            assign(cur, key, nxt)
        cur, name = nxt, part
    raise AssertionError("empty update path")


def locate_creating(doc: dict, path: Sequence[str]) -> tuple[Any, Any]:
    found = locate(doc, path, create=True)
    assert found is not None  # creating lookups either find a slot or raise
    return found
