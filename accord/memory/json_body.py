"""Request bodies as the memory doors read them: strict JSON (:func:`loads`).

The HTTP API and the MCP server read every body and message here before any other check
(:mod:`accord.memory.validation`): nesting is measured on the bytes before anything is
parsed, the text must be UTF-8 without a byte order mark, numbers finite, and every field
of an object given once. A refusal is an :class:`~accord.memory.validation.InvalidField`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from accord.memory.validation import MAX_DEPTH, InvalidField, preview

__all__ = ["MAX_JSON_DEPTH", "json_depth", "loads"]

#: Nesting of a whole request body (a value or a filter, and the body around it).
MAX_JSON_DEPTH = MAX_DEPTH + 4
#: A string, from its quote to the closing one, or to the end of the text when it never
#: closes (invalid JSON, refused by the parser): a string that failed to close made the
#: search start again at every later quote and scan to the end, quadratic in the body
#: (``"x\\"x\\"...``: 12 s for 63 KB, holding the GIL). Possessive: no backtracking.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_NESTING = np.zeros(256, dtype=np.int8)
_NESTING[[ord("["), ord("{")]] = 1
_NESTING[[ord("]"), ord("}")]] = -1


def json_depth(data: bytes) -> int:
    """How deep JSON text ``data`` nests (``[]``/``{}`` outside strings), without parsing
    it: one regular expression and one numpy pass, so a deeply nested input is refused
    before any object of it is built."""
    brackets = np.frombuffer(_STRING.sub(b"", data), dtype=np.uint8)
    if not len(brackets):
        return 0
    return int(np.cumsum(_NESTING[brackets], dtype=np.int32).max())


def loads(data: bytes | str, *, max_depth: int = MAX_JSON_DEPTH, field: str = "body") -> Any:
    """Strict JSON: nested at most ``max_depth`` (checked before parsing); no ``NaN``,
    ``Infinity`` or numbers beyond a double (``1e400``), which JSON does not have and
    which would read back as null; bytes must be UTF-8 without a byte order mark. A refusal
    is an :class:`InvalidField` on ``field``."""
    if isinstance(data, str):
        text, raw = data, data.encode("utf-8", "surrogatepass")
    else:
        # JSON is UTF-8 (RFC 8259); Python's reader would also guess UTF-16 or UTF-32,
        # whose bytes the nesting check below cannot read (a character whose UTF-16 bytes
        # hold a quote hides the brackets after it)
        raw = data
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidField(field, "not valid JSON: the text is not UTF-8") from None
    if b"\x00" in raw:  # never in JSON text (escaped in strings): UTF-16 or UTF-32
        raise InvalidField(
            field, "not valid JSON: the text holds NUL bytes; JSON is UTF-8 (not UTF-16 or 32)"
        )
    if text.startswith("\ufeff"):
        raise InvalidField(field, "not valid JSON: a byte order mark; JSON is UTF-8 without one")
    depth = json_depth(raw)
    if depth > max_depth:
        raise InvalidField(field, f"JSON nested {depth} levels deep; at most {max_depth}")
    try:
        return json.loads(
            text, parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_unique
        )
    except json.JSONDecodeError as exc:
        raise InvalidField(
            field, f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except UnicodeDecodeError:
        raise InvalidField(field, "not valid JSON: the text is not UTF-8") from None
    except InvalidField:
        raise
    except (ValueError, RecursionError) as exc:  # e.g. an integer of 5,000 digits
        raise InvalidField(field, f"not valid JSON: {str(exc)[:200]}") from None


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose every field appears once: JSON readers differ on ``{"a": 1, "a":
    2}`` (a proxy may read 1 where Python reads 2), so the text means two things."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise InvalidField(
                    "body", f"{preview(name)} given twice in one object; give each field once"
                )
            seen.add(name)
    return obj


def _no_constant(name: str) -> Any:
    raise InvalidField("body", f"{name} is not a JSON number; numbers are finite")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise InvalidField("body", f"{preview(text)} is beyond what a number can hold")
    return number
