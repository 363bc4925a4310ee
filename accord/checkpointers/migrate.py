"""Copy threads from any LangGraph checkpointer (e.g. MongoDBSaver) into an accord saver."""

from __future__ import annotations

import copy
import hashlib
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

VersionMap = dict[str, dict[Any, str]]  # channel -> source version -> accord version


def migrate_threads(
    source: BaseCheckpointSaver, target: BaseCheckpointSaver, thread_ids: Iterable[str]
) -> dict[str, int]:
    """Copy every checkpoint (all namespaces, forks included) and pending write of the
    given threads from ``source`` to ``target``; returns checkpoints copied per thread.

    Checkpoints are replayed oldest first through ``target.put``, so they get accord's
    storage model (changed channels only, messages once). Each put addresses its parent
    explicitly, so forked histories copy as forks. Integer channel versions (MongoDBSaver,
    SqliteSaver) repeat across the branches of a forked thread; accord keys channel values
    by version, so they are rewritten to accord's unique versions (same order) in
    ``channel_versions`` and ``versions_seen`` alike. Run it while nothing writes to
    those threads; re-running it is harmless.
    """
    copied: dict[str, int] = {}
    for thread_id in thread_ids:
        tuples = list(source.list({"configurable": {"thread_id": thread_id}}))
        by_ns: dict[str, list[CheckpointTuple]] = defaultdict(list)
        for tup in tuples:
            by_ns[tup.config["configurable"].get("checkpoint_ns", "")].append(tup)
        for ns, items in by_ns.items():
            items.sort(key=lambda t: t.checkpoint["id"])  # parents before children
            maps: dict[str, VersionMap] = {}
            for tup in items:
                _copy_one(target, thread_id, ns, tup, maps)
        copied[thread_id] = len(tuples)
    return copied


def _copy_one(
    target: BaseCheckpointSaver,
    thread_id: str,
    ns: str,
    tup: CheckpointTuple,
    maps: dict[str, VersionMap],
) -> None:
    cid = tup.checkpoint["id"]
    parent = (tup.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    inherited = maps.get(parent, {}) if parent else {}
    vmap: VersionMap = {ch: dict(vs) for ch, vs in inherited.items()}
    checkpoint = copy.copy(tup.checkpoint)
    new_versions: dict[str, Any] = {}
    versions: dict[str, Any] = {}
    for ch, v in tup.checkpoint["channel_versions"].items():
        known = vmap.setdefault(ch, {})
        if v not in known:  # introduced by this checkpoint
            known[v] = _unique(v, cid, ch)
            new_versions[ch] = known[v]
        versions[ch] = known[v]
    checkpoint["channel_versions"] = versions
    checkpoint["versions_seen"] = {
        node: {ch: vmap.get(ch, {}).get(v) or _unique(v, "", ch) for ch, v in seen.items()}
        for node, seen in tup.checkpoint["versions_seen"].items()
    }
    maps[cid] = vmap
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if parent:
        conf["checkpoint_id"] = parent
    metadata = {k: v for k, v in (tup.metadata or {}).items() if k != "writes"}
    target.put({"configurable": conf}, checkpoint, metadata, new_versions)  # type: ignore[arg-type]
    writes: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for task_id, channel, value in tup.pending_writes or ():
        writes[task_id].append((channel, value))
    wconf = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}
    for task_id, task_writes in writes.items():
        target.put_writes({"configurable": wconf}, task_writes, task_id)


def _unique(version: Any, checkpoint_id: str, channel: str) -> str:
    """accord's version format (zero-padded counter + suffix), unique per introduction."""
    if isinstance(version, str) and "." in version:
        return version  # already unique (random suffix, as accord and InMemorySaver do)
    counter = int(float(version)) if not isinstance(version, str) else int(version or 0)
    suffix = hashlib.blake2b(f"{checkpoint_id}\x00{channel}".encode(), digest_size=8).hexdigest()
    return f"{counter:032}.{suffix}"
