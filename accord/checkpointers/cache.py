"""The writer's memory of the threads it wrote: the fast step.

A saver keeps, per thread, the latest checkpoint of each namespace it committed (or
read), with what ``get_tuple`` needs to rebuild it without a query: the serialized
checkpoint and metadata, each channel's serialized value, the serialized messages of
message channels with their keys (and their reference chain state, the base of the next
``put``), and the pending writes recorded on it.

It is only served while it is known to be current, which the run registry's ``version``
tells (:mod:`accord.platform.runs`): every commit on a thread sets a new version, so an
entry stamped with the version of this saver's own last commit is current exactly when
the registry still shows that version. A run holding the thread's lease knows it without
asking (nobody else can commit); a claim returns the version; anyone else reads it (one
small indexed read instead of the five of a full read).

Values are handed out as fresh objects on every read (deserialized from the kept bytes),
so what LangGraph or the application does with a checkpoint it loaded (mutating a
message from ``get_state`` before passing it to ``update_state``, say) never changes the
cache: it returns exactly what a read from the database would. Memory is bounded:
at most ``max_threads`` threads, ``max_bytes`` of serialized payload (estimated), and
``MAX_NAMESPACES`` namespaces per thread; least recently used goes first.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from accord.checkpointers.chains import RefState

#: Namespaces kept per thread (subgraph namespaces carry task ids, so they keep coming).
MAX_NAMESPACES = 32
#: Pending writes kept for checkpoints not cached yet (writes that arrive before their put).
MAX_EARLY_WRITES = 256


@dataclass
class Value:
    """A channel's value at one version: serialized, or (message channels) decoded."""

    version: str
    typed: tuple[str, bytes] | None = None
    #: message channels: (message key, serialized message), in order
    messages: tuple[tuple[str, tuple[str, bytes]], ...] | None = None
    refs: RefState | None = None
    #: message channels: the message objects a run's loop holds (see :func:`build_tuple`)
    objects: tuple[Any, ...] | None = None

    @functools.cached_property
    def size(self) -> int:
        """Bytes this value holds (computed once: a value is never changed, and a message
        channel's is asked at every put of its thread, over all of its messages)."""
        if self.typed is not None:
            return len(self.typed[1])
        # bytes, and about as much again for the objects
        return 2 * sum(len(t[1]) for _, t in self.messages or ())

    def message_bytes(self) -> dict[str, tuple[str, bytes]]:
        return dict(self.messages or ())


@dataclass
class Write:
    task_id: str
    task_path: str
    idx: int
    channel: str
    typed: tuple[str, bytes]


@dataclass
class Entry:
    """The latest checkpoint of one namespace, as far as this saver knows.

    ``current``: known to be the namespace's latest with every pending write (the
    thread's registry version said so); otherwise the entry is only the content of
    checkpoint ``checkpoint_id`` (immutable), good as the base of a put on top of it.
    """

    checkpoint_id: str
    parent_id: str | None
    body: tuple[str, bytes]
    metadata: tuple[str, bytes]
    values: dict[str, Value]
    writes: dict[tuple[str, int], Write] = field(default_factory=dict)
    current: bool = True

    @property
    def size(self) -> int:
        return (
            len(self.body[1])
            + len(self.metadata[1])
            + sum(v.size for v in self.values.values())
            + sum(len(w.typed[1]) for w in self.writes.values())
        )

    def refs(self) -> dict[str, RefState]:
        """Message channels' reference state (the base of the next put)."""
        return {c: v.refs for c, v in self.values.items() if v.refs is not None}


@dataclass
class _Thread:
    #: the thread's registry version the current entries were checked against
    version: str | None
    namespaces: OrderedDict[str, Entry] = field(default_factory=OrderedDict)
    size: int = 0
    #: counts the moments this saver lost track (a write outside a run, a mismatch): a
    #: read is stored as current only if none happened since it started
    epoch: int = 0


