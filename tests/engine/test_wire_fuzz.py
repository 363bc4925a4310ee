"""Wire-protocol robustness: malformed, truncated and oversized messages on raw sockets.

Every case is sent on its own TCP connection, followed by a half-close (``SHUT_WR``). The
server must then either answer with well-formed messages or close the connection, within a
few seconds: never hang with the connection open, never die. Afterwards pymongo must still
be served. The server address comes from ``client.address``, so the file also runs against
a real MongoDB (``MONGODB_URI``).
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import bson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient

OP_REPLY, OP_UPDATE, OP_INSERT, OP_QUERY, OP_GET_MORE, OP_DELETE, OP_KILL_CURSORS = (
    1,
    2001,
    2002,
    2004,
    2005,
    2006,
    2007,
)
OP_COMPRESSED, OP_MSG = 2012, 2013
FUZZ_DB = "t_fuzz_wire"
TIMEOUT_S = 5.0


# -- framing helpers ------------------------------------------------------------------------


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def header(length: int, op_code: int, request_id: int = 1, response_to: int = 0) -> bytes:
    return struct.pack("<iiii", length, request_id, response_to, op_code)


def frame(op_code: int, body: bytes, request_id: int = 1) -> bytes:
    return header(16 + len(body), op_code, request_id) + body


def op_msg(
    command: dict | bytes,
    *,
    flags: int = 0,
    sequences: dict[str, list[dict]] | None = None,
    checksum: bool = False,
    request_id: int = 1,
) -> bytes:
    doc = command if isinstance(command, bytes) else bson.encode(command)
    body = struct.pack("<I", flags | (1 if checksum else 0)) + b"\x00" + doc
    for ident, docs in (sequences or {}).items():
        payload = ident.encode() + b"\x00" + b"".join(bson.encode(d) for d in docs)
        body += b"\x01" + struct.pack("<i", 4 + len(payload)) + payload
    if not checksum:
        return frame(OP_MSG, body, request_id)
    message = header(16 + len(body) + 4, OP_MSG, request_id) + body
    return message + struct.pack("<I", crc32c(message))


def op_query(namespace: bytes, query: bytes | dict, skip: int = 0, n_return: int = -1) -> bytes:
    doc = query if isinstance(query, bytes) else bson.encode(query)
    body = struct.pack("<i", 0) + namespace + struct.pack("<ii", skip, n_return) + doc
    return frame(OP_QUERY, body)


@dataclass
class Outcome:
    replies: list[dict]  # decoded reply documents
    closed: bool  # the server closed the connection (or reset it)


def parse_replies(data: bytes) -> list[dict]:
    """Decode the server's messages; anything it sends must be well formed."""
    out = []
    pos = 0
    while pos < len(data):
        assert len(data) - pos >= 16, f"truncated reply header: {data[pos:]!r}"
        length, _, _, op_code = struct.unpack_from("<iiii", data, pos)
        assert 16 < length <= len(data) - pos, f"bad reply length {length}"
        body = data[pos + 16 : pos + length]
        if op_code == OP_MSG:
            (flags,) = struct.unpack_from("<I", body, 0)
            end = len(body) - (4 if flags & 1 else 0)
            assert body[4] == 0, "reply must start with a body section"
            out.append(bson.decode(body[5:end]))
        else:
            assert op_code == OP_REPLY, f"unexpected reply opCode {op_code}"
            (n_returned,) = struct.unpack_from("<i", body, 16)
            docs = bson.decode_all(body[20:])
            assert len(docs) == n_returned
            out.extend(docs)
        pos += length
    return out


