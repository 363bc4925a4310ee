"""What the sync and async savers share: settings, scoping, write plans, caches."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, ChannelVersions
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

from accord.checkpointers import schema, storage, validation
from accord.checkpointers.ops import Group, Op, insert_once
from accord.checkpointers.ownership import (
    BRANCH_MARKER,
    HeadPlan,
    check_put_writes,
    decide_put,
    lost_thread,
)
from accord.checkpointers.serde import RevisionCache
from accord.checkpointers.storage import BUSINESS_CHANNEL, PutDocs, RefState, Scope
from accord.errors import AccordError, ConcurrentRunError, ConfigurationError

logger = logging.getLogger(__name__)


class _HideBusinessChannel(logging.Filter):
    """LangGraph warns about writes to channels it does not know; the business channel is
    deliberate (it carries staged business writes to ``put_writes``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return BUSINESS_CHANNEL not in record.getMessage()


logging.getLogger("langgraph").addFilter(_HideBusinessChannel())


class HeadMoved(AccordError):
    """Internal: the head compare-and-set matched nothing; re-read the head and decide."""


class NotSaved(AccordError):
    """Internal: the task's checkpoint is not saved yet; wait for its put and retry."""


class AlreadyRecorded(AccordError):
    """Internal: the task's business writes were applied when it was first recorded;
    abort this transaction and record the task's writes without them."""


def mark_ids(groups: Sequence[Group]) -> list[str]:
    """``_id``s of the business marks in a put_writes plan, if it applies business writes."""
    if not any(g.name.startswith("business:") for g in groups):
        return []
    return [op.filter["_id"] for g in groups if g.name == "marks" for op in g.ops if op.filter]


def check_business_marks(marks: Any) -> None:
    """Raise AlreadyRecorded when a business mark of this task existed already."""
    if marks is not None and marks.matched:
        raise AlreadyRecorded()


#: Failures of a task: its business writes are discarded.
FAILED_CHANNELS = frozenset({ERROR, INTERRUPT})

_MESSAGE_CACHE_SIZE = 4096


class AccordBase(BaseCheckpointSaver[str]):
    """Settings and pure logic shared by :class:`AccordSaver` and :class:`AsyncAccordSaver`.

    Args:
        db_name: database holding the checkpointer's collections.
        serde: serializer for channel values, writes and checkpoints (LangGraph's
            ``JsonPlusSerializer`` by default; ``EncryptedSerializer`` works).
        tenant_id: tenant used when ``config["configurable"]["tenant_id"]`` is absent.
        collections: collection names (:class:`~accord.checkpointers.schema.CollectionNames`).
        message_channels: channels stored as short-term memory, one document per message.
        chunk_size: values larger than this are split over several documents.
        business_db: database of business collections (default: ``db_name``).
        client_bulk: use MongoDB 8.0's client-level bulkWrite; ``None`` = detect.
    """

    def __init__(
        self,
        *,
        db_name: str,
        serde: SerializerProtocol | None = None,
        tenant_id: str = schema.DEFAULT_TENANT,
        collections: schema.CollectionNames | None = None,
        message_channels: Sequence[str] = ("messages",),
        chunk_size: int = schema.DEFAULT_CHUNK_SIZE,
        business_db: str | None = None,
        client_bulk: bool | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.db_name = validation.identifier(db_name, "db_name")
        self.tenant_id = validation.identifier(tenant_id, "tenant_id")
        self.collections = collections or schema.CollectionNames()
        if isinstance(message_channels, str):
            raise ConfigurationError(
                "message_channels must be a sequence of channel names, not a string."
            )
        self.message_channels = frozenset(message_channels)
        if not isinstance(chunk_size, int) or chunk_size < 1024:
            raise ConfigurationError("chunk_size must be an int >= 1024 bytes.")
        self.chunk_size = chunk_size
        self.business_db = business_db or db_name
        self._client_bulk = client_bulk
        self._msg_cache: OrderedDict[tuple[str, ...], tuple[str, RefState]] = OrderedDict()
        self._msg_lock = threading.Lock()
        self._instance_id = uuid.uuid4().hex
        self._revisions = RevisionCache()
        # (tenant, thread, checkpoint id) -> tasks that staged business writes not yet recorded
        self._units: dict[tuple[str, str, str], set[str]] = {}
        self._units_cond = threading.Condition()

    # --- scoping and validation ----------------------------------------------------

    def tenant_of(self, config: RunnableConfig | None) -> str:
        tenant = validation.configurable(config).get("tenant_id")
        return self.tenant_id if tenant is None else validation.identifier(tenant, "tenant_id")

    def _scope(self, config: RunnableConfig) -> Scope:
        conf = validation.configurable(config)
        if "thread_id" not in conf:
            raise validation.InvalidInputError(
                "config['configurable']['thread_id'] is required (pass "
                "{'configurable': {'thread_id': '...'}})."
            )
        return Scope(
            self.tenant_of(config),
            validation.identifier(conf["thread_id"], "thread_id"),
            validation.identifier(conf.get("checkpoint_ns", ""), "checkpoint_ns", allow_empty=True),
        )

    def _scope_for(self, thread_id: Any, tenant_id: str | None) -> Scope:
        tenant = (
            self.tenant_id if tenant_id is None else validation.identifier(tenant_id, "tenant_id")
        )
        return Scope(tenant, validation.identifier(thread_id, "thread_id"), "")

    def _config_extra(self, scope: Scope, *, marker: str | None) -> dict[str, Any]:
        extra: dict[str, Any] = {BRANCH_MARKER: marker}
        if scope.tenant_id != self.tenant_id:
            extra["tenant_id"] = scope.tenant_id
        return extra

    def writer_token(self, config: RunnableConfig) -> str:
        """Identity of the writer (one graph invocation) behind a put/put_writes call.

        A LangGraph ``run_id`` when the caller set one; otherwise the invocation's runtime
        object, which LangGraph passes to every save of one run; otherwise this saver.
        """
        run_id = (config.get("metadata") or {}).get("run_id") or config.get("run_id")
        if run_id:
            return f"run:{run_id}"
        runtime = validation.configurable(config).get("__pregel_runtime")
        if runtime is not None:
            return f"{self._instance_id}:{id(runtime)}"
        return self._instance_id

    # --- staged business writes (see business.py) --------------------------------------

    def note_staged(self, tenant_id: str, thread_id: str, checkpoint_id: str, task_id: str) -> None:
        """A task of ``checkpoint_id`` staged business writes; the next ``put`` waits for
        that task's ``put_writes`` so a crash can never keep the next checkpoint while
        losing the business writes (LangGraph's "async" durability saves both concurrently)."""
        with self._units_cond:
            self._units.setdefault((tenant_id, thread_id, checkpoint_id), set()).add(task_id)

    def _unit_done(self, scope: Scope, checkpoint_id: str, task_id: str) -> None:
        key = (scope.tenant_id, scope.thread_id, checkpoint_id)
        with self._units_cond:
            tasks = self._units.get(key)
            if tasks is not None:
                tasks.discard(task_id)
                if not tasks:
                    del self._units[key]
            self._units_cond.notify_all()

    def _units_pending(self, scope: Scope, checkpoint_id: str | None) -> bool:
        if checkpoint_id is None:
            return False
        with self._units_cond:
            return (scope.tenant_id, scope.thread_id, checkpoint_id) in self._units

    def _wait_units(self, scope: Scope, checkpoint_id: str | None, timeout: float) -> None:
        if checkpoint_id is None:
            return
        key = (scope.tenant_id, scope.thread_id, checkpoint_id)
        with self._units_cond:
            self._units_cond.wait_for(lambda: key not in self._units, timeout=timeout)

    async def _await_units(self, scope: Scope, checkpoint_id: str | None, timeout: float) -> None:
        # Staging happens in node threads, so this is a thread-safe registry; poll it.
        import asyncio

        deadline = time.monotonic() + timeout
        while self._units_pending(scope, checkpoint_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.002)

    def reserved_collections(self) -> set[str]:
        return set(self.collections.all().values()) if self.business_db == self.db_name else set()

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

    # --- short-term-memory cache -----------------------------------------------------

    def _known_messages(self, scope: Scope, parent_id: str | None) -> dict[str, RefState]:
        """Message keys already stored for the parent checkpoint's message channels.

        Valid because the put's head compare-and-set proves the parent is still the head,
        so the messages it references exist. A forked put rebuilds without this.
        """
        if parent_id is None:
            return {}
        out: dict[str, RefState] = {}
        with self._msg_lock:
            for channel in self.message_channels:
                hit = self._msg_cache.get(
                    (scope.tenant_id, scope.thread_id, scope.checkpoint_ns, channel)
                )
                if hit is not None and hit[0] == parent_id:
                    out[channel] = hit[1]
        return out

    def _remember_messages(
        self,
        scope: Scope,
        checkpoint_id: str,
        refs: Mapping[str, RefState],
        parent_id: str | None = None,
    ) -> None:
        """Record the message channels' state at ``checkpoint_id``; channels this
        checkpoint did not change carry over from ``parent_id``."""
        with self._msg_lock:
            for channel in self.message_channels:
                k = (scope.tenant_id, scope.thread_id, scope.checkpoint_ns, channel)
                if channel in refs:
                    self._msg_cache[k] = (checkpoint_id, refs[channel])
                elif (
                    parent_id is not None
                    and (hit := self._msg_cache.get(k))
                    and hit[0] == parent_id
                ):
                    self._msg_cache[k] = (checkpoint_id, hit[1])
                else:
                    continue
                self._msg_cache.move_to_end(k)
            while len(self._msg_cache) > _MESSAGE_CACHE_SIZE:
                self._msg_cache.popitem(last=False)

    def _forget_thread(self, tenant_id: str, thread_id: str) -> None:
        with self._msg_lock:
            for k in [k for k in self._msg_cache if k[0] == tenant_id and k[1] == thread_id]:
                del self._msg_cache[k]

    # --- write plans -----------------------------------------------------------------

    def _group(self, name: str, collection_key: str, ops: list[Op]) -> Group:
        return Group(name, self.db_name, getattr(self.collections, collection_key), ops)

    def _build_put(
        self,
        scope: Scope,
        config: RunnableConfig,
        checkpoint: Any,
        metadata: Any,
        new_versions: ChannelVersions,
        parent_id: str | None,
        *,
        use_cache: bool,
    ) -> PutDocs:
        return storage.build_put(
            scope,
            checkpoint,
            metadata,
            new_versions,
            parent_id,
            serde=self.serde,
            chunk_size=self.chunk_size,
            message_channels=self.message_channels,
            known_messages=self._known_messages(scope, parent_id) if use_cache else {},
            revisions=self._revisions,
        )

    def _put_groups(
        self,
        scope: Scope,
        docs: PutDocs,
        plan: HeadPlan,
        checkpoint_id: str,
        run_id: Any,
        writer: str,
    ) -> list[Group]:
        ts = storage.now()
        run = run_id if isinstance(run_id, str) else None
        if plan.create:
            head = insert_once(
                {
                    "_id": scope.head_id,
                    **scope.ns_filter,
                    "checkpoint_id": checkpoint_id,
                    "run_id": run,
                    "writer": writer,
                    "updated_at": ts,
                }
            )
        else:
            head = Op(
                "update",
                {"_id": scope.head_id, "checkpoint_id": plan.expected},
                {
                    "$set": {
                        "checkpoint_id": checkpoint_id,
                        "run_id": run,
                        "writer": writer,
                        "updated_at": ts,
                    }
                },
            )
        assert docs.checkpoint is not None and docs.outbox is not None
        groups = [
            self._group("head", "heads", [head]),
            self._group("checkpoint", "checkpoints", [docs.checkpoint]),
        ]
        if docs.blobs:
            groups.append(self._group("blobs", "blobs", docs.blobs))
        if docs.messages:
            groups.append(self._group("messages", "messages", docs.messages))
        groups.append(self._group("outbox", "outbox", [docs.outbox]))
        return groups

    def _decide_put(
        self,
        scope: Scope,
        head: Mapping[str, Any] | None,
        conf: Mapping[str, Any],
        checkpoint_id: str,
        parent_id: str | None,
        metadata: Mapping[str, Any],
    ) -> HeadPlan:
        return decide_put(
            head,
            thread_id=scope.thread_id,
            checkpoint_ns=scope.checkpoint_ns,
            checkpoint_id=checkpoint_id,
            parent_id=parent_id,
            marker=conf.get(BRANCH_MARKER),
            source=metadata.get("source"),
            step=metadata.get("step"),
        )

    @staticmethod
    def _write_verdict(
        head: Mapping[str, Any] | None, checkpoint_id: str, marker: Any, writer: str
    ) -> str:
        return check_put_writes(head, checkpoint_id=checkpoint_id, marker=marker, writer=writer)

    @staticmethod
    def _after_existence(
        scope: Scope, head: Mapping[str, Any] | None, verdict: str, checkpoint_id: str, exists: bool
    ) -> None:
        """Second half of the put_writes check, once the checkpoint's existence is known."""
        if not exists:
            raise NotSaved()
        if verdict == "foreign":
            assert head is not None
            raise lost_thread(
                head,
                thread_id=scope.thread_id,
                checkpoint_ns=scope.checkpoint_ns,
                checkpoint_id=checkpoint_id,
            )

    @staticmethod
    def _checkpoint_doc_id(scope: Scope, checkpoint_id: str) -> str:
        return schema.checkpoint_doc_id(
            scope.tenant_id, scope.thread_id, scope.checkpoint_ns, checkpoint_id
        )

    @staticmethod
    def _kept_moving(scope: Scope, checkpoint_id: str) -> ConcurrentRunError:
        return ConcurrentRunError(
            f"Thread {scope.thread_id!r} (namespace {scope.checkpoint_ns!r}) kept moving while "
            f"this worker tried to save checkpoint {checkpoint_id!r}; nothing was written."
        )

    @staticmethod
    def _head_ok(plan: HeadPlan, counts: Any) -> bool:
        return counts.upserted == 1 if plan.create else counts.matched == 1

    def _writes_groups(
        self,
        scope: Scope,
        checkpoint_id: str,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
        *,
        apply_business: bool,
    ) -> list[Group]:
        """Groups of one put_writes transaction (writes, business marks, business, outbox)."""
        failed = self._task_failed(writes)
        ops, marks, _ = storage.build_writes(
            scope,
            checkpoint_id,
            writes,
            task_id,
            task_path,
            serde=self.serde,
            chunk_size=self.chunk_size,
            failed=failed,
        )
        groups = [self._group("writes", "writes", ops), self._group("marks", "writes", marks)]
        if apply_business and not failed:
            groups.extend(self._business_groups([v for c, v in writes if c == BUSINESS_CHANNEL]))
        outbox = storage.outbox_doc(scope, checkpoint_id, "writes", storage.now(), task_id=task_id)
        groups.append(self._group("outbox", "outbox", [insert_once(outbox)]))
        return groups

    def _business_groups(self, staged: list[Any]) -> list[Group]:
        groups: list[Group] = []
        for spec in staged:
            op = _business_op(spec)
            name = spec["collection"]
            if groups and groups[-1].collection == name:
                groups[-1].ops.append(op)
            else:
                groups.append(Group(f"business:{len(groups)}", self.business_db, name, [op]))
        return groups

    @staticmethod
    def _task_failed(writes: Sequence[tuple[str, Any]]) -> bool:
        return any(c in FAILED_CHANNELS for c, _ in writes)


def _business_op(spec: Mapping[str, Any]) -> Op:
    kind = spec["op"]
    if kind == "insert_one":
        return Op("insert", doc=spec["document"])
    if kind == "update_one":
        return Op("update", spec["filter"], spec["update"], upsert=spec.get("upsert", False))
    if kind == "replace_one":
        return Op("replace", spec["filter"], spec["document"], upsert=spec.get("upsert", False))
    if kind == "delete_one":
        return Op("delete", spec["filter"])
    raise ConfigurationError(f"unknown staged business operation {kind!r}")


# --- read plans (shared by the sync and async savers) ---------------------------------


def _or(clauses: list[dict[str, Any]]) -> dict[str, Any]:
    return clauses[0] if len(clauses) == 1 else {"$or": clauses}


class ReadBatch:
    """Batched reads behind a set of checkpoint documents: a constant number of queries
    (blobs, writes, messages) however many checkpoints are hydrated."""

    def __init__(
        self, tenant_id: str, docs: list[Mapping[str, Any]], serde: SerializerProtocol
    ) -> None:
        self.tenant_id = tenant_id
        self.docs = docs
        self.bodies = [storage.load_checkpoint_body(d, serde) for d in docs]
        self.serde = serde

    def blobs_filter(self) -> dict[str, Any] | None:
        keys: dict[tuple[str, str], set[str]] = {}
        for d, body in zip(self.docs, self.bodies, strict=True):
            ks = keys.setdefault((d["thread_id"], d["checkpoint_ns"]), set())
            ks.update(schema.blob_key(c, v) for c, v in body.get("channel_versions", {}).items())
            ks.update(d.get("blobs") or ())
        clauses = [
            {"thread_id": t, "checkpoint_ns": ns, "key": {"$in": sorted(ks)}}
            for (t, ns), ks in keys.items()
            if ks
        ]
        return {"tenant_id": self.tenant_id, **_or(clauses)} if clauses else None

    def writes_filter(self) -> dict[str, Any] | None:
        ids: dict[tuple[str, str], set[str]] = {}
        for d in self.docs:
            ids.setdefault((d["thread_id"], d["checkpoint_ns"]), set()).add(d["checkpoint_id"])
        clauses = [
            {
                "thread_id": t,
                "checkpoint_ns": ns,
                "checkpoint_id": next(iter(c)) if len(c) == 1 else {"$in": sorted(c)},
            }
            for (t, ns), c in ids.items()
        ]
        return {"tenant_id": self.tenant_id, **_or(clauses)} if clauses else None

    @staticmethod
    def bases_filter(tenant_id: str, blob_docs: list[Mapping[str, Any]]) -> dict[str, Any] | None:
        """Base snapshots of message-ref deltas not fetched yet (one more query, if any)."""
        missing = storage.missing_bases(blob_docs)
        clauses = [
            {"thread_id": t, "checkpoint_ns": ns, "key": {"$in": sorted(ks)}}
            for (t, ns), ks in missing.items()
        ]
        return {"tenant_id": tenant_id, **_or(clauses)} if clauses else None

    def messages_filter(self, blob_docs: list[Mapping[str, Any]]) -> dict[str, Any] | None:
        keys: dict[str, set[str]] = {}
        for b in blob_docs:
            if b.get("type") == schema.MSGREFS_TYPE:
                keys.setdefault(b["thread_id"], set()).update(b.get("refs") or ())
        clauses = [{"thread_id": t, "key": {"$in": sorted(ks)}} for t, ks in keys.items() if ks]
        return {"tenant_id": self.tenant_id, **_or(clauses)} if clauses else None

    def assemble(
        self,
        blob_docs: list[Mapping[str, Any]],
        write_docs: list[Mapping[str, Any]],
        message_docs: list[Mapping[str, Any]],
        extra: Any,
    ) -> list[Any]:
        """Build tuples; ``extra(doc)`` gives the extra configurable keys of each tuple."""
        blobs = storage.group_fragments(blob_docs, "thread_id", "checkpoint_ns", "key")
        messages = storage.group_fragments(message_docs, "key")
        writes = storage.group_fragments(write_docs, "thread_id", "checkpoint_ns", "checkpoint_id")
        return [
            storage.build_tuple(
                d,
                blobs=blobs,
                writes=writes.get((d["thread_id"], d["checkpoint_ns"], d["checkpoint_id"]), []),
                messages=messages,
                serde=self.serde,
                config_extra=extra(d),
                body=body,
            )
            for d, body in zip(self.docs, self.bodies, strict=True)
        ]

    def message_refs(
        self, blob_docs: list[Mapping[str, Any]], doc: Mapping[str, Any]
    ) -> dict[str, RefState]:
        """State of each message channel of checkpoint ``doc`` (to seed the cache)."""
        body = self.bodies[self.docs.index(doc)]
        blobs = storage.group_fragments(blob_docs, "thread_id", "checkpoint_ns", "key")
        out: dict[str, RefState] = {}
        for channel, version in body.get("channel_versions", {}).items():
            key = schema.blob_key(channel, version)
            frags = blobs.get((doc["thread_id"], doc["checkpoint_ns"], key))
            if not frags or frags[0].get("type") != schema.MSGREFS_TYPE:
                continue
            b = frags[0]
            refs = tuple(storage.full_refs(b, blobs))
            out[channel] = RefState(refs, b.get("base", key), b.get("base_len", len(refs)))
        return out


def list_query(
    saver: AccordBase,
    config: RunnableConfig | None,
    filter: Mapping[str, Any] | None,
    before: RunnableConfig | None,
) -> tuple[str, dict[str, Any]]:
    """(tenant, MongoDB filter) of ``list``; validates every input first."""
    tenant = saver.tenant_of(config)
    query: dict[str, Any] = {"tenant_id": tenant}
    conf = validation.configurable(config)
    if "thread_id" in conf:  # absent: every thread of the tenant; present: a string
        query["thread_id"] = validation.identifier(conf["thread_id"], "thread_id")
    if "checkpoint_ns" in conf and conf["checkpoint_ns"] is not None:
        query["checkpoint_ns"] = validation.identifier(
            conf["checkpoint_ns"], "checkpoint_ns", allow_empty=True
        )
    if conf.get("checkpoint_id") is not None:
        query["checkpoint_id"] = validation.identifier(conf["checkpoint_id"], "checkpoint_id")
    query.update(validation.metadata_filter(filter))
    if before is not None:
        bid = validation.configurable(before).get("checkpoint_id")
        if bid is not None:
            bid = validation.identifier(bid, "before.checkpoint_id")
            current = query.get("checkpoint_id")
            query["checkpoint_id"] = (
                {"$lt": bid} if current is None else {"$lt": bid, "$eq": current}
            )
    return tenant, query
