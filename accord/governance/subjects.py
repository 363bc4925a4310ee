"""Data subjects (GDPR Art. 15 and 17): finding everything accord holds about one, and
exporting it (``accord governance export-subject``). Erasure: :mod:`accord.governance.erasure`.

A subject is a value of the policy's ``subject_fields`` (e.g. ``meta.user_id = "u-42"`` on
checkpoints, ``namespace`` containing ``"u-42"`` on memories, ``user_id`` on a business
collection the policy names). What accord holds about it, per class:

* **threads**: every thread with a document of a thread-scoped class whose subject fields
  name the subject (a checkpoint whose metadata carries ``user_id``); the whole thread is
  the subject's: its checkpoints, channel values (``checkpoint_blob``), pending writes,
  messages, head, recorded calls and run-registry entry;
* **memories**: long-term memories whose subject fields name the subject, and those
  derived from one of its threads (``provenance.thread_id``), with their history (the
  same, by ``memory_id`` too) and their vectors (by ``memory_id``);
* **outbox** events and **workflow events** whose subject fields name the subject, and
  the outbox events of its threads;
* **business** records of every ``business:NAME`` class with subject fields.

Everything is read through the kernel (``ReadContext``, the caller's principal: the
CLI's operating-system user, role admin), in pages of :data:`PAGE` documents by ``_id``;
a filter that lists threads, memories or documents lists at most :data:`PAGE` of them
(:func:`chunks`), so no command grows with the subject's size.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import chain
from pathlib import Path
from typing import Any, TypeVar

import bson
from bson import json_util

from accord.errors import InvalidInputError
from accord.governance.policy import Policy, class_of
from accord.platform.artifacts import (
    CLASSES,
    LONG_TERM_MEMORY,
    MEMORY_HISTORY,
    MEMORY_VECTOR,
    OUTBOX,
    RUN,
)
from accord.platform.context import ReadContext

__all__ = [
    "PAGE", "SubjectData", "Target", "chunks", "collection_of", "export_subject",
    "find_subject", "same_subject", "subject_hash", "subject_values", "validate_subject",
]  # fmt: skip

#: Documents read per page, and the most values one ``$in`` list of a filter holds
#: (a subject's 10^5 thread ids in one filter could pass MongoDB's 16 MB command limit).
PAGE = 1000
#: The longest subject identifier accepted (as a legal hold's value).
MAX_SUBJECT = 500
#: The longest tenant (``accord.checkpointers.validation.MAX_ID_LENGTH``: no tenant's
#: documents have a longer one).
MAX_TENANT = 1024
OPERATION = "governance.subject"
Progress = Callable[[str, int], None]

#: The thread-scoped classes, in the order a thread's data is listed.
THREAD_CLASSES = tuple(c.name for c in CLASSES.values() if c.thread_scoped)
#: Classes whose documents go with a thread, a memory or a hold, not found by fields.
_FOUND_OTHERWISE = {*THREAD_CLASSES, LONG_TERM_MEMORY.name, MEMORY_HISTORY.name,
                    MEMORY_VECTOR.name}  # fmt: skip
#: The fixed labels of accord's own memory namespaces (the aggregator's
#: ``("memories", "{user_id}")`` and ``("episodes", "{thread_id}")``, the MCP server's
#: ``("memories",)``): any element of a namespace names a subject, so these would name
#: everybody.
RESERVED_SUBJECTS = frozenset({"memories", "episodes"})
#: accord's own bookkeeping and the audit trail: never a subject's data as a class.
_NOT_SUBJECT_DATA = {"audit", "audit_digest", "catalog", "migration", "policy", "hold"}


def validate_subject(subject: Any, tenant_id: Any = None) -> tuple[str, str | None]:
    """``(subject, tenant_id)`` checked: a subject is a string of 1 to 500 characters,
    without a leading ``$`` (an operator, not an identifier) or a NUL; the tenant, when
    given, a non-empty string. Anything else is an ``InvalidInputError`` saying why."""
    if not isinstance(subject, str):
        raise InvalidInputError(
            f"a data subject is identified by a string (a value of the policy's "
            f"subject_fields), got {type(subject).__name__} {_shown(subject)}"
        )
    if not subject.strip() or len(subject) > MAX_SUBJECT:
        raise InvalidInputError(
            f"a data subject's identifier must be 1 to {MAX_SUBJECT} characters and not "
            f"blank, got {_shown(subject)}"
        )
    if not _encodes(subject):
        raise InvalidInputError(
            f"{_shown(subject)} is not a data subject's identifier: it is not valid Unicode text "
            "(a lone surrogate, as a non-UTF-8 byte in a command line becomes); nothing "
            "was read or changed"
        )
    if subject in RESERVED_SUBJECTS:
        raise InvalidInputError(
            f"{subject!r} is a label of accord's own memory namespaces (the aggregator's "
            f"and the MCP server's {sorted(RESERVED_SUBJECTS)}), not a data subject: an "
            f"erasure of it would take every user's memories; nothing was read or changed"
        )
    if subject.startswith("$") or "\x00" in subject:
        raise InvalidInputError(
            f"{_shown(subject)} is not a data subject's identifier: it starts with '$' (a query "
            "operator) or holds a NUL; nothing was read or changed"
        )
    if isinstance(tenant_id, str) and not _encodes(tenant_id):
        raise InvalidInputError(
            f"the tenant {_shown(tenant_id)} is not valid Unicode text (a lone surrogate, as "
            "a non-UTF-8 byte in a command line becomes); nothing was read or changed"
        )
    if tenant_id is not None and (not isinstance(tenant_id, str) or not tenant_id.strip()
                                  or tenant_id.startswith("$")
                                  or len(tenant_id) > MAX_TENANT):  # fmt: skip
        raise InvalidInputError(
            f"a tenant is a non-empty string of at most {MAX_TENANT} characters, got "
            f"{_shown(tenant_id)}"
        )
    return subject, tenant_id


def _shown(value: Any, limit: int = 80) -> str:
    """``value``'s repr for an error message, cut (a megabyte of id is no message)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


