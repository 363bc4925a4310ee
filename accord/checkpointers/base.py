"""What the sync and async savers share: settings, scoping, in-process state (not generated).

The savers themselves (``accord/checkpointers/asynchronous/saver.py`` and its generated
sync twin) do the I/O; everything else lives in plain modules: documents
(:mod:`~accord.checkpointers.storage`), plans (:mod:`~accord.checkpointers.plans`),
read plans (:mod:`~accord.checkpointers.reads`), ownership
(:mod:`~accord.checkpointers.ownership`), the fast-step cache
(:mod:`~accord.checkpointers.cache`) and errors (:mod:`~accord.checkpointers.failures`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

from accord.checkpointers import cache, langgraph_internals, layout, plans, schema, validation
from accord.checkpointers import staged as staged_ops
from accord.checkpointers.ownership import ActiveRun, StagedTasks
from accord.checkpointers.serde import RevisionCache
from accord.checkpointers.storage import BUSINESS_CHANNEL, Scope
from accord.errors import ConfigurationError, InvalidInputError
from accord.platform import artifacts, gridfs_layout, runs
from accord.platform.context import ReadContext

logger = logging.getLogger("accord.checkpointers")


class _HideBusinessChannel(logging.Filter):
    """LangGraph warns about writes to channels it does not know; the business channel is
    deliberate (it carries staged business writes to ``put_writes``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return BUSINESS_CHANNEL not in record.getMessage()


logging.getLogger("langgraph").addFilter(_HideBusinessChannel())

#: Failures of a task: its business writes are discarded.
FAILED_CHANNELS = frozenset({ERROR, INTERRUPT})
#: Default bound, in seconds, on one call (a transaction with its retries, a read, a wait).
DEFAULT_TIMEOUT = 30.0
#: How long a refreshed list of reserved collections is trusted.
_RESERVED_TTL = 60.0
#: accord's own ``accord_``-named collections: never a business write's target, made yet
#: or not (data keys, audit cuts; generic default names such as ``outbox`` are reserved
#: once the catalog names them, so an application's own ``outbox`` stays usable).
_DEFAULT_COLLECTIONS = frozenset(
    c.default_collection
    for c in artifacts.CLASSES.values()
    if c.default_collection and c.default_collection.startswith("accord_")
)


class AccordBase(BaseCheckpointSaver[str]):
    """Settings and shared state of :class:`AccordSaver` and :class:`AsyncAccordSaver`.

    Args:
        db_name: database holding the checkpointer's collections.
        serde: serializer for channel values, writes and checkpoints (LangGraph's
            ``JsonPlusSerializer`` by default; ``EncryptedSerializer`` works).
        tenant_id: given, the saver serves that tenant only: a config (or a ``tenant_id=``
            argument) naming another tenant is refused with ``InvalidInputError``, as a
            store built with ``tenant_id=`` refuses a run of another tenant. Not given:
            each config's ``configurable.tenant_id``, ``"default"`` when absent.
        collections: collection names (:class:`~accord.checkpointers.schema.CollectionNames`).
        checkpoint_collection_name, writes_collection_name: MongoDBSaver's names for the
            checkpoints and pending-writes collections (override ``collections``).
        ttl: seconds; as MongoDBSaver's ``ttl``: a thread's data expires that long after
            it was written (see docs/checkpointer.md, "Expiry").
        message_channels: channels stored as short-term memory, one document per message.
        chunk_size: values larger than this are split over several documents.
        business_db: database of business collections (default: ``db_name``).
        client_bulk: use MongoDB 8.0's client-level bulkWrite; ``None`` = detect.
        lease_seconds: how long a run holds a thread without renewing its lease.
        timeout: bound in seconds on every call (transactions with retries, reads, waits).
        cache_threads, cache_bytes: bounds of the fast-step cache (0 threads disables it).
        unmigrated: what setup does when the database holds MongoDBSaver threads that
            were not migrated: ``"refuse"`` (raise ``ForeignDataError`` naming the
            migration command) or ``"ignore"`` (run beside them). Another saver's
            documents in a collection this saver writes are always refused.
        outbox_events: write outbox events: ``None`` (default) when a consumer (the memory
            aggregator) is registered for the outbox, ``True`` always, ``False`` never.
    """

    def __init__(
        self,
        *,
        db_name: str,
        serde: SerializerProtocol | None = None,
        tenant_id: str | None = None,
        collections: schema.CollectionNames | None = None,
        checkpoint_collection_name: str | None = None,
        writes_collection_name: str | None = None,
        ttl: int | float | None = None,
        message_channels: Sequence[str] = ("messages",),
        chunk_size: int = schema.DEFAULT_CHUNK_SIZE,
        business_db: str | None = None,
        client_bulk: bool | None = None,
        lease_seconds: float = runs.DEFAULT_LEASE_SECONDS,
        timeout: float = DEFAULT_TIMEOUT,
        cache_threads: int = 256,
        cache_bytes: int = 64 * 1024 * 1024,
        unmigrated: str = "refuse",
        outbox_events: bool | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.db_name = validation.identifier(db_name, "db_name")
        #: built with tenant_id=: serves that tenant only (:meth:`tenant_named`)
        self.pinned = tenant_id is not None
        self.tenant_id = validation.identifier(
            schema.DEFAULT_TENANT if tenant_id is None else tenant_id, "tenant_id"
        )
        self.collections = _names(collections, checkpoint_collection_name, writes_collection_name)
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0
        ):
            raise ConfigurationError(
                f"ttl must be a positive number of seconds or None, got {ttl!r}."
            )
        self.ttl = ttl
        if isinstance(message_channels, str):
            raise ConfigurationError(
                "message_channels must be a sequence of channel names, not a string."
            )
        self.message_channels = frozenset(message_channels)
        if not isinstance(chunk_size, int) or chunk_size < 1024:
            raise ConfigurationError("chunk_size must be an int >= 1024 bytes.")
        self.chunk_size = chunk_size
        self.business_db = validation.identifier(business_db or db_name, "business_db")
        for name, value, low in (("lease_seconds", lease_seconds, 0.5), ("timeout", timeout, 0.1)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
                raise ConfigurationError(
                    f"{name} must be a number >= {low} seconds, got {value!r}."
                )
        self.lease_seconds = float(lease_seconds)
        self.timeout = float(timeout)
        if not isinstance(cache_threads, int) or cache_threads < 0:
            raise ConfigurationError("cache_threads must be an int >= 0 (0 disables the cache).")
        self._client_bulk = client_bulk
        self.unmigrated = layout.check_unmigrated_mode(unmigrated)
        self._outbox_events = outbox_events
        self._layout_done = False
        self.target = plans.Target(self.db_name, self.collections, self.business_db)
        self.cache = cache.ThreadCache(cache_threads, cache_bytes)
        self._revisions = RevisionCache()
        #: runs this saver holds: (id(anchor), tenant, thread) -> run
        self._runs: dict[tuple[int, str, str], ActiveRun] = {}
        self._runs_mutex = threading.Lock()
        #: staged business writes of calls that belong to no run this saver holds
        self._staged = StagedTasks()
        self._reserved: frozenset[str] = frozenset()
        self._reserved_at = -1.0
        self._allowed: set[str] = set()

    def _use_collections(self, names: schema.CollectionNames) -> None:
        """Use ``names`` (resolved at setup: a database an earlier accord set up keeps
        its collection names, accord.checkpointers.layout)."""
        if names != self.collections:
            self.collections = names
            self.target = plans.Target(self.db_name, names, self.business_db)
        self._layout_done = True

    # --- scoping and validation ----------------------------------------------------

    def tenant_of(self, config: RunnableConfig | None) -> str:
        """The tenant a config names (``configurable.tenant_id``), checked."""
        tenant = validation.configurable(config).get("tenant_id")
        return self.tenant_named(tenant, "config['configurable']['tenant_id']")

    def tenant_named(self, tenant: Any, where: str = "tenant_id") -> str:
        """``tenant`` (None: the saver's), a valid identifier, and the saver's own when
        the saver is pinned to one (built with ``tenant_id=``)."""
        if tenant is None:
            return self.tenant_id
        tenant = validation.identifier(tenant, "tenant_id")
        if self.pinned and tenant != self.tenant_id:
            raise InvalidInputError(
                f"this saver serves tenant {self.tenant_id!r} only, and {where} names tenant "
                f"{tenant!r:.80}; nothing was read or written. Build the saver without "
                f"tenant_id= to serve the tenant each config names, or one saver per tenant."
            )
        return tenant

    def _scope(self, config: RunnableConfig) -> Scope:
        conf = validation.configurable(config)
        if "thread_id" not in conf:
            raise InvalidInputError(
                "config['configurable']['thread_id'] is required (pass "
                "{'configurable': {'thread_id': '...'}})."
            )
        return Scope(
            self.tenant_of(config),
            validation.identifier(conf["thread_id"], "thread_id"),
            validation.identifier(conf.get("checkpoint_ns", ""), "checkpoint_ns", allow_empty=True),
        )

    def _scope_for(self, thread_id: Any, tenant_id: str | None) -> Scope:
        tenant = self.tenant_named(tenant_id)
        return Scope(tenant, validation.identifier(thread_id, "thread_id"), "")

    def _read_context(self, filt: Mapping[str, Any]) -> ReadContext:
        """The context of a read by this saver: the tenant and thread its filter names."""
        tenant, thread = filt.get("tenant_id"), filt.get("thread_id")
        return ReadContext(
            tenant_id=tenant if isinstance(tenant, str) else self.tenant_id,
            thread_id=thread if isinstance(thread, str) else None,
            operation="checkpoint.read",
        )

    def _remember(self, message: Any, key: str) -> None:
        self._revisions.remember(message, key)

    def _config_extra(self, tenant_id: str) -> dict[str, Any]:
        """Extra configurable keys of returned configs: the tenant, when not the saver's
        default (LangGraph's own keys otherwise, exactly)."""
        return {} if tenant_id == self.tenant_id else {"tenant_id": tenant_id}

    def _returned_config(self, scope: Scope, checkpoint_id: str) -> RunnableConfig:
        return {
            "configurable": {
                "thread_id": scope.thread_id,
                "checkpoint_ns": scope.checkpoint_ns,
                "checkpoint_id": checkpoint_id,
                **self._config_extra(scope.tenant_id),
            }
        }

    def get_next_version(self, current: str | None, channel: None) -> str:  # type: ignore[override]
        # Random suffix: two branches of a forked thread never produce the same version of
        # a channel, so blobs keyed by (channel, version) never collide.
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(str(current).split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # --- runs -------------------------------------------------------------------------

    def _run_of(self, scope: Scope, config: RunnableConfig | None) -> ActiveRun | None:
        """The run this saver holds that ``config`` belongs to, if any."""
        anchor = langgraph_internals.anchor_of(config)
        if anchor is None:
            return None
        with self._runs_mutex:
            return self._runs.get((id(anchor), scope.tenant_id, scope.thread_id))

    def _register(self, scope: Scope, run: ActiveRun) -> None:
        with self._runs_mutex:
            self._runs[(id(run.anchor), scope.tenant_id, scope.thread_id)] = run

    def _unregister(self, run: ActiveRun) -> None:
        lease = run.lease
        with self._runs_mutex:
            self._runs.pop((id(run.anchor), lease.tenant_id, lease.thread_id), None)

    def _runs_on(self, scope: Scope) -> list[ActiveRun]:
        """This saver's runs on ``scope``'s thread (its own, or one a read comes from)."""
        with self._runs_mutex:
            return [
                r
                for (_, tenant, thread), r in self._runs.items()
                if (tenant, thread) == (scope.tenant_id, scope.thread_id)
            ]

    # --- recorded calls (see recorded.py) -----------------------------------------------

    def run_lease(self, config: RunnableConfig) -> runs.Lease | None:
        """The lease of the run a task's ``config`` belongs to, when this saver holds it
        (recorded calls carry its fence), else None."""
        run = self._run_of(self._scope(config), config)
        return run.lease if run is not None else None

    def checkpoint_saved(
        self, config: RunnableConfig, checkpoint_ns: str, checkpoint_id: str
    ) -> bool | None:
        """Whether the run of ``config`` committed (or loaded) checkpoint
        ``checkpoint_id`` of ``checkpoint_ns``: True, False (its put is still queued:
        "async" durability) or None (no run of this saver: nothing to wait for)."""
        run = self._run_of(self._scope(config), config)
        if run is None:
            return None
        return run.is_saved(checkpoint_ns, checkpoint_id)

    def wait_checkpoint_saved(
        self, config: RunnableConfig, checkpoint_ns: str, checkpoint_id: str
    ) -> bool:
        """Wait (a thread) until :meth:`checkpoint_saved` is not False, within the saver's
        timeout; False when it ran out or the put failed."""
        run = self._run_of(self._scope(config), config)
        if run is None:
            return True
        return run.signal.wait_for(
            lambda: (
                run.is_saved(checkpoint_ns, checkpoint_id)
                or run.put_error(checkpoint_ns, checkpoint_id) is not None
                or run.failure is not None
            ),
            self.timeout,
        ) and run.is_saved(checkpoint_ns, checkpoint_id)

    async def await_checkpoint_saved(
        self, config: RunnableConfig, checkpoint_ns: str, checkpoint_id: str
    ) -> bool:
        """:meth:`wait_checkpoint_saved` for a coroutine."""
        run = self._run_of(self._scope(config), config)
        if run is None:
            return True
        return await run.signal.await_for(
            lambda: (
                run.is_saved(checkpoint_ns, checkpoint_id)
                or run.put_error(checkpoint_ns, checkpoint_id) is not None
                or run.failure is not None
            ),
            self.timeout,
        ) and run.is_saved(checkpoint_ns, checkpoint_id)

    # --- staged business writes (see business.py) --------------------------------------

    def note_staged(self, config: RunnableConfig, checkpoint_id: str, task_id: str) -> None:
        """A task of ``checkpoint_id`` staged business writes (called from the node, in
        any thread): the run's next ``put`` waits until that task's ``put_writes`` is
        done, so a crash can never keep the next checkpoint while losing the business
        writes (LangGraph's "async" durability saves both concurrently)."""
        scope = self._scope(config)
        key = (scope.tenant_id, scope.thread_id, checkpoint_id)
        run = self._run_of(scope, config)
        (run.staged if run is not None else self._staged).add(key, task_id)

    def _staged_of(self, run: ActiveRun | None) -> StagedTasks:
        return run.staged if run is not None else self._staged

    def reserved_collections(self) -> frozenset[str]:
        """Collection names business writes may never target (accord's own collections in
        this database, whichever component or application configured them; refreshed from
        the catalog by the saver)."""
        own = (
            {
                *self.collections.all().values(),
                gridfs_layout.FILES,
                gridfs_layout.CHUNKS,
                *_DEFAULT_COLLECTIONS,  # those not made yet too (data keys, audit cuts)
            }
            if self.business_db == self.db_name
            else set()
        )
        return self._reserved | own

    def _reserved_stale(self, names: Sequence[str]) -> bool:
        """Whether the catalog must be read again before writing to ``names``."""
        return any(n not in self._allowed for n in names) or (
            time.monotonic() - self._reserved_at > _RESERVED_TTL
        )

    def _set_reserved(self, reserved: frozenset[str]) -> None:
        self._reserved = reserved
        self._reserved_at = time.monotonic()
        self._allowed = set()

    def _check_business_targets(
        self, staged: Sequence[Any], tenant_id: str, thread_id: str
    ) -> None:
        """Every staged operation checked again as it arrives (:mod:`.staged`: shapes,
        collection names, tenancy), then its target against accord's own collections."""
        reserved = self.reserved_collections()
        staged_ops.check_staged(staged, tenant_id, thread_id, reserved)
        for spec in staged:
            name = spec.get("collection")
            if spec.get("op") in (plans.APPEND_EVENT, plans.COMMIT_ARTIFACT):
                continue  # accord's workflow log / artifacts, checked by check_staged
            if name in reserved:
                raise InvalidInputError(
                    f"business writes may not target {name!r}: it is one of accord's own "
                    f"collections in database {self.business_db!r} (listed in its "
                    f"accord_catalog). Write to the application's own collections."
                )
            self._allowed.add(str(name))

    @staticmethod
    def _task_failed(writes: Sequence[tuple[str, Any]]) -> bool:
        return any(c in FAILED_CHANNELS for c, _ in writes)


def _names(
    collections: schema.CollectionNames | None,
    checkpoints: str | None,
    writes: str | None,
) -> schema.CollectionNames:
    names = collections or schema.CollectionNames()
    if not isinstance(names, schema.CollectionNames):
        raise ConfigurationError("collections must be a CollectionNames(...).")
    changes: dict[str, str] = {}
    if checkpoints is not None:
        changes["checkpoints"] = validation.identifier(checkpoints, "checkpoint_collection_name")
    if writes is not None:
        changes["writes"] = validation.identifier(writes, "writes_collection_name")
    if changes:
        from dataclasses import replace

        names = replace(names, **changes)
    values = list(names.all().values())
    if len(set(values)) != len(values):
        raise ConfigurationError(f"collection names must differ from each other: {names}.")
    return names


def validate_writes(writes: Any) -> list[tuple[str, Any]]:
    if not isinstance(writes, Sequence) or isinstance(writes, str | bytes):
        raise InvalidInputError("writes must be a sequence of (channel, value) pairs.")
    out = []
    for i, w in enumerate(writes):
        if not isinstance(w, tuple | list) or len(w) != 2:
            raise InvalidInputError(f"writes[{i}] must be a (channel, value) pair.")
        channel = validation.identifier(w[0], f"writes[{i}] channel")
        if channel == BUSINESS_CHANNEL and not isinstance(w[1], Mapping):
            raise InvalidInputError(
                f"writes[{i}] on channel {BUSINESS_CHANNEL!r} must be a staged business "
                f"operation (a dict, as accord.checkpointers.business stages it), got "
                f"{type(w[1]).__name__}; nothing was written."
            )
        out.append((channel, w[1]))
    return out
