# Generated from accord/platform/asynchronous/reachability.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""Fail fast, with a useful message, when MongoDB does not answer.

accord bounds every call with pymongo's client-side operation timeout (30 s by default),
and under that bound pymongo waits for a server for the whole bound, whatever the
client's ``serverSelectionTimeoutMS``: an unreachable server cost 30 s and ended in
"the transaction did not complete". :func:`ensure_reachable` is called first: when the
client knows no writable server yet, it pings within the client's own server-selection
timeout (``connect()`` sets 5 s, ``ACCORD_SERVER_SELECTION_TIMEOUT``) and raises
:class:`~accord.errors.DatabaseUnreachable` naming the hosts. When a writable server is
known it costs nothing (no I/O).

Generated from ``accord/platform/asynchronous/reachability.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

from typing import Any

import pymongo
from pymongo import MongoClient
from pymongo.errors import ConnectionFailure, OperationFailure

from accord.errors import DatabaseError
from accord.platform import reachability

_IS_SYNC = True


def ensure_reachable(client: MongoClient[Any]) -> None:
    """Return once ``client`` has a writable server; raise
    :class:`~accord.errors.DatabaseUnreachable` after its server-selection timeout."""
    if client.topology_description.has_writable_server():
        return
    timeout = client.options.server_selection_timeout
    try:
        # Nested in a caller's pymongo.timeout, the shorter of the two bounds the ping.
        with pymongo.timeout(timeout):
            client.admin.command("ping")
    except ConnectionFailure as exc:  # ServerSelectionTimeoutError, or a dropped connection
        raise reachability.unreachable(exc, reachability.hosts_of(client), timeout) from exc
    except OperationFailure as exc:  # e.g. authentication failed
        hosts = ", ".join(reachability.hosts_of(client)) or "the configured hosts"
        raise DatabaseError(
            f"MongoDB at {hosts} refused accord's connection check: {exc} (code {exc.code}). "
            f"Check the user name, password and authSource of the URI; nothing was written."
        ) from exc
