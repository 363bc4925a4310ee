# Generated from accord/platform/asynchronous/reachability.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""Fail fast, with a useful message, when MongoDB does not answer.

accord bounds every call with pymongo's client-side operation timeout (30 s by default),
and under that bound pymongo waits for a server for the whole bound, whatever the
client's ``serverSelectionTimeoutMS``: an unreachable server cost 30 s and ended in
"the transaction did not complete". :func:`ensure_reachable` is called first: when the
client knows no writable server yet, it selects one as pymongo does before any command,
but within the client's server-selection timeout (``connect()`` sets 5 s,
``ACCORD_SERVER_SELECTION_TIMEOUT``) or the caller's bound if shorter, and raises
:class:`~accord.errors.DatabaseUnreachable` naming the hosts and their errors. It sends
no command (server selection only watches the topology pymongo's monitor keeps), so it
adds nothing to a plan's round trips; when a writable server is known it costs one
attribute read. A closed client raises pymongo's ``InvalidOperation``, as any operation
on it would.

Generated from ``accord/platform/asynchronous/reachability.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

from typing import Any

from pymongo import MongoClient
from pymongo.errors import ServerSelectionTimeoutError
from pymongo.server_selectors import writable_server_selector

from accord.platform import reachability

_IS_SYNC = True


def ensure_reachable(client: MongoClient[Any], bound: float | None = None) -> None:
    """Return once ``client`` knows a writable server; raise
    :class:`~accord.errors.DatabaseUnreachable` after its server-selection timeout (or
    ``bound`` seconds, if shorter)."""
    if client.topology_description.has_writable_server():
        return
    timeout: float = client.options.server_selection_timeout
    if bound is not None:
        timeout = min(timeout, bound)
    # pymongo's own first step of every operation (it opens a client made with
    # connect=False, or an async one, and refuses a closed one); then its selection loop.
    topology = client._get_topology()
    try:
        topology.select_server(
            writable_server_selector, "accord.reachability", server_selection_timeout=timeout
        )
    except ServerSelectionTimeoutError as exc:
        raise reachability.unreachable(exc, reachability.hosts_of(client), timeout) from exc