#: A decimal integer as an identifier spells it (no sign but ``-``, no leading zero).
_INTEGER = re.compile(r"0|-?[1-9][0-9]{0,18}")


def subject_values(subject: str) -> tuple[Any, ...]:
    """The stored values that name ``subject``: the identifier, its NFC and NFD forms
    (canonically equivalent text, typed one way and stored the other: ``"josé"`` with
    one code point or two) and, for a decimal integer in int64's range, the number (an
    application whose ``user_id`` is an ``int``: a command line only gives text).
    Letter case is not folded: ``Alice`` and ``alice`` may be two subjects."""
    values: list[Any] = [subject]
    for form in ("NFC", "NFD"):
        text = unicodedata.normalize(form, subject)
        if text not in values:
            values.append(text)
    if _INTEGER.fullmatch(subject) and -(2**63) <= int(subject) < 2**63:
        values.append(int(subject))
    return tuple(values)


def same_subject(value: Any, subject: str) -> bool:
    """Whether ``value`` (a legal hold's) names the same subject as ``subject``."""
    return isinstance(value, str) and (
        value in subject_values(subject)
        or unicodedata.normalize("NFC", value) == unicodedata.normalize("NFC", subject)
    )


def subject_hash(subject: str) -> str:
    """What records of an erasure keep of the subject: the SHA-256 of its identifier."""
    return hashlib.sha256(subject.encode()).hexdigest()


def collection_of(policy: Policy, name: str) -> str | None:
    """The collection of class ``name`` (``business:NAME``: ``NAME``) under ``policy``."""
    cls = policy.classes.get(name)
    if cls is not None and cls.collection:
        return cls.collection
    registered = CLASSES.get(name)
    return registered.default_collection if registered is not None else None


