"""Saves of a run queued under "async" durability, as data (not generated).

A put or a task's writes that LangGraph does not wait for is serialized at once into a
job and committed later, in order, by the run's drainer (``saver_queue``). What a job
holds, how a failure of one is raised again from a later call, and how a batch is named
in an error live here, shared by the sync and async savers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata

from accord.checkpointers import cache, storage
from accord.checkpointers.storage import Scope
from accord.errors import AccordError, BusinessWriteError, TaskWriteError
from accord.platform.plan import Counts

#: How long task writes wait for the put of their checkpoint when none is in flight
#: (LangGraph submits a checkpoint's put before its tasks run, behind the previous put).
GRACE = 2.0


class NotSaved(AccordError):
    """Internal: the checkpoint of a task's writes is not stored (yet)."""


def not_saved(counts: Counts) -> BaseException:
    """The refusal of a guard that a checkpoint is stored."""
    return NotSaved()


class WritesJob:
    """A task's writes, serialized and queued ("async" durability), with the business
    writes it staged (committed with them, in the same transaction)."""

    __slots__ = ("scope", "checkpoint_id", "task_id", "docs", "business", "node", "done")

    def __init__(
        self,
        scope: Scope,
        checkpoint_id: str,
        task_id: str,
        docs: storage.WriteDocs,
        business: Sequence[Mapping[str, Any]] = (),
        node: str | None = None,
    ) -> None:
        self.scope = scope
        self.checkpoint_id = checkpoint_id
        self.task_id = task_id
        self.docs = docs
        self.business = list(business)
        self.node = node
        self.done = False


class PutJob:
    """A put, serialized: what committing it needs (and what to rebuild it from)."""

    __slots__ = ("scope", "checkpoint_id", "parent_id", "docs", "source", "parent", "done")

    def __init__(
        self,
        scope: Scope,
        checkpoint_id: str,
        parent_id: str | None,
        docs: storage.PutDocs,
        source: tuple[Checkpoint, CheckpointMetadata, ChannelVersions],
        parent: cache.Entry | None,
    ) -> None:
        self.scope = scope
        self.checkpoint_id = checkpoint_id
        self.parent_id = parent_id
        self.docs = docs
        self.source = source
        self.parent = parent
        self.done = False


def detached(checkpoint: Checkpoint) -> Checkpoint:
    """``checkpoint`` with its own copy of the sets among its channel values. LangGraph
    hands ``put`` the live set of a fan-in barrier's seen nodes (``copy_checkpoint`` is
    shallow) and adds the next step's nodes to it in place; under "async" durability the
    put runs beside that step, so the set is copied first thing, before anything else of
    the put (validation, finding its run) widens the window."""
    values = checkpoint.get("channel_values")
    if not isinstance(values, Mapping) or not any(isinstance(v, set) for v in values.values()):
        return checkpoint
    copied = {k: set(v) if isinstance(v, set) else v for k, v in values.items()}
    return {**checkpoint, "channel_values": copied}  # type: ignore[typeddict-item]


def unsure(job: PutJob) -> bool:
    """A queued put whose base stopped being known current after it was queued (the
    cache lost track of the thread): committed alone, with its parent checked."""
    return job.parent is not None and not job.parent.current


def describe(batch: Sequence[PutJob | WritesJob]) -> str:
    """What queued saves are, for an error message."""
    checkpoints = [repr(j.checkpoint_id) for j in batch if isinstance(j, PutJob)]
    tasks = [repr(j.task_id) for j in batch if isinstance(j, WritesJob)]
    parts = []
    if checkpoints:
        parts.append(f"save of checkpoint{'s' * (len(checkpoints) > 1)} {', '.join(checkpoints)}")
    if tasks:
        parts.append(f"record of task{'s' * (len(tasks) > 1)} {', '.join(tasks)}")
    return " and ".join(parts)


def again(error: BaseException) -> BaseException:
    """The failure of a queued put, raised again from a later call (a fresh exception
    of the same accord class when possible, chained to the original)."""
    if isinstance(error, BusinessWriteError):
        out: BaseException = error.copy()
    elif isinstance(error, AccordError):
        try:
            out = type(error)(str(error))
        except TypeError:
            out = error
    else:
        out = TaskWriteError(
            f"An earlier save of this run failed with {type(error).__name__}: {error}. Nothing "
            f"after the last saved checkpoint was written; resume the thread "
            f"(graph.invoke(None, config))."
        )
    if out is not error:
        out.__cause__ = error
    return out
