"""Copy threads from another LangGraph checkpointer (e.g. MongoDBSaver) into an accord saver.

Two ways in:

* :func:`migrate_threads` replays the threads any ``BaseCheckpointSaver`` lists (sync);
* :class:`accord.checkpointers.synchronous.migration.MongoDBSaverMigration` (and its async
  twin) reads MongoDBSaver's documents directly: a whole database, resumable, with
  progress (``accord checkpoints migrate``).

Both replay each checkpoint oldest first through the accord saver's ``put`` (so the
history gets accord's storage model: changed channels only, messages once), each
addressing its parent explicitly so forked histories copy as forks, then the checkpoint's
pending writes through ``put_writes``. This module holds what they share, with no I/O:
:class:`Replay` (the version rewriting) and the decoding of MongoDBSaver's documents.
"""

from __future__ import annotations

import copy
import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

VersionMap = dict[str, dict[Any, str]]  # channel -> source version -> accord version


@dataclass(frozen=True)
class Step:
    """One checkpoint as accord's saver takes it: ``put(config, checkpoint, metadata,
    new_versions)``, then ``put_writes(writes_config, writes, task_id)`` per task."""

    config: RunnableConfig
    checkpoint: Any
    metadata: Any
    new_versions: dict[str, Any]
    writes_config: RunnableConfig
    writes: list[tuple[str, list[tuple[str, Any]]]]  # (task_id, [(channel, value)])


@dataclass
class MigrationProgress:
    """Where a migration is, after each thread (what a progress bar shows)."""

    total: int
    done: int = 0
    migrated: int = 0
    skipped: int = 0
    checkpoints: int = 0
    writes: int = 0
    thread_id: str | None = None


@dataclass(frozen=True)
class MigrationReport:
    """What a migration did: threads seen, ``migrated`` (copied now), ``skipped`` (all
    their checkpoints were in accord already), checkpoints and pending writes copied,
    and whether the source is now recorded as migrated (a full run)."""

    source: str
    target: str
    tenant_id: str
    threads: int
    migrated: int
    skipped: int
    checkpoints: int
    writes: int
    recorded: bool
    migrated_threads: list[str] = field(default_factory=list)
    #: documents of an earlier accord copied out of MongoDBSaver's collections
    separated: int = 0
    #: threads accord went on with after their migration and MongoDBSaver wrote again
    #: since: not copied (counted in ``skipped``)
    diverged: list[str] = field(default_factory=list)


