"""MongoDB wire protocol framing: OP_MSG, legacy OP_QUERY/OP_REPLY.

Only parsing and encoding live here; what a command means is decided in ``commands``.
Every parse error raises ``ProtocolError`` so the server can answer it (or close the
connection) without ever letting a malformed message take the process down.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.codec_options import CodecOptions

OP_REPLY = 1
OP_QUERY = 2004
OP_COMPRESSED = 2012
OP_MSG = 2013

HEADER = struct.Struct("<iiii")
MAX_MESSAGE_SIZE = 48_000_000
MAX_BSON_SIZE = 16 * 1024 * 1024

FLAG_CHECKSUM = 1 << 0
FLAG_MORE_TO_COME = 1 << 1
FLAG_EXHAUST_ALLOWED = 1 << 16
_KNOWN_FLAGS = FLAG_CHECKSUM | FLAG_MORE_TO_COME | FLAG_EXHAUST_ALLOWED

# Decode to plain dicts (insertion-ordered) with naive UTC datetimes, as mongod compares them.
CODEC = CodecOptions(document_class=dict, tz_aware=False)


class ProtocolError(Exception):
    """The bytes on the wire are not a valid message."""


@dataclass
class Request:
    """One decoded client message."""

    request_id: int
    op_code: int
    command: dict[str, Any]
    more_to_come: bool = False
    # OP_QUERY only: the full collection name the legacy query targeted.
    legacy_namespace: str | None = None
    sequences: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def parse_header(data: bytes) -> tuple[int, int, int, int]:
    length, request_id, response_to, op_code = HEADER.unpack(data)
    if length < HEADER.size + 5 or length > MAX_MESSAGE_SIZE:
        raise ProtocolError(f"message length {length} is outside [21, {MAX_MESSAGE_SIZE}]")
    return length, request_id, response_to, op_code


def _decode_doc(buf: bytes | memoryview, offset: int) -> tuple[dict[str, Any], int]:
    if offset + 5 > len(buf):
        raise ProtocolError("truncated BSON document")
    (size,) = struct.unpack_from("<i", buf, offset)
    if size < 5 or offset + size > len(buf):
        raise ProtocolError(f"invalid BSON document size {size}")
    try:
        doc = bson.decode(bytes(buf[offset : offset + size]), CODEC)
    except Exception as exc:  # bson raises several types for corrupt input
        raise ProtocolError(f"invalid BSON: {exc}") from exc
    return doc, offset + size


def _cstring(buf: bytes | memoryview, offset: int) -> tuple[str, int]:
    end = bytes(buf[offset:]).find(b"\x00")
    if end < 0:
        raise ProtocolError("unterminated C string")
    try:
        return bytes(buf[offset : offset + end]).decode("utf-8"), offset + end + 1
    except UnicodeDecodeError as exc:
        raise ProtocolError("C string is not valid UTF-8") from exc


def parse_message(request_id: int, op_code: int, body: bytes) -> Request:
    """Parse the bytes after the 16-byte header."""
    if op_code == OP_MSG:
        return _parse_op_msg(request_id, body)
    if op_code == OP_QUERY:
        return _parse_op_query(request_id, body)
    if op_code == OP_COMPRESSED:
        raise ProtocolError("OP_COMPRESSED is not supported: the server advertises no compressors")
    raise ProtocolError(f"unsupported opCode {op_code}")


def _parse_op_msg(request_id: int, body: bytes) -> Request:
    if len(body) < 5:
        raise ProtocolError("OP_MSG too short")
    (flags,) = struct.unpack_from("<I", body, 0)
    if flags & 0xFFFF & ~_KNOWN_FLAGS:
        # Unknown required bits (0-15) must make the server reject the message.
        raise ProtocolError(f"unsupported OP_MSG flag bits {flags:#x}")
    end = len(body)
    if flags & FLAG_CHECKSUM:
        if end < 9:
            raise ProtocolError("OP_MSG checksum flag set but message too short")
        end -= 4  # the CRC-32C trailer; a local TCP peer's bytes are not re-verified
    view = memoryview(body)[:end]
    offset = 4
    command: dict[str, Any] | None = None
    sequences: dict[str, list[dict[str, Any]]] = {}
    while offset < end:
        kind = view[offset]
        offset += 1
        if kind == 0:
            if command is not None:
                raise ProtocolError("OP_MSG has more than one body section")
            command, offset = _decode_doc(view, offset)
        elif kind == 1:
            if offset + 4 > end:
                raise ProtocolError("truncated document sequence")
            (size,) = struct.unpack_from("<i", view, offset)
            seq_end = offset + size
            if size < 5 or seq_end > end:
                raise ProtocolError(f"invalid document sequence size {size}")
            ident, pos = _cstring(view[:seq_end], offset + 4)
            docs: list[dict[str, Any]] = []
            while pos < seq_end:
                doc, pos = _decode_doc(view[:seq_end], pos)
                docs.append(doc)
            if ident in sequences:
                raise ProtocolError(f"duplicate document sequence {ident!r}")
            sequences[ident] = docs
            offset = seq_end
        else:
            raise ProtocolError(f"unknown OP_MSG section kind {kind}")
    if command is None:
        raise ProtocolError("OP_MSG has no body section")
    for ident, docs in sequences.items():
        if ident in command:
            raise ProtocolError(f"field {ident!r} is both in the body and a document sequence")
        command[ident] = docs
    return Request(
        request_id=request_id,
        op_code=OP_MSG,
        command=command,
        more_to_come=bool(flags & FLAG_MORE_TO_COME),
        sequences=sequences,
    )


def _parse_op_query(request_id: int, body: bytes) -> Request:
    if len(body) < 4:
        raise ProtocolError("OP_QUERY too short")
    namespace, offset = _cstring(body, 4)
    if offset + 8 > len(body):
        raise ProtocolError("OP_QUERY truncated")
    offset += 8  # numberToSkip, numberToReturn
    query, offset = _decode_doc(body, offset)
    if not namespace.endswith(".$cmd"):
        raise ProtocolError("legacy OP_QUERY is only supported for commands on DB.$cmd")
    if "$query" in query:  # the legacy wrapped form {$query: cmd, $readPreference: ...}
        query = query["$query"]
        if not isinstance(query, dict):
            raise ProtocolError("$query must be an object")
    command = dict(query)
    command.setdefault("$db", namespace[: -len(".$cmd")])
    return Request(
        request_id=request_id, op_code=OP_QUERY, command=command, legacy_namespace=namespace
    )


_next_id = 0


def _request_id() -> int:
    global _next_id
    _next_id = (_next_id + 1) & 0x7FFFFFFF
    return _next_id


def encode_reply(request: Request, reply: dict[str, Any]) -> bytes:
    """Encode a command reply in the format the request came in."""
    payload = bson.encode(reply, codec_options=CODEC)
    if request.op_code == OP_QUERY:
        body = struct.pack("<iqii", 0, 0, 0, 1) + payload
        op = OP_REPLY
    else:
        body = struct.pack("<I", 0) + b"\x00" + payload
        op = OP_MSG
    return HEADER.pack(HEADER.size + len(body), _request_id(), request.request_id, op) + body
