"""Text MongoDB can store: UTF-8 only.

A lone surrogate (``"\\ud800"``: what Python makes of command-line bytes that are not
UTF-8, or what a JSON ``"\\ud800"`` escape decodes to) cannot be encoded; pymongo raises
``UnicodeEncodeError`` when it meets one, after a command may have connected or read.
Every door checks its text with :func:`surrogate_at` first and names the value instead.
"""

from __future__ import annotations


def surrogate_at(value: str) -> int | None:
    """Where ``value`` holds a lone surrogate (the character's index), or None when it is
    text MongoDB can store."""
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None
