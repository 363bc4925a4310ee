"""The embedded engine's network server: its lifecycle, the data directory's lock, and
housekeeping. Connections are served by one event loop (netloop.py), which runs writes
itself and hands every other command to the connection's worker thread.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import itertools
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import bson

from accord.errors import DataDirLockedError, EngineStartError, PortInUseError
from accord.platform.embedded import discovery, vector_search, wire
from accord.platform.embedded.auth.catalog import AuthCatalog
from accord.platform.embedded.auth.checks import Authorizer
from accord.platform.embedded.commands import MAX_WIRE_VERSION
from accord.platform.embedded.discovery import DEFAULT_PORT, LOCK_FILE, REPLICA_SET
from accord.platform.embedded.dispatch import Connection, Dispatcher, PendingReply
from accord.platform.embedded.engine import HISTORY_WINDOW_S, SESSION_TIMEOUT_MINUTES, Engine
from accord.platform.embedded.group_commit import GroupCommitter
from accord.platform.embedded.netloop import EventLoop
from accord.platform.embedded.storage import COMPACT_ROWS
from accord.platform.embedded.ttl import expire_once

log = logging.getLogger("accord.engine")


# A message must arrive whole within this long of its header: a client that declares a
# large message and sends it slowly is disconnected instead of holding its buffer.
MESSAGE_TIMEOUT_S = 30.0
# mongod's net.maxIncomingConnections; each connection has its buffers (and, once it ran
# a command the loop does not run itself, a thread).
MAX_CONNECTIONS = 1000
# The most connections whatever the open-file limit: each may hold a thread (a stack, an
# entry against the user's process limit), and mongod's documented default was this.
CONNECTIONS_CEILING = 65_536
# The share of the open-file limit connections may take (mongod's rule on UNIX): the rest
# is the engine's own files (database, WAL, journal, lock, log, selector, wake-up pipe).
CONNECTIONS_SHARE_OF_FILES = 0.8
# A shutdown slower than this logs where its time went.
SLOW_SHUTDOWN_S = 2.0


def connection_limit() -> int:
    """The most connections the engine may be told to accept: 80% of this process's
    open-file limit (``ulimit -n``), at most :data:`CONNECTIONS_CEILING`. A cap above the
    file limit never acts: ``accept`` fails with EMFILE first, the pending connection
    keeps the loop waking, and the engine's own files can no longer be opened."""
    try:
        import resource
    except ImportError:  # not a Unix
        return CONNECTIONS_CEILING
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return CONNECTIONS_CEILING
    return max(1, min(CONNECTIONS_CEILING, int(soft * CONNECTIONS_SHARE_OF_FILES)))


def check_max_connections(value: int | None) -> int:
    """``value`` if it is from 1 to :func:`connection_limit`, else ValueError naming the
    range; None: :data:`MAX_CONNECTIONS`, or fewer when the open-file limit is lower
    (as mongod lowers its default)."""
    limit = connection_limit()
    if value is None:
        return min(MAX_CONNECTIONS, limit)
    if not 1 <= value <= limit:
        raise ValueError(
            f"must be from 1 to {limit} (80% of the open-file limit, ulimit -n, at most "
            f"{CONNECTIONS_CEILING}: each connection holds a socket and may hold a thread), "
            f"got {value}"
        )
    return value


