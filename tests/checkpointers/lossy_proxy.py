"""A TCP proxy in front of a MongoDB server that loses the reply of chosen commands.

Test code (no fake in accord). Between pymongo and the server, it forwards every message
both ways, except that for the first N commands named ``drop`` (e.g.
``commitTransaction``) it forwards the command to the server, waits for the server's
reply, and then closes the client's connection instead of forwarding the reply: the
server did the work, the client saw a network error (pymongo then reports
``UnknownTransactionCommitResult`` and retries the commit). That is MongoDB's
``closeConnection`` fail point, done on the wire so it works against any server.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

import bson

OP_MSG = 2013


def _read(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _read_message(sock: socket.socket) -> bytes:
    header = _read(sock, 16)
    (length,) = struct.unpack("<i", header[:4])
    return header + _read(sock, length - 16)


def _command_name(message: bytes) -> str | None:
    """The command name of an OP_MSG (its body section's first key)."""
    (opcode,) = struct.unpack("<i", message[12:16])
    if opcode != OP_MSG:
        return None
    pos = 20  # header (16) + flag bits (4)
    while pos < len(message):
        kind = message[pos]
        pos += 1
        (size,) = struct.unpack("<i", message[pos : pos + 4])
        if kind == 0:
            doc = bson.decode(message[pos : pos + size])
            return next(iter(doc), None)
        pos += size
    return None


class LossyProxy:
    """``LossyProxy(server_port, drop="commitTransaction", times=1).start()`` -> port."""

    def __init__(self, server_port: int, *, drop: str, times: int = 1) -> None:
        self.server_port = server_port
        self.drop = drop
        self.remaining = times
        self.dropped = 0
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._closed = False

    def start(self) -> LossyProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _take(self, name: str | None) -> bool:
        with self._lock:
            if name == self.drop and self.remaining > 0:
                self.remaining -= 1
                self.dropped += 1
                return True
            return False

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(("127.0.0.1", self.server_port))
        except OSError:  # the server is gone (a client's monitor outlived the test)
            _close(client)
            return
        doomed: set[int] = set()  # request ids whose reply is lost

        def upstream() -> None:
            try:
                while True:
                    message = _read_message(client)
                    if self._take(_command_name(message)):
                        (request_id,) = struct.unpack("<i", message[4:8])
                        doomed.add(request_id)
                    server.sendall(message)
            except (ConnectionError, OSError):
                pass
            finally:
                _close(client, server)

        threading.Thread(target=upstream, daemon=True).start()
        try:
            while True:
                reply = _read_message(server)
                (response_to,) = struct.unpack("<i", reply[8:12])
                if response_to in doomed:
                    return  # the server did it; the client never hears back
                client.sendall(reply)
        except (ConnectionError, OSError):
            return
        finally:
            _close(client, server)


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def uri_through(proxy: LossyProxy) -> str:
    """A URI to the server through the proxy (direct connection: the proxy is not the
    replica-set member the server names)."""
    return f"mongodb://127.0.0.1:{proxy.port}/?directConnection=true"
