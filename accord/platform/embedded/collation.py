"""Collation: locale-aware string comparison for queries, sorts and ``distinct``.

Supported: ``{locale: "simple"}`` (binary comparison, the default) and the English
locales (``en``, ``en_US``, ...) at ``strength`` 1 (base letters: case and accents
ignored), 2 (accents matter, case ignored) or 3 (the default: case matters, lowercase
first), approximating ICU's root collation: whitespace < punctuation < symbols < digits <
letters, then accents, then case. Other locales, strengths 4 and 5, and the options
``caseLevel``, ``caseFirst``, ``numericOrdering``, ``alternate: "shifted"`` and
``backwards`` are refused with an error that says so, instead of being ignored.

How it is applied: while a command runs with a collation, the strings of the documents
it compares and of its filter are wrapped in ``CollatedStr``, a ``str`` whose equality,
hash and order are those of its collation key (so every evaluator's ``==``, ``in`` and
``<`` follow the collation) while its text stays the original (so ``$regex``, which
ignores collation in MongoDB too, still sees the real string).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from accord.platform.embedded.errors import Code, EngineError

__all__ = [
    "CollatedStr",
    "Collation",
    "active",
    "collate",
    "collate_filter",
    "current",
    "key_values",
    "parse",
]

Doc = dict[str, Any]
SUPPORTED_LOCALES = ("en", "en_US", "en_GB", "en_AU", "en_CA", "en_IE", "en_IN", "en_NZ")
# Options mongod accepts, with the only value this engine implements.
_DEFAULTS: Doc = {
    "caseLevel": False,
    "caseFirst": "off",
    "alternate": "non-ignorable",
    "maxVariable": "punct",
    "normalization": False,
    "backwards": False,
    "numericOrdering": False,
}
_ALLOWED = {"locale", "strength", "version", *_DEFAULTS}


def _char_class(ch: str) -> int:
    category = unicodedata.category(ch)
    if ch.isspace() or category.startswith("Z"):
        return 0
    if category.startswith("P"):
        return 1
    if category.startswith("S"):
        return 2
    if category == "Nd":
        return 3
    if category.startswith("L"):
        return 4
    return 5


@dataclass(frozen=True)
class Collation:
    """One supported collation: an English locale at strength 1, 2 or 3."""

    locale: str
    strength: int

    def key(self, text: str) -> str:
        """A string whose code-point order is this collation's order of ``text``."""
        primary: list[str] = []
        secondary: list[str] = []
        tertiary: list[str] = []
        for ch in unicodedata.normalize("NFD", text):
            if unicodedata.combining(ch):
                if secondary:
                    secondary[-1] += ch  # an accent weighs on the letter before it
                continue
            cls = chr(0x20 + _char_class(ch))
            for folded in ch.casefold():
                primary.append(cls + folded)
                secondary.append("\x01")
                tertiary.append("\x02" if ch.isupper() else "\x01")
        parts = ["".join(primary)]
        if self.strength >= 2:
            parts.append("".join(secondary))
        if self.strength >= 3:
            parts.append("".join(tertiary))
        return "\x00".join(parts)

    def spec(self) -> Doc:
        """The collation document as mongod reports it (listIndexes, listCollections)."""
        return {"locale": self.locale, **_DEFAULTS, "strength": self.strength, "version": "57.1"}


