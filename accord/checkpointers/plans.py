"""Write plans of the checkpointer (pure data for the platform's unit of work).

Every plan that touches a thread carries a *guard* on the thread's run-registry document
(:class:`accord.platform.runs.ThreadGuard`) in its context; the kernel executes it first in
the transaction:

* the owner guard, for a run that holds the thread: refused (fenced out) if another run
  took the thread since;
* the free guard, for a write that belongs to no run: refused while a live run holds
  the thread;
* the takeover, for ``delete_thread``: whatever run holds the thread loses it.

Each sets a new ``version`` on the registry document, which is how savers know whether
their cached state of the thread is current (:mod:`accord.checkpointers.cache`).

Then, for ``put``: the checkpoint, the blobs of the changed channels, the new messages;
for ``put_writes``: the business marks (plain inserts: a mark that exists stops the
ordered bulk write before the business writes behind it, so a task recorded before is
never applied twice), the business writes, the pending writes. Events go to the outbox
in the same transaction (the outbox hook).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bson import ObjectId

from accord.checkpointers import events, schema
from accord.checkpointers.storage import PutDocs, Scope, WriteDocs
from accord.errors import ArtifactNotFound, ConfigurationError, WriteRefused
from accord.platform import gridfs_layout, runs
from accord.platform.artifacts import ARTIFACT, BUSINESS, WORKFLOW_EVENT
from accord.platform.context import WriteContext
from accord.platform.plan import Counts, Expect, Group, Op, OutboxEvent, Plan

#: Name of the guard group the kernel puts first in every plan (the run registry).
GUARD = runs.GUARD_GROUP
#: Prefix of the names of groups that hold a task's staged business writes.
BUSINESS_PREFIX = "business:"
#: Group of a guard that the checkpoint of a task's writes is stored.
SAVED = "checkpoint_saved"
MARKS = "marks"

Refusal = Callable[[Counts], BaseException]


class Target:
    """Where a saver writes: database, collection names, business database."""

    def __init__(self, db: str, names: schema.CollectionNames, business_db: str) -> None:
        self.db = db
        self.names = names
        self.business_db = business_db

    def group(self, name: str, key: str, ops: list[Op], **kw: Any) -> Group:
        return Group(name, self.db, getattr(self.names, key), schema.ARTIFACTS[key], ops, **kw)

    def thread_deleted(self, scope: Scope, version: str) -> OutboxEvent:
        """The event of a deleted thread (``version``: the deletion's registry version,
        so deleting a thread again after it was written anew is a new event)."""
        return OutboxEvent(
            self.db,
            self.names.outbox,
            events.THREAD_DELETED,
            scope.tenant_id,
            (scope.thread_id, version),
            {"thread_id": scope.thread_id, "checkpoint_ns": ""},
        )

    def event(self, scope: Scope, kind: str, checkpoint_id: str, **fields: Any) -> OutboxEvent:
        """An outbox event of the thread (the public event contract: docs/checkpointer.md)."""
        key: tuple[str, ...] = (scope.thread_id, scope.checkpoint_ns, checkpoint_id)
        if fields.get("task_id") is not None:
            key += (fields["task_id"],)
        body = {
            "thread_id": scope.thread_id,
            "checkpoint_ns": scope.checkpoint_ns,
            "checkpoint_id": checkpoint_id,
            **{k: v for k, v in fields.items() if v is not None},
        }
        return OutboxEvent(self.db, self.names.outbox, kind, scope.tenant_id, key, body)


# --- guards -----------------------------------------------------------------------------


class StillInUse(Exception):
    """Internal: an expired thread was written (or claimed) before the sweep deleted it."""


def gone(counts: Counts) -> BaseException:
    """The refusal of an expired-thread deletion whose thread was written since."""
    return StillInUse()


def context(
    scope: Scope,
    operation: str,
    guard: runs.ThreadGuard | None,
    run: runs.Lease | None = None,
) -> WriteContext:
    """The context of a plan on ``scope``'s thread: the kernel puts ``guard`` first in the
    transaction (None: the plan runs behind another plan's guard, ``execute_all``)."""
    return WriteContext(
        tenant_id=scope.tenant_id, thread_id=scope.thread_id, operation=operation,
        run=run, guard=guard,
    )  # fmt: skip


# --- put / put_writes ----------------------------------------------------------------


def put_plan(
    target: Target,
    scope: Scope,
    guard: runs.ThreadGuard | None,
    docs: PutDocs,
    checkpoint_id: str,
    *,
    parent: Group | None = None,
    run: runs.Lease | None = None,
) -> Plan:
    """A checkpoint; ``parent``: a guard that the parent is stored (when the put stores
    only what changed since a parent the saver is not sure still exists). ``guard``
    None: the plan runs behind another plan's guard in one transaction
    (``execute_all``)."""
    groups = [parent] if parent is not None else []
    groups.append(target.group("checkpoint", "checkpoints", [docs.checkpoint]))
    if docs.blobs:
        groups.append(target.group("blobs", "blobs", docs.blobs))
    if docs.messages:
        groups.append(target.group("messages", "messages", docs.messages))
    event = target.event(
        scope,
        events.CHECKPOINT,
        checkpoint_id,
        messages=docs.message_keys or None,
        **{events.CONFIGURABLE: docs.configurable or None},
    )
    return Plan(context(scope, "checkpoint.put", guard, run), groups, [event])


def saved_guard(target: Target, scope: Scope, checkpoint_id: str, refused: Refusal) -> Group:
    """That a checkpoint is stored (when the saver does not know it is): a no-op update
    that matches it."""
    op = Op("update", {"_id": scope.checkpoint_doc_id(checkpoint_id)}, {"$setOnInsert": {"_": 0}})
    return target.group(SAVED, "checkpoints", [op], expect=Expect(matched=1, error=refused))


def writes_plan(
    target: Target,
    scope: Scope,
    guard: runs.ThreadGuard | None,
    docs: WriteDocs,
    checkpoint_id: str,
    task_id: str,
    *,
    business: Sequence[Mapping[str, Any]] = (),
    saved: Group | None = None,
    run: runs.Lease | None = None,
) -> Plan:
    """A task's writes; with ``business`` (staged operations), its marks and business
    writes too. ``guard`` as in :func:`put_plan`."""
    groups: list[Group] = []
    if saved is not None:
        groups.append(saved)
    if business:
        groups.append(target.group(MARKS, "writes", list(docs.marks)))
        origin = {
            "thread_id": scope.thread_id, "checkpoint_ns": scope.checkpoint_ns,
            "checkpoint_id": checkpoint_id, "task_id": task_id,
        }  # fmt: skip
        writes = [s for s in business if s.get("op") != COMMIT_ARTIFACT]
        groups.extend(business_groups(target.business_db, writes, origin=origin))
        commits = [s for s in business if s.get("op") == COMMIT_ARTIFACT]
        if commits:
            groups.append(artifact_commits(target, scope, commits, checkpoint_id, task_id))
    if docs.ops:
        groups.append(target.group("writes", "writes", docs.ops))
    event = target.event(scope, events.WRITES, checkpoint_id, task_id=task_id)
    return Plan(context(scope, "checkpoint.put_writes", guard, run), groups, [event])


#: The staged op that appends an event to a shared workflow log (``business.append_event``).
APPEND_EVENT = "append_event"
#: The staged op that commits the reference of an artifact the task stored
#: (``saver.put_artifact`` inside a node).
COMMIT_ARTIFACT = "commit_artifact"
#: Group of a task's artifact commits.
ARTIFACT_COMMITS = "artifacts:commit"


def artifact_commits(
    target: Target,
    scope: Scope,
    staged: Sequence[Mapping[str, Any]],
    checkpoint_id: str,
    task_id: str,
) -> Group:
    """The pending artifacts a task stored, committed with its writes: each must still
    be pending on the task's thread (else :class:`~accord.errors.ArtifactNotFound`: it
    was collected as an orphan, the task's writes are not committed)."""
    ids = [str(s.get("artifact_id")) for s in staged]
    ops = [
        Op(
            "update",
            {
                "_id": i,
                "tenant_id": scope.tenant_id,
                "thread_id": scope.thread_id,
                "status": gridfs_layout.PENDING,
            },
            {
                "$set": {
                    "status": gridfs_layout.COMMITTED,
                    "checkpoint_ns": scope.checkpoint_ns,
                    "checkpoint_id": checkpoint_id,
                    "task_id": task_id,
                }
            },
        )  # fmt: skip
        for i in ids
    ]

    def collected(counts: Counts) -> BaseException:
        return ArtifactNotFound(
            f"task {task_id!r} of thread {scope.thread_id!r} stored artifacts {ids}, but not "
            f"all of them are pending any more (collected as orphans: gc_artifacts ran with "
            f"a grace shorter than the task). Nothing of the task was committed; resuming "
            f"the thread runs it again."
        )

    return Group(
        ARTIFACT_COMMITS, target.db, gridfs_layout.FILES, ARTIFACT.name, ops,
        expect=Expect(matched=len(ops), error=collected),
    )  # fmt: skip


def business_groups(
    db: str, staged: Sequence[Mapping[str, Any]], *, origin: Mapping[str, Any] | None = None
) -> list[Group]:
    """One group per run of consecutive staged ops on the same collection, in order; an
    op staged with ``expect_version`` is a group of its own, expected to match its record
    (else :class:`StaleVersion`, which the saver turns into ``VersionConflict``).
    ``origin``: the task the writes come from (the undo log records it)."""
    groups: list[Group] = []
    for spec in staged:
        op = business_op(spec)
        name = spec["collection"]
        if spec["op"] == APPEND_EVENT:
            # numbered in the transaction by the kernel's seal (platform/workflow_log.py)
            groups.append(
                Group(
                    f"{BUSINESS_PREFIX}{len(groups)}",
                    db,
                    name,
                    WORKFLOW_EVENT.name,
                    [op],
                    sources=[spec],
                )  # fmt: skip
            )
            continue
        expected = spec.get("expect_version")
        last = groups[-1] if groups else None
        if (
            expected is None
            and last is not None
            and last.collection == name
            and last.expect is None
        ):
            last.ops.append(op)
            assert last.sources is not None
            last.sources.append(spec)
            continue
        group_name = f"{BUSINESS_PREFIX}{len(groups)}"
        expect = None
        if expected is not None:
            stale = _stale(group_name, spec)
            expect = (
                Expect(deleted=1, error=stale)
                if op.kind == "delete"
                else Expect(matched=1, error=stale)
            )
        groups.append(
            Group(
                group_name,
                db,
                name,
                BUSINESS.name,
                [op],
                sources=[spec],
                expect=expect,
                origin=origin,
            )  # fmt: skip
        )
    return groups


class StaleVersion(WriteRefused):
    """A business op staged with ``expect_version`` matched no record at that version."""


def _stale(group: str, spec: Mapping[str, Any]) -> Callable[[Counts], BaseException]:
    def error(counts: Counts) -> BaseException:
        reason = (
            f"no record matching the filter is at version {spec.get('expect_version')} any "
            f"more: another writer changed or removed it first"
        )
        return StaleVersion(
            reason, group=group, collection=str(spec["collection"]), index=0, reason=reason,
            source=spec,
        )  # fmt: skip

    return error


#: The version every business write keeps on its record (see ``business``'s docstring).
VERSION_FIELD = "_version"
#: The pipeline stage that moves a record's version on (an update given as a pipeline).
_NEXT_VERSION = {"$set": {VERSION_FIELD: {"$add": [{"$ifNull": ["$" + VERSION_FIELD, 0]}, 1]}}}


#: The fields of a business record that are accord's: its version, and the expiry a legal
#: hold set aside (``held_expire_at``: a write moving it back would lift the hold).
BOOKKEEPING_FIELDS = (VERSION_FIELD, "held_expire_at")


def _bookkeeping(path: Any) -> str | None:
    """The bookkeeping field ``path`` names (itself or inside it), or None."""
    head = path.split(".", 1)[0] if isinstance(path, str) else None
    return head if head in BOOKKEEPING_FIELDS else None


def bookkeeping_problem(spec: Mapping[str, Any]) -> str | None:
    """Why a staged op would set one of accord's bookkeeping fields itself (``_version``,
    ``held_expire_at``), or filter on ``_version`` beside ``expect_version``, or None."""
    doc = spec.get("document")
    if isinstance(doc, Mapping):
        for name in BOOKKEEPING_FIELDS:
            if name in doc:
                return f"the document sets {name!r}"
    update = spec.get("update")
    if isinstance(update, Mapping):
        for operator, arg in update.items():
            if not isinstance(arg, Mapping):
                continue
            for path, value in arg.items():
                named = _bookkeeping(path) or (
                    _bookkeeping(value) if operator == "$rename" else None
                )
                if named:
                    return f"{operator} names {named!r}"
    elif isinstance(update, Sequence) and not isinstance(update, str | bytes):
        for stage in update:
            for name, arg in stage.items() if isinstance(stage, Mapping) else ():
                paths = [arg] if isinstance(arg, str) else arg
                if name == "$unset" and isinstance(paths, list | tuple):
                    named = next((n for p in paths if (n := _bookkeeping(p))), None)
                    if named:
                        return f"$unset names {named!r}"
                elif isinstance(arg, Mapping):
                    named = next((n for p in arg if (n := _bookkeeping(p))), None)
                    if named:
                        return f"{name} names {named!r}"
    filt = spec.get("filter")
    versioned = spec.get("expect_version") is not None
    if versioned and isinstance(filt, Mapping) and VERSION_FIELD in filt:
        return f"the filter names {VERSION_FIELD!r} beside expect_version"
    if spec.get("upsert") and isinstance(filt, Mapping):
        # an upsert that creates a record copies the filter's equalities into it
        named = _filter_bookkeeping(filt)
        if named:
            return f"the filter of an upsert names {named!r} (a record it creates would get it)"
    return None


#: The query operators whose clauses an upsert may copy into the record it creates.
_LOGICAL = ("$and", "$or", "$nor")


def _filter_bookkeeping(filt: Mapping[str, Any]) -> str | None:
    """The bookkeeping field a filter names, at its top level or in the clauses of
    ``$and`` / ``$or`` / ``$nor`` at any depth, or None."""
    stack: list[Any] = [filt]
    while stack:  # iterative: a put_writes caller's filter may nest without bound
        clause = stack.pop()
        if not isinstance(clause, Mapping):
            continue
        for path, value in clause.items():
            named = _bookkeeping(path)
            if named:
                return named
            if path in _LOGICAL and isinstance(value, list | tuple):
                stack.extend(value)
    return None


def _versioned_filter(spec: Mapping[str, Any]) -> Any:
    filt = spec["filter"]
    expected = spec.get("expect_version")
    if expected is None:
        return filt
    return {**filt, VERSION_FIELD: expected if expected else {"$in": [None, 0]}}


def _names_no_id(filt: Any, update: Mapping[str, Any]) -> bool:
    """Whether neither the filter nor any operator of ``update`` names ``_id``."""
    if not isinstance(filt, Mapping) or "_id" in filt:
        return False
    return not any(
        isinstance(arg, Mapping) and any(str(p).split(".", 1)[0] == "_id" for p in arg)
        for arg in update.values()
    )


def business_op(spec: Mapping[str, Any]) -> Op:
    """The op a staged business write runs: the application's op, keeping the record's
    ``_version`` (and matching only the expected one, with ``expect_version``)."""
    kind = spec["op"]
    if kind == APPEND_EVENT:
        return Op("insert", doc=spec["document"])
    if kind == "insert_one":
        # the record's _id given here rather than by the driver: the undo log names it
        return Op("insert", doc={"_id": ObjectId(), **spec["document"], VERSION_FIELD: 1})
    if kind == "update_one":
        update = spec["update"]
        if isinstance(update, Mapping):
            inc = update.get("$inc")
            versioned: Any = {
                **update,
                "$inc": {**(inc if isinstance(inc, Mapping) else {}), VERSION_FIELD: 1},
            }
            if spec.get("upsert") and _names_no_id(spec["filter"], update):
                # a record the upsert creates gets an _id the undo log knows
                on_insert = update.get("$setOnInsert")
                versioned["$setOnInsert"] = {
                    **(on_insert if isinstance(on_insert, Mapping) else {}),
                    "_id": ObjectId(),
                }
        else:
            versioned = [*update, _NEXT_VERSION]
        return Op("update", _versioned_filter(spec), versioned, upsert=spec.get("upsert", False))
    if kind == "replace_one":
        expected = spec.get("expect_version")
        # without an expected version the next one is unknown: a fresh value (versions
        # are compared for equality only) that no earlier version of the record had
        version = expected + 1 if expected is not None else secrets.randbelow(2**62) + 2**32
        doc = {**spec["document"], VERSION_FIELD: version}
        return Op("replace", _versioned_filter(spec), doc, upsert=spec.get("upsert", False))
    if kind == "delete_one":
        return Op("delete", _versioned_filter(spec))
    raise ConfigurationError(f"unknown staged business operation {kind!r}")


# --- maintenance ------------------------------------------------------------------------


def maintenance_plan(
    target: Target,
    scope: Scope,
    guard: runs.ThreadGuard,
    deletes: Sequence[tuple[str, dict[str, Any]]],
    operation: str,
    inserts: Sequence[tuple[str, list[Op]]] = (),
    extra: Sequence[Group] = (),
) -> Plan:
    """``deletes``: (collection key, filter) pairs run as ``delete_many`` in order;
    ``inserts``: (collection key, ops); ``extra``: groups on collections outside the
    saver's names (a thread's artifacts and undo log), last."""
    groups: list[Group] = []
    for i, (key, filt) in enumerate(deletes):
        groups.append(target.group(f"delete:{i}:{key}", key, [Op("delete_many", filt)]))
    for i, (key, ops) in enumerate(inserts):
        if ops:
            groups.append(target.group(f"insert:{i}:{key}", key, ops))
    groups.extend(extra)
    return Plan(context(scope, operation, guard), groups)