def exchange(address: tuple[str, int], payload: bytes, timeout: float = TIMEOUT_S) -> Outcome:
    """Send ``payload``, half-close, and read until the server closes the connection."""
    sock = socket.create_connection(address, timeout=timeout)
    sock.settimeout(timeout)
    chunks: list[bytes] = []
    closed = False
    try:
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # EPIPE, ECONNRESET, ENOTCONN: the server already hung up
            closed = True
        deadline = time.monotonic() + timeout
        while not closed:
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                closed = True
                break
            except TimeoutError:
                break
            if not chunk:
                closed = True
                break
            chunks.append(chunk)
            if time.monotonic() > deadline:
                break
    finally:
        sock.close()
    data = b"".join(chunks)
    assert closed, (
        f"server neither answered-and-closed nor closed within {timeout}s ({len(data)} bytes read)"
    )
    return Outcome(replies=parse_replies(data) if data else [], closed=closed)


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def address(client: MongoClient) -> Iterator[tuple[str, int]]:
    client.admin.command("ping")
    addr = client.address
    assert addr is not None
    yield addr
    client.drop_database(FUZZ_DB)


def assert_serving(client: MongoClient) -> None:
    assert client.admin.command("ping")["ok"] == 1.0
    coll = client[FUZZ_DB]["after"]
    marker = random.random()
    coll.insert_one({"marker": marker})
    assert coll.find_one({"marker": marker}, {"_id": 0}) == {"marker": marker}


# -- positive framing checks ----------------------------------------------------------------


def test_op_query_handshake(address) -> None:
    out = exchange(address, op_query(b"admin.$cmd\x00", {"isMaster": 1}))
    (reply,) = out.replies
    assert reply["ok"] == 1.0
    assert reply["ismaster"] is True
    assert reply["maxWireVersion"] == 25


def test_op_msg_document_sequence_with_checksum(address, client: MongoClient) -> None:
    msg = op_msg(
        {"insert": "seq", "$db": FUZZ_DB},
        sequences={"documents": [{"_id": 1, "v": "a"}, {"_id": 2, "v": "b"}]},
        checksum=True,
    )
    (reply,) = exchange(address, msg).replies
    assert reply["ok"] == 1.0 and reply["n"] == 2
    assert sorted(d["_id"] for d in client[FUZZ_DB]["seq"].find()) == [1, 2]


def test_pipelined_messages_on_one_connection(address) -> None:
    ping = op_msg({"ping": 1, "$db": "admin"}, request_id=7)
    out = exchange(address, ping + ping + ping)
    assert [r["ok"] for r in out.replies] == [1.0, 1.0, 1.0]


def test_error_reply_keeps_the_connection_usable(address) -> None:
    ping = op_msg({"ping": 1, "$db": "admin"})
    out = exchange(address, ping + op_msg({"noSuchCommand": 1, "$db": "admin"}) + ping)
    assert out.replies[0]["ok"] == 1.0
    assert out.replies[1]["ok"] == 0.0 and out.replies[1]["code"] == 59
    assert out.replies[2]["ok"] == 1.0


def test_more_to_come_gets_no_reply(address) -> None:
    out = exchange(
        address, op_msg({"ping": 1, "$db": "admin"}, flags=2) + op_msg({"ping": 1, "$db": "admin"})
    )
    assert [r["ok"] for r in out.replies] == [1.0]


# -- deterministic malformed corpus ----------------------------------------------------------