def parse(spec: Any) -> Collation | None:
    """Check a ``collation`` option; None means binary comparison (absent or ``simple``)."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise EngineError(
            Code.TypeMismatch,
            f"BSON field 'collation' is the wrong type '{type(spec).__name__}', expected type 'object'",
        )
    locale = spec.get("locale")
    if not isinstance(locale, str):
        raise EngineError(Code.FailedToParse, "collation requires a string 'locale'")
    unknown = sorted(set(spec) - _ALLOWED)
    if unknown:
        raise EngineError(Code.FailedToParse, f"unknown collation field: {unknown[0]}")
    if locale == "simple":
        if set(spec) - {"locale", "version"}:
            raise EngineError(
                Code.BadValue, "a collation with locale 'simple' may not have other options"
            )
        return None
    if locale not in SUPPORTED_LOCALES:
        raise EngineError(
            Code.BadValue,
            f"collation locale '{locale}' is not supported by the embedded engine; it supports "
            f"'simple' and {', '.join(SUPPORTED_LOCALES)}",
        )
    strength = spec.get("strength", 3)
    if isinstance(strength, bool) or not isinstance(strength, int | float) or strength not in (
        1, 2, 3, 4, 5,
    ):  # fmt: skip
        raise EngineError(Code.BadValue, f"collation strength must be 1 to 5, got {strength!r}")
    if strength > 3:
        raise EngineError(
            Code.BadValue,
            f"collation strength {int(strength)} is not supported by the embedded engine "
            "(it supports 1, 2 and 3)",
        )
    for option, default in _DEFAULTS.items():
        if option in spec and spec[option] != default and option != "maxVariable":
            raise EngineError(
                Code.BadValue,
                f"collation option {option}: {spec[option]!r} is not supported by the embedded "
                f"engine (only {default!r})",
            )
    return Collation(locale, int(strength))


class CollatedStr(str):
    """A string that compares, hashes and sorts by a collation key."""

    __slots__ = ("collation_key",)
    collation_key: str

    def __new__(cls, text: str, key: str) -> CollatedStr:
        obj = super().__new__(cls, text)
        obj.collation_key = key
        return obj

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CollatedStr):
            return self.collation_key == other.collation_key
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.collation_key)

    def __lt__(self, other: str) -> bool:
        return self.collation_key < _key_of(other)

    def __le__(self, other: str) -> bool:
        return self.collation_key <= _key_of(other)

    def __gt__(self, other: str) -> bool:
        return self.collation_key > _key_of(other)

    def __ge__(self, other: str) -> bool:
        return self.collation_key >= _key_of(other)


def _key_of(value: str) -> str:
    return value.collation_key if isinstance(value, CollatedStr) else value


_ACTIVE: ContextVar[Collation | None] = ContextVar("accord_collation", default=None)


def current() -> Collation | None:
    """The collation of the command running in this context, if any."""
    return _ACTIVE.get()


@contextmanager
def active(collation: Collation | None) -> Iterator[None]:
    """Run the block with ``collation`` (None: binary comparison)."""
    token = _ACTIVE.set(collation)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def collate(value: Any) -> Any:
    """``value`` with every string wrapped for the active collation (as is without one)."""
    collation = _ACTIVE.get()
    return value if collation is None else _wrap(value, collation)


def _wrap(value: Any, collation: Collation) -> Any:
    if isinstance(value, str) and not isinstance(value, CollatedStr):
        return CollatedStr(value, collation.key(value))
    if isinstance(value, dict):
        return {k: _wrap(v, collation) for k, v in value.items()}
    if isinstance(value, list):
        return [_wrap(v, collation) for v in value]
    return value


def key_values(value: Any, collation: Collation | None = None) -> Any:
    """``value`` with each string replaced by its collation key (a plain ``str``), for
    hashing and index keys: two values equal under the collation become identical. Uses
    the active collation unless one is given; as is without either."""
    collation = collation or _ACTIVE.get()
    if collation is None:
        return value
    if isinstance(value, str):
        return collation.key(value)
    if isinstance(value, dict):
        return {k: key_values(v, collation) for k, v in value.items()}
    if isinstance(value, list):
        return [key_values(v, collation) for v in value]
    return value


# Operators whose string arguments are not values to compare.
_RAW_OPERATORS = {"$regex", "$options", "$type", "$where", "$jsonSchema", "$text", "$comment"}


def collate_filter(spec: Any) -> Any:
    """A query filter whose comparison values are wrapped for the active collation."""
    collation = _ACTIVE.get()
    return spec if collation is None else _wrap_filter(spec, collation)


def _wrap_filter(node: Any, collation: Collation) -> Any:
    if isinstance(node, dict):
        out: Doc = {}
        for key, value in node.items():
            if key in _RAW_OPERATORS:
                out[key] = value
            elif key == "$expr":
                out[key] = _wrap_expression(value, collation)
            else:
                out[key] = _wrap_filter(value, collation)
        return out
    if isinstance(node, list):
        return [_wrap_filter(v, collation) for v in node]
    return _wrap(node, collation)


def _wrap_expression(node: Any, collation: Collation) -> Any:
    # Field paths and variables ("$a", "$$x") stay plain; string constants compare collated.
    if isinstance(node, str):
        return node if node.startswith("$") else _wrap(node, collation)
    if isinstance(node, list):
        return [_wrap_expression(v, collation) for v in node]
    if isinstance(node, dict):
        if set(node) == {"$literal"}:
            return {"$literal": _wrap(node["$literal"], collation)}
        return {k: _wrap_expression(v, collation) for k, v in node.items()}
    return node