class ThreadCache:
    """See the module docstring. Thread-safe (savers are called from several threads)."""

    def __init__(self, max_threads: int = 256, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_threads = max_threads
        self.max_bytes = max_bytes
        self._threads: OrderedDict[tuple[str, str], _Thread] = OrderedDict()
        self._early: OrderedDict[tuple[str, str, str, str], dict[tuple[str, int], Write]] = (
            OrderedDict()
        )
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_threads > 0

    def knows(self, tenant_id: str, thread_id: str) -> bool:
        with self._lock:
            return (tenant_id, thread_id) in self._threads

    # --- validity ---------------------------------------------------------------------

    def validate(self, tenant_id: str, thread_id: str, version: str | None) -> bool:
        """Whether the thread's entries are current at registry ``version``. If not, they
        become bases only, and reads from here are current at ``version`` (the caller
        read it before reading the thread)."""
        if not self.enabled:
            return False
        with self._lock:
            key = (tenant_id, thread_id)
            t = self._threads.get(key)
            if t is None:
                self._threads[key] = _Thread(version)
                self._evict()
                return False
            self._threads.move_to_end(key)
            if version is not None and t.version == version:
                return True
            t.version = version
            self._lose(t)
            return False

    def epoch(self, tenant_id: str, thread_id: str) -> int | None:
        """Token for :meth:`store_read` (None: the thread is not tracked)."""
        with self._lock:
            t = self._threads.get((tenant_id, thread_id))
            return None if t is None else t.epoch

    @staticmethod
    def _lose(t: _Thread) -> None:
        t.epoch += 1
        for entry in t.namespaces.values():
            entry.current = False

    def invalidate(self, tenant_id: str, thread_id: str) -> None:
        """Someone (this saver, outside a run) changed the thread: entries stay bases."""
        with self._lock:
            t = self._threads.get((tenant_id, thread_id))
            if t is not None:
                t.version = None
                self._lose(t)

    def drop(self, tenant_id: str, thread_id: str) -> None:
        with self._lock:
            self._drop((tenant_id, thread_id))
            for k in [k for k in self._early if k[:2] == (tenant_id, thread_id)]:
                del self._early[k]

    def _drop(self, key: tuple[str, str]) -> None:
        t = self._threads.pop(key, None)
        if t is not None:
            self._bytes -= t.size

    # --- reads ------------------------------------------------------------------------

    def _entry(self, tenant_id: str, thread_id: str, ns: str) -> Entry | None:
        with self._lock:
            t = self._threads.get((tenant_id, thread_id))
            if t is None:
                return None
            entry = t.namespaces.get(ns)
            if entry is not None:
                self._threads.move_to_end((tenant_id, thread_id))
            return entry

    def lookup(
        self, tenant_id: str, thread_id: str, ns: str, checkpoint_id: str | None
    ) -> Entry | None:
        """The current entry for a read of ``checkpoint_id`` (None: the latest), if any."""
        entry = self._entry(tenant_id, thread_id, ns)
        if entry is None or not entry.current:
            return None
        if checkpoint_id is not None and entry.checkpoint_id != checkpoint_id:
            return None
        return entry

    def base(self, tenant_id: str, thread_id: str, ns: str, checkpoint_id: str) -> Entry | None:
        """The entry of checkpoint ``checkpoint_id``, current or not (a put's parent)."""
        entry = self._entry(tenant_id, thread_id, ns)
        if entry is None or entry.checkpoint_id != checkpoint_id:
            return None
        return entry

    # --- writes -----------------------------------------------------------------------

    def store(
        self, tenant_id: str, thread_id: str, ns: str, entry: Entry, version: str | None
    ) -> None:
        """Record ``entry`` as the latest of ``ns`` (if it is not older than the cached
        one). ``version``: the thread's registry version after the commit that wrote it,
        when this saver knows nobody else wrote since the entries were current (its run
        holds the thread); None: ``entry`` is kept as a base only. Writes that arrived
        before this checkpoint's put are attached."""
        if not self.enabled:
            return
        with self._lock:
            key = (tenant_id, thread_id)
            t = self._threads.get(key)
            if t is None:
                t = self._threads[key] = _Thread(version)
            if version is None:
                t.version = None
                self._lose(t)
                entry.current = False
            else:
                t.version = version
            early = self._early.pop((tenant_id, thread_id, ns, entry.checkpoint_id), None)
            if early:
                for k, w in early.items():
                    entry.writes.setdefault(k, w)
            self._place(t, ns, entry)
            self._threads.move_to_end(key)
            self._evict()

    def _place(self, t: _Thread, ns: str, entry: Entry) -> None:
        """Make ``entry`` the latest of ``ns`` unless the cached one is newer."""
        current = t.namespaces.get(ns)
        if current is not None and current.checkpoint_id > entry.checkpoint_id:
            return
        if current is not None:
            t.size -= current.size
            self._bytes -= current.size
        t.namespaces[ns] = entry
        t.namespaces.move_to_end(ns)
        t.size += entry.size
        self._bytes += entry.size
        while len(t.namespaces) > MAX_NAMESPACES:
            _, old = t.namespaces.popitem(last=False)
            t.size -= old.size
            self._bytes -= old.size

    def store_read(
        self, tenant_id: str, thread_id: str, ns: str, entry: Entry, epoch: int | None
    ) -> None:
        """Record a checkpoint read from the database: current if the thread's entries
        were current when the read started (``epoch`` from :meth:`epoch`) and nothing
        changed since; else as a base."""
        if not self.enabled:
            return
        with self._lock:
            t = self._threads.get((tenant_id, thread_id))
            if t is None:
                return
            entry.current = epoch is not None and t.epoch == epoch and t.version is not None
            self._place(t, ns, entry)
            self._evict()

    def stamp(self, tenant_id: str, thread_id: str, version: str) -> None:
        """The thread's registry version moved to ``version`` by a commit of the run that
        holds the thread, which changed nothing the cache holds."""
        with self._lock:
            t = self._threads.get((tenant_id, thread_id))
            if t is not None:
                t.version = version

    def add_writes(
        self,
        tenant_id: str,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        writes: Sequence[Write],
        *,
        overwrite: bool,
        version: str | None,
    ) -> None:
        """Record committed pending writes (insert-once, or replacing the task's writes
        at the same indexes when ``overwrite``, as the store does). ``version`` as in
        :meth:`store` (None: the thread's entries become bases only)."""
        if not self.enabled:
            return
        with self._lock:
            t = self._threads.get((tenant_id, thread_id))
            if t is None:
                return
            entry = t.namespaces.get(ns)
            if version is not None:
                t.version = version
            else:
                t.version = None
                self._lose(t)
            if entry is not None and entry.checkpoint_id == checkpoint_id:
                for w in writes:
                    k = (w.task_id, w.idx)
                    before = entry.writes.get(k)
                    if before is not None and not overwrite:
                        continue
                    entry.writes[k] = w
                    delta = len(w.typed[1]) - (len(before.typed[1]) if before else 0)
                    t.size += delta
                    self._bytes += delta
            elif entry is None or entry.checkpoint_id < checkpoint_id:
                # the put of this checkpoint has not landed yet ("async" durability)
                ek = (tenant_id, thread_id, ns, checkpoint_id)
                early = self._early.setdefault(ek, {})
                self._early.move_to_end(ek)
                for w in writes:
                    if overwrite or (w.task_id, w.idx) not in early:
                        early[(w.task_id, w.idx)] = w
                while len(self._early) > MAX_EARLY_WRITES:
                    self._early.popitem(last=False)
            self._evict()

    def _evict(self) -> None:
        while self._threads and (
            len(self._threads) > self.max_threads or self._bytes > self.max_bytes
        ):
            _, t = self._threads.popitem(last=False)
            self._bytes -= t.size


# --- building tuples ------------------------------------------------------------------


def build_tuple(
    entry: Entry,
    *,
    thread_id: str,
    ns: str,
    serde: SerializerProtocol,
    config_extra: Mapping[str, Any],
    remember: Callable[[Any, str], None] | None = None,
) -> CheckpointTuple | None:
    """A ``CheckpointTuple`` of ``entry``; None if a channel value is not cached (the
    caller reads the database instead).

    Every value is a fresh object, deserialized from the kept bytes, but for messages
    handed to a run's own loop (``remember`` given: it is told the key of each): those
    are the message objects that loop handed to the last put, shared, as LangGraph never
    mutates channel values in place (its nodes must not either). That spares
    deserializing the whole conversation at every step of a run's thread."""
    body = dict(serde.loads_typed(entry.body))
    values: dict[str, Any] = {}
    for channel, version in body.get("channel_versions", {}).items():
        cached = entry.values.get(channel)
        if cached is None or cached.version != str(version):
            return None
        if cached.messages is not None:
            if remember is not None and cached.objects is not None:
                values[channel] = list(cached.objects)
                continue
            loaded = [serde.loads_typed(typed) for _, typed in cached.messages]
            if remember is not None:
                for message, (key, _) in zip(loaded, cached.messages, strict=True):
                    remember(message, key)
                cached.objects = tuple(loaded)
            values[channel] = loaded
        elif cached.typed is not None and cached.typed[0] != "empty":
            values[channel] = serde.loads_typed(cached.typed)
    checkpoint = {**body, "channel_values": values}
    metadata = serde.loads_typed(entry.metadata)
    base = {"thread_id": thread_id, "checkpoint_ns": ns}
    config: RunnableConfig = {
        "configurable": {**base, "checkpoint_id": entry.checkpoint_id, **config_extra}
    }
    parent: RunnableConfig | None = (
        {"configurable": {**base, "checkpoint_id": entry.parent_id, **config_extra}}
        if entry.parent_id
        else None
    )
    writes = sorted(entry.writes.values(), key=lambda w: (w.task_path, w.task_id, w.idx))
    pending = [(w.task_id, w.channel, serde.loads_typed(w.typed)) for w in writes]
    return CheckpointTuple(config, checkpoint, metadata, parent, pending)  # type: ignore[arg-type]
