"""Time limits of one command: its ``maxTimeMS``, and a bound on every regular expression.

Commands run under the engine lock, so one slow command stalls every client. Two limits
keep that finite:

- ``maxTimeMS`` (mongod's): the dispatcher opens a ``time_limit`` around the command, and
  the evaluators call ``check()`` per document (filters, pipeline stages, sorts); past the
  deadline the command fails with MaxTimeMSExpired (50) and its transaction is discarded.
- every user regular expression (``$regex``, ``$in`` with regexes, ``$regexMatch``,
  ``$jsonSchema`` ``pattern``) is matched by the ``regex`` package with a timeout of at most
  ``REGEX_BOUND_S`` per value (the role PCRE's match limit plays in mongod), or the
  command's remaining ``maxTimeMS`` if that is shorter. A pattern that backtracks
  catastrophically therefore fails the command instead of holding the lock for minutes.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import regex
from bson.regex import Regex

from accord.platform.embedded.errors import Code, EngineError

__all__ = [
    "REGEX_BOUND_S",
    "check",
    "compile_pattern",
    "regex_search",
    "remaining",
    "time_limit",
]

# The longest one regular expression may run on one value.
REGEX_BOUND_S = 1.0
_DEADLINE: ContextVar[float | None] = ContextVar("accord_deadline", default=None)


def _expired() -> EngineError:
    return EngineError(Code.MaxTimeMSExpired, "operation exceeded time limit")


@contextmanager
def time_limit(max_time_ms: Any) -> Iterator[None]:
    """Run the block under the command's ``maxTimeMS`` (absent or 0: no limit)."""
    if max_time_ms is None:
        yield
        return
    if (
        isinstance(max_time_ms, bool)
        or not isinstance(max_time_ms, int | float)
        or max_time_ms != max_time_ms  # NaN
        or max_time_ms < 0
        or max_time_ms > 2**31 - 1
        or int(max_time_ms) != max_time_ms
    ):
        raise EngineError(
            Code.BadValue,
            f"maxTimeMS must be a non-negative 32-bit integer of milliseconds, got {max_time_ms!r}",
        )
    if max_time_ms == 0:
        yield
        return
    token = _DEADLINE.set(time.monotonic() + max_time_ms / 1000.0)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def remaining() -> float | None:
    """Seconds left before the command's deadline (None: no ``maxTimeMS``)."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()


def check() -> None:
    """Raise MaxTimeMSExpired if the running command is past its ``maxTimeMS``."""
    deadline = _DEADLINE.get()
    if deadline is not None and time.monotonic() > deadline:
        raise _expired()


@functools.lru_cache(maxsize=512)
def compile_pattern(pattern: str, flags: int = 0) -> regex.Pattern[str]:
    """A user pattern compiled by the ``regex`` package (re-compatible syntax)."""
    try:
        return regex.compile(pattern, flags & (re.I | re.M | re.S | re.X | re.U))
    except regex.error as exc:
        raise EngineError(
            Code.Location51091, f"Regular expression is invalid: {exc}: {pattern!r}"
        ) from exc


def _pattern(rx: Any) -> regex.Pattern[str]:
    if isinstance(rx, str):
        return compile_pattern(rx)
    if isinstance(rx, Regex):
        return compile_pattern(rx.pattern, rx.flags if isinstance(rx.flags, int) else 0)
    if isinstance(rx, re.Pattern):
        return compile_pattern(rx.pattern, rx.flags)
    if isinstance(rx, regex.Pattern):
        return rx
    raise EngineError(Code.BadValue, f"not a regular expression: {rx!r}")


def regex_search(rx: Any, text: str) -> bool:
    """Whether ``rx`` (a pattern string, ``re``/``bson`` regex) matches somewhere in
    ``text``, within the regex bound and the command's deadline."""
    pattern = _pattern(rx)
    left = remaining()
    timeout = REGEX_BOUND_S if left is None else max(0.0, min(REGEX_BOUND_S, left))
    try:
        return pattern.search(text, timeout=timeout) is not None
    except TimeoutError:
        if left is not None and left <= REGEX_BOUND_S:
            raise _expired() from None
        raise EngineError(
            Code.Location51156,
            f"the regular expression /{pattern.pattern}/ ran longer than {REGEX_BOUND_S:g} s on "
            f"one value of {len(text)} characters (catastrophic backtracking?); simplify it, "
            "for example by removing nested repetition such as (a+)+",
        ) from None
