"""Logging a failure: one line at WARNING/ERROR, its traceback at DEBUG.

A failure the caller is also handed (a ``BusinessWriteError`` it catches) or that accord
recovers from (a lease that expires by itself) is worth one line in the log, not 60
lines of chained tracebacks at WARNING; the traceback is still there at DEBUG for whoever
investigates (``logging.getLogger("accord").setLevel(logging.DEBUG)``).
"""

from __future__ import annotations

import logging

#: Longest the one line's description of the exception gets.
MAX_DESCRIPTION = 500


def describe(exc: BaseException) -> str:
    """``Type: first line of the message``, at most :data:`MAX_DESCRIPTION` characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if len(text) > MAX_DESCRIPTION:
        text = text[: MAX_DESCRIPTION - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def log_failure(
    logger: logging.Logger,
    level: int,
    message: str,
    *args: object,
    exc: BaseException,
) -> None:
    """Log ``message % args`` and ``exc`` described in one line at ``level``; the
    traceback at DEBUG."""
    logger.log(level, message + " (%s)", *args, describe(exc))
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("traceback of: " + message, *args, exc_info=exc)