@dataclass(frozen=True)
class Target:
    """One class's documents of the subject: ``ids`` per tenant, in ``collection``."""

    name: str  # the policy's class name (``business:orders``)
    artifact: str  # the registry's class (``business``)
    collection: str
    ids: dict[str, list[Any]] = field(default_factory=dict)

    def count(self) -> int:
        return sum(len(v) for v in self.ids.values())


@dataclass
class SubjectData:
    """Where a subject's documents are (:func:`find_subject`)."""

    subject: str
    tenant_id: str | None
    db: str
    #: the stored values that name the subject (:func:`subject_values`)
    values: tuple[Any, ...] = ()
    #: the last name of every subject field of the policy (``meta.user_id``: ``user_id``),
    #: by which audit images are searched for a numeric identifier
    leaves: frozenset[str] = frozenset()
    #: (tenant, thread) of the subject's threads
    threads: set[tuple[str, str]] = field(default_factory=set)
    #: class name -> its documents of the subject (threads' classes not included)
    targets: dict[str, Target] = field(default_factory=dict)
    #: thread-scoped class -> collection
    thread_collections: dict[str, str] = field(default_factory=dict)

    def tenants(self) -> set[str]:
        found = {t for t, _ in self.threads}
        for target in self.targets.values():
            found.update(target.ids)
        return found

    def memory_ids(self) -> list[Any]:
        target = self.targets.get(LONG_TERM_MEMORY.name)
        return [i for ids in target.ids.values() for i in ids] if target else []


_T = TypeVar("_T")


def chunks(values: Sequence[_T], size: int | None = None) -> Iterator[list[_T]]:
    """``values`` in slices of at most ``size`` (default :data:`PAGE`, read when called,
    so a test can lower it): one ``$in`` list per slice keeps each command bounded."""
    step = size or PAGE
    for start in range(0, len(values), step):
        yield list(values[start : start + step])


