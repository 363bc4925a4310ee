"""Saves of a run queued under "async" durability, as data (not generated).

A put or a task's writes that LangGraph does not wait for is serialized at once into a
job and committed later, in order, by the run's drainer (``saver_queue``). What a job
holds, how a failure of one is raised again from a later call, and how a batch is named
in an error live here, shared by the sync and async savers.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    """A task's writes (no business writes), serialized and queued ("async" durability)."""

    __slots__ = ("scope", "checkpoint_id", "task_id", "docs", "done")

    def __init__(
        self, scope: Scope, checkpoint_id: str, task_id: str, docs: storage.WriteDocs
    ) -> None:
        self.scope = scope
        self.checkpoint_id = checkpoint_id
        self.task_id = task_id
        self.docs = docs
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
