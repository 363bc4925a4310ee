"""SCRAM-SHA-256 and SCRAM-SHA-1 for the engine, with the ``scramp`` package doing the
exchange (nonces, proofs, signatures; RFC 5802 and 7677), as mongod does it:

- credentials are stored per mechanism as ``{iterationCount, salt, storedKey, serverKey}``
  (base64), mongod's ``credentials`` field; the password itself is never stored;
- SCRAM-SHA-256 prepares the password with SASLprep (scramp does); SCRAM-SHA-1 uses
  MongoDB's digest ``md5("user:mongo:password")`` as the password, as every driver does;
- iteration counts are mongod's defaults (``scramIterationCount`` 10000,
  ``scramSHA256IterationCount`` 15000);
- the user name in the client's first message is looked up as sent (mongod does not
  SASLprep user names, so ``"\\u2168"`` and ``"IX"`` are two users); scramp is handed that
  user's stored keys.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from typing import Any

import scramp

from accord.platform.embedded.errors import Code, EngineError

Doc = dict[str, Any]
MECHANISMS = ("SCRAM-SHA-1", "SCRAM-SHA-256")
ITERATIONS = {"SCRAM-SHA-1": 10_000, "SCRAM-SHA-256": 15_000}
AUTH_FAILED = "Authentication failed."


def mongo_digest(user: str, password: str) -> str:
    """MongoDB's SCRAM-SHA-1 password: md5 of ``user:mongo:password`` in hex."""
    return hashlib.md5(f"{user}:mongo:{password}".encode()).hexdigest()  # noqa: S324


def make_credentials(user: str, password: str, mechanisms: tuple[str, ...]) -> Doc:
    """The ``credentials`` of a user document for ``mechanisms``; refuses a password
    SASLprep refuses (BadValue)."""
    out: Doc = {}
    for mech in mechanisms:
        secret = mongo_digest(user, password) if mech == "SCRAM-SHA-1" else password
        try:
            salt, stored, server, count = scramp.ScramMechanism(mech).make_auth_info(
                secret, iteration_count=ITERATIONS[mech]
            )
        except scramp.ScramException as exc:
            raise EngineError(
                Code.BadValue, f"the password cannot be used with {mech}: {exc}"
            ) from exc
        out[mech] = {
            "iterationCount": count,
            "salt": _b64(salt),
            "storedKey": _b64(stored),
            "serverKey": _b64(server),
        }
    return out


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def auth_failed() -> EngineError:
    """What every failed authentication answers (mongod says no more, on purpose)."""
    return EngineError(Code.AuthenticationFailed, AUTH_FAILED)


class Conversation:
    """One SCRAM exchange on a connection: ``first`` (saslStart), then ``final``
    (saslContinue); ``user`` and ``db`` name who authenticated once ``done``."""

    def __init__(
        self, mechanism: str, db: str, lookup: Callable[[str, str], Doc | None], skip_empty: bool
    ) -> None:
        self.mechanism = mechanism
        self.db = db
        self.user: str | None = None
        self.skip_empty = skip_empty
        self.done = False
        self.proved = False
        self._lookup = lookup
        self._server: Any = None

    def first(self, payload: bytes) -> bytes:
        """The server-first message for the client-first ``payload``."""
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
            raise auth_failed() from None
        self.user = client_first_user(text)
        doc = self._lookup(self.user, self.db) if self.user is not None else None
        creds = (doc or {}).get("credentials", {}).get(self.mechanism)
        if not isinstance(creds, dict):
            raise auth_failed()  # no such user, or none for this mechanism
        try:
            info = (
                base64.b64decode(creds["salt"]),
                base64.b64decode(creds["storedKey"]),
                base64.b64decode(creds["serverKey"]),
                int(creds["iterationCount"]),
            )
            # The keys of the user named as sent (see the module docstring): scramp's
            # name argument is its SASLprepped form, which may name another user.
            self._server = scramp.ScramMechanism(self.mechanism).make_server(lambda _name: info)
            self._server.set_client_first(text)
            return str(self._server.get_server_first()).encode()
        except (scramp.ScramException, KeyError, ValueError, TypeError):
            raise auth_failed() from None

    def final(self, payload: bytes) -> bytes:
        """The server-final message (``v=signature``) once the client's proof checks out."""
        if self._server is None or self.proved:
            raise auth_failed()
        try:
            self._server.set_client_final(payload.decode("utf-8"))
            reply = str(self._server.get_server_final()).encode()
        except (scramp.ScramException, UnicodeDecodeError):
            raise auth_failed() from None
        self.proved = True
        return reply


def client_first_user(message: str) -> str | None:
    """The user name of a client-first message (``n,,n=NAME,r=NONCE``), unescaped."""
    parts = message.split(",", 3)
    if len(parts) < 4 or not parts[2].startswith("n="):
        return None
    name = parts[2][2:]
    return name.replace("=2C", ",").replace("=3D", "=")
