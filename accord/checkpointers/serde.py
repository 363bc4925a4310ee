"""Serialization helpers: payload chunking and the message-channel encoding.

Values are serialized with the saver's pluggable serde (LangGraph's ``JsonPlusSerializer``
by default, ``EncryptedSerializer`` supported). The helpers here only decide how the
resulting ``(type, bytes)`` is laid out in documents.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from accord.errors import AccordError

_PLAIN = JsonPlusSerializer()


class CorruptStateError(AccordError):
    """Stored checkpoint data is incomplete (e.g. a chunk is missing)."""


def split_payload(type_: str, data: bytes, chunk_size: int) -> list[dict[str, Any]]:
    """Lay ``(type, data)`` out as one or more chunk fragments.

    Every fragment has ``chunk`` (0-based) and ``chunks`` (total) and a ``data`` slice;
    only fragment 0 needs ``type`` but all carry it so any fragment identifies the value.
    """
    if len(data) <= chunk_size:
        return [{"chunk": 0, "chunks": 1, "type": type_, "data": data}]
    parts = [data[i : i + chunk_size] for i in range(0, len(data), chunk_size)]
    return [
        {"chunk": i, "chunks": len(parts), "type": type_, "data": p} for i, p in enumerate(parts)
    ]


def join_payload(fragments: Iterable[Mapping[str, Any]], what: str) -> tuple[str, bytes]:
    """Inverse of :func:`split_payload` for the fragments of one value (any order)."""
    frags = sorted(fragments, key=lambda d: d["chunk"])
    if not frags:
        raise CorruptStateError(f"{what}: no data stored")
    expected = frags[0]["chunks"]
    if len(frags) != expected or [f["chunk"] for f in frags] != list(range(expected)):
        raise CorruptStateError(f"{what}: {len(frags)} of {expected} chunks present")
    if expected == 1:
        return frags[0]["type"], bytes(frags[0]["data"] or b"")
    return frags[0]["type"], b"".join(bytes(f["data"]) for f in frags)


def is_message_list(value: Any) -> bool:
    """Whether a channel value can be stored as references to per-message documents."""
    return isinstance(value, list) and all(
        isinstance(m, BaseMessage) and isinstance(m.id, str) and m.id for m in value
    )


def message_revision(message: BaseMessage) -> str:
    """Content hash of one message revision (the same id edited gets a new revision).

    Computed over LangGraph's plain msgpack encoding, never over ciphertext, so the same
    message deduplicates under ``EncryptedSerializer`` too.
    """
    _, data = _PLAIN.dumps_typed(message)
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class RevisionCache:
    """Message object -> revision, so a long conversation is not re-hashed every step.

    LangGraph's ``add_messages`` keeps the same message objects from step to step; only
    new or replaced objects are hashed. Entries are keyed by object identity, guarded by
    a weak reference and by the identity of ``id``/``content`` (state must not be mutated
    in place, as LangGraph requires).
    """

    def __init__(self, size: int = 200_000) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, tuple[weakref.ref[BaseMessage], Any, Any, str]] = (
            OrderedDict()
        )

    def remember(self, message: Any, revision: str) -> None:
        """Record the revision of a message the saver just deserialized (it knows it)."""
        if not isinstance(message, BaseMessage):
            return
        with self._lock:
            self._entries[id(message)] = (
                weakref.ref(message),
                message.id,
                message.content,
                revision,
            )
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    def revision(self, message: BaseMessage) -> str:
        k = id(message)
        with self._lock:
            hit = self._entries.get(k)
        if (
            hit is not None
            and hit[0]() is message
            and hit[1] is message.id
            and hit[2] is message.content
        ):
            return hit[3]
        rev = message_revision(message)
        with self._lock:
            self._entries[k] = (weakref.ref(message), message.id, message.content, rev)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return rev


def message_summary(message: BaseMessage, serde: SerializerProtocol) -> dict[str, Any]:
    """Plain fields for the memory aggregator; omitted when values are encrypted."""
    out: dict[str, Any] = {"role": message.type}
    if not isinstance(serde, EncryptedSerializer) and not _is_wrapped_encrypted(serde):
        text = message.text if isinstance(message.text, str) else str(message.text)
        out["text"] = text[:100_000]
    return out


def _is_wrapped_encrypted(serde: SerializerProtocol) -> bool:
    # maybe_add_typed_methods may wrap the serde; look one level inside.
    inner = getattr(serde, "serde", None)
    return isinstance(inner, EncryptedSerializer)