def malformed_corpus(seed: int = 1234) -> list[bytes]:
    rng = random.Random(seed)
    good_cmd = bson.encode({"ping": 1, "$db": "admin"})
    good_msg_body = struct.pack("<I", 0) + b"\x00" + good_cmd
    cases: list[bytes] = []

    # Random bytes of all small lengths, and a few bigger blobs.
    for n in range(0, 64):
        cases.append(rng.randbytes(n))
    for _ in range(400):
        cases.append(rng.randbytes(rng.randint(16, 400)))

    # Valid-looking headers with bad lengths.
    for length in (-1, -(2**31), 0, 1, 15, 16, 17, 20, 21, 2**31 - 1, 48_000_001, 100_000_000):
        cases.append(header(length, OP_MSG) + good_msg_body)
        cases.append(header(length, OP_QUERY) + rng.randbytes(30))
    # Declared length larger than what is sent (truncated), or smaller than the message.
    for cut in (1, 5, 10, len(good_msg_body) - 1):
        cases.append(header(16 + len(good_msg_body), OP_MSG) + good_msg_body[:cut])
    cases.append(header(16 + 10_000_000, OP_MSG) + good_msg_body)  # huge declared, tiny sent
    cases.append(header(16 + 8, OP_MSG) + good_msg_body)  # declared too small

    # Wrong / legacy / unknown opcodes with plausible bodies.
    for op in (
        0,
        -1,
        OP_REPLY,
        OP_UPDATE,
        OP_INSERT,
        OP_GET_MORE,
        OP_DELETE,
        OP_KILL_CURSORS,
        2010,
        2011,
        OP_COMPRESSED,
        2014,
        9999,
        2**31 - 1,
    ):
        cases.append(frame(op, good_msg_body))
        cases.append(frame(op, rng.randbytes(rng.randint(5, 100))))
    cases.append(frame(OP_COMPRESSED, struct.pack("<iiB", OP_MSG, 100, 1) + rng.randbytes(40)))

    # OP_MSG structure errors.
    for flags in (1 << 2, 1 << 3, 1 << 15, 0xFFFF, 0xFFFFFFFF):
        cases.append(frame(OP_MSG, struct.pack("<I", flags) + b"\x00" + good_cmd))
    for kind in (2, 3, 7, 0x80, 0xFF):
        cases.append(frame(OP_MSG, struct.pack("<I", 0) + bytes([kind]) + good_cmd))
    cases.append(frame(OP_MSG, struct.pack("<I", 0)))  # no sections
    cases.append(frame(OP_MSG, struct.pack("<I", 0) + b"\x00"))  # kind without document
    cases.append(frame(OP_MSG, good_msg_body + b"\x00" + good_cmd))  # two body sections
    cases.append(frame(OP_MSG, struct.pack("<I", 1) + b"\x00" + good_cmd[:5]))  # checksum, short
    cases.append(
        frame(OP_MSG, struct.pack("<I", 1) + b"\x00" + good_cmd + b"\x00\x00\x00\x00")
    )  # bad crc
    seq_only = (
        struct.pack("<I", 0)
        + b"\x01"
        + struct.pack("<i", 20)
        + b"documents\x00"
        + bson.encode({"a": 1})[:7]
    )
    cases.append(frame(OP_MSG, seq_only))
    for size in (-5, 0, 3, 4, 5, 10_000):
        seq = b"\x01" + struct.pack("<i", size) + b"documents\x00" + bson.encode({"a": 1})
        cases.append(frame(OP_MSG, good_msg_body + seq))
    cases.append(
        frame(OP_MSG, good_msg_body + b"\x01" + struct.pack("<i", 30) + b"x" * 26)
    )  # no NUL
    dup = b"\x01" + struct.pack("<i", 4 + 10 + 5) + b"documents\x00" + bson.encode({})
    cases.append(
        frame(
            OP_MSG,
            struct.pack("<I", 0)
            + b"\x00"
            + bson.encode({"insert": "c", "$db": FUZZ_DB})
            + dup
            + dup,
        )
    )
    both = b"\x01" + struct.pack("<i", 4 + 10 + 5) + b"documents\x00" + bson.encode({})
    cases.append(
        frame(
            OP_MSG,
            struct.pack("<I", 0)
            + b"\x00"
            + bson.encode({"insert": "c", "documents": [], "$db": FUZZ_DB})
            + both,
        )
    )

    # Invalid BSON inside a well-framed OP_MSG.
    bad_docs = [
        b"\x05\x00\x00\x00",  # too short
        b"\x04\x00\x00\x00\x00",  # size below minimum
        b"\xff\xff\xff\x7f\x00",  # size far beyond the message
        b"\x05\x00\x00\x00\x01",  # missing terminator
        b"\x0c\x00\x00\x00\x99a\x00\x01\x00\x00\x00\x00",  # unknown element type
        b"\x0d\x00\x00\x00\x02a\x00\x05\x00\x00\x00ab\x00",  # string length past end
        b"\x0e\x00\x00\x00\x02a\x00\x02\x00\x00\x00\xff\x00\x00",  # invalid UTF-8
        b"\x0c\x00\x00\x00\x02a\x00\xf0\xff\xff\xff\x00",  # negative string length
        b"\x10\x00\x00\x00\x03a\x00\x20\x00\x00\x00\x00\x00\x00\x00",  # subdoc too long
        b"\x0b\x00\x00\x00\x08a\x00\x07\x00\x00",  # bad boolean
    ]
    for doc in bad_docs:
        cases.append(frame(OP_MSG, struct.pack("<I", 0) + b"\x00" + doc))
        cases.append(op_query(b"admin.$cmd\x00", doc))
    for _ in range(500):  # bit-flipped valid commands
        raw = bytearray(bson.encode({"find": "c", "filter": {"a": {"$gt": 1}}, "$db": FUZZ_DB}))
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        cases.append(frame(OP_MSG, struct.pack("<I", 0) + b"\x00" + bytes(raw)))

    # Semantically bad commands in valid frames.
    semantic = [
        {},
        {"$db": "admin"},
        {"ping": 1},  # no $db
        {"ping": 1, "$db": 5},
        {"ping": 1, "$db": ""},
        {"ping": 1, "$db": "bad.name"},
        {"find": 5, "$db": FUZZ_DB},
        {"find": "", "$db": FUZZ_DB},
        {"find": "c", "filter": 5, "$db": FUZZ_DB},
        {"find": "c", "filter": {"$where": "1"}, "$db": FUZZ_DB},
        {"find": "c", "sort": {"a": "sideways"}, "$db": FUZZ_DB},
        {"find": "c", "limit": "ten", "$db": FUZZ_DB},
        {"find": "c", "batchSize": -5, "$db": FUZZ_DB},
        {"insert": "c", "documents": 5, "$db": FUZZ_DB},
        {"insert": "c", "documents": [5, "x"], "$db": FUZZ_DB},
        {"insert": "c", "$db": FUZZ_DB},
        {"update": "c", "updates": [{"q": 1}], "$db": FUZZ_DB},
        {"update": "c", "updates": [{"q": {}, "u": 7}], "$db": FUZZ_DB},
        {"delete": "c", "deletes": [{"q": {}, "limit": 5}], "$db": FUZZ_DB},
        {"aggregate": "c", "pipeline": "nope", "cursor": {}, "$db": FUZZ_DB},
        {"aggregate": "c", "pipeline": [{"$group": 5}], "cursor": {}, "$db": FUZZ_DB},
        {"aggregate": "c", "pipeline": [{"$a": 1, "$b": 2}], "cursor": {}, "$db": FUZZ_DB},
        {"getMore": "x", "collection": "c", "$db": FUZZ_DB},
        {"getMore": bson.Int64(2**62), "collection": "c", "$db": FUZZ_DB},
        {"killCursors": "c", "cursors": "all", "$db": FUZZ_DB},
        {"createIndexes": "c", "indexes": [{"key": {}}], "$db": FUZZ_DB},
        {"createIndexes": "c", "indexes": [{"key": {"a": "bogus"}, "name": "x"}], "$db": FUZZ_DB},
        {"find": "c", "lsid": 5, "$db": FUZZ_DB},
        {"find": "c", "lsid": {"id": "not-a-uuid"}, "$db": FUZZ_DB},
        {
            "find": "c",
            "lsid": {"id": bson.Binary(b"\x00" * 16, 4)},
            "txnNumber": "one",
            "$db": FUZZ_DB,
        },
        {
            "insert": "c",
            "documents": [{}],
            "lsid": {"id": bson.Binary(b"\x01" * 16, 4)},
            "txnNumber": bson.Int64(1),
            "autocommit": True,
            "$db": FUZZ_DB,
        },
        {
            "commitTransaction": 1,
            "lsid": {"id": bson.Binary(b"\x02" * 16, 4)},
            "txnNumber": bson.Int64(5),
            "autocommit": False,
            "$db": "admin",
        },
        {"abortTransaction": 1, "$db": "admin"},
        {"bulkWrite": 1, "ops": "x", "nsInfo": [], "$db": "admin"},
        {
            "bulkWrite": 1,
            "ops": [{"insert": 9, "document": {}}],
            "nsInfo": [{"ns": "nodot"}],
            "$db": "admin",
        },
        {"hello": 1, "maxAwaitTimeMS": "soon", "topologyVersion": 5, "$db": "admin"},
    ]
    for cmd in semantic:
        cases.append(op_msg(cmd))
    # Deeply nested documents.
    nested: dict = {"x": 1}
    for _ in range(500):
        nested = {"a": nested}
    cases.append(op_msg({"find": "c", "filter": nested, "$db": FUZZ_DB}))
    cases.append(op_msg({"insert": "c", "documents": [nested], "$db": FUZZ_DB}))
    deep_array: list = [1]
    for _ in range(500):
        deep_array = [deep_array]
    cases.append(op_msg({"insert": "c", "documents": [{"a": deep_array}], "$db": FUZZ_DB}))

    # OP_QUERY garbage.
    cases.append(frame(OP_QUERY, struct.pack("<i", 0) + b"admin.$cmd"))  # unterminated namespace
    cases.append(
        frame(OP_QUERY, struct.pack("<i", 0) + b"admin.$cmd\x00" + b"\x00\x00")
    )  # truncated
    cases.append(op_query(b"\xff\xfe.$cmd\x00", {"isMaster": 1}))  # invalid UTF-8 namespace
    cases.append(op_query(b"test.coll\x00", {"a": 1}))  # legacy find
    cases.append(op_query(b"\x00", {"isMaster": 1}))
    cases.append(op_query(b"admin.$cmd\x00", {"$query": 5}))
    cases.append(op_query(b"admin.$cmd\x00", {"$query": {}}))
    cases.append(op_query(b"admin.$cmd\x00", {"isMaster": 1}, skip=-5, n_return=2**31 - 1))
    cases.append(op_query(b"admin.$cmd\x00", {"noSuchCommand": 1}))
    for _ in range(100):
        body = struct.pack("<i", rng.randint(-(2**31), 2**31 - 1)) + rng.randbytes(
            rng.randint(0, 60)
        )
        cases.append(frame(OP_QUERY, body))

    # Many short partial headers.
    for n in range(1, 16):
        cases.append(header(100, OP_MSG)[:n])
    return cases