# Longest the housekeeping thread puts off compacting the heap while reads are under way.
HEAP_COMPACTION_DELAY_S = 10.0


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
        port: int = DEFAULT_PORT,
        sync: bool = True,
        ttl_interval: float = 60.0,
        transaction_lifetime: float = 60.0,
        snapshot_history: float = HISTORY_WINDOW_S,
        repair: bool = False,
        enable_test_commands: bool = False,
        max_connections: int | None = None,
        message_timeout: float = MESSAGE_TIMEOUT_S,
        auth: bool = False,
        admin_user: tuple[str, str] | None = None,
    ) -> None:
        self.dbpath = Path(dbpath)
        if not 0 <= snapshot_history <= 86_400:  # (also NaN; inf made every snapshot read fail)
            raise ValueError(
                f"snapshot_history must be 0 to 86400 seconds, got {snapshot_history!r}"
            )
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
        # mongod's --auth: every command is checked against the user's privileges.
        self.auth = auth
        # (user, password) of a root user created at start when no user exists yet.
        if admin_user is not None and not (admin_user[0] and admin_user[1]):
            raise EngineStartError("the first admin user needs both a name and a password")
        self.admin_user = admin_user
        self.connection_ids = itertools.count(1)
        if message_timeout <= 0:
            raise EngineStartError("message_timeout must be positive")
        try:
            self.max_connections = check_max_connections(max_connections)
        except ValueError as exc:
            raise EngineStartError(f"max_connections {exc}") from None
        self.message_timeout = message_timeout
        self._connections = 0
        self._connections_lock = threading.Lock()
        self.stopping = threading.Event()
        self.engine: Engine | None = None
        self.dispatcher: Dispatcher | None = None
        self._listener: socket.socket | None = None
        self._port: int | None = None
        self._loop: EventLoop | None = None
        self._lock_fd: int | None = None
        self._threads: list[threading.Thread] = []
        self._serving = False
        self._loop_thread: threading.Thread | None = None
        self._process_id = bson.ObjectId()
        # The topology never changes: one process id, counter 0.
        self.topology_version = {"processId": self._process_id, "counter": bson.Int64(0)}

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise EngineStartError("the engine is not running")
        return self._port

    @property
    def bound_host(self) -> str:
        """The address the engine listens on, as the socket reports it."""
        if self._listener is None:
            raise EngineStartError("the engine is not running")
        return str(self._listener.getsockname()[0])

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
        previous = os.pread(self._lock_fd, 100, 0)
        unclean = bool(previous.strip())
        # Until this engine listens, the file names no pid and port (``read_lock`` takes
        # it for an engine starting): a previous engine's would send clients to its port,
        # and make a starter take this engine for another one. Not empty, so a crash
        # before the start completes still counts as unclean.
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"starting {os.getpid()}\n".encode(), 0)
        # The port before the data: a port in use is reported at once, not after loading
        # the data set (which can take seconds). Nobody connects before the lock file
        # names the port, below.
        try:
            self._listener = _listen(self.host, self.requested_port)
        except OSError as exc:
            # Nothing was opened: the lock file says again what it said (clean or not).
            os.ftruncate(self._lock_fd, 0)
            os.pwrite(self._lock_fd, previous, 0)
            os.close(self._lock_fd)
            self._lock_fd = None
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(
                    f"cannot listen on {self.host}:{self.requested_port}: address already in "
                    f"use (another accord engine, or a mongod?). Pick another --port, or "
                    f"--port 0 for any free one; `accord engine ls` lists running engines."
                ) from exc
            raise EngineStartError(
                f"cannot listen on {self.host}:{self.requested_port}: {exc.strerror or exc}"
            ) from exc
        try:
            self.engine = Engine(
                self.dbpath, sync=self.sync, history_window=self.snapshot_history,
                expect_durable=unclean, repair=self.repair,
            )  # fmt: skip
        except BaseException:
            self._listener.close()
            self._listener = None
            os.close(self._lock_fd)  # leave the lock file's content: still unclean
            self._lock_fd = None
            raise
        # Vector search matrices are built now, not on the first search after a start.
        vector_search.open_at_startup(self.engine)
        catalog = AuthCatalog()
        catalog.attach(self.engine)
        self.dispatcher = Dispatcher(
            self.engine,
            self.hello,
            txn_lifetime=self.transaction_lifetime,
            test_commands=self.enable_test_commands,
            topology_version=self.topology_version,
            authz=Authorizer(catalog, enforced=self.auth),
        )
        if self.admin_user is not None:
            try:
                self._create_first_admin(*self.admin_user)
            except BaseException:
                self._listener.close()
                self._listener = None
                self.engine.close()
                self._release_lock()
                raise
        # Kept: a command still running at shutdown (an awaitable hello) may ask for it
        # after the listening socket is closed.
        self._port = int(self._listener.getsockname()[1])
        self._loop = EventLoop(self, self._listener)
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{os.getpid()} {self.port}\n".encode(), 0)
        discovery.register(self.dbpath, host=self.host, port=self.port, pid=os.getpid())
        housekeeping = threading.Thread(
            target=self._housekeeping, name="accord-engine-housekeeping", daemon=True
        )
        housekeeping.start()
        self._threads.append(housekeeping)

    def _create_first_admin(self, user: str, password: str) -> None:
        """Create ``user`` with the ``root`` role on ``admin`` unless a user exists
        (ACCORD_ENGINE_ADMIN_USER / ..._PASSWORD, docs/engine.md)."""
        assert self.dispatcher is not None
        if self.dispatcher.authz.catalog.users:
            return
        conn = Connection(auth=self.dispatcher.authz.internal_session())
        reply = self.dispatcher.execute(
            {"createUser": user, "pwd": password, "roles": [{"role": "root", "db": "admin"}],
             "$db": "admin"},
            conn,
        )  # fmt: skip
        if not reply.get("ok"):
            raise EngineStartError(
                f"could not create the first admin user {user!r}: {reply.get('errmsg')}"
            )
        log.info("created the first admin user %s@admin (root)", user)

    def start(self) -> EmbeddedServer:
        """Start serving in background threads; returns once the port accepts connections."""
        self._open()
        assert self._loop is not None
        t = threading.Thread(target=self._loop.run, name="accord-engine", daemon=True)
        self._serving = True
        self._loop_thread = t
        t.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until ``stop()`` (or a signal) ends it."""
        self._open()
        assert self._loop is not None
        self._serving = True
        self._loop_thread = threading.current_thread()
        try:
            self._loop.run()
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
            if self._loop is not None and self._serving:
                self._loop.stop()
                thread = self._loop_thread
                if thread is not None and thread is not threading.current_thread():
                    thread.join()  # the loop ends within a round
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
        if self._loop is not None:
            self._loop.stop()
        for thread in self._threads:
            if thread is not threading.current_thread() and thread.name.endswith("housekeeping"):
                thread.join(timeout=5)
                if thread.is_alive():
                    log.warning("shutdown: the housekeeping thread is still busy after 5 s")
        joined = time.monotonic()
        if self.engine is not None:
            with self.engine.locked("shutdown"):
                self.engine.close()
        if self._loop is not None:
            # After the engine closed: replies to the commits it made durable are sent.
            self._loop.close_connections()
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
            if self._port is not None:
                discovery.unregister(self.dbpath, os.getpid())
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
        self, request: wire.Request, conn: Connection | None = None, *, may_wait: bool = True
    ) -> dict[str, Any] | PendingReply:
        """Execute one request: its reply, or one that is ready once its commit is durable
        (``Dispatcher.start``); raises ``CloseConnection`` if a fail point says so, and
        without ``may_wait`` ``WouldWait`` instead of waiting for a transaction."""
        assert self.dispatcher is not None
        return self.dispatcher.start(
            request.command, conn, may_wait=may_wait, sequences=request.sequences.keys()
        )

    def failpoints_armed(self) -> bool:
        """Whether a fail point may act on a command (the loop then runs none itself:
        one may block)."""
        assert self.dispatcher is not None
        return self.dispatcher.failpoints.armed

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
        last_ttl = last_heap = time.monotonic()
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
                # A full collection stops every thread for as long as it walks what was
                # allocated since the last one, which a heavy read makes large (60-80 ms
                # beside the memory searches at 100k memories, every second): put off
                # while reads are under way, for at most HEAP_COMPACTION_DELAY_S.
                now = time.monotonic()
                if now - last_heap >= HEAP_COMPACTION_DELAY_S or not engine.reads_in_flight():
                    last_heap = now
                    engine.compact_heap()
                self._compact_journal(engine)
                engine.committer.checkpoint()
                if time.monotonic() - last_ttl >= self.ttl_interval:
                    last_ttl = time.monotonic()
                    expire_once(engine, stopping=self.stopping)
            except Exception:  # housekeeping must never take the server down
                log.exception("engine housekeeping failed")


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 if ``host`` is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock
