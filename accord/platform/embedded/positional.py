"""Positional update paths: ``$`` (the first array element the query matched), ``$[]``
(every element) and ``$[ident]`` (the elements an ``arrayFilters`` entry selects).

``positional_index`` is also what a find projection's ``a.$`` uses.
"""

from __future__ import annotations

import re
from typing import Any

from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.mongomock_bridge import matches_filter
from accord.platform.embedded.paths import (
    MISSING,
    array_index,
    dotted,
    get_path,
    is_array_marker,
    lookup,
)
from accord.platform.embedded.values import bson_type_name, format_value

__all__ = [
    "NO_POSITIONAL_MATCH",
    "check_identifiers",
    "expand",
    "is_operator_doc",
    "parse_array_filters",
    "positional_index",
    "resolve_dollar",
]

_IDENT_RE = re.compile(r"[a-z][a-zA-Z0-9]*")
NO_POSITIONAL_MATCH = "The positional operator did not find the match needed from the query."


def _filter_identifiers(flt: dict) -> set[str]:
    names: set[str] = set()
    for key, value in flt.items():
        if key in ("$and", "$or", "$nor") and isinstance(value, list):
            for sub in value:
                if isinstance(sub, dict):
                    names |= _filter_identifiers(sub)
        elif not key.startswith("$"):
            names.add(key.split(".", 1)[0])
    return names


def parse_array_filters(array_filters: list[dict] | None) -> dict[str, dict]:
    filters: dict[str, dict] = {}
    for flt in array_filters or []:
        if not isinstance(flt, dict):
            raise EngineError(
                Code.TypeMismatch,
                f"Each array filter must be an object, found {bson_type_name(flt)}",
            )
        names = sorted(_filter_identifiers(flt))
        if not names:
            raise EngineError(
                Code.FailedToParse,
                "Cannot use an expression without a top-level field name in arrayFilters",
            )
        if len(names) > 1:
            raise EngineError(
                Code.FailedToParse,
                "Error parsing array filter :: caused by :: Expected a single top-level field "
                f"name, found '{names[0]}' and '{names[1]}'",
            )
        ident = names[0]
        if not _IDENT_RE.fullmatch(ident):
            raise EngineError(
                Code.BadValue,
                "Error parsing array filter :: caused by :: The top-level field name must be an "
                f"alphanumeric string beginning with a lowercase letter, found '{ident}'",
            )
        if ident in filters:
            raise EngineError(
                Code.FailedToParse,
                f"Found multiple array filters with the same top-level field name {ident}",
            )
        filters[ident] = flt
    return filters


def check_identifiers(paths: list[tuple[str, ...]], filters: dict[str, dict], update: dict) -> None:
    """Every ``$[ident]`` in ``paths`` has an array filter, and every filter is used."""
    used: set[str] = set()
    for path in paths:
        for part in path:
            if is_array_marker(part) and part != "$[]":
                ident = part[2:-1]
                if ident not in filters:
                    raise EngineError(
                        Code.BadValue,
                        f"No array filter found for identifier '{ident}' in path '{dotted(path)}'",
                    )
                used.add(ident)
    for ident in filters:
        if ident not in used:
            raise EngineError(
                Code.FailedToParse,
                f"The array filter for identifier '{ident}' was not used in the update "
                f"{format_value(update)}",
            )


def _query_conditions(query: dict, doc: dict) -> list[tuple[str, Any]]:
    """The query's field conditions: top level, inside ``$and`` and inside the first
    ``$or`` branch that matches ``doc`` (the branch mongod would record a position for)."""
    conditions: list[tuple[str, Any]] = []
    for key, value in query.items():
        if key == "$and" and isinstance(value, list):
            for sub in value:
                if isinstance(sub, dict):
                    conditions += _query_conditions(sub, doc)
        elif key == "$or" and isinstance(value, list):
            for sub in value:
                if isinstance(sub, dict) and matches_filter(sub, doc):
                    conditions += _query_conditions(sub, doc)
                    break
        elif not key.startswith("$"):
            conditions.append((key, value))
    return conditions