def test_malformed_corpus(address, client: MongoClient) -> None:
    cases = malformed_corpus()
    assert len(cases) > 1_000
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(lambda payload: exchange(address, payload), cases))
    for outcome in outcomes:
        for reply in outcome.replies:
            assert "ok" in reply
    assert_serving(client)
    assert time.monotonic() - started < 45


def test_oversized_messages(address, client: MongoClient) -> None:
    big_value = "x" * (17 * 1024 * 1024)
    # A command body over the 16 MB BSON limit.
    exchange(
        address,
        op_msg({"insert": "big", "documents": [{"v": big_value}], "$db": FUZZ_DB}),
        timeout=20,
    )
    # A document in a sequence over the limit.
    exchange(
        address,
        op_msg({"insert": "big", "$db": FUZZ_DB}, sequences={"documents": [{"v": big_value}]}),
        timeout=20,
    )
    # 20 MB of random bytes with a matching declared length.
    body = random.Random(5).randbytes(20 * 1024 * 1024)
    exchange(address, frame(OP_MSG, body), timeout=20)
    # More than the 48 MB message limit.
    out = exchange(address, header(48_000_000 + 100, OP_MSG) + b"\x00" * 1024, timeout=20)
    assert out.closed
    assert client[FUZZ_DB]["big"].count_documents({}) == 0
    assert_serving(client)


