"""The embedded engine's network server: a threaded MongoDB wire-protocol listener.

One thread per connection reads a message, has the dispatcher execute it and writes the
reply; a write's reply is sent by the thread that makes its commit durable and visible
(``_Replies``, group_commit.py), while the connection's thread reads on. Malformed input
gets an error reply when the request id is known, otherwise the connection is closed; the
server itself never goes down for a client's bytes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import itertools
import logging
import os
import socket
import socketserver
import struct
import threading
import time
from pathlib import Path
from typing import Any

import bson

from accord.errors import DataDirLockedError, EngineStartError
from accord.platform.embedded import vector_search, wire
from accord.platform.embedded.commands import MAX_WIRE_VERSION
from accord.platform.embedded.discovery import LOCK_FILE, REPLICA_SET
from accord.platform.embedded.dispatch import Connection, Dispatcher, PendingReply
from accord.platform.embedded.engine import HISTORY_WINDOW_S, SESSION_TIMEOUT_MINUTES, Engine
from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.failpoints import CloseConnection
from accord.platform.embedded.group_commit import GroupCommitter
from accord.platform.embedded.storage import COMPACT_ROWS
from accord.platform.embedded.ttl import expire_once

log = logging.getLogger("accord.engine")

# An idle connection (between messages) is closed after this long.
READ_TIMEOUT_S = 3600.0
# A message must arrive whole within this long of its header: a client that declares a
# large message and sends it slowly is disconnected instead of holding its buffer.
MESSAGE_TIMEOUT_S = 30.0
# mongod's net.maxIncomingConnections; each connection is a thread and its buffers.
MAX_CONNECTIONS = 1000
# A shutdown slower than this logs where its time went.
SLOW_SHUTDOWN_S = 2.0


class _Handler(socketserver.BaseRequestHandler):
    server: _TCPServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # A blocking socket whose idle bound is the kernel's: with a Python-level timeout
        # every recv and send would first poll(), a second system call each time.
        _set_kernel_timeouts(sock, READ_TIMEOUT_S)
        owner = self.server.owner
        conn = Connection(id=next(owner.connection_ids))
        reader = _MessageReader(sock)
        replies = _Replies(sock)
        try:
            while not owner.stopping.is_set():
                header = reader.take(wire.HEADER.size)
                if header is None:
                    return
                try:
                    length, request_id, _, op_code = wire.parse_header(header)
                except wire.ProtocolError:
                    return  # cannot even frame the message: drop the connection
                deadline = time.monotonic() + owner.message_timeout
                body = reader.take(length - wire.HEADER.size, deadline)
                if body is None:
                    return
                # Replies go out in request order: a client that sent this before the
                # last reply (pipelining) waits for it first.
                replies.wait_idle()
                try:
                    request = wire.parse_message(request_id, op_code, body)
                except wire.ProtocolError as exc:
                    if op_code in (wire.OP_MSG, wire.OP_QUERY):
                        fake = wire.Request(request_id=request_id, op_code=op_code, command={})
                        error = EngineError(Code.FailedToParse, f"invalid message: {exc}")
                        replies.send(wire.encode_reply(fake, error.to_reply()))
                        continue
                    return
                try:
                    outcome = owner.begin(request, conn)
                    if isinstance(outcome, PendingReply):
                        if not request.more_to_come:
                            # Sent by whichever thread finalizes the commit (this one
                            # when no write was in progress), so this thread reads on.
                            replies.defer(request, outcome, owner.committer)
                            continue
                        outcome.wait()
                        continue
                    reply = outcome
                except CloseConnection:
                    return  # a fail point: the client sees the connection drop, no reply
                if request.more_to_come:
                    continue  # unacknowledged write: the client expects no reply
                replies.send(_encode_reply(request, reply))
        except (ConnectionError, TimeoutError, OSError):
            return
        finally:
            # The socket is closed once this returns: a reply still due must be sent (or
            # given up) first, never written to whatever reuses the descriptor.
            replies.close()

    def finish(self) -> None:
        self.server.owner.release_connection()


def _encode_reply(request: wire.Request, reply: dict[str, Any]) -> bytes:
    try:
        return wire.encode_reply(request, reply)
    except Exception as exc:  # e.g. a reply over the BSON size limit
        error = EngineError(Code.BSONObjectTooLarge, f"reply could not be encoded: {exc}")
        return wire.encode_reply(request, error.to_reply())


class _Replies:
    """A connection's replies. A deferred one (at most one at a time) is sent by whichever
    thread finalizes its commit (``defer``); that thread never blocks on a client: what
    the socket does not take at once is sent by a thread of its own. Every send holds
    ``_lock``, so replies leave in order."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        # Set when no deferred reply is waiting for its commit.
        self.idle = threading.Event()
        self.idle.set()
        # Held while the socket is written; once ``_closed`` nothing is (the descriptor may
        # be closed and reused). A plain lock: the slow path's thread releases it.
        self._lock = threading.Lock()
        self._closed = False

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no deferred reply waits for its commit; False if ``timeout`` passed."""
        return self.idle.is_set() or self.idle.wait(timeout)

    def send(self, data: bytes) -> None:
        """Send a reply from the connection's thread, after any reply before it."""
        with self._lock:
            self.sock.sendall(data)

    def defer(
        self, request: wire.Request, pending: PendingReply, committer: GroupCommitter
    ) -> None:
        """Send ``pending``'s reply once its commit is done or failed."""
        self.idle.clear()

        def send() -> None:
            self._lock.acquire()
            rest = b""
            try:
                if self._closed:
                    return
                try:
                    data = _encode_reply(request, pending.result())
                except CloseConnection:
                    self._shutdown()
                    return
                # Before the send: the client's next message may arrive before this thread
                # runs again, and its reply queues behind this one on the lock anyway.
                self.idle.set()
                try:
                    sent = self.sock.send(data, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    sent = 0
                except OSError:  # the client is gone; its thread sees that too
                    return
                rest = data[sent:]
            finally:
                self.idle.set()
                if not rest:
                    self._lock.release()
            if not rest:
                return
            # The lock stays held: the rest goes first, then the next reply.
            threading.Thread(
                target=self._send_rest, args=(rest,), daemon=True, name="accord-engine-reply"
            ).start()

        if not committer.on_durable(pending.ticket, send):
            send()

    def _send_rest(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            self._shutdown()
        finally:
            self._lock.release()

    def close(self) -> None:
        """The connection's thread is done with the socket: wait for a reply still due
        (bounded; a client that does not read is cut off), then let nothing else write."""
        if not self.wait_idle(MESSAGE_TIMEOUT_S):
            self._shutdown()
        if not self._lock.acquire(timeout=MESSAGE_TIMEOUT_S):
            self._shutdown()  # a send blocked on a client that does not read returns
            self._lock.acquire()
        self._closed = True
        self._lock.release()

    def _shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


def _set_kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Bound each blocking ``recv``/``send`` of ``sock`` to ``seconds`` (SO_RCVTIMEO,
    SO_SNDTIMEO); one past it fails with an ``OSError`` (EAGAIN)."""
    whole = int(seconds)
    timeval = struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


class _MessageReader:
    """Bytes of one connection, read ahead: a message that arrives whole (the usual case:
    a driver writes each message at once) costs one ``recv``, and the socket's bound is
    changed only when a message is still incomplete after it. System calls were most of
    a small command's time: each one lets another thread take the interpreter lock, and
    the handover is a context switch."""

    CHUNK = 1 << 16

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.scratch = bytearray(self.CHUNK)

    def take(self, n: int, deadline: float | None = None) -> bytes | None:
        """The next ``n`` bytes (None if the peer closed first); raises TimeoutError
        past ``deadline``."""
        buffer = self.buffer
        if len(buffer) < n:
            try:
                while len(buffer) < n:
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise TimeoutError("the message did not arrive in time")
                        _set_kernel_timeouts(self.sock, max(min(left, READ_TIMEOUT_S), 0.001))
                    got = self.sock.recv_into(self.scratch)
                    if not got:
                        return None
                    buffer += memoryview(self.scratch)[:got]
            finally:
                if deadline is not None:
                    _set_kernel_timeouts(self.sock, READ_TIMEOUT_S)
        with memoryview(buffer) as view:
            data = bytes(view[:n])
        del buffer[:n]
        return data


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    owner: EmbeddedServer

    def verify_request(self, request: Any, client_address: Any) -> bool:
        # Over the connection cap the connection is closed at once, as mongod does.
        return self.owner.admit_connection(client_address)


class EmbeddedServer:
    """accord's embedded MongoDB-compatible server on one data directory.

    ``start()`` runs it in background threads of this process; ``serve_forever()`` in the
    foreground. Reports itself as the primary of a one-node replica set named ``accord``
    running MongoDB 8.0, so pymongo enables sessions, transactions, retryable writes and
    client-level ``bulk_write``.
    """

    def __init__(
        self,
        dbpath: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 27017,
        sync: bool = True,
        ttl_interval: float = 60.0,
        transaction_lifetime: float = 60.0,
        snapshot_history: float = HISTORY_WINDOW_S,
        repair: bool = False,
        enable_test_commands: bool = False,
        max_connections: int = MAX_CONNECTIONS,
        message_timeout: float = MESSAGE_TIMEOUT_S,
    ) -> None:
        self.dbpath = Path(dbpath)
        self.snapshot_history = snapshot_history
        self.repair = repair
        self._stop_lock = threading.Lock()
        self._closed = False
        self.host = host
        self.requested_port = port
        self.sync = sync
        self.ttl_interval = ttl_interval
        self.transaction_lifetime = transaction_lifetime
        self.enable_test_commands = enable_test_commands
        self.connection_ids = itertools.count(1)
        if max_connections < 1 or message_timeout <= 0:
            raise EngineStartError("max_connections and message_timeout must be positive")
        self.max_connections = max_connections
        self.message_timeout = message_timeout
        self._connections = 0
        self._connections_lock = threading.Lock()
        self.stopping = threading.Event()
        self.engine: Engine | None = None
        self.dispatcher: Dispatcher | None = None
        self._tcp: _TCPServer | None = None
        self._lock_fd: int | None = None
        self._threads: list[threading.Thread] = []
        self._serving = False
        self._process_id = bson.ObjectId()
        # The topology never changes: one process id, counter 0.
        self.topology_version = {"processId": self._process_id, "counter": bson.Int64(0)}

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._tcp is None:
            raise EngineStartError("the engine is not running")
        return int(self._tcp.server_address[1])

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def uri(self) -> str:
        return f"mongodb://{self.address}/?replicaSet={REPLICA_SET}"

    def _open(self) -> None:
        try:
            self.dbpath.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EngineStartError(
                f"cannot use {self.dbpath} as the data directory: {exc.strerror}"
            ) from exc
        self._lock_fd = os.open(self.dbpath / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise DataDirLockedError(
                f"{self.dbpath} is in use by another accord engine (lock file {LOCK_FILE}); "
                "stop it first or pick another --dbpath"
            ) from None
        # A clean shutdown empties the lock file; anything in it means the last one was not.
        unclean = bool(os.pread(self._lock_fd, 100, 0).strip())
        # Until this engine listens, the file names no pid and port (``read_lock`` takes
        # it for an engine starting): a previous engine's would send clients to its port,
        # and make a starter take this engine for another one. Not empty, so a crash
        # before the start completes still counts as unclean.
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"starting {os.getpid()}\n".encode(), 0)
        try:
            self.engine = Engine(
                self.dbpath, sync=self.sync, history_window=self.snapshot_history,
                expect_durable=unclean, repair=self.repair,
            )  # fmt: skip
        except BaseException:
            os.close(self._lock_fd)  # leave the lock file's content: still unclean
            self._lock_fd = None
            raise
        # Vector search matrices are built now, not on the first search after a start.
        vector_search.open_at_startup(self.engine)
        self.dispatcher = Dispatcher(
            self.engine,
            self.hello,
            txn_lifetime=self.transaction_lifetime,
            test_commands=self.enable_test_commands,
            topology_version=self.topology_version,
        )
        try:
            self._tcp = _TCPServer(
                (self.host, self.requested_port), _Handler, bind_and_activate=True
            )
        except OSError as exc:
            self.engine.close()
            self._release_lock()
            raise EngineStartError(
                f"cannot listen on {self.host}:{self.requested_port}: {exc}"
            ) from exc
        self._tcp.owner = self
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{os.getpid()} {self.port}\n".encode(), 0)
        housekeeping = threading.Thread(
            target=self._housekeeping, name="accord-engine-housekeeping", daemon=True
        )
        housekeeping.start()
        self._threads.append(housekeeping)

    def start(self) -> EmbeddedServer:
        """Start serving in background threads; returns once the port accepts connections."""
        self._open()
        assert self._tcp is not None
        t = threading.Thread(
            target=self._tcp.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="accord-engine",
            daemon=True,
        )
        self._serving = True
        t.start()
        self._threads.append(t)
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until ``stop()`` (or a signal) ends it."""
        self._open()
        assert self._tcp is not None
        self._serving = True
        try:
            self._tcp.serve_forever(poll_interval=0.2)
        finally:
            self._serving = False
            self._close()

    def stop(self) -> None:
        """Stop serving and close the store; safe to call from several threads at once
        (a signal handler and the main thread both do)."""
        self.stopping.set()
        with self._stop_lock:
            if self._closed:
                return
            if self._tcp is not None and self._serving:
                self._tcp.shutdown()  # returns once serve_forever's loop has ended
            self._close_locked()

    def _close(self) -> None:
        with self._stop_lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stopping.set()
        started = time.monotonic()
        if self._tcp is not None:
            self._tcp.server_close()
        for thread in self._threads:
            if thread is not threading.current_thread() and thread.name.endswith("housekeeping"):
                thread.join(timeout=5)
                if thread.is_alive():
                    log.warning("shutdown: the housekeeping thread is still busy after 5 s")
        joined = time.monotonic()
        if self.engine is not None:
            with self.engine.locked("shutdown"):
                self.engine.close()
        # A slow stop is reported with where its time went, before the lock is released
        # (``accord engine stop`` shows the end of this log when it gives up waiting).
        if time.monotonic() - started > SLOW_SHUTDOWN_S:
            log.warning(
                "shutdown took %.1f s: %.1f s for the housekeeping thread, %.1f s to make "
                "pending commits durable and close the store",
                time.monotonic() - started, joined - started, time.monotonic() - joined,
            )  # fmt: skip
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- requests ---------------------------------------------------------------------------

    def admit_connection(self, client_address: Any) -> bool:
        """Count a new connection in, or refuse it at ``max_connections``."""
        with self._connections_lock:
            if self._connections >= self.max_connections:
                log.warning(
                    "connection from %s refused: %d connections open (--max-conns)",
                    client_address, self._connections,
                )  # fmt: skip
                return False
            self._connections += 1
            return True

    def release_connection(self) -> None:
        with self._connections_lock:
            self._connections -= 1

    @property
    def open_connections(self) -> int:
        return self._connections

    def begin(
        self, request: wire.Request, conn: Connection | None = None
    ) -> dict[str, Any] | PendingReply:
        """Execute one request: its reply, or one that is ready once its commit is durable
        (``Dispatcher.start``); raises ``CloseConnection`` if a fail point says so."""
        assert self.dispatcher is not None
        return self.dispatcher.start(request.command, conn)

    @property
    def committer(self) -> GroupCommitter:
        assert self.engine is not None
        return self.engine.committer

    def hello(self, cmd: dict[str, Any]) -> dict[str, Any]:
        # Awaitable hello (streaming monitor): the topology never changes, so hold the
        # reply for maxAwaitTimeMS instead of answering at once (which makes pymongo spin).
        if "topologyVersion" in cmd and "maxAwaitTimeMS" in cmd:
            wait = cmd.get("maxAwaitTimeMS")
            if isinstance(wait, int) and wait > 0:
                self.stopping.wait(min(wait, 60_000) / 1000.0)
        name = next(iter(cmd), "hello")
        me = self.address
        reply: dict[str, Any] = {
            "isWritablePrimary": True, "topologyVersion": self.topology_version,
            "hosts": [me], "setName": REPLICA_SET, "setVersion": 1, "primary": me, "me": me,
            "electionId": bson.ObjectId("7fffffff0000000000000001"),
            "lastWrite": {"lastWriteDate": dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0)},
            "maxBsonObjectSize": wire.MAX_BSON_SIZE, "maxMessageSizeBytes": wire.MAX_MESSAGE_SIZE,
            "maxWriteBatchSize": 100_000, "localTime": dt.datetime.now(dt.UTC).replace(tzinfo=None),
            "logicalSessionTimeoutMinutes": SESSION_TIMEOUT_MINUTES, "connectionId": 1,
            "minWireVersion": 0, "maxWireVersion": MAX_WIRE_VERSION, "readOnly": False, "ok": 1.0,
        }  # fmt: skip
        if name != "hello":
            reply["ismaster"] = True
            del reply["isWritablePrimary"]
        if cmd.get("helloOk"):
            reply["helloOk"] = True
        return reply

    def _compact_journal(self, engine: Engine) -> None:
        """Move the commits journaled since the last pass into the storage's tables, a
        slice at a time with a pause between slices for waiting commits (bounded to a
        second, so a busy engine's journal never keeps this thread from its other work)."""
        deadline = time.monotonic() + 1.0
        while not self.stopping.is_set() and time.monotonic() < deadline:
            if engine.committer.compact() < COMPACT_ROWS:
                return
            time.sleep(0.001)

    def _housekeeping(self) -> None:
        """Once a second: expire transactions, sessions and cursors; collect garbage in
        passes of a few milliseconds while any is due; every ``ttl_interval`` a TTL pass.
        An idle engine does next to nothing here."""
        last_ttl = time.monotonic()
        while not self.stopping.wait(min(1.0, self.ttl_interval, self.transaction_lifetime / 2)):
            engine, dispatcher = self.engine, self.dispatcher
            assert engine is not None and dispatcher is not None
            try:
                dispatcher.reap()
                more = True
                while more and not self.stopping.is_set():
                    with engine.locked("gc"):
                        more = engine.collect_garbage()
                    time.sleep(0.001)  # let waiting commands in between passes
                engine.compact_heap()
                self._compact_journal(engine)
                engine.committer.checkpoint()
                if time.monotonic() - last_ttl >= self.ttl_interval:
                    last_ttl = time.monotonic()
                    expire_once(engine, stopping=self.stopping)
            except Exception:  # housekeeping must never take the server down
                log.exception("engine housekeeping failed")