def _listed(field: str, by_tenant: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Clauses ``{tenant_id, field: {$in: ...}}`` for ``by_tenant``'s values, :data:`PAGE`
    values a clause (each clause is read on its own: an ``$or`` of them all would be
    one filter as large as the lists)."""
    return [
        {"tenant_id": tenant, field: {"$in": part}}
        for tenant, values in by_tenant.items()
        for part in chunks(values)
    ]


def _match(subject: str, fields: tuple[str, ...], tenant_id: str | None) -> dict[str, Any]:
    """Documents whose subject fields name ``subject`` (any of :func:`subject_values`; an
    array field: one element)."""
    values = list(subject_values(subject))
    match: dict[str, Any] = {"$or": [{f: {"$in": values}} for f in fields]}
    if tenant_id is not None:
        match["tenant_id"] = tenant_id
    return match


def pages(
    uow: Any, artifact: str, db: str, collection: str, filt: Mapping[str, Any],
    *, projection: Mapping[str, Any] | None = None, operation: str = OPERATION,
) -> Iterator[list[dict[str, Any]]]:  # fmt: skip
    """The documents matching ``filt``, :data:`PAGE` at a time in ``_id`` order, read
    through the kernel (so the policy and the audit see every read)."""
    last: Any = None
    while True:
        page = dict(filt) if last is None else {"$and": [dict(filt), {"_id": {"$gt": last}}]}
        docs = uow.find(ReadContext("*", operation=operation), artifact, db, collection, page,
                        projection=projection, sort=[("_id", 1)], limit=PAGE)  # fmt: skip
        if not docs:
            return
        yield docs
        last = docs[-1]["_id"]
        if len(docs) < PAGE:
            return


def _ids(uow: Any, artifact: str, db: str, collection: str,
         clauses: Iterable[Mapping[str, Any]], into: dict[str, list[Any]]) -> None:  # fmt: skip
    """Add to ``into`` (tenant -> ids) the ids of the documents matching any of
    ``clauses``, each read on its own (bounded filters), each document once."""
    seen = {(t, _id_key(i)) for t, ids in into.items() for i in ids}
    for clause in clauses:
        for docs in pages(uow, artifact, db, collection, clause,
                          projection={"_id": 1, "tenant_id": 1}):  # fmt: skip
            for d in docs:
                key = (str(d.get("tenant_id")), _id_key(d["_id"]))
                if key not in seen:  # (matched by an earlier clause too)
                    seen.add(key)
                    into.setdefault(key[0], []).append(d["_id"])


def _id_key(value: Any) -> bytes:
    """A hashable, exact key of an ``_id`` (which may be a document)."""
    return bson.encode({"_": value})


def find_subject(uow: Any, db: str, policy: Policy, subject: str,
                 tenant_id: str | None = None) -> SubjectData:  # fmt: skip
    """Where ``subject``'s documents are in ``db`` (module docstring), read through
    ``uow`` (a sync kernel). Only ``tenant_id``'s when given."""
    subject, tenant_id = validate_subject(subject, tenant_id)
    leaves = frozenset(f.rsplit(".", 1)[-1] for c in policy.classes.values()
                       for f in c.subject_fields)  # fmt: skip
    found = SubjectData(subject, tenant_id, db, subject_values(subject), leaves)
    for name in THREAD_CLASSES:
        coll = collection_of(policy, name)
        if coll is None:
            continue
        found.thread_collections[name] = coll
        cls = policy.of(name)
        if cls is None or not cls.subject_fields:
            continue
        filt = _match(subject, cls.subject_fields, tenant_id)
        for docs in pages(uow, name, db, coll, filt, projection={"tenant_id": 1, "thread_id": 1}):
            found.threads.update(
                (str(d["tenant_id"]), str(d["thread_id"])) for d in docs if d.get("thread_id")
            )
    threads_by_tenant: dict[str, list[str]] = {}
    for tenant, thread in sorted(found.threads):
        threads_by_tenant.setdefault(tenant, []).append(thread)
    of_threads = _listed("thread_id", threads_by_tenant)
    derived = _listed("provenance.thread_id", threads_by_tenant)  # memories of the threads

    for name, cls in policy.classes.items():
        base = class_of(name)
        if base is None or base in _NOT_SUBJECT_DATA or base in _FOUND_OTHERWISE:
            continue
        coll = collection_of(policy, name)
        if coll is None or (not cls.subject_fields and base != OUTBOX.name):
            continue
        either = [_match(subject, cls.subject_fields, tenant_id)] if cls.subject_fields else []
        if base == OUTBOX.name:
            either += of_threads
        if not either:
            continue
        target = Target(name, base, coll)
        _ids(uow, base, db, coll, either, target.ids)
        found.targets[name] = target
    # memories: by their subject fields, or derived from one of the subject's threads
    memory = policy.of(LONG_TERM_MEMORY.name)
    memory_coll = collection_of(policy, LONG_TERM_MEMORY.name)
    if memory is not None and memory_coll is not None:
        either = (
            [_match(subject, memory.subject_fields, tenant_id)] if memory.subject_fields else []
        )
        target = Target(LONG_TERM_MEMORY.name, LONG_TERM_MEMORY.name, memory_coll)
        _ids(uow, target.artifact, db, memory_coll, either + derived, target.ids)
        found.targets[target.name] = target
        history = policy.of(MEMORY_HISTORY.name)
        history_coll = collection_of(policy, MEMORY_HISTORY.name)
        if history_coll is not None:
            either = _listed("memory_id", target.ids)
            if history is not None and history.subject_fields:
                either.append(_match(subject, history.subject_fields, tenant_id))
            versions = Target(MEMORY_HISTORY.name, MEMORY_HISTORY.name, history_coll)
            _ids(uow, versions.artifact, db, history_coll, either + derived, versions.ids)
            found.targets[versions.name] = versions
        vectors_coll = collection_of(policy, MEMORY_VECTOR.name)
        if vectors_coll is not None:
            vectors = Target(MEMORY_VECTOR.name, MEMORY_VECTOR.name, vectors_coll)
            _ids(uow, vectors.artifact, db, vectors_coll, _listed("memory_id", target.ids),
                 vectors.ids)  # fmt: skip
            found.targets[vectors.name] = vectors
    return found


# --- export ----------------------------------------------------------------------------


def _file_name(name: str, taken: Iterable[str]) -> str:
    """The file of class ``name``: the name made safe for any file system, with a hash of
    the name when another class's file has it already (``business:a b`` and
    ``business:a-b``, or two names that differ in case only: the second overwrote the
    first)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", name)
    if f"{safe}.jsonl".lower() in {t.lower() for t in taken}:
        safe += "-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return safe + ".jsonl"


def _pages_of(uow: Any, artifact: str, db: str, collection: str,
              clauses: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:  # fmt: skip
    """The pages of each clause in turn (the clauses match disjoint documents: threads
    or ids, each in one clause)."""
    return chain.from_iterable(pages(uow, artifact, db, collection, c) for c in clauses)


def export_subject(uow: Any, db: str, policy: Policy, subject: str, out: str | os.PathLike[str],
                   *, tenant_id: str | None = None,
                   progress: Progress | None = None) -> dict[str, Any]:  # fmt: skip
    """Write everything ``db`` holds about ``subject`` to the directory ``out``: one JSONL
    file per class (MongoDB Extended JSON, relaxed: one document a line, as stored) and
    ``manifest.json`` (per file: class, collection, documents, bytes, SHA-256). Returns the
    manifest. ``out`` must be empty or new: an export never overwrites."""
    found = find_subject(uow, db, policy, subject, tenant_id)
    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise InvalidInputError(f"{root} exists and is not an empty directory; name a new one")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(f"cannot write the export into {root}: {exc.strerror}") from None
    files: dict[str, dict[str, Any]] = {}

    def write(name: str, artifact: str, collection: str, batches: Iterator[list[dict[str, Any]]]) -> None:  # fmt: skip
        path = root / _file_name(name, files)
        digest, count, size = hashlib.sha256(), 0, 0
        with path.open("wb") as f:
            for docs in batches:
                for d in docs:
                    line = (json_util.dumps(d, json_options=json_util.RELAXED_JSON_OPTIONS)
                            + "\n").encode()  # fmt: skip
                    f.write(line)
                    digest.update(line)
                    count += 1
                    size += len(line)
                if progress is not None:
                    progress(name, len(docs))
        files[path.name] = {"class": name, "artifact": artifact, "collection": collection,
                            "documents": count, "bytes": size, "sha256": digest.hexdigest()}  # fmt: skip

    by_tenant: dict[str, list[str]] = {}
    for tenant, thread in sorted(found.threads):
        by_tenant.setdefault(tenant, []).append(thread)
    for name, coll in found.thread_collections.items():
        if name == RUN.name:
            continue  # leases and fences: no data of the subject
        write(name, name, coll, _pages_of(uow, name, db, coll, _listed("thread_id", by_tenant)))
    for name, target in found.targets.items():
        if target.artifact == MEMORY_VECTOR.name:
            continue  # numbers derived from the memories, which are exported
        write(name, target.artifact, target.collection,
              _pages_of(uow, target.artifact, db, target.collection,
                        _listed("_id", target.ids)))  # fmt: skip
    manifest = {
        "generator": "accord governance export-subject",
        "generated_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "db": db,
        "subject": subject,
        "tenant_id": tenant_id,
        "threads": [{"tenant_id": t, "thread_id": th} for t, th in sorted(found.threads)],
        "documents": sum(f["documents"] for f in files.values()),
        "files": files,
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