def test_reply_to_well_formed_garbage_commands_under_concurrency(
    address, client: MongoClient
) -> None:
    """Garbage on many connections at once while pymongo keeps working."""
    rng = random.Random(99)
    cases = [
        frame(OP_MSG, struct.pack("<I", 0) + b"\x00" + rng.randbytes(rng.randint(5, 64)))
        for _ in range(300)
    ]
    with ThreadPoolExecutor(max_workers=16) as pool:
        futures = [pool.submit(exchange, address, c) for c in cases]
        for i in range(50):
            client[FUZZ_DB]["live"].insert_one({"i": i})
        for f in futures:
            f.result()
    assert client[FUZZ_DB]["live"].count_documents({}) == 50
    assert_serving(client)


# -- hypothesis ---------------------------------------------------------------------------------

FUZZ_SETTINGS = settings(
    max_examples=250,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@FUZZ_SETTINGS
@given(
    op_code=st.sampled_from([OP_MSG, OP_QUERY, OP_COMPRESSED, OP_INSERT, 0, 2015]),
    body=st.binary(max_size=512),
    length_delta=st.sampled_from([0, 0, 0, -1, 1, -7, 64]),
)
def test_hypothesis_raw_frames(address, op_code: int, body: bytes, length_delta: int) -> None:
    exchange(address, header(16 + len(body) + length_delta, op_code) + body)


bson_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**31), max_value=2**31 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
keys = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=8)
bson_values = st.recursive(
    bson_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)
