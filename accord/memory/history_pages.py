"""Pages of a memory's history: its versions in one order, and the cursor between pages.

A memory changed a hundred thousand times has a hundred thousand history entries, so
the HTTP API serves them a page at a time. Pages are keyed, not counted: a page starts
after the last entry of the one before (``replaced_at``, then ``version``, then ``_id``,
since a memory deleted and made again starts at version 1 again), so an entry added
while a client pages is never served twice or skipped, and a deep page costs what the
first does (an offset would scan every entry before it).

The cursor is opaque to clients: URL-safe base64 of ``<ms>.<version>.<_id hex>``. A
cursor that does not decode is refused naming ``after``; one that decodes but names no
entry simply starts after that position (it cannot reach another memory: the memory and
the tenant are in the query, not in the cursor).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bson import ObjectId
from pymongo import ASCENDING

from accord.memory.validation import InvalidField

__all__ = ["CURSOR_PATTERN", "MAX_CURSOR", "ORDER", "HistoryPage", "after_filter", "cursor_of"]

#: The order of a memory's history, oldest first; every page follows it.
ORDER = [("replaced_at", ASCENDING), ("version", ASCENDING), ("_id", ASCENDING)]
#: The longest cursor accepted (``<13 digits>.<16 digits>.<24 hex>``, base64).
MAX_CURSOR = 96
#: What a cursor is made of (URL-safe base64 without padding), for the API's schema.
CURSOR_PATTERN = r"^[A-Za-z0-9_-]+$"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SHAPE = re.compile(r"(\d{1,15})\.(\d{1,16})\.([0-9a-f]{24})")


@dataclass(frozen=True)
class HistoryPage:
    """One page of a memory's history: ``items`` oldest first (as ``history`` returns
    them), ``next`` the cursor of the page after it (None: this is the last)."""

    items: list[dict[str, Any]]
    next: str | None


def cursor_of(entry: Mapping[str, Any]) -> str:
    """The cursor of the page that starts after ``entry`` (a stored history document)."""
    at: datetime = entry["replaced_at"]
    if at.tzinfo is None:  # pymongo's datetimes are naive UTC
        at = at.replace(tzinfo=UTC)
    millis = (at - _EPOCH) // timedelta(milliseconds=1)  # exact: BSON keeps milliseconds
    raw = f"{millis}.{int(entry['version'])}.{entry['_id']}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def after_filter(cursor: Any, field: str = "after") -> dict[str, Any]:
    """The filter of the entries after ``cursor`` (from :func:`cursor_of`); a cursor that
    is not one is an :class:`~accord.memory.validation.InvalidField` naming ``field``."""
    if not isinstance(cursor, str) or not 0 < len(cursor) <= MAX_CURSOR:
        raise InvalidField(field, "must be the 'next' cursor of a previous history page")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        raw = ""
    shape = _SHAPE.fullmatch(raw)
    if shape is None:
        raise InvalidField(field, "is not a history cursor (pass the 'next' of a previous page)")
    millis, version, oid = int(shape[1]), int(shape[2]), ObjectId(shape[3])
    try:
        at = _EPOCH + timedelta(milliseconds=millis)
    except OverflowError:
        raise InvalidField(field, "is not a history cursor (its time is out of range)") from None
    return {
        "$or": [
            {"replaced_at": {"$gt": at}},
            {"replaced_at": at, "version": {"$gt": version}},
            {"replaced_at": at, "version": version, "_id": {"$gt": oid}},
        ]
    }
