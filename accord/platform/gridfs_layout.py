"""Artifacts by pointer: large outputs and files of a thread's steps, stored in GridFS's
layout and referenced from state by id and digest.

Two collections, in pymongo's ``gridfs`` layout for the bucket ``accord_artifacts`` (so
``gridfs.GridFSBucket(db, "accord_artifacts").open_download_stream(ref.id)`` reads an
artifact as well as accord does):

``accord_artifacts.files`` (artifact class ``artifact``)
    one document per artifact: GridFS's ``_id``, ``length``, ``chunkSize``,
    ``uploadDate``, ``filename``, ``metadata``, plus accord's ``tenant_id``,
    ``thread_id``, ``checkpoint_ns``, ``checkpoint_id`` / ``task_id`` (the step that
    stored it), ``sha256``, ``contentType`` and ``status``: ``pending`` until the
    transaction that records the storing task as finished commits the reference
    (``committed``).
``accord_artifacts.chunks`` (artifact class ``artifact_chunk``)
    GridFS's chunks (``files_id``, ``n``, ``data``), each also carrying ``tenant_id`` and
    ``thread_id``.

Pure builders and checks; the saver writes and reads them through the kernel.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from bson import Binary
from pymongo import ASCENDING, IndexModel

from accord.errors import ArtifactCorrupted, InvalidInputError
from accord.platform.artifacts import ARTIFACT, ARTIFACT_CHUNK
from accord.platform.text import surrogate_at

__all__ = [
    "BUCKET", "CHUNKS", "CHUNK_SIZE", "COMMITTED", "FILES", "PENDING", "ArtifactRef",
    "assemble", "chunk_docs", "copy_chunk_doc", "copy_files_doc", "copy_id", "files_doc",
    "new_id", "ref_of",
]  # fmt: skip

#: The GridFS bucket name: its collections are ``BUCKET.files`` and ``BUCKET.chunks``.
BUCKET = "accord_artifacts"
FILES = ARTIFACT.default_collection or f"{BUCKET}.files"
CHUNKS = ARTIFACT_CHUNK.default_collection or f"{BUCKET}.chunks"
#: GridFS's default chunk size (255 KiB).
CHUNK_SIZE = 255 * 1024
PENDING = "pending"
COMMITTED = "committed"
_ID = re.compile(r"^art_[0-9a-f]{32}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_MAX_TEXT = 200

INDEXES: dict[str, list[IndexModel]] = {
    FILES: [
        IndexModel([("filename", ASCENDING), ("uploadDate", ASCENDING)]),  # GridFS's own
        IndexModel([("tenant_id", ASCENDING), ("thread_id", ASCENDING)], name="tenant_thread"),
        IndexModel([("status", ASCENDING), ("uploadDate", ASCENDING)], name="status_date"),
        # a fork's copies, found by the id their state refers to
        IndexModel([("tenant_id", ASCENDING), ("alias_of", ASCENDING)], name="alias"),
    ],
    CHUNKS: [
        IndexModel([("files_id", ASCENDING), ("n", ASCENDING)], unique=True),  # GridFS's
        IndexModel([("tenant_id", ASCENDING), ("thread_id", ASCENDING)], name="tenant_thread"),
    ],
}


@dataclass(frozen=True)
class ArtifactRef:
    """What state keeps of an artifact: its ``id``, the SHA-256 ``digest`` of its bytes
    (hex), their ``length`` and ``content_type``. Put it in state as it is, or as
    :meth:`as_dict` (plain data any serializer stores)."""

    id: str
    digest: str
    length: int
    content_type: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def new_id() -> str:
    """A fresh artifact id (a string: state serializers store it as is)."""
    return "art_" + secrets.token_hex(16)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def data_of(value: Any) -> bytes:
    """``value`` as bytes (bytes, bytearray, memoryview), else ``InvalidInputError``."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise InvalidInputError(
        f"artifact data must be bytes (or bytearray / memoryview), got "
        f"{type(value).__name__}; encode text first (e.g. text.encode('utf-8'))."
    )


