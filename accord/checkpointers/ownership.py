"""Single writer per thread: who may extend a thread's checkpoint chain.

Each (tenant, thread, namespace) has a *head* document naming the checkpoint that may be
extended. Every ``put`` compares-and-sets it inside the step transaction:

* ``put`` whose parent is the head advances it. Two workers that loaded the same head race
  on that compare-and-set; exactly one transaction commits, the other gets
  :class:`~accord.errors.ConcurrentRunError` and none of its documents are written.
* A parent that is *not* the head is a stale writer, unless the caller branched on purpose:
  LangGraph's own fork/update checkpoints (``metadata.source`` ``"fork"``/``"update"``),
  or a config that came from an *addressed* read (``get_tuple`` with a ``checkpoint_id``,
  or ``list``), which carries :data:`BRANCH_MARKER` naming the checkpoint it read. That is
  how time travel and ``update_state`` keep working while a stale worker cannot.
* No parent while a head exists starts a new root. LangGraph only does that for a thread
  it believes empty (``source="input"``, ``step=-1``), so that case means two workers both
  started the thread: the second is refused. Other parent-less puts (tools, migrations,
  the conformance suite) are allowed.

``put_writes`` must target the head (or the addressed checkpoint named by the marker):
a stale worker's task results never commit, and neither do the business writes staged
with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accord.errors import ConcurrentRunError

#: configurable key set on configs returned by addressed reads; see the module docstring.
BRANCH_MARKER = "__accord_branch_from"

#: What to do about a ConcurrentRunError; every message ends with it.
WHAT_TO_DO = (
    "Only one worker may advance a thread at a time: reload the thread's latest state "
    "(graph.get_state(config) or saver.get_tuple(config) without a checkpoint_id) and "
    "retry from there, and make sure a single worker runs this thread."
)

EXPLICIT_BRANCH_SOURCES = frozenset({"fork", "update"})


@dataclass(frozen=True)
class HeadPlan:
    """How a put transaction updates the head document.

    ``expected`` is the head checkpoint id to compare-and-set against; ``None`` means the
    head document must not exist yet (create it).
    """

    expected: str | None
    create: bool


def fast_plan(parent_id: str | None) -> HeadPlan | None:
    """The optimistic plan used before reading anything: the parent is the head."""
    return HeadPlan(expected=parent_id, create=False) if parent_id is not None else None


def decide_put(
    head: Mapping[str, Any] | None,
    *,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str,
    parent_id: str | None,
    marker: Any,
    source: Any,
    step: Any,
) -> HeadPlan:
    """Decide, from the current head document, whether this put may proceed."""
    if head is None:
        return HeadPlan(expected=None, create=True)
    current = head.get("checkpoint_id")
    if current in (checkpoint_id, parent_id):
        # Idempotent re-put of the head itself, or the fast path lost a benign race.
        return HeadPlan(expected=current, create=False)
    if parent_id is None:
        if source == "input" and step == -1:
            raise ConcurrentRunError(
                f"Thread {thread_id!r} (namespace {checkpoint_ns!r}) already has checkpoint "
                f"{current!r} (run {head.get('run_id')!r}), but this worker started it as a new "
                f"thread with checkpoint {checkpoint_id!r}: another worker started the same "
                f"thread at the same time. Nothing of this step was written. {WHAT_TO_DO}"
            )
        return HeadPlan(expected=current, create=False)
    if source in EXPLICIT_BRANCH_SOURCES or (marker is not None and marker == parent_id):
        return HeadPlan(expected=current, create=False)
    raise ConcurrentRunError(
        f"Thread {thread_id!r} (namespace {checkpoint_ns!r}) was advanced by another writer: "
        f"its head is {current!r} (run {head.get('run_id')!r}), but this step (checkpoint "
        f"{checkpoint_id!r}) extends {parent_id!r}. Nothing of this step was written. "
        f"{WHAT_TO_DO} To branch from an older checkpoint on purpose, pass its checkpoint_id "
        f"(time travel) instead."
    )


def check_put_writes(
    head: Mapping[str, Any] | None,
    *,
    checkpoint_id: str,
    marker: Any,
    writer: str,
) -> str:
    """Classify a ``put_writes`` against the thread's head.

    ``"ok"``: the checkpoint is the head, or was addressed on purpose: write.
    ``"mine"``: the head belongs to this same writer, which moved on (LangGraph's "async"
    durability saves the next checkpoint concurrently with the previous step's writes), or
    there is no head yet: write only if the checkpoint is saved.
    ``"foreign"``: another writer owns the head: refuse if the checkpoint is saved (this
    worker lost the thread); if it is not saved yet, wait for this process's own put of it.
    """
    if head is not None and (head.get("checkpoint_id") == checkpoint_id or marker == checkpoint_id):
        return "ok"
    if head is None or head.get("writer") == writer:
        return "mine"
    return "foreign"


def lost_thread(
    head: Mapping[str, Any], *, thread_id: str, checkpoint_ns: str, checkpoint_id: str
) -> ConcurrentRunError:
    return ConcurrentRunError(
        f"Thread {thread_id!r} (namespace {checkpoint_ns!r}) moved on to checkpoint "
        f"{head.get('checkpoint_id')!r} (run {head.get('run_id')!r}) written by another worker "
        f"while this worker ran a task of checkpoint {checkpoint_id!r}. The task's writes and "
        f"business writes were not committed. {WHAT_TO_DO}"
    )


def not_saved(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> ConcurrentRunError:
    return ConcurrentRunError(
        f"Checkpoint {checkpoint_id!r} of thread {thread_id!r} (namespace {checkpoint_ns!r}) "
        f"was never saved (another worker advanced the thread first), so the writes and "
        f"business writes of this task of it were not committed. {WHAT_TO_DO}"
    )


def kept_moving(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> ConcurrentRunError:
    return ConcurrentRunError(
        f"Thread {thread_id!r} (namespace {checkpoint_ns!r}) kept moving while this worker "
        f"tried to save checkpoint {checkpoint_id!r}: its head changed at every attempt, so "
        f"another worker is advancing it. Nothing of this step was written. {WHAT_TO_DO}"
    )
