"""Session, transaction and retryable-write bookkeeping around each command.

This is where the driver's protocol for sessions lives: ``lsid`` + ``txnNumber`` +
``startTransaction``/``autocommit: false`` open and continue a multi-document transaction,
``commitTransaction``/``abortTransaction`` end it (idempotently, so a driver may retry a
commit whose result it did not see), and ``txnNumber`` without ``autocommit`` makes a
write retryable: its reply is stored in the same commit, and a retry returns the stored
reply instead of applying the write twice.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import bson
from bson.timestamp import Timestamp

from accord.platform import logs
from accord.platform.embedded import collation, commands, limits
from accord.platform.embedded.auth import handshake
from accord.platform.embedded.auth.catalog import AuthCatalog
from accord.platform.embedded.auth.checks import Authorizer, cursor_owner_error, recheck
from accord.platform.embedded.auth.session import AuthSession
from accord.platform.embedded.commands import (
    AUTH_WRITE_COMMANDS,
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
    timestamp_to_ts,
    ts_to_timestamp,
)
from accord.platform.embedded.errors import (
    STATE_CHANGE_CODES,
    TRANSIENT,
    Code,
    EngineError,
    server_error_labels,
    type_mismatch,
)
from accord.platform.embedded.failpoints import Action, CloseConnection, FailPoints
from accord.platform.embedded.group_commit import CommitFailed, PendingCommit

log = logging.getLogger("accord.engine")

Doc = dict[str, Any]
# How long an autocommit write waits for a transaction holding its documents.
WRITE_WAIT_S = 30.0


# Commands that may read at a snapshot outside a transaction (readConcern level snapshot).
SNAPSHOT_READS = {"find", "aggregate", "distinct"}
# Reads whose queries let other commands run between slices of their work
# (``Engine.read_pause``) and that work on the documents they collected with the engine
# lock released (``Engine.released``); a command that writes never does either.
YIELDING_READS = {"find", "aggregate", "count", "distinct", "getMore"}
# The commands a ``txnNumber`` without ``autocommit`` makes retryable (mongod's
# ``Command::supportsRetryableWrite``, checked by ``validateSessionOptions`` in
# src/mongo/db/transaction_validation.cpp); on any other command it is refused with 50768.
RETRYABLE_WRITE_COMMANDS = WRITE_COMMANDS | {"findandmodify"}
# Commands mongod runs without authentication (``requiresAuth()`` false): a ``txnNumber`` on
# one is refused with 50889 (src/mongo/db/initialize_operation_session_info.cpp).
NO_TXN_NUMBER_COMMANDS = {
    "hello", "isMaster", "ismaster", "ping", "buildInfo", "buildinfo", "saslStart",
    "saslContinue", "authenticate",
}  # fmt: skip
_NO_SIGNATURE = {"hash": bson.Binary(b"\x00" * 20), "keyId": bson.Int64(0)}


class _Call:
    """What one command leaves for after the engine lock is released."""

    __slots__ = ("ticket", "op_ts", "close_after")

    def __init__(self) -> None:
        # A commit to wait for before the reply may be sent (group commit).
        self.ticket: PendingCommit | None = None
        # The cluster time the command read at or committed at (operationTime).
        self.op_ts: int | None = None
        # A fail point wants the connection closed once the command is durable (why).
        self.close_after: str | None = None


@dataclass
class Connection:
    """One client connection, as the dispatcher needs to know it."""

    id: int = 0
    # The handshake's client.application.name (failCommand's appName matches it).
    app_name: str | None = None
    # From the loopback interface (the localhost exception applies to it).
    local: bool = True
    # Who authenticated on it (set by the dispatcher on the first command).
    auth: AuthSession | None = None


HELLO_COMMANDS = ("hello", "isMaster", "ismaster")


class WouldWait(Exception):  # noqa: N818 (an instruction to the caller, not an error)
    """Raised instead of waiting by a command started with ``may_wait=False``: a write
    found documents held by a transaction. Nothing of the command was applied; the caller
    runs it again where it may wait (the server's loop hands it to a worker)."""


class PendingReply:
    """The reply to a command whose commit is on its way to disk (``ticket``): ready once
    the commit is done or failed. The server has the group committer send it
    (``on_durable``) rather than keeping a thread waiting for it."""

    __slots__ = ("_dispatcher", "_cmd", "_call", "_reply", "_action")

    def __init__(
        self, dispatcher: Dispatcher, cmd: Doc, call: _Call, reply: Doc, action: Action | None
    ) -> None:
        self._dispatcher, self._cmd, self._call = dispatcher, cmd, call
        self._reply, self._action = reply, action

    @property
    def ticket(self) -> PendingCommit:
        assert self._call.ticket is not None
        return self._call.ticket

    def result(self) -> Doc:
        """The reply (the commit's error if it failed) once the commit is done or failed;
        raises ``CloseConnection`` when a fail point says so."""
        return self._dispatcher._finish(self._cmd, self._call, self._reply, self._action)

    def wait(self) -> Doc:
        """Wait (engine lock NOT held) for the commit, then the reply as ``result``."""
        with contextlib.suppress(CommitFailed):  # the reply says so
            self._dispatcher.engine.wait_durable(self.ticket)
        return self.result()


def _labelled(
    reply: Doc, cmd: Doc, override: tuple[str, ...] | None, topology_version: Doc | None = None
) -> Doc:
    """Add the error labels mongod would add (or, from a fail point, exactly ``override``),
    and for a state-change error the server's ``topologyVersion`` as mongod does."""
    code = None if reply.get("ok") else reply.get("code")
    wce = reply.get("writeConcernError")
    wc_code = wce.get("code") if isinstance(wce, dict) else None
    if topology_version is not None and (code or wc_code) in STATE_CHANGE_CODES:
        reply["topologyVersion"] = topology_version
    if override is not None:
        labels = list(override)
    else:
        labels = list(reply.get("errorLabels", []))
        labels += [x for x in server_error_labels(cmd, code, wc_code) if x not in labels]
    if labels:
        reply["errorLabels"] = labels
    else:
        reply.pop("errorLabels", None)
    return reply


def no_such_transaction(number: int) -> EngineError:
    return EngineError(
        Code.NoSuchTransaction,
        f"Transaction with {{ txnNumber: {number} }} has been aborted.",
        labels=(TRANSIENT,),
    )


def _check_session_uuid(value: bson.Binary) -> None:
    """An lsid's ``id`` is a UUID: binary subtype 4, 16 bytes (mongod's IDL ``uuid``)."""
    if value.subtype != bson.binary.UUID_SUBTYPE:
        raise EngineError(
            Code.TypeMismatch,
            f"BSON field 'lsid.id' is the wrong binData type (subtype {value.subtype}), "
            "expected type 'UUID'",
        )
    if len(value) != 16:
        raise EngineError(Code.InvalidUUID, "UUIDs must be exactly 16 bytes")


class Dispatcher:
    """Executes one command document against the engine."""

    def __init__(
        self,
        engine: Engine,
        hello: Callable[[Doc], Doc],
        *,
        txn_lifetime: float = TXN_LIFETIME_LIMIT_S,
        test_commands: bool = False,
        topology_version: Doc | None = None,
        authz: Authorizer | None = None,
    ) -> None:
        self.engine = engine
        if authz is None:  # users and roles are served even without --auth, as by mongod
            catalog = AuthCatalog()
            catalog.attach(engine)
            authz = Authorizer(catalog, enforced=False)
        # Users, roles and whether privileges are checked (--auth): auth/checks.py.
        self.authz = authz
        # mongod's transactionLifetimeLimitSeconds: older open transactions are aborted.
        self.txn_lifetime = txn_lifetime
        self.cursors = CursorManager()
        self.hello = hello
        # mongod's enableTestCommands: configureFailPoint and the other TEST_COMMANDS.
        self.test_commands = test_commands
        self.failpoints = FailPoints()
        # ``may_wait`` of the command this thread runs (see ``start``).
        self._local = threading.local()
        # What hello reports; state-change errors carry it too (see _labelled).
        self.topology_version = topology_version

    def execute(
        self, cmd: Doc, conn: Connection | None = None, sequences: Collection[str] = ()
    ) -> Doc:
        """The reply to ``cmd``, once any commit it made is durable; raises
        ``CloseConnection`` when a fail point says so."""
        outcome = self.start(cmd, conn, sequences=sequences)
        if isinstance(outcome, PendingReply):
            return outcome.wait()
        return outcome

    def start(
        self, cmd: Doc, conn: Connection | None = None, *, may_wait: bool = True,
        sequences: Collection[str] = (),
    ) -> Doc | PendingReply:  # fmt: skip
        """Execute ``cmd``: its reply, or for a command that committed a write, a
        ``PendingReply`` that is ready once the commit is durable (the engine lock is free
        meanwhile). Raises ``CloseConnection`` when a fail point says so, and without
        ``may_wait`` ``WouldWait`` where the command would wait for a transaction.
        ``sequences``: the fields that arrived as OP_MSG document sequences (an
        Unauthorized message leaves them out, as mongod's does)."""
        conn = conn or Connection()
        if conn.auth is None:
            conn.auth = self.authz.new_session(local=conn.local)
        local = self._local
        local.may_wait, local.conn, local.sequences = may_wait, conn, sequences
        try:
            return self._start(cmd, conn)
        finally:
            local.may_wait, local.conn, local.sequences = True, None, ()

    def _start(self, cmd: Doc, conn: Connection) -> Doc | PendingReply:
        name = next(iter(cmd), "")
        action = self.failpoints.on_command(name, conn.app_name)
        if action is not None:
            if action.block_ms:
                time.sleep(action.block_ms / 1000)
            if action.close_connection:
                raise CloseConnection(f"failCommand closed the connection on {name}")
            if action.error_code is not None:
                reply = action.error_reply()
                reply = _labelled(reply, cmd, action.error_labels, self.topology_version)
                return self._stamp(reply, _Call())
        if name in HELLO_COMMANDS:
            client = cmd.get("client")
            app = client.get("application") if isinstance(client, dict) else None
            if isinstance(app, dict) and isinstance(app.get("name"), str):
                conn.app_name = app["name"]  # the handshake names the application
            reply = self.hello(cmd)
            assert conn.auth is not None
            handshake.authenticate_in_hello(self.authz, conn.auth, cmd, reply)
            return reply
        call = _Call()
        reply = self._reply(cmd, call)
        if call.ticket is not None:
            return PendingReply(self, cmd, call, reply, action)
        return self._finish(cmd, call, reply, action)

    def _finish(self, cmd: Doc, call: _Call, reply: Doc, action: Action | None) -> Doc:
        """The reply as sent, once ``call.ticket`` (if any) is done or failed."""
        ticket = call.ticket
        if ticket is not None:
            if ticket.state == "failed":
                assert ticket.error is not None
                reply = _labelled(ticket.error.to_reply(), cmd, None, self.topology_version)
            else:
                call.op_ts = ticket.ts
        if action is not None and action.write_concern_error is not None and reply.get("ok"):
            # A copy: the reply may be the one stored for a retried write, which has no error.
            reply = {**reply, "writeConcernError": action.write_concern_error}
            reply = _labelled(reply, cmd, action.error_labels, self.topology_version)
        if call.close_after is not None:
            raise CloseConnection(call.close_after)
        return self._stamp(reply, call)

    def _reply(self, cmd: Doc, call: _Call) -> Doc:
        try:
            return self._execute(cmd, call)
        except (CloseConnection, WouldWait):
            raise
        except EngineError as exc:
            return _labelled(exc.to_reply(), cmd, None, self.topology_version)
        except RecursionError:
            return EngineError(Code.BadValue, "document nested too deeply").to_reply()
        except Exception as exc:  # a bug must not kill the connection or the server
            logs.log_failure(
                log, logging.ERROR, "internal error executing %r", next(iter(cmd), None), exc=exc
            )
            return EngineError(
                Code.InternalError, f"internal error: {type(exc).__name__}: {exc}"
            ).to_reply()

    def _stamp(self, reply: Doc, call: _Call) -> Doc:
        """Add ``operationTime`` and ``$clusterTime`` as a replica-set member does."""
        visible = self.engine.visible
        op_ts = call.op_ts if call.op_ts is not None else visible
        reply["operationTime"] = ts_to_timestamp(op_ts)
        reply["$clusterTime"] = {
            "clusterTime": ts_to_timestamp(max(visible, op_ts)), "signature": _NO_SIGNATURE,
        }  # fmt: skip
        return reply

    def _execute(self, cmd: Doc, call: _Call) -> Doc:
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
        _check_session_options(name, cmd)
        # maxTimeMS counts from here: waiting for the engine lock is part of the command.
        # On a change stream's getMore it is the await time, not a limit (as in mongod).
        max_time = cmd.get("maxTimeMS")
        cursor_id = cmd.get("getMore") if name == "getMore" else None
        if isinstance(cursor_id, int) and cursor_id in self.cursors.streams:
            max_time = None
        sess: AuthSession = self._local.conn.auth
        with limits.time_limit(max_time), self.engine.locked(name):
            self._authorize(sess, name, db, cmd)
            limits.check()
            with collation.active(self._collation(db, name, cmd)):
                reply = self._run(name, handler, db, cmd, call)
            cursor = reply.get("cursor")
            if isinstance(cursor, dict) and cursor.get("id") and name != "getMore":
                # A cursor belongs to who opened it (getMore and killCursors check).
                again = recheck(name, db, cmd, self.cursors) if sess.enforced else None
                self.cursors.claim(int(cursor["id"]), (sess.owner(), again))
        # A commit (call.ticket) is acknowledged only once durable: see PendingReply.
        return reply

    def _authorize(self, sess: AuthSession, name: str, db: str, cmd: Doc) -> None:
        """The privilege check (auth/checks.py); a getMore also checks its cursor's owner."""
        self.authz.check(sess, name, db, cmd, self.cursors, self._local.sequences)
        if name == "getMore" and isinstance(cmd.get("getMore"), int):
            cursor_id = int(cmd["getMore"])
            if self.cursors.exists(cursor_id):
                error = cursor_owner_error(sess, cursor_id, self.cursors.owner_of(cursor_id))
                if error is not None:
                    raise error

    def _collation(self, db: str, name: str, cmd: Doc) -> collation.Collation | None:
        """The command's ``collation``, else its collection's default (None: binary)."""
        spec = cmd.get("collation")
        target = cmd.get(name)
        if spec is None and isinstance(target, str):
            coll = self.engine.get_collection(f"{db}.{target}")
            spec = coll.options.get("collation") if coll is not None else None
        return collation.parse(spec)

    def _run(self, name: str, handler: commands.Handler, db: str, cmd: Doc, call: _Call) -> Doc:
        engine = self.engine
        lsid = cmd.get("lsid")
        session: Session | None = None
        if lsid is not None:
            if not isinstance(lsid, dict) or not isinstance(lsid.get("id"), bson.Binary):
                raise EngineError(Code.BadValue, "lsid must be an object with a UUID 'id'")
            _check_session_uuid(lsid["id"])
            session = engine.session(bson.encode({"id": lsid["id"]}))
        txn_number = cmd.get("txnNumber")  # checked by _check_session_options
        autocommit = cmd.get("autocommit")
        if cmd.get("startTransaction") is not None and autocommit is None:
            # it ran as a plain command: the caller believed it was in a transaction
            raise EngineError(
                Code.InvalidOptions, "startTransaction needs autocommit: false beside it"
            )
        read_concern = _read_concern(cmd)
        _check_write_concern(name, cmd, in_transaction=autocommit is not None)
        if autocommit is not None:
            return self._in_transaction(
                name, handler, db, cmd, session, txn_number, autocommit, read_concern, call
            )
        if name in ("commitTransaction", "abortTransaction"):
            raise EngineError(
                Code.NotARetryableWriteCommand, f"{name} must be run within a transaction"
            )
        snapshot_at = self._read_point(name, read_concern)
        if txn_number is not None:
            # A retryable write: _check_session_options refused a txnNumber on anything else
            # and without an lsid.
            assert session is not None and name in RETRYABLE_WRITE_COMMANDS
            return self._retryable(handler, db, cmd, session, txn_number, call)
        if (
            name in RETRYABLE_WRITE_COMMANDS  # the writes, findandmodify among them
            or name in AUTH_WRITE_COMMANDS
            or commands.writes_output(name, cmd)
        ):
            return self._autocommit(handler, db, cmd, session, None, call)
        view = engine.begin(explicit=False, snapshot=snapshot_at)
        view.yields = name in YIELDING_READS
        call.op_ts = view.snapshot
        try:
            reply = handler(self._ctx(db, view, False, session), cmd)
        finally:
            engine.abort(view, "read finished")
        if read_concern.get("level") == "snapshot" and reply.get("ok"):
            at = ts_to_timestamp(view.snapshot)
            if isinstance(reply.get("cursor"), dict):
                reply["cursor"]["atClusterTime"] = at
            else:
                reply["atClusterTime"] = at
        return reply

    def _read_point(self, name: str, read_concern: Doc) -> int | None:
        """The snapshot a command outside a transaction reads at (None: the latest),
        after waiting for ``afterClusterTime``; refuses snapshot reads MongoDB refuses."""
        engine = self.engine
        after = read_concern.get("afterClusterTime")
        if after is not None:
            engine.advance_to(self._known_time(after, "afterClusterTime"))
        if read_concern.get("level") != "snapshot":
            if "atClusterTime" in read_concern:
                raise EngineError(
                    Code.InvalidOptions,
                    "atClusterTime is only allowed with readConcern level snapshot",
                )
            return None
        if name not in SNAPSHOT_READS:
            raise EngineError(
                Code.InvalidOptions,
                f"readConcern level 'snapshot' is not supported for '{name}' outside a "
                "multi-document transaction: only find, aggregate and distinct read at a snapshot",
            )
        at = read_concern.get("atClusterTime")
        if at is None:
            return engine.visible
        ts = self._known_time(at, "atClusterTime")
        if ts < engine.history_start():
            raise EngineError(
                Code.SnapshotTooOld,
                f"Read timestamp {at} is older than the oldest available timestamp: the engine "
                f"keeps {engine.history_window:g} s of history (minSnapshotHistoryWindowInSeconds)",
            )
        engine.advance_to(ts)
        return ts

    def _known_time(self, value: Any, name: str) -> int:
        """A read concern's cluster time, refused past the engine's clock as mongod refuses
        it past its cluster time (72): a client only learns times the engine gave it, and
        one far ahead moved the clock there for good (at the maximum, no write could be
        acknowledged any more)."""
        ts = timestamp_to_ts(value)
        if ts > self.engine.clock:
            raise EngineError(
                Code.InvalidOptions,
                f"readConcern {name} value {value} must not be greater than the current "
                f"clusterTime {ts_to_timestamp(self.engine.clock)}",
            )
        return ts

    def _ctx(self, db: str, txn: Txn, in_txn: bool, session: Session | None) -> Context:
        return Context(
            engine=self.engine, cursors=self.cursors, db=db, txn=txn, in_transaction=in_txn,
            session_key=session.key if session else None, hello=self.hello,
            failpoints=self.failpoints, test_commands=self.test_commands,
            auth=self._local.conn.auth, authz=self.authz,
        )  # fmt: skip

    # -- autocommit writes ------------------------------------------------------------------

    def _autocommit(
        self, handler: commands.Handler, db: str, cmd: Doc, session: Session | None,
        record: tuple[bytes, int] | None, call: _Call, fail_before_commit: int | None = None,
    ) -> Doc:  # fmt: skip
        """Run a write command in its own transaction, waiting out conflicting transactions.

        ``fail_before_commit`` (a fail point's error code) aborts the write after it ran.
        """
        deadline = time.monotonic() + WRITE_WAIT_S
        while True:
            txn = self.engine.begin(explicit=False)
            try:
                reply = handler(self._ctx(db, txn, False, session), cmd)
            except EngineError as exc:
                self.engine.abort(txn, "write failed")
                if exc.code != Code.WriteConflict:
                    raise
                if not getattr(self._local, "may_wait", True):
                    raise WouldWait("a transaction holds the documents") from exc
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EngineError(
                        Code.MaxTimeMSExpired,
                        "operation exceeded time limit waiting for a transaction that holds the documents",
                    ) from exc
                self.engine.wait_changed(min(remaining, 0.5))
                continue
            except BaseException:
                self.engine.abort(txn, "write failed")
                raise
            if fail_before_commit is not None:
                self.engine.abort(txn, "failed by the onPrimaryTransactionalWrite fail point")
                raise EngineError(
                    fail_before_commit,
                    "Failing write due to failpoint. The write must not be reflected.",
                )
            stored = None
            if record is not None:
                stored = (record[0], record[1], {"kind": "retry", "reply": reply})
            call.ticket = self.engine.commit(txn, record=stored)
            call.op_ts = txn.snapshot if call.ticket is None else call.ticket.ts
            return reply

    def _retryable(
        self, handler: commands.Handler, db: str, cmd: Doc, session: Session, number: int,
        call: _Call,
    ) -> Doc:  # fmt: skip
        if number < session.retry_number or number < session.txn_number:
            raise EngineError(
                Code.TransactionTooOld,
                f"Retryable write with txnNumber {number} is prohibited on session because a newer retryable write with txnNumber {max(session.retry_number, session.txn_number)} has already started on this session.",
            )
        if number == session.retry_number and session.retry_reply is not None:
            ticket = session.retry_ticket
            if ticket is not None and ticket.state not in ("done", "failed"):
                call.ticket = ticket  # the first attempt is not durable yet: wait for it
            return dict(session.retry_reply, retriedStmtIds=[])  # applied once already
        action = self.failpoints.on_transactional_write(_statements(cmd))
        fail_code = action.fail_before_commit_code if action else None
        try:
            reply = self._autocommit(
                handler, db, cmd, session, (session.key, number), call, fail_code
            )
        except EngineError:
            if action is not None and action.close_connection:
                raise CloseConnection("onPrimaryTransactionalWrite failed the write") from None
            raise
        if action is not None and action.close_connection:
            # The write commits (durably, before the close) and its reply is lost: the
            # client must retry to learn it.
            call.close_after = "onPrimaryTransactionalWrite closed the connection"
        session.retry_number, session.retry_reply = number, reply
        ticket = call.ticket
        if ticket is not None:
            session.retry_ticket = ticket

            def forget() -> None:  # the write was rolled back: a retry must apply it
                if session.retry_number == number and session.retry_ticket is ticket:
                    session.retry_reply = None
                    session.retry_ticket = None

            ticket.on_failure.append(forget)
        return reply

    # -- multi-document transactions -------------------------------------------------------

    def _in_transaction(
        self, name: str, handler: commands.Handler, db: str, cmd: Doc, session: Session | None,
        number: int | None, autocommit: Any, read_concern: Doc, call: _Call,
    ) -> Doc:  # fmt: skip
        if autocommit is not False:
            raise EngineError(Code.InvalidOptions, "autocommit must be false when specified")
        if session is None or number is None:
            raise EngineError(
                Code.NotARetryableWriteCommand, "a transaction requires both lsid and txnNumber"
            )
        engine = self.engine
        if cmd.get("startTransaction"):
            if number < session.txn_number or number <= session.retry_number:
                raise EngineError(
                    Code.TransactionTooOld,
                    f"Cannot start transaction {number} on session because a newer transaction {session.txn_number} has already started.",
                )
            if number == session.txn_number:
                raise EngineError(
                    Code.NoSuchTransaction
                    if session.txn_state != "in_progress"
                    else Code.Location50911,
                    f"Cannot start a transaction with txnNumber {number}: it was already started on this session.",
                )
            if session.txn is not None and session.txn_state == "in_progress":
                engine.abort(session.txn, "a newer transaction started on the session")
            snapshot = None
            if read_concern.get("afterClusterTime") is not None:
                after = self._known_time(read_concern["afterClusterTime"], "afterClusterTime")
                engine.advance_to(after)
            if read_concern.get("atClusterTime") is not None:
                snapshot = self._read_point("find", read_concern)
            txn = engine.begin(explicit=True, session=session, snapshot=snapshot)
            txn.txn_number = number
            session.txn, session.txn_number, session.txn_state = txn, number, "in_progress"
        elif number != session.txn_number:
            raise no_such_transaction(number)
        elif read_concern:
            raise EngineError(
                Code.InvalidOptions,
                "Only the first command in a transaction may specify a readConcern",
            )
        if name == "commitTransaction":
            return self._commit(session, number, call)
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
        call.op_ts = txn.snapshot
        txn.yields = name in YIELDING_READS and not commands.writes_output(name, cmd)
        try:
            reply = handler(self._ctx(db, txn, True, session), cmd)
        except BaseException:
            # As in mongod, an error inside a transaction aborts it: any error, not only
            # an EngineError (a RecursionError or a bug may come after some of the
            # statement's writes, which a commit must never make durable).
            engine.abort(txn, "an operation in the transaction failed")
            raise
        finally:
            txn.yields = False
        if reply.get("writeErrors") or reply.get("nErrors"):
            engine.abort(txn, "a write in the transaction failed")
        self._bind_cursor(reply, number)
        return reply

    def _bind_cursor(self, reply: Doc, number: int) -> None:
        """Record that a cursor a command opened belongs to transaction ``number``: only
        a ``getMore`` in that transaction may read it (mongod's 50739-50741). It is not
        killed when the transaction commits or aborts (neither does mongod: its
        TransactionParticipant never touches the CursorManager); ``killCursors``, the
        session's end or the timeout ends it."""
        cursor = reply.get("cursor")
        if isinstance(cursor, dict) and cursor.get("id"):
            self.cursors.bind_transaction(int(cursor["id"]), number)

    def _commit(self, session: Session, number: int, call: _Call) -> Doc:
        if session.txn_state == "committed":
            # A retried commit of a transaction that already committed (or is committing).
            ticket = session.commit_ticket
            if ticket is not None and ticket.state not in ("done", "failed"):
                call.ticket = ticket
            return {"ok": 1.0}
        if session.txn_state != "in_progress" or session.txn is None:
            raise no_such_transaction(number)
        txn = session.txn
        # A read-only transaction has nothing to make durable.
        wrote = bool(txn.writes or txn.created)
        record = (session.key, number, {"kind": "commit"}) if wrote else None
        ticket = self.engine.commit(txn, record=record)
        session.txn_state = "committed"
        session.txn = None
        session.commit_ticket = ticket
        call.op_ts = txn.snapshot
        if ticket is not None:
            call.ticket = ticket

            def reopen() -> None:  # the commit was rolled back: it did not happen
                if session.txn_number == number and session.commit_ticket is ticket:
                    session.txn_state = "aborted"
                    session.commit_ticket = None

            ticket.on_failure.append(reopen)
        return {"ok": 1.0}

    # -- housekeeping -------------------------------------------------------------------------

    def reap(self) -> None:
        """Abort expired transactions, forget idle sessions, close idle cursors."""
        now = time.monotonic()
        with self.engine.locked("reap"):
            for txn in list(self.engine.active.values()):
                if txn.explicit and now - txn.started > self.txn_lifetime:
                    self.engine.abort(txn, "transaction exceeded transactionLifetimeLimitSeconds")
            idle = now - SESSION_TIMEOUT_MINUTES * 60
            for key, session in list(self.engine.sessions.items()):
                if session.last_used < idle and session.txn_state != "in_progress":
                    del self.engine.sessions[key]  # its retry records stay on disk
            self.cursors.reap()


def _statements(cmd: Doc) -> int:
    """How many statements (documents written) a write command carries."""
    for key in ("documents", "updates", "deletes", "ops"):
        value = cmd.get(key)
        if isinstance(value, list):
            return len(value)
    return 1


def _check_session_options(name: str, cmd: Doc) -> None:
    """Refuse a ``txnNumber`` that neither a transaction nor a retryable write uses, as
    mongod does before the privilege check (it would otherwise be ignored: a ``find`` read
    outside the transaction its caller believed it was in). In mongod's order:
    ``initializeOperationSessionInfo`` (src/mongo/db/initialize_operation_session_info.cpp)
    refuses one on a command that needs no authentication (50889), one without an lsid and
    a negative one (72), then ``validateSessionOptions``
    (src/mongo/db/transaction_validation.cpp) one without ``autocommit`` on a command that
    is not a retryable write (50768)."""
    txn_number = cmd.get("txnNumber")
    if txn_number is None:
        return
    if not isinstance(txn_number, int) or isinstance(txn_number, bool):
        raise EngineError(Code.TypeMismatch, "txnNumber must be a 64-bit integer")
    in_transaction = cmd.get("autocommit") is not None
    if name in NO_TXN_NUMBER_COMMANDS and not in_transaction:
        raise EngineError(
            Code.Location50889, "It is illegal to provide a txnNumber for this command"
        )
    if cmd.get("lsid") is None:
        raise EngineError(
            Code.InvalidOptions, "Transaction number requires a session ID to also be specified"
        )
    if txn_number < 0:
        raise EngineError(Code.InvalidOptions, "Transaction number cannot be negative")
    if not in_transaction and name not in RETRYABLE_WRITE_COMMANDS:
        raise EngineError(
            Code.NotARetryableWriteCommand,
            "txnNumber may only be provided for multi-document transactions and retryable "
            f"write commands. autocommit:false was not provided, and {name} is not a "
            "retryable write command.",
        )


def _check_write_concern(name: str, cmd: Doc, *, in_transaction: bool) -> None:
    """Refuse a write concern this one-node replica set cannot honour, as mongod does:
    acknowledging ``w: 5`` would tell the client its write replicated when it did not."""
    wc = cmd.get("writeConcern")
    if wc is None:
        return
    if not isinstance(wc, dict):
        raise type_mismatch("writeConcern must be an object")
    if in_transaction and name not in ("commitTransaction", "abortTransaction"):
        raise EngineError(
            Code.InvalidOptions,
            f"Cannot set write concern after starting a transaction ({name} is part of one)",
        )
    w = wc.get("w")
    if w is None or (isinstance(w, int | float) and not isinstance(w, bool) and 0 <= w <= 1):
        return
    if isinstance(w, int | float) and not isinstance(w, bool) and w > 1:
        raise EngineError(
            Code.UnsatisfiableWriteConcern,
            f"Not enough data-bearing nodes: w {w:g} asked, this replica set has 1 member",
        )
    if isinstance(w, str) and w != "majority":
        raise EngineError(
            Code.UnknownReplWriteConcern,
            f"No write concern mode named {w[:100]!r} found in replica set configuration",
        )
    if not isinstance(w, str):
        raise EngineError(Code.FailedToParse, f"w has to be a number or a string, got {w!r:.100}")


def _read_concern(cmd: Doc) -> Doc:
    rc = cmd.get("readConcern")
    if rc is None:
        return {}
    if not isinstance(rc, dict):
        raise type_mismatch("readConcern must be an object")
    level = rc.get("level")
    if level is not None and level not in (
        "local",
        "majority",
        "linearizable",
        "available",
        "snapshot",
    ):
        raise EngineError(
            Code.FailedToParse,
            f"readConcern level {level!r} is not one of local, majority, linearizable, available, snapshot",
        )
    for name in ("afterClusterTime", "atClusterTime"):
        if name in rc and not isinstance(rc[name], Timestamp):
            raise type_mismatch(f"readConcern.{name} must be a timestamp")
    return rc