def is_operator_doc(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(k.startswith("$") for k in value)


def _elem_match_applies(inner: Any, elem: Any) -> bool:
    if not isinstance(inner, dict):
        raise EngineError(Code.BadValue, "$elemMatch needs an Object")
    if is_operator_doc(inner) and not set(inner) <= {"$and", "$or", "$nor", "$expr"}:
        return matches_filter({"v": inner}, {"v": elem})
    return isinstance(elem, dict) and matches_filter(inner, elem)


def _element_satisfies(elem: Any, rest: str, cond: Any) -> bool:
    """Does one array element satisfy a query condition on ``<array>[.rest]``?"""
    if rest:
        return matches_filter({"v." + rest: cond}, {"v": elem})
    if is_operator_doc(cond) and "$elemMatch" in cond:
        others = {k: v for k, v in cond.items() if k != "$elemMatch"}
        return _elem_match_applies(cond["$elemMatch"], elem) and (
            not others or matches_filter({"v": others}, {"v": elem})
        )
    return matches_filter({"v": cond}, {"v": elem})


def positional_index(doc: dict, prefix: tuple[str, ...], query: dict | None) -> int:
    """The index the ``$`` operator stands for: the first element of the array at
    ``prefix`` that the query's conditions on that array matched."""
    array = get_path(doc, prefix)
    if not isinstance(array, list) or not query:
        raise EngineError(Code.BadValue, NO_POSITIONAL_MATCH)
    prefix_text = dotted(prefix)
    relevant = []
    for key, cond in _query_conditions(query, doc):
        if key == prefix_text:
            relevant.append(("", cond))
        elif key.startswith(prefix_text + "."):
            relevant.append((key[len(prefix_text) + 1 :], cond))
    if not relevant:
        raise EngineError(Code.BadValue, NO_POSITIONAL_MATCH)
    matches = [[_element_satisfies(e, rest, cond) for e in array] for rest, cond in relevant]
    for i in range(len(array)):
        if all(m[i] for m in matches):
            return i
    for m in matches:  # conditions met by different elements: mongod keeps one of them
        if any(m):
            return m.index(True)
    raise EngineError(Code.BadValue, NO_POSITIONAL_MATCH)


def expand(doc: dict, path: tuple[str, ...], filters: dict[str, dict]) -> list[tuple[str, ...]]:
    """Expand ``$[]`` / ``$[ident]`` into the concrete paths they select in ``doc``."""
    if not any(is_array_marker(p) for p in path):
        return [path]
    out: list[tuple[str, ...]] = []

    def walk(node: Any, i: int, taken: tuple[str, ...]) -> None:
        rest = path[i:]
        if not any(is_array_marker(p) for p in rest):
            out.append(taken + rest)
            return
        part = path[i]
        if not is_array_marker(part):
            if isinstance(node, list):
                idx = array_index(part)
                child = MISSING if idx is None else lookup(node, idx)
            else:
                child = lookup(node, part)
            walk(child, i + 1, taken + (part,))
            return
        if node is MISSING:
            raise EngineError(
                Code.BadValue,
                f"The path '{dotted(taken)}' must exist in the document in order to apply "
                "array updates.",
            )
        if not isinstance(node, list):
            raise EngineError(
                Code.BadValue,
                f"Cannot apply array updates to non-array element {taken[-1]}: "
                f"{format_value(node)}",
            )
        ident = part[2:-1]
        for idx, elem in enumerate(node):
            if not ident or matches_filter(filters[ident], {ident: elem}):
                walk(elem, i + 1, taken + (str(idx),))

    walk(doc, 0, ())
    return out


def resolve_dollar(
    path: tuple[str, ...], doc: dict, query: dict | None, cache: dict[tuple[str, ...], int]
) -> tuple[str, ...]:
    if "$" not in path:
        return path
    at = path.index("$")
    prefix = path[:at]
    if any(is_array_marker(p) for p in prefix):
        raise EngineError(Code.BadValue, NO_POSITIONAL_MATCH)
    if prefix not in cache:
        cache[prefix] = positional_index(doc, prefix, query)
    return prefix + (str(cache[prefix]),) + path[at + 1 :]