SAFE_COMMANDS = [
    "find", "insert", "update", "delete", "aggregate", "count", "distinct", "getMore",
    "killCursors", "findAndModify", "listCollections", "listIndexes", "create",
    "createIndexes", "ping", "hello", "isMaster", "buildInfo", "endSessions", "collMod",
    "bulkWrite", "commitTransaction", "abortTransaction",
]  # fmt: skip


@st.composite
def commands(draw) -> dict:
    name = draw(st.sampled_from(SAFE_COMMANDS) | keys.map(lambda s: "zzFuzz" + s))
    doc = {name: draw(bson_values)}
    doc.update(
        draw(
            st.dictionaries(
                st.sampled_from(
                    [
                        "filter",
                        "documents",
                        "updates",
                        "deletes",
                        "pipeline",
                        "cursor",
                        "query",
                        "update",
                        "key",
                        "indexes",
                        "sort",
                        "projection",
                        "limit",
                        "batchSize",
                        "ops",
                        "nsInfo",
                        "lsid",
                        "txnNumber",
                        "autocommit",
                        "startTransaction",
                    ]
                ),
                bson_values,
                max_size=4,
            )
        )
    )
    doc["$db"] = draw(st.sampled_from([FUZZ_DB, FUZZ_DB, FUZZ_DB, "", "bad.db", "x$y"]))
    return doc


@FUZZ_SETTINGS
@given(command=commands())
def test_hypothesis_commands_get_a_reply(address, command: dict) -> None:
    out = exchange(address, op_msg(command))
    # A well-formed OP_MSG command always gets exactly one reply document with ``ok``.
    assert len(out.replies) == 1, command
    assert out.replies[0]["ok"] in (0.0, 1.0)
    if out.replies[0]["ok"] == 0.0:
        assert isinstance(out.replies[0].get("code"), int)


@FUZZ_SETTINGS
@given(command=commands(), data=st.data())
def test_hypothesis_corrupted_commands(address, command: dict, data) -> None:
    raw = bytearray(op_msg(command))
    for _ in range(data.draw(st.integers(1, 5))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    exchange(address, bytes(raw))


def test_server_still_serves_pymongo_after_fuzzing(address, client: MongoClient) -> None:
    assert_serving(client)
    other = MongoClient(client.address[0], client.address[1], directConnection=True)
    try:
        assert other.admin.command("ping")["ok"] == 1.0
        other[FUZZ_DB]["after"].insert_one({"fresh": True})
        assert other[FUZZ_DB]["after"].count_documents({"fresh": True}) >= 1
    finally:
        other.close()
