"""What the sync and async savers share: settings, scoping, write plans, caches."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, ChannelVersions
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

from accord.checkpointers import ownership, schema, storage, validation
from accord.checkpointers.ops import BUSINESS_PREFIX, BusinessOpFailed, Group, Op, insert_once
from accord.checkpointers.ownership import (
    BRANCH_MARKER,
    HeadPlan,
    check_put_writes,
    decide_put,
    lost_thread,
)
from accord.checkpointers.serde import RevisionCache
from accord.checkpointers.storage import BUSINESS_CHANNEL, PutDocs, RefState, Scope
from accord.errors import (
    AccordError,
    BusinessWriteError,
    ConcurrentRunError,
    ConfigurationError,
    TaskWriteError,
)

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
        # (tenant, thread, ns, checkpoint id) -> task id -> failed put_writes of that task;
        # the writer's next put on top of that checkpoint is refused (see _refuse_put)
        self._failed: OrderedDict[tuple[str, ...], dict[str, FailedTask]] = OrderedDict()

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

    def _unit_done(
        self,
        scope: Scope,
        checkpoint_id: str,
        task_id: str,
        *,
        config: RunnableConfig | None = None,
        writes: Sequence[tuple[str, Any]] = (),
        error: BaseException | None = None,
    ) -> None:
        """A ``put_writes`` ended. A failure is remembered *before* the waiting ``put`` of
        the next checkpoint wakes up, so that put is refused (see :meth:`_refuse_put`);
        a later success of the same task (a resume re-ran it) clears it."""
        key = (scope.tenant_id, scope.thread_id, checkpoint_id)
        fkey = (scope.tenant_id, scope.thread_id, scope.checkpoint_ns, checkpoint_id)
        with self._units_cond:
            if error is not None:
                token, runtime = self._writer_identity(config)
                self._failed.setdefault(fkey, {})[task_id] = FailedTask(
                    task_id, _node_of(writes), error, token, runtime
                )
                self._failed.move_to_end(fkey)
                while len(self._failed) > _FAILED_SIZE:
                    self._failed.popitem(last=False)
            elif (failed := self._failed.get(fkey)) is not None:
                failed.pop(task_id, None)
                if not failed:
                    del self._failed[fkey]
            tasks = self._units.get(key)
            if tasks is not None:
                tasks.discard(task_id)
                if not tasks:
                    del self._units[key]
            self._units_cond.notify_all()

    def _writer_identity(self, config: RunnableConfig | None) -> tuple[str, Any]:
        """(writer token, the invocation's runtime object or None)."""
        if config is None:
            return self._instance_id, None
        return self.writer_token(config), validation.configurable(config).get("__pregel_runtime")

    def _refuse_put(
        self, scope: Scope, config: RunnableConfig, parent_id: str | None, checkpoint_id: str
    ) -> None:
        """Refuse a ``put`` on top of a checkpoint one of whose tasks this writer failed to
        record: the new checkpoint would say the task ran while its writes (and its
        business writes) were never committed, so a resume would not redo it.

        Only the same writer (same invocation) is refused; another run, e.g. a resume
        after the data was fixed, re-runs the task and may save on top of the checkpoint.
        """
        if parent_id is None:
            return
        token, runtime = self._writer_identity(config)
        fkey = (scope.tenant_id, scope.thread_id, scope.checkpoint_ns, parent_id)
        with self._units_cond:
            failed = [
                f
                for f in (self._failed.get(fkey) or {}).values()
                if f.writer == token and (f.runtime is None or f.runtime is runtime)
            ]
        if failed:
            raise step_not_saved(scope, checkpoint_id, parent_id, failed[0])

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
        return ownership.kept_moving(scope.thread_id, scope.checkpoint_ns, checkpoint_id)

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
                assert groups[-1].sources is not None
                groups[-1].sources.append(spec)
            else:
                groups.append(
                    Group(
                        f"{BUSINESS_PREFIX}{len(groups)}",
                        self.business_db,
                        name,
                        [op],
                        sources=[spec],
                    )
                )
        return groups

    @staticmethod
    def _business_error(
        scope: Scope, checkpoint_id: str, task_id: str, failed: BusinessOpFailed
    ) -> BusinessWriteError:
        return business_error(scope, checkpoint_id, task_id, failed)

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


# --- failed task writes ------------------------------------------------------------------

#: failed put_writes remembered per saver (checkpoints); a failure only matters until the
#: writer's next put, which follows within the same run
_FAILED_SIZE = 1_000


@dataclass(frozen=True)
class FailedTask:
    """A ``put_writes`` that raised: its task is not recorded."""

    task_id: str
    node: str | None
    error: BaseException
    writer: str
    #: the invocation's runtime object, held so its ``id()`` (part of ``writer``) cannot be
    #: reused by a later run while this record exists
    runtime: Any


def _node_of(writes: Sequence[tuple[str, Any]]) -> str | None:
    for channel, value in writes:
        if channel == BUSINESS_CHANNEL and isinstance(value, Mapping):
            node = value.get("node")
            if isinstance(node, str):
                return node
    return None


def _task_name(node: str | None, task_id: str) -> str:
    return f"node {node!r} (task {task_id!r})" if node else f"task {task_id!r}"


def _describe_key(info: Mapping[str, Any]) -> str:
    key = info.get("keyValue")
    if isinstance(key, Mapping) and key:
        return "duplicate key " + ", ".join(f"{k}={v!r}" for k, v in key.items())
    return "duplicate key"


def business_error(
    scope: Scope, checkpoint_id: str, task_id: str, failed: BusinessOpFailed
) -> BusinessWriteError:
    """The user-facing error of a staged business write the database refused."""
    spec = failed.source or {}
    info = failed.info
    code = info.get("code")
    reason_text = str(info.get("errmsg") or failed.cause)
    node = spec.get("node") if isinstance(spec.get("node"), str) else None
    operation = spec.get("op") if isinstance(spec.get("op"), str) else None
    what = f"{operation} on" if operation else "a staged write to"
    if code in (11000, 11001, 12582):
        reason = f"{_describe_key(info)} ({reason_text})"
    else:
        reason = f"{reason_text} (code {code})" if code is not None else reason_text
    count = len(failed.group.ops)
    which = "" if failed.source is not None or count == 1 else f" (one of {count} staged there)"
    message = (
        f"Business write failed in {_task_name(node, task_id)} of thread "
        f"{scope.thread_id!r}: {what} collection {failed.group.collection!r}{which} was "
        f"refused: {reason}. Nothing of the task was committed (neither its business writes "
        f"nor its task record) and no later checkpoint of this run is saved on top of it: the "
        f"thread stays at checkpoint {checkpoint_id!r}. Fix the data or the node, then resume "
        f"the thread (graph.invoke(None, config)) to re-run the task."
    )
    key_value = info.get("keyValue")
    return BusinessWriteError(
        message,
        thread_id=scope.thread_id,
        checkpoint_id=checkpoint_id,
        task_id=task_id,
        node=node,
        collection=failed.group.collection,
        operation=operation,
        code=code if isinstance(code, int) else None,
        reason=reason_text,
        key_value=dict(key_value) if isinstance(key_value, Mapping) else None,
    )


def step_not_saved(
    scope: Scope, checkpoint_id: str, parent_id: str, failed: FailedTask
) -> AccordError:
    """Why ``put`` of ``checkpoint_id`` is refused: a task of its parent was not recorded.

    Same class as the task's error when it is an accord error (so a BusinessWriteError
    stays one, with the same details), else :class:`TaskWriteError`.
    """
    prefix = (
        f"Checkpoint {checkpoint_id!r} of thread {scope.thread_id!r} was not saved: "
        f"{_task_name(failed.node, failed.task_id)} of its parent checkpoint {parent_id!r} "
        f"could not be recorded. "
    )
    err = failed.error
    out: AccordError
    if isinstance(err, BusinessWriteError):
        # Its message already says that nothing later is saved: repeat it as is, so the
        # user reads the same error whichever durability mode surfaced it.
        out = err.copy()
    elif isinstance(err, ConcurrentRunError):
        out = ConcurrentRunError(prefix + str(err))
    else:
        out = TaskWriteError(
            prefix + f"Its writes failed with {type(err).__name__}: {err}. Nothing of the task "
            f"was committed and the thread stays at checkpoint {parent_id!r}; resume the thread "
            f"(graph.invoke(None, config)) to re-run the task."
        )
    out.__cause__ = err
    return out


def unsaved_checkpoint_error(
    scope: Scope, checkpoint_id: str, task_id: str, put_error: BaseException | None
) -> AccordError:
    """Why a task's writes are refused: the checkpoint it ran from was never saved."""
    if isinstance(put_error, TaskWriteError | ConcurrentRunError):
        prefix = (
            f"The writes of task {task_id!r} of thread {scope.thread_id!r} were not committed: "
            f"the checkpoint it ran from, {checkpoint_id!r}, was not saved. "
        )
        out: AccordError
        if isinstance(put_error, BusinessWriteError):
            out = put_error.copy()
        else:
            out = type(put_error)(prefix + str(put_error))
        out.__cause__ = put_error
        return out
    return ownership.not_saved(scope.thread_id, scope.checkpoint_ns, checkpoint_id)


# --- read plans (shared by the sync and async savers) ---------------------------------


def _or(clauses: list[dict[str, Any]]) -> dict[str, Any]:
    return clauses[0] if len(clauses) == 1 else {"$or": clauses}


def merge_docs(docs: list[Any], more: Iterable[Any]) -> list[Any]:
    """``docs`` plus the documents of ``more`` it does not hold yet (by ``_id``)."""
    seen = {d["_id"] for d in docs}
    return docs + [d for d in more if d["_id"] not in seen]


def _blob_clauses(
    tenant_id: str,
    keys: Mapping[tuple[str, str], set[str]],
    chains: Mapping[tuple[str, str], Mapping[str, set[int]]],
) -> dict[str, Any] | None:
    """Filter of blobs by key, or of message-ref chain documents (never both in one
    clause: each is one indexed predicate), per (thread, ns)."""
    clauses = []
    for scope in sorted(set(keys) | set(chains)):
        thread_id, ns = scope
        inner: list[dict[str, Any]] = []
        if keys.get(scope):
            inner.append({"key": {"$in": sorted(keys[scope])}})
        if (chain := storage.chain_clause(chains.get(scope) or {})) is not None:
            inner.append(chain)
        if inner:
            clauses.append({"thread_id": thread_id, "checkpoint_ns": ns, **_or(inner)})
    return {"tenant_id": tenant_id, **_or(clauses)} if clauses else None


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

    def roots(self) -> set[tuple[str, str, str]]:
        """(thread, ns, key) of the channel values the checkpoints read."""
        return {
            (d["thread_id"], d["checkpoint_ns"], schema.blob_key(c, v))
            for d, body in zip(self.docs, self.bodies, strict=True)
            for c, v in body.get("channel_versions", {}).items()
        }

    def blobs_filter(self) -> dict[str, Any] | None:
        """Every channel value of the checkpoints, by key: one query."""
        keys: dict[tuple[str, str], set[str]] = {}
        for t, ns, key in self.roots():
            keys.setdefault((t, ns), set()).add(key)
        for d in self.docs:  # earlier layout: base snapshots of message-ref deltas
            keys.setdefault((d["thread_id"], d["checkpoint_ns"]), set()).update(
                d.get("blobs") or ()
            )
        return _blob_clauses(self.tenant_id, keys, {})

    def chains_filter(self) -> dict[str, Any] | None:
        """The message-ref chains the checkpoints end (known at save time): one query,
        none when every message channel is at a snapshot."""
        chains: dict[tuple[str, str], dict[str, set[int]]] = {}
        for d in self.docs:
            cs = chains.setdefault((d["thread_id"], d["checkpoint_ns"]), {})
            for chain, seq in d.get("chains") or ():
                cs.setdefault(chain, set()).add(int(seq))
        return _blob_clauses(self.tenant_id, {}, chains)

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

    def bases_filter(self, blob_docs: list[Mapping[str, Any]]) -> dict[str, Any] | None:
        """Message-ref chains (and base snapshots of the earlier layout) still missing:
        one more query, only when the saver did not know them at save time."""
        missing = storage.missing_links(blob_docs, self.roots())
        return _blob_clauses(
            self.tenant_id,
            {scope: ks for scope, (ks, _) in missing.items()},
            {scope: cs for scope, (_, cs) in missing.items()},
        )

    def messages_filter(self, blob_docs: list[Mapping[str, Any]]) -> dict[str, Any] | None:
        keys = storage.message_keys(blob_docs, self.roots())
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
            out[channel] = storage.ref_state(frags[0], blobs)
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
