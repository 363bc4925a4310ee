"""Session, transaction and retryable-write bookkeeping around each command.

This is where the driver's protocol for sessions lives: ``lsid`` + ``txnNumber`` +
``startTransaction``/``autocommit: false`` open and continue a multi-document transaction,
``commitTransaction``/``abortTransaction`` end it (idempotently, so a driver may retry a
commit whose result it did not see), and ``txnNumber`` without ``autocommit`` makes a
write retryable: its reply is stored in the same commit, and a retry returns the stored
reply instead of applying the write twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import bson

from accord.platform.embedded import commands
from accord.platform.embedded.commands import (
    COMMANDS,
    TEST_COMMANDS,
    TXN_COMMANDS,
    WRITE_COMMANDS,
    Context,
)
from accord.platform.embedded.cursors import CursorManager
from accord.platform.embedded.engine import (
    SESSION_TIMEOUT_MINUTES,
    TXN_LIFETIME_LIMIT_S,
    Engine,
    Session,
    Txn,
)
from accord.platform.embedded.errors import TRANSIENT, Code, EngineError

log = logging.getLogger("accord.engine")

Doc = dict[str, Any]
# How long an autocommit write waits for a transaction holding its documents.
WRITE_WAIT_S = 30.0
GENERIC_ARGS = {
    "$db", "lsid", "txnNumber", "autocommit", "startTransaction", "readConcern", "writeConcern",
    "$clusterTime", "$readPreference", "apiVersion", "apiStrict", "apiDeprecationErrors",
    "maxTimeMS", "comment", "$audit", "$client", "mayBypassWriteBlocking",
}  # fmt: skip


def no_such_transaction(number: int) -> EngineError:
    return EngineError(
        Code.NoSuchTransaction,
        f"Transaction with {{ txnNumber: {number} }} has been aborted.",
        labels=(TRANSIENT,),
    )


class Dispatcher:
    """Executes one command document against the engine."""

    def __init__(
        self,
        engine: Engine,
        hello: Callable[[Doc], Doc],
        *,
        txn_lifetime: float = TXN_LIFETIME_LIMIT_S,
        test_commands: bool = False,
    ) -> None:
        self.engine = engine
        # mongod's transactionLifetimeLimitSeconds: older open transactions are aborted.
        self.txn_lifetime = txn_lifetime
        self.cursors = CursorManager()
        self.hello = hello
        # mongod's enableTestCommands: the TEST_COMMANDS are served only when it is set.
        self.test_commands = test_commands

    def execute(self, cmd: Doc) -> Doc:
        try:
            return self._execute(cmd)
        except EngineError as exc:
            return exc.to_reply()
        except RecursionError:
            return EngineError(Code.BadValue, "document nested too deeply").to_reply()
        except Exception as exc:  # a bug must not kill the connection or the server
            log.exception("internal error executing %r", next(iter(cmd), None))
            return EngineError(
                Code.InternalError, f"internal error: {type(exc).__name__}: {exc}"
            ).to_reply()

    def _execute(self, cmd: Doc) -> Doc:
        if not cmd:
            raise EngineError(Code.CommandNotFound, "no such command: ''")
        name = next(iter(cmd))
        handler = COMMANDS.get(name)
        if handler is None or (name in TEST_COMMANDS and not self.test_commands):
            raise EngineError(Code.CommandNotFound, f"no such command: '{name}'")
        db = cmd.get("$db")
        if db is None:
            raise EngineError(Code.Location40571, "OP_MSG requests require a $db argument")
        commands.check_db_name(db)
        with self.engine.lock:
            return self._run(name, handler, db, cmd)

    def _run(self, name: str, handler: commands.Handler, db: str, cmd: Doc) -> Doc:
        engine = self.engine
        lsid = cmd.get("lsid")
        session: Session | None = None
        if lsid is not None:
            if not isinstance(lsid, dict) or not isinstance(lsid.get("id"), bson.Binary):
                raise EngineError(Code.BadValue, "lsid must be an object with a UUID 'id'")
            session = engine.session(bson.encode({"id": lsid["id"]}))
        txn_number = cmd.get("txnNumber")
        if txn_number is not None and (
            not isinstance(txn_number, int) or isinstance(txn_number, bool)
        ):
            raise EngineError(Code.TypeMismatch, "txnNumber must be a 64-bit integer")
        autocommit = cmd.get("autocommit")
        if autocommit is not None:
            return self._in_transaction(name, handler, db, cmd, session, txn_number, autocommit)
        if name in ("commitTransaction", "abortTransaction"):
            raise EngineError(Code.Location50768, f"{name} must be run within a transaction")
        if txn_number is not None and name in WRITE_COMMANDS:
            if session is None:
                raise EngineError(
                    Code.Location50768,
                    "txnNumber may only be provided for multi-document transactions and retryable write commands: it needs an lsid",
                )
            return self._retryable(handler, db, cmd, session, txn_number)
        if name in WRITE_COMMANDS:
            return self._autocommit(handler, db, cmd, session, None)
        view = engine.begin(explicit=False)
        try:
            return handler(self._ctx(db, view, False, session), cmd)
        finally:
            engine.abort(view, "read finished")

    def _ctx(self, db: str, txn: Txn, in_txn: bool, session: Session | None) -> Context:
        return Context(
            engine=self.engine, cursors=self.cursors, db=db, txn=txn, in_transaction=in_txn,
            session_key=session.key if session else None, hello=self.hello,
            test_commands=self.test_commands,
        )  # fmt: skip

    # -- autocommit writes ------------------------------------------------------------------

    def _autocommit(
        self, handler: commands.Handler, db: str, cmd: Doc, session: Session | None,
        record: tuple[bytes, int] | None,
    ) -> Doc:  # fmt: skip
        """Run a write command in its own transaction, waiting out conflicting transactions."""
        deadline = time.monotonic() + WRITE_WAIT_S
        while True:
            txn = self.engine.begin(explicit=False)
            try:
                reply = handler(self._ctx(db, txn, False, session), cmd)
            except EngineError as exc:
                self.engine.abort(txn, "write failed")
                if exc.code != Code.WriteConflict:
                    raise
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EngineError(
                        Code.MaxTimeMSExpired,
                        "operation exceeded time limit waiting for a transaction that holds the documents",
                    ) from exc
                self.engine.changed.wait(min(remaining, 0.5))
                continue
            except BaseException:
                self.engine.abort(txn, "write failed")
                raise
            stored = None
            if record is not None:
                stored = (record[0], record[1], {"kind": "retry", "reply": reply})
            self.engine.commit(txn, record=stored)
            return reply

    def _retryable(
        self, handler: commands.Handler, db: str, cmd: Doc, session: Session, number: int
    ) -> Doc:
        if number < session.retry_number or number < session.txn_number:
            raise EngineError(
                Code.TransactionTooOld,
                f"Retryable write with txnNumber {number} is prohibited on session because a newer retryable write with txnNumber {max(session.retry_number, session.txn_number)} has already started on this session.",
            )
        if number == session.retry_number and session.retry_reply is not None:
            return dict(session.retry_reply, retriedStmtIds=[])  # applied once already
        reply = self._autocommit(handler, db, cmd, session, (session.key, number))
        session.retry_number, session.retry_reply = number, reply
        return reply

    # -- multi-document transactions -------------------------------------------------------

    def _in_transaction(
        self, name: str, handler: commands.Handler, db: str, cmd: Doc, session: Session | None,
        number: int | None, autocommit: Any,
    ) -> Doc:  # fmt: skip
        if autocommit is not False:
            raise EngineError(Code.InvalidOptions, "autocommit must be false when specified")
        if session is None or number is None:
            raise EngineError(Code.Location50768, "a transaction requires both lsid and txnNumber")
        engine = self.engine
        if cmd.get("startTransaction"):
            if number < session.txn_number or number <= session.retry_number:
                raise EngineError(
                    Code.TransactionTooOld,
                    f"Cannot start transaction {number} on session because a newer transaction {session.txn_number} has already started.",
                )
            if number == session.txn_number:
                raise EngineError(
                    Code.NoSuchTransaction if session.txn_state != "in_progress" else 50911,
                    f"Cannot start a transaction with txnNumber {number}: it was already started on this session.",
                )
            if session.txn is not None and session.txn_state == "in_progress":
                engine.abort(session.txn, "a newer transaction started on the session")
            txn = engine.begin(explicit=True, session=session)
            txn.txn_number = number
            session.txn, session.txn_number, session.txn_state = txn, number, "in_progress"
        elif number != session.txn_number:
            raise no_such_transaction(number)
        if name == "commitTransaction":
            return self._commit(session, number)
        if name == "abortTransaction":
            if session.txn_state != "in_progress" or session.txn is None:
                raise no_such_transaction(number)
            engine.abort(session.txn, "aborted by the client")
            return {"ok": 1.0}
        if session.txn_state != "in_progress" or session.txn is None:
            raise no_such_transaction(number)
        txn = session.txn
        if txn.aborted_reason is not None:
            raise no_such_transaction(number)
        if time.monotonic() - txn.started > self.txn_lifetime:
            engine.abort(txn, "transaction exceeded transactionLifetimeLimitSeconds")
            raise no_such_transaction(number)
        if name not in TXN_COMMANDS:
            raise EngineError(
                Code.OperationNotSupportedInTransaction,
                f"Cannot run '{name}' in a multi-document transaction.",
            )
        try:
            reply = handler(self._ctx(db, txn, True, session), cmd)
        except EngineError:
            # As in mongod, an error inside a transaction aborts it.
            engine.abort(txn, "an operation in the transaction failed")
            raise
        if reply.get("writeErrors") or reply.get("nErrors"):
            engine.abort(txn, "a write in the transaction failed")
        return reply

    def _commit(self, session: Session, number: int) -> Doc:
        if session.txn_state == "committed":
            return {"ok": 1.0}  # a retried commit of a transaction that already committed
        if session.txn_state != "in_progress" or session.txn is None:
            raise no_such_transaction(number)
        txn = session.txn
        self.engine.commit(txn, record=(session.key, number, {"kind": "commit"}))
        session.txn_state = "committed"
        session.txn = None
        return {"ok": 1.0}

    # -- housekeeping -------------------------------------------------------------------------

    def reap(self) -> None:
        """Abort expired transactions, forget idle sessions, close idle cursors."""
        now = time.monotonic()
        with self.engine.lock:
            for txn in list(self.engine.active.values()):
                if txn.explicit and now - txn.started > self.txn_lifetime:
                    self.engine.abort(txn, "transaction exceeded transactionLifetimeLimitSeconds")
            idle = now - SESSION_TIMEOUT_MINUTES * 60
            for key, session in list(self.engine.sessions.items()):
                if session.last_used < idle and session.txn_state != "in_progress":
                    del self.engine.sessions[key]  # its retry records stay on disk
            self.cursors.reap()
            self.engine.vacuum()