class Replay:
    """The checkpoints of one namespace of one thread, oldest first, as accord's puts.

    Integer channel versions (MongoDBSaver, SqliteSaver) repeat across the branches of a
    forked thread; accord keys channel values by version, so they are rewritten to
    accord's unique versions (same order), in ``channel_versions`` and ``versions_seen``
    alike, following each checkpoint's parent."""

    def __init__(self, thread_id: str, checkpoint_ns: str) -> None:
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns
        self.maps: dict[str, VersionMap] = {}

    def step(self, tup: CheckpointTuple) -> Step:
        cid = tup.checkpoint["id"]
        parent = (tup.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        inherited = self.maps.get(parent, {}) if parent else {}
        vmap: VersionMap = {ch: dict(vs) for ch, vs in inherited.items()}
        checkpoint = copy.copy(tup.checkpoint)
        new_versions: dict[str, Any] = {}
        versions: dict[str, Any] = {}
        for ch, v in tup.checkpoint["channel_versions"].items():
            known = vmap.setdefault(ch, {})
            if v not in known:  # introduced by this checkpoint
                known[v] = unique_version(v, cid, ch)
                new_versions[ch] = known[v]
            versions[ch] = known[v]
        checkpoint["channel_versions"] = versions
        checkpoint["versions_seen"] = {
            node: {
                ch: vmap.get(ch, {}).get(v) or unique_version(v, "", ch) for ch, v in seen.items()
            }
            for node, seen in tup.checkpoint["versions_seen"].items()
        }
        self.maps[cid] = vmap
        conf: dict[str, Any] = {"thread_id": self.thread_id, "checkpoint_ns": self.checkpoint_ns}
        if parent:
            conf["checkpoint_id"] = parent
        metadata = {k: v for k, v in (tup.metadata or {}).items() if k != "writes"}
        writes: dict[str, list[tuple[str, Any]]] = defaultdict(list)
        for task_id, channel, value in tup.pending_writes or ():
            writes[task_id].append((channel, value))
        wconf = {"thread_id": self.thread_id, "checkpoint_ns": self.checkpoint_ns,
                 "checkpoint_id": cid}  # fmt: skip
        return Step(
            {"configurable": conf}, checkpoint, metadata, new_versions,
            {"configurable": wconf}, list(writes.items()),
        )  # fmt: skip


def migrate_threads(
    source: BaseCheckpointSaver, target: BaseCheckpointSaver, thread_ids: Iterable[str]
) -> dict[str, int]:
    """Copy every checkpoint (all namespaces, forks included) and pending write of the
    given threads from ``source`` to ``target``; returns checkpoints copied per thread.

    Run it while nothing writes to those threads; re-running it is harmless. For a whole
    MongoDBSaver database (resumable, with progress), use ``accord checkpoints migrate``
    or :class:`accord.checkpointers.synchronous.migration.MongoDBSaverMigration`.
    """
    copied: dict[str, int] = {}
    for thread_id in thread_ids:
        tuples = list(source.list({"configurable": {"thread_id": thread_id}}))
        by_ns: dict[str, list[CheckpointTuple]] = defaultdict(list)
        for tup in tuples:
            by_ns[tup.config["configurable"].get("checkpoint_ns", "")].append(tup)
        for ns, items in by_ns.items():
            items.sort(key=lambda t: t.checkpoint["id"])  # parents before children
            replay = Replay(thread_id, ns)
            for tup in items:
                step = replay.step(tup)
                target.put(step.config, step.checkpoint, step.metadata, step.new_versions)
                for task_id, task_writes in step.writes:
                    target.put_writes(step.writes_config, task_writes, task_id)
        copied[thread_id] = len(tuples)
    return copied


def unique_version(version: Any, checkpoint_id: str, channel: str) -> str:
    """accord's version format (zero-padded counter + suffix), unique per introduction."""
    if isinstance(version, str) and "." in version:
        return version  # already unique (random suffix, as accord and InMemorySaver do)
    counter = int(float(version)) if not isinstance(version, str) else int(version or 0)
    suffix = hashlib.blake2b(f"{checkpoint_id}\x00{channel}".encode(), digest_size=8).hexdigest()
    return f"{counter:032}.{suffix}"


# --- MongoDBSaver's documents (langgraph-checkpoint-mongodb 0.x) -------------------------

#: MongoDBSaver's documents have no ``tenant_id`` (accord's all do): the filter that reads
#: only them, also from a collection an earlier accord wrote into beside MongoDBSaver.
FOREIGN = {"tenant_id": None}


def _typed(value: Any) -> tuple[str, bytes]:
    kind, data = value  # MongoDBSaver stores serde.dumps_typed(...) pairs as BSON arrays
    return str(kind), bytes(data)


def load_metadata(serde: SerializerProtocol, stored: Any) -> Any:
    """MongoDBSaver's metadata: a document whose leaves are ``dumps_typed`` pairs."""
    if isinstance(stored, Mapping):
        return {k: load_metadata(serde, v) for k, v in stored.items()}
    return serde.loads_typed(_typed(stored))


def decode_checkpoint(
    doc: Mapping[str, Any], writes: Sequence[Mapping[str, Any]], serde: SerializerProtocol
) -> CheckpointTuple:
    """A MongoDBSaver checkpoint document and its pending-writes documents, as LangGraph's
    tuple (what MongoDBSaver's ``get_tuple`` returns for it)."""
    conf = {
        "thread_id": doc["thread_id"],
        "checkpoint_ns": doc.get("checkpoint_ns", ""),
        "checkpoint_id": doc["checkpoint_id"],
    }
    parent = doc.get("parent_checkpoint_id")
    return CheckpointTuple(
        {"configurable": conf},
        serde.loads_typed((str(doc["type"]), bytes(doc["checkpoint"]))),
        load_metadata(serde, doc.get("metadata") or {}),
        {"configurable": {**conf, "checkpoint_id": parent}} if parent else None,
        [
            (w["task_id"], w["channel"], serde.loads_typed((str(w["type"]), bytes(w["value"]))))
            for w in writes
        ],
    )
