"""When MongoDB does not answer: what to tell the user (pure; no I/O).

An unreachable ``MONGODB_URI`` used to end in a raw pymongo traceback after 30 s, or in
"the transaction did not complete within 30s". :func:`unreachable` turns pymongo's
``ServerSelectionTimeoutError`` into :class:`~accord.errors.DatabaseUnreachable`, whose
message names the hosts tried and the likely fix, and never the credentials (URIs are
shown through :func:`redact`). The I/O half, which bounds the wait by the client's
server-selection timeout, is ``asynchronous/reachability.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pymongo.errors import ServerSelectionTimeoutError

from accord.errors import DatabaseUnreachable

# ``mongodb://user:password@host`` -> the credentials part, whatever it holds.
_CREDENTIALS = re.compile(r"(?P<scheme>mongodb(?:\+srv)?://)(?P<userinfo>[^@/?#]*)@")
# A server's address and last error in pymongo's topology description:
# <ServerDescription ('localhost', 1) server_type: Unknown, rtt: None, error=AutoReconnect('...')>
_SERVER = re.compile(r"<ServerDescription \('(?P<host>[^']*)', (?P<port>\d+)\)(?P<rest>[^>]*)>")
_SERVER_ERROR = re.compile(r"error=\w+\((?P<q>['\"])(?P<msg>.*?)(?P=q)\)")
# pymongo's suffix on network errors; it says nothing the user can act on.
_CONFIGURED = re.compile(r" \(configured timeouts: [^)]*\)")


def redact(uri: str) -> str:
    """``uri`` with any password replaced by ``***``. The user name of ``user:password``
    is kept (it helps to debug authentication); credentials of one part (a token) are
    hidden whole."""

    def hide(m: re.Match[str]) -> str:
        user, colon, _ = m.group("userinfo").partition(":")
        return f"{m.group('scheme')}{user}:***@" if colon and user else f"{m.group('scheme')}***@"

    return _CREDENTIALS.sub(hide, uri)


def hosts_of(client: Any) -> list[str]:
    """``host:port`` of every server ``client`` knows of (its seeds until one answers)."""
    try:
        addresses = client.topology_description.server_descriptions().keys()
    except Exception:  # a client of another shape: the message just names no host
        return []
    return [f"{host}:{port}" for host, port in addresses]


def server_errors(exc: BaseException) -> list[str]:
    """The per-server errors in a ``ServerSelectionTimeoutError``'s topology description."""
    found = []
    for m in _SERVER.finditer(str(exc)):
        err = _SERVER_ERROR.search(m.group("rest"))
        if err:
            found.append(redact(_CONFIGURED.sub("", err.group("msg"))))
    return found


def hosts_in(exc: BaseException) -> list[str]:
    """``host:port`` of the servers named in a ``ServerSelectionTimeoutError``'s message."""
    return [f"{m.group('host')}:{m.group('port')}" for m in _SERVER.finditer(str(exc))]


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) means no server could be selected."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, ServerSelectionTimeoutError):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def unreachable(exc: BaseException, hosts: Iterable[str], timeout: float) -> DatabaseUnreachable:
    """The accord error for a server selection that timed out after ``timeout`` seconds."""
    reasons = server_errors(exc)
    replica_set = "replicaset" in str(exc).lower()
    err = _unreachable(list(hosts), reasons, timeout, replica_set)
    err.__cause__ = exc
    return err


def _unreachable(
    hosts: list[str], reasons: list[str], timeout: float, replica_set: bool
) -> DatabaseUnreachable:
    named = ", ".join(hosts) or "the configured hosts"
    why = f" ({reasons[0]})" if reasons else ""
    hint = (
        " A replica set's members must be reachable under the names the set reports "
        "(with Docker, add directConnection=true to the URI for a single node)."
        if replica_set and not reasons
        else ""
    )
    return DatabaseUnreachable(
        f"MongoDB at {named} is unreachable: no server answered within {timeout:g}s{why}. "
        f"Nothing was written. Check that the server is running and that MONGODB_URI (or "
        f"the URI you passed) names it; unset MONGODB_URI to use the embedded engine "
        f"instead.{hint} On a slow network raise the wait with "
        f"ACCORD_SERVER_SELECTION_TIMEOUT (seconds) or the URI's serverSelectionTimeoutMS."
    )
