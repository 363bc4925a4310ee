"""Fail fast, with a useful message, when MongoDB does not answer.

accord bounds every call with pymongo's client-side operation timeout (30 s by default),
and under that bound pymongo waits for a server for the whole bound, whatever the
client's ``serverSelectionTimeoutMS``: an unreachable server cost 30 s and ended in
"the transaction did not complete". :func:`ensure_reachable` is called first: when the
client knows no writable server yet, it waits for its monitor to find one, at most the
client's server-selection timeout (``connect()`` sets 5 s,
``ACCORD_SERVER_SELECTION_TIMEOUT``) or the caller's bound if shorter, and raises
:class:`~accord.errors.DatabaseUnreachable` naming the hosts and their errors. It sends
no command (it watches the topology the driver's monitor keeps), so it adds nothing to a
plan's round trips; when a writable server is known it costs one attribute read.

This module is the async source; its sync twin is generated from it by
``tools/synchro.py``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pymongo import AsyncMongoClient

from accord.platform import reachability

_IS_SYNC = False

#: How often the topology is looked at while waiting for a server.
POLL_S = 0.005


async def ensure_reachable(client: AsyncMongoClient[Any], bound: float | None = None) -> None:
    """Return once ``client`` knows a writable server; raise
    :class:`~accord.errors.DatabaseUnreachable` after its server-selection timeout (or
    ``bound`` seconds, if shorter)."""
    if client.topology_description.has_writable_server():
        return
    timeout: float = client.options.server_selection_timeout
    if bound is not None:
        timeout = min(timeout, bound)
    # Opens the client if it is not yet (an async client, or one made with connect=False,
    # starts its monitors on first use); pymongo's own first step of every operation.
    await client._get_topology()
    deadline = time.monotonic() + timeout
    while not client.topology_description.has_writable_server():
        if time.monotonic() >= deadline:
            raise reachability.unreachable_topology(client.topology_description, timeout)
        await asyncio.sleep(POLL_S)
