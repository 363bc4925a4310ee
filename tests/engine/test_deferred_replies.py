"""Write replies sent when their commit is durable, by whichever thread finalizes it.

The engine's event loop hands a write's reply to the group committer and goes back to
reading; whichever thread finalizes the commit sends it (netloop.py). These tests hold it to what a
client relies on: replies in request order on one connection, a client that does not read
holds up no one else's commits, and a client gone before its reply leaves the server well.
Raw sockets, addressed by ``client.address``, so the file also runs against MongoDB.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import bson
from pymongo import MongoClient

OP_MSG = 2013
TIMEOUT_S = 30.0


def op_msg(command: dict, request_id: int) -> bytes:
    body = struct.pack("<I", 0) + b"\x00" + bson.encode(command)
    return struct.pack("<iiii", 16 + len(body), request_id, 0, OP_MSG) + body


def read_reply(sock: socket.socket) -> tuple[int, dict]:
    """The next reply on ``sock``: (responseTo, document)."""

    def exactly(n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the server closed the connection"
            data += chunk
        return bytes(data)

    length, _, response_to, op_code = struct.unpack("<iiii", exactly(16))
    body = exactly(length - 16)
    assert op_code == OP_MSG and body[4] == 0
    return response_to, bson.decode(body[5:])


def connect(client: MongoClient, rcvbuf: int | None = None) -> socket.socket:
    host, port = client.address  # type: ignore[misc]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connecting, so the window is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(TIMEOUT_S)
    sock.connect((host, port))
    return sock


def test_pipelined_writes_are_answered_once_each_in_request_order(client: MongoClient, db) -> None:
    sock = connect(client)
    try:
        messages = b"".join(
            op_msg({"insert": "piped", "documents": [{"_id": i}], "$db": db.name}, i + 1)
            for i in range(40)
        )
        started = time.monotonic()
        sock.sendall(messages)  # all of them before reading any reply
        replies = [read_reply(sock) for _ in range(40)]
        elapsed = time.monotonic() - started
    finally:
        sock.close()
    assert [to for to, _ in replies] == list(range(1, 41))
    # Each message's turn comes as soon as the reply before it is out, not at the loop's
    # next timeout (an engine that waited for one took 18 s for these 40).
    assert elapsed < 5.0, f"40 pipelined writes took {elapsed:.1f} s"
    assert all(doc["ok"] == 1 and doc["n"] == 1 for _, doc in replies)
    assert sorted(d["_id"] for d in db.piped.find()) == list(range(40))


def test_clients_that_do_not_read_their_replies_hold_up_no_one(client: MongoClient, db) -> None:
    big = "x" * (4 << 20)
    db.big.insert_many([{"_id": k, "v": big} for k in range(4)])
    stop = threading.Event()
    done = [0] * 4

    def insert(k: int) -> None:  # other clients writing all along
        while not stop.is_set():
            db.others.insert_one({"k": k})
            done[k] += 1

    writers = [threading.Thread(target=insert, args=(k,)) for k in range(4)]
    for t in writers:
        t.start()
    slow = [connect(client, rcvbuf=4096) for _ in range(4)]
    try:
        for k, sock in enumerate(slow):
            # Its reply (a 4 MiB document) is far more than its socket takes at once, and
            # its commit is likely finalized by another client's thread or the writer's.
            sock.sendall(
                op_msg(
                    {
                        "findAndModify": "big",
                        "query": {"_id": k},
                        "update": {"$set": {"n": k}},
                        "new": True,
                        "$db": db.name,
                    },
                    k + 1,
                )  # fmt: skip
            )
            time.sleep(0.05)
        before = sum(done)
        time.sleep(1.0)
        stop.set()
        for t in writers:
            t.join(TIMEOUT_S)
        assert not any(t.is_alive() for t in writers), "writes waited for the slow readers"
        assert sum(done) > before, "no other write was acknowledged while replies were due"
        replies = [read_reply(sock) for sock in slow]  # reading at last, each arrives whole
    finally:
        stop.set()
        for sock in slow:
            sock.close()
    for k, (response_to, reply) in enumerate(replies):
        assert response_to == k + 1 and reply["ok"] == 1
        assert reply["value"]["n"] == k and len(reply["value"]["v"]) == len(big)
    assert db.others.count_documents({}) == sum(done)


def test_clients_gone_before_their_reply_leave_the_writes_and_the_server_well(
    client: MongoClient, db
) -> None:
    def write_and_vanish(k: int) -> None:
        sock = connect(client)
        sock.sendall(op_msg({"insert": "gone", "documents": [{"_id": k}], "$db": db.name}, 1))
        sock.close()  # before the reply

    threads = [threading.Thread(target=write_and_vanish, args=(k,)) for k in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # A received write is applied whether or not its client stays for the reply.
    deadline = time.monotonic() + TIMEOUT_S
    while db.gone.count_documents({}) < 50 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(d["_id"] for d in db.gone.find()) == list(range(50))
    db.gone.insert_one({"_id": "after"})
    assert db.gone.count_documents({}) == 51