def text(value: Any, name: str, *, optional: bool = False) -> str | None:
    """A short label (content type, file name): a non-empty string of at most 200
    characters without NUL."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > _MAX_TEXT or "\x00" in value:
        raise InvalidInputError(
            f"{name} must be a non-empty string of at most {_MAX_TEXT} characters without "
            f"NUL, got {value!r:.80}"
        )
    at = surrogate_at(value)
    if at is not None:
        raise InvalidInputError(
            f"{name} holds a lone surrogate at character {at}; it must be valid "
            f"Unicode, got {value!r:.80}"
        )
    return value


def ref_of(value: Any) -> ArtifactRef:
    """An :class:`ArtifactRef` from itself or its :meth:`~ArtifactRef.as_dict` form."""
    if isinstance(value, ArtifactRef):
        fields: Mapping[str, Any] = value.as_dict()
    elif isinstance(value, Mapping):
        fields = value
    else:
        raise InvalidInputError(
            f"an artifact reference must be an ArtifactRef or its dict form, got "
            f"{type(value).__name__}"
        )
    art_id, dig = fields.get("id"), fields.get("digest")
    length, ctype = fields.get("length"), fields.get("content_type")
    # fullmatch: re's "$" also matches before a final newline ("art_<32 hex>\n")
    if not isinstance(art_id, str) or not _ID.fullmatch(art_id):
        raise InvalidInputError(f"artifact id must look like 'art_<32 hex>', got {art_id!r:.80}")
    if not isinstance(dig, str) or not _DIGEST.fullmatch(dig):
        raise InvalidInputError(f"artifact digest must be 64 hex characters, got {dig!r:.80}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise InvalidInputError(f"artifact length must be a non-negative int, got {length!r}")
    return ArtifactRef(art_id, dig, length, text(ctype, "content_type") or "")


def files_doc(
    ref: ArtifactRef,
    *,
    tenant_id: str,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str | None,
    task_id: str | None,
    status: str,
    filename: str | None,
    metadata: Mapping[str, Any] | None,
    at: datetime,
) -> dict[str, Any]:
    """The ``files`` document of an artifact."""
    return {
        "_id": ref.id,
        "length": ref.length,
        "chunkSize": CHUNK_SIZE,
        "uploadDate": at,
        "filename": filename or ref.id,
        "metadata": dict(metadata or {}),
        "contentType": ref.content_type,
        "sha256": ref.digest,
        "tenant_id": tenant_id,
        "thread_id": thread_id,
        "checkpoint_ns": checkpoint_ns,
        "checkpoint_id": checkpoint_id,
        "task_id": task_id,
        "status": status,
    }


def chunk_docs(
    artifact_id: str, data: bytes, *, tenant_id: str, thread_id: str
) -> list[dict[str, Any]]:
    """The ``chunks`` documents of ``data`` (none for empty data, as GridFS stores it)."""
    return [
        {
            "_id": f"{artifact_id}:{n}",
            "files_id": artifact_id,
            "n": n,
            "data": Binary(data[start : start + CHUNK_SIZE]),
            "tenant_id": tenant_id,
            "thread_id": thread_id,
        }
        for n, start in enumerate(range(0, len(data), CHUNK_SIZE))
    ]


def copy_id(artifact_id: str, tenant_id: str, thread_id: str) -> str:
    """The id of ``artifact_id``'s copy on thread ``thread_id`` (a fork): derived, so a
    copy retried after a crash is the same copy; shaped like any artifact id."""
    seed = f"{artifact_id}\x00{tenant_id}\x00{thread_id}".encode()
    return "art_" + hashlib.sha256(seed).hexdigest()[:32]


def copy_files_doc(doc: Mapping[str, Any], thread_id: str) -> dict[str, Any]:
    """The ``files`` document of ``doc``'s copy on thread ``thread_id``: pending (its
    chunks follow), ``alias_of`` the id the copied state refers to (a copy of a copy
    keeps the first id)."""
    original = str(doc.get("alias_of") or doc["_id"])
    return {**doc, "_id": copy_id(str(doc["_id"]), str(doc["tenant_id"]), thread_id),
            "thread_id": thread_id, "alias_of": original, "status": PENDING}  # fmt: skip


def copy_chunk_doc(chunk: Mapping[str, Any], files_id: str, thread_id: str) -> dict[str, Any]:
    """A chunk of an artifact's copy (:func:`copy_files_doc`)."""
    return {**chunk, "_id": f"{files_id}:{chunk['n']}", "files_id": files_id,
            "thread_id": thread_id}  # fmt: skip


def assemble(ref: ArtifactRef, files: Mapping[str, Any], chunks: list[Mapping[str, Any]]) -> bytes:
    """The artifact's bytes from its documents (chunks sorted by ``n``), checked against
    ``ref``: else :class:`~accord.errors.ArtifactCorrupted` naming what differs."""
    expected = -(-int(files.get("length", -1)) // CHUNK_SIZE) if files.get("length") else 0
    numbers = [c.get("n") for c in chunks]
    if numbers != list(range(expected)):
        raise ArtifactCorrupted(
            f"artifact {ref.id!r} is corrupted: chunks {numbers[:10]} stored, "
            f"0..{expected - 1} expected. Nothing returned; store the data again."
        )
    data = b"".join(bytes(c["data"]) for c in chunks)
    if len(data) != ref.length or files.get("length") != ref.length:
        raise ArtifactCorrupted(
            f"artifact {ref.id!r} is corrupted: {len(data)} bytes stored, the reference says "
            f"{ref.length}. Nothing returned; store the data again."
        )
    found = digest(data)
    if found != ref.digest or files.get("sha256") != ref.digest:
        raise ArtifactCorrupted(
            f"artifact {ref.id!r} is corrupted: its bytes digest to {found[:16]}..., the "
            f"reference says {ref.digest[:16]}... Nothing returned; store the data again."
        )
    return data
