"""The engine's connections: one event loop reads every socket, writes run on it.

A thread per connection cost more than the commands it ran: each message woke a thread,
which then waited for the interpreter lock held by another connection's thread, and on
the virtual machines this runs on a wake-up also finds the processor's caches cold. One
loop thread (``accord-engine``) instead waits on all sockets at once (a selector), reads
what arrived and frames the messages:

- A write (``INLINE_COMMANDS``) runs on the loop: its commit is installed under the
  engine lock and queued, and once everything that arrived in a round is queued the loop
  writes it (``GroupCommitter.write_queued``): the commits of many connections share one
  SQLite transaction and one fsync, and what arrives during that fsync waits in the kernel
  and forms the next group. Writing on the loop saves the hand-overs to and from a writer
  thread (a wake-up, and the interpreter lock passed back and forth), which cost more
  than the parallelism they bought: 13-25% more commits/s at 4 clients and a third more
  at 16, with the latency of reads alongside unchanged (docs/benchmarks.md). The loop
  writes only what is quick, though: a large group, or any group on a disk whose recent
  writes were slow, goes to the group committer's writer thread, so a slow disk does not
  keep the loop from the other connections' reads. Whichever thread finalizes a commit
  sends its reply.
- Every other command (reads, DDL, anything that may wait: an awaitable ``hello``, a
  change stream's ``getMore``, a command while a fail point is armed) runs on the
  connection's own worker thread, started on first need, so a long query never holds the
  loop up; it is parsed there too.

A connection runs one request at a time: its next message is framed only once the reply
to the one before has left, so replies go out in request order (a pipelining client
waits) and a client that does not read its replies holds at most one of them here.
Sockets are non-blocking; what the kernel does not take at once is sent by the loop.
Malformed input gets an error reply when the request id is known, otherwise the
connection is closed; the server never goes down for a client's bytes.
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import logging
import queue
import selectors
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Any

from accord.platform.embedded import wire, writes_first
from accord.platform.embedded.dispatch import HELLO_COMMANDS, Connection, PendingReply, WouldWait
from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.failpoints import CloseConnection

if TYPE_CHECKING:
    from accord.platform.embedded.server import EmbeddedServer

log = logging.getLogger("accord.engine")

# Commands the loop runs itself: writes (their cost is under the engine lock whichever
# thread runs them, and their commits are what a round groups) and trivial ones.
INLINE_COMMANDS = frozenset(
    {"insert", "update", "delete", "findAndModify", "findandmodify",
     "commitTransaction", "abortTransaction", "ping", *HELLO_COMMANDS}
)  # fmt: skip
# The writes among them: while one runs, long reads step aside (``writes_first``).
WRITES_FIRST = INLINE_COMMANDS - {"ping", *HELLO_COMMANDS}
# An idle connection (between messages) is closed after this long.
READ_TIMEOUT_S = 3600.0
RECV_CHUNK = 1 << 16
# How often the loop looks for connections past their timeouts.
EXPIRY_INTERVAL_S = 0.5

_INT32 = struct.Struct("<i")


def command_name(op_code: int, body: bytes) -> str | None:
    """The command an OP_MSG names (its body section's first key) without decoding it;
    None when the message is not laid out as drivers send it (it is then parsed, and any
    error reported, on a worker)."""
    # flags (4 bytes), section kind 0 (1), document size (4), element type (1), name.
    if op_code != wire.OP_MSG or len(body) < 11 or body[4] != 0:
        return None
    end = body.find(b"\x00", 10, 10 + 64)
    if end < 0:
        return None
    try:
        return body[10:end].decode("ascii")
    except UnicodeDecodeError:
        return None


class _Conn:
    """One client connection. ``lock`` guards ``busy``, ``out`` and ``closed``, which
    other threads (a worker, whichever thread finalizes a commit) change."""

    def __init__(self, sock: socket.socket, cid: int, local: bool = True) -> None:
        self.sock = sock
        self.fileno = sock.fileno()
        self.conn = Connection(id=cid, local=local)
        self.lock = threading.Lock()
        # Bytes read and not yet framed (loop thread only).
        self.inbox = bytearray()
        # A request is running, or its reply is due.
        self.busy = False
        # Reply bytes the socket has not taken yet.
        self.out = bytearray()
        self.closed = False
        # The client closed its side: what it sent is still answered, then it is closed.
        self.eof = False
        self.worker: _Worker | None = None
        # The selector events it is registered for (loop thread only; 0: not registered).
        self.events = 0
        # When the incomplete message at the head of ``inbox`` began (loop thread only).
        self.message_started: float | None = None
        self.last_active = time.monotonic()
        # Its current request is a write that long reads step aside for (``writes_first``).
        self.write_first = False

    def end_write_first(self) -> None:
        """Its write is answered, dropped or handed to its worker (``lock`` held)."""
        if self.write_first:
            self.write_first = False
            writes_first.ended()


class _Worker:
    """A connection's thread for the commands the loop does not run."""

    def __init__(self, loop: EventLoop, conn: _Conn) -> None:
        self.loop, self.conn = loop, conn
        self.jobs: queue.SimpleQueue[tuple[int, int, bytes] | wire.Request | None] = (
            queue.SimpleQueue()
        )
        self.thread = threading.Thread(
            target=self._run, name=f"accord-engine-conn-{conn.conn.id}", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            try:
                if isinstance(job, wire.Request):
                    self.loop.execute(self.conn, job, on_loop=False)
                else:
                    request = self.loop.parse(self.conn, *job)
                    if request is not None:
                        self.loop.execute(self.conn, request, on_loop=False)
            except Exception:  # a bug must cost this connection, never the server
                log.exception("a command failed outside its error handling")
                self.loop.drop(self.conn)


class EventLoop:
    """The loop over the listening socket and every connection (``run``, one thread)."""

    def __init__(self, server: EmbeddedServer, listener: socket.socket) -> None:
        self.server = server
        self.listener = listener
        listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.selector.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
        # (connection, "serve" | "write" | "close") to do once this round's events are.
        self._posted: collections.deque[tuple[_Conn, str]] = collections.deque()
        self.conns: dict[int, _Conn] = {}
        self._scratch = bytearray(RECV_CHUNK)
        self._thread_id: int | None = None
        self._stop = False
        self._next_expiry = 0.0

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until ``stop``; then stop listening (connections stay open until
        ``close_connections``: replies still due at shutdown are sent)."""
        self._thread_id = threading.get_ident()
        committer = self.server.committer
        try:
            while not self._stop:
                # Work posted by this thread's own writes (a pipelined message whose turn
                # came) is not signalled by the wake socket: look again at once.
                timeout = 0 if self._posted else EXPIRY_INTERVAL_S
                for key, mask in self.selector.select(timeout):
                    data = key.data
                    if data is None:
                        self._accept()
                    elif data is self._wake_r:
                        self._take_posted()
                    else:
                        self._ready(data, mask)
                # What this round's replies made ready to run (never recursively: a
                # pipelining client's messages would nest one call per message).
                while self._posted:
                    conn, what = self._posted.popleft()
                    self._do(conn, what)
                # Everything this round queued goes to disk in one group, written here
                # when that is quick, else by the writer thread (``write_queued``).
                committer.write_queued()
                now = time.monotonic()
                if now >= self._next_expiry:
                    self._next_expiry = now + EXPIRY_INTERVAL_S
                    self._expire(now)
        finally:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(self.listener)
            self.listener.close()

    def _ready(self, conn: _Conn, mask: int) -> None:
        try:
            if mask & selectors.EVENT_WRITE:
                self._write(conn)
            if mask & selectors.EVENT_READ:
                self._read(conn)
        except Exception:  # a bug must cost this connection, never the loop
            log.exception("connection %d failed outside its error handling", conn.conn.id)
            self._close(conn)

    def stop(self) -> None:
        """Have ``run`` return (from any thread)."""
        self._stop = True
        self._wake()

    def close_connections(self) -> None:
        """Close every connection and the loop's own sockets (after ``run`` returned)."""
        for conn in list(self.conns.values()):
            self._close(conn)
        self.listener.close()  # again, if ``run`` never ran
        self.selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"\x00")

    def _post(self, conn: _Conn, what: str) -> None:
        self._posted.append((conn, what))
        if threading.get_ident() != self._thread_id:
            self._wake()

    def _take_posted(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while self._wake_r.recv(4096):
                pass
        while self._posted:
            conn, what = self._posted.popleft()
            self._do(conn, what)

    def _do(self, conn: _Conn, what: str) -> None:
        if self.conns.get(conn.fileno) is not conn:
            return  # closed meanwhile
        try:
            if what == "write":
                self._write(conn)
            elif what == "serve":
                self._serve(conn)
                self._update_events(conn)
            elif what == "close":
                self._close(conn)
        except Exception:  # a bug must cost this connection, never the loop
            log.exception("connection %d failed outside its error handling", conn.conn.id)
            self._close(conn)

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of descriptors: refuse this one, go on
                log.warning("accepting a connection failed: %s", exc)
                return
            # Over the connection cap the connection is closed at once, as mongod does.
            if not self.server.admit_connection(address):
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, next(self.server.connection_ids), _is_loopback(address))
            self.conns[conn.fileno] = conn
            self._update_events(conn)

    def _update_events(self, conn: _Conn) -> None:
        """Register ``conn`` for what it waits for: reading while it has room for a
        message more (a pipelining client is not buffered without bound), writing while
        a reply is not all sent."""
        if conn.closed:
            return
        room = not conn.eof and len(conn.inbox) < wire.MAX_MESSAGE_SIZE
        events = selectors.EVENT_READ if room else 0
        if conn.out:
            events |= selectors.EVENT_WRITE
        if events == conn.events:
            return
        if conn.events == 0:
            self.selector.register(conn.sock, events, conn)
        elif events == 0:
            self.selector.unregister(conn.sock)
        else:
            self.selector.modify(conn.sock, events, conn)
        conn.events = events

    def _read(self, conn: _Conn) -> None:
        try:
            got = conn.sock.recv_into(self._scratch)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not got:
            conn.eof = True
            self._serve(conn)
            self._update_events(conn)
            return
        conn.last_active = time.monotonic()
        conn.inbox += memoryview(self._scratch)[:got]
        self._serve(conn)
        self._update_events(conn)

    def _serve(self, conn: _Conn) -> None:
        """Frame and start the next message of ``conn`` if it is free to run one."""
        with conn.lock:
            if conn.busy or conn.out or conn.closed:
                return  # the one finishing the current request asks again
        inbox = conn.inbox
        if conn.eof and (len(inbox) < wire.HEADER.size or len(inbox) < _length(inbox)):
            self._close(conn)  # all it sent is answered; the rest cannot complete
            return
        if len(inbox) < wire.HEADER.size:
            if inbox and conn.message_started is None:
                conn.message_started = time.monotonic()
            return
        try:
            length, request_id, _, op_code = wire.parse_header(bytes(inbox[: wire.HEADER.size]))
        except wire.ProtocolError:
            self._close(conn)  # cannot even frame the message: drop the connection
            return
        if len(inbox) < length:
            if conn.message_started is None:
                conn.message_started = time.monotonic()
            return
        body = bytes(inbox[wire.HEADER.size : length])
        del inbox[:length]
        conn.message_started = None
        with conn.lock:
            conn.busy = True
        name = command_name(op_code, body)
        if name in INLINE_COMMANDS and not self.server.failpoints_armed():
            if name in WRITES_FIRST:
                with conn.lock:
                    conn.write_first = True
                writes_first.started()
            request = self.parse(conn, request_id, op_code, body)
            if request is None:
                return
            if name in HELLO_COMMANDS and "maxAwaitTimeMS" in request.command:
                self._worker(conn).jobs.put(request)  # it waits: not on the loop
                return
            try:
                self.execute(conn, request, on_loop=True)
            except Exception:
                log.exception("a command failed outside its error handling")
                self._close(conn)
            return
        self._worker(conn).jobs.put((request_id, op_code, body))

    def _worker(self, conn: _Conn) -> _Worker:
        if conn.worker is None:
            conn.worker = _Worker(self, conn)
        return conn.worker

    def _write(self, conn: _Conn) -> None:
        """Send what the socket did not take before; once all is out, serve on."""
        with conn.lock:
            if conn.closed:
                return
            try:
                sent = conn.sock.send(conn.out) if conn.out else 0
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                sent = -1
            if sent > 0:
                del conn.out[:sent]
            pending = bool(conn.out)
        if sent < 0:
            self._close(conn)
            return
        if not pending:
            self._serve(conn)
        self._update_events(conn)

    def _expire(self, now: float) -> None:
        timeout = self.server.message_timeout
        for conn in list(self.conns.values()):
            if conn.busy or conn.out:
                continue  # its bytes wait for this engine, not for the client
            started = conn.message_started
            if started is not None and now - started > timeout:
                log.info("connection %d: a message did not arrive whole in time", conn.conn.id)
                self._close(conn)
            elif now - conn.last_active > READ_TIMEOUT_S:
                self._close(conn)

    def _close(self, conn: _Conn) -> None:
        """Close ``conn`` (loop thread, or after the loop ended)."""
        if self.conns.get(conn.fileno) is not conn:
            return
        del self.conns[conn.fileno]
        if conn.events:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.selector.unregister(conn.sock)
            conn.events = 0
        with conn.lock:
            conn.end_write_first()
            # Under the lock: no thread writes to a descriptor that may be reused.
            conn.closed = True
            conn.sock.close()
        if conn.worker is not None:
            conn.worker.jobs.put(None)
        self.server.release_connection()

    # -- requests (loop or worker thread) ---------------------------------------------------

    def parse(self, conn: _Conn, request_id: int, op_code: int, body: bytes) -> wire.Request | None:
        """The request in ``body``; None when it was malformed (answered, or the
        connection dropped)."""
        try:
            return wire.parse_message(request_id, op_code, body)
        except wire.ProtocolError as exc:
            if op_code in (wire.OP_MSG, wire.OP_QUERY):
                fake = wire.Request(request_id=request_id, op_code=op_code, command={})
                error = EngineError(Code.FailedToParse, f"invalid message: {exc}")
                self.reply(conn, wire.encode_reply(fake, error.to_reply()))
            else:
                self.drop(conn)
            return None

    def execute(self, conn: _Conn, request: wire.Request, *, on_loop: bool) -> None:
        """Run ``request`` and send its reply (for a write, once its commit is durable:
        queued on the loop, written by this thread on a worker)."""
        try:
            outcome = self.server.begin(request, conn.conn, may_wait=not on_loop)
        except CloseConnection:
            self.drop(conn)  # a fail point: the client sees the connection drop, no reply
            return
        except WouldWait:  # nothing of it was applied: it waits on its worker instead
            with conn.lock:
                conn.end_write_first()  # a wait of unknown length: reads go on meanwhile
            self._worker(conn).jobs.put(request)
            return
        if isinstance(outcome, PendingReply):
            pending = outcome

            def send() -> None:
                try:
                    reply = pending.result()
                except CloseConnection:
                    self.drop(conn)
                    return
                self.reply(conn, None if request.more_to_come else _encode_reply(request, reply))

            if not self.server.committer.on_durable(pending.ticket, send, write=not on_loop):
                send()
            return
        # An unacknowledged write (``more_to_come``): the client expects no reply.
        self.reply(conn, None if request.more_to_come else _encode_reply(request, outcome))

    def reply(self, conn: _Conn, data: bytes | None) -> None:
        """End ``conn``'s current request, sending ``data`` (None: no reply), and let its
        next message run. Never blocks: what the socket does not take, the loop sends."""
        with conn.lock:
            conn.busy = False
            conn.end_write_first()
            if conn.closed:
                return
            if data:
                if not conn.out:
                    try:
                        sent = conn.sock.send(data, socket.MSG_DONTWAIT)
                    except (BlockingIOError, InterruptedError):
                        sent = 0
                    except OSError:  # the client is gone: the loop sees that too
                        return
                    data = data[sent:]
                conn.out += data
            writing = bool(conn.out)
            # Read after ``busy`` is cleared: a message the loop buffered while it was set
            # is then seen here, or the loop saw ``busy`` cleared and serves it itself.
            waiting = bool(conn.inbox) or conn.eof
        if writing:
            self._post(conn, "write")
        elif waiting:
            self._post(conn, "serve")

    def drop(self, conn: _Conn) -> None:
        """Close ``conn`` from any thread (the loop does the closing)."""
        with conn.lock:
            conn.busy = False
            conn.end_write_first()
            if not conn.closed:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)
        self._post(conn, "close")


def _is_loopback(address: Any) -> bool:
    """Whether a peer address is the loopback interface (the localhost exception)."""
    try:
        return ipaddress.ip_address(str(address[0]).split("%", 1)[0]).is_loopback
    except (ValueError, IndexError, TypeError):
        return False


def _length(inbox: bytearray) -> int:
    """The length the message at the head of ``inbox`` declares (header present)."""
    return int(_INT32.unpack_from(inbox, 0)[0])


def _encode_reply(request: wire.Request, reply: dict[str, Any]) -> bytes:
    try:
        return wire.encode_reply(request, reply)
    except Exception as exc:  # e.g. a reply over the BSON size limit
        error = EngineError(Code.BSONObjectTooLarge, f"reply could not be encoded: {exc}")
        return wire.encode_reply(request, error.to_reply())
