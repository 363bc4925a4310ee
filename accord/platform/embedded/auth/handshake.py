"""SASL on a connection: ``saslStart`` / ``saslContinue``, and the same first step as
pymongo sends it inside the handshake (``hello`` with ``speculativeAuthenticate``), plus
``saslSupportedMechs`` (which mechanisms a user has, for the driver's negotiation).

Replies are mongod's: ``{conversationId: 1, done, payload}``; with ``skipEmptyExchange``
(what drivers send) the exchange is done after the client's proof, otherwise one more
empty round trip ends it. Any failure is 18 ``AuthenticationFailed`` "Authentication
failed." whatever the cause (unknown user, wrong password, no credentials for the
mechanism), so a client learns nothing about which users exist.
"""

from __future__ import annotations

import logging
from typing import Any

import bson

from accord.platform.embedded.auth.checks import Authorizer
from accord.platform.embedded.auth.scram import MECHANISMS, Conversation, auth_failed
from accord.platform.embedded.auth.session import AuthSession
from accord.platform.embedded.errors import Code, EngineError

log = logging.getLogger("accord.engine")

Doc = dict[str, Any]
CONVERSATION_ID = 1


def _payload(value: Any) -> bytes:
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, str):  # the shell sends strings; mongod accepts both
        return value.encode()
    raise EngineError(Code.TypeMismatch, "payload must be BinData or a string")


def sasl_start(authz: Authorizer, sess: AuthSession, db: str, cmd: Doc) -> Doc:
    """Begin an exchange for ``mechanism`` as a user of ``db``."""
    mechanism = cmd.get("mechanism")
    if not isinstance(mechanism, str):
        raise EngineError(Code.BadValue, "saslStart needs a 'mechanism' string")
    if mechanism not in MECHANISMS:
        raise EngineError(
            Code.MechanismUnavailable,
            f"Received authentication for mechanism {mechanism} which is not enabled",
        )
    options = cmd.get("options")
    skip = bool(options.get("skipEmptyExchange")) if isinstance(options, dict) else False
    conversation = Conversation(mechanism, db, authz.catalog.user, skip)
    sess.conversation = None
    try:
        first = conversation.first(_payload(cmd.get("payload")))
    except EngineError:
        log.info("authentication failed: %s as %r on %s", mechanism, conversation.user, db)
        raise
    sess.conversation = conversation
    return {
        "conversationId": CONVERSATION_ID,
        "done": False,
        "payload": bson.Binary(first),
        "ok": 1.0,
    }


def sasl_continue(sess: AuthSession, cmd: Doc) -> Doc:
    """The next step of the connection's exchange; logs the connection in once done."""
    conversation = sess.conversation
    if conversation is None or cmd.get("conversationId") not in (CONVERSATION_ID, None):
        raise EngineError(Code.ProtocolError, "No SASL session state found")
    payload = _payload(cmd.get("payload", b""))
    try:
        if not conversation.proved:
            final = conversation.final(payload)
            if not conversation.skip_empty:
                return {
                    "conversationId": CONVERSATION_ID,
                    "done": False,
                    "payload": bson.Binary(final),
                    "ok": 1.0,
                }
            reply_payload = final
        elif payload:
            raise auth_failed()
        else:
            reply_payload = b""
    except EngineError:
        sess.conversation = None
        log.info(
            "authentication failed: %s as %r on %s",
            conversation.mechanism, conversation.user, conversation.db,
        )  # fmt: skip
        raise
    sess.conversation = None
    assert conversation.user is not None
    login(sess, conversation.user, conversation.db)
    return {
        "conversationId": CONVERSATION_ID,
        "done": True,
        "payload": bson.Binary(reply_payload),
        "ok": 1.0,
    }


def login(sess: AuthSession, user: str, db: str) -> None:
    """Make the connection ``user@db``'s; one user per connection, as mongod 5.0+."""
    if sess.user is not None and sess.principal() is not None and sess.user != (user, db):
        previous = f"{sess.user[0]}@{sess.user[1]}"
        if sess.user[1] != db:
            raise EngineError(
                Code.Location5626701,
                "Each client connection may only be authenticated once. "
                f"Previously authenticated as: {previous}",
            )
        raise EngineError(
            Code.Location5626702,
            "Client has attempted to authenticate on multiple databases."
            f"Already authenticated as: {previous}",
        )
    sess.login(user, db)


def authenticate_in_hello(authz: Authorizer, sess: AuthSession, cmd: Doc, reply: Doc) -> None:
    """``saslSupportedMechs`` and ``speculativeAuthenticate`` of a handshake, answered in
    its reply. A speculative exchange that fails leaves the field out (the driver then
    authenticates the normal way and gets the error), as mongod does."""
    wanted = cmd.get("saslSupportedMechs")
    if isinstance(wanted, str) and "." in wanted:
        db, _, name = wanted.partition(".")
        doc = authz.catalog.user(name, db)
        creds = doc.get("credentials") if doc else None
        if isinstance(creds, dict):
            reply["saslSupportedMechs"] = [m for m in MECHANISMS if m in creds]
    spec = cmd.get("speculativeAuthenticate")
    if isinstance(spec, dict) and "saslStart" in spec:
        source = spec.get("db")
        if not isinstance(source, str):
            return
        try:
            reply["speculativeAuthenticate"] = _without_ok(sasl_start(authz, sess, source, spec))
        except EngineError:
            sess.conversation = None


def _without_ok(doc: Doc) -> Doc:
    doc.pop("ok", None)
    return doc
