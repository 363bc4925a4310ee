"""The checkpointer's errors: what failed, in LangGraph's terms, and what to do.

The unit of work reports a refused write as :class:`~accord.errors.WriteRefused` naming
the plan group and op; here it becomes a :class:`~accord.errors.BusinessWriteError`
naming the node, the task, the thread and the staged operation. A task whose writes were
not recorded stops its run: the next ``put`` of that run is refused with the task's own
error (:func:`step_not_saved`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accord.checkpointers.ownership import FailedTask
from accord.checkpointers.plans import StaleVersion
from accord.checkpointers.storage import BUSINESS_CHANNEL, Scope
from accord.errors import (
    AccordError,
    BusinessWriteError,
    ConcurrentRunError,
    DatabaseError,
    TaskWriteError,
    TransactionTimeout,
    VersionConflict,
    WriteRefused,
)
from accord.platform import codes, reachability


def node_of(writes: Sequence[tuple[str, Any]]) -> str | None:
    """The node that staged business writes among ``writes``, if it said."""
    for channel, value in writes:
        if channel == BUSINESS_CHANNEL and isinstance(value, Mapping):
            node = value.get("node")
            if isinstance(node, str):
                return node
    return None


def task_name(node: str | None, task_id: str) -> str:
    return f"node {node!r} (task {task_id!r})" if node else f"task {task_id!r}"


def _describe_key(key: Any) -> str:
    if isinstance(key, Mapping) and key:
        return "duplicate key " + ", ".join(f"{k}={v!r}" for k, v in key.items())
    return "duplicate key"


def business_error(
    scope: Scope, checkpoint_id: str, task_id: str, refused: WriteRefused, ops_in_group: int
) -> BusinessWriteError:
    """The user-facing error of a staged business write the database refused."""
    spec = refused.source if isinstance(refused.source, Mapping) else {}
    code = refused.code
    reason_text = refused.reason or str(refused)
    node = spec.get("node") if isinstance(spec.get("node"), str) else None
    operation = spec.get("op") if isinstance(spec.get("op"), str) else None
    what = f"{operation} on" if operation else "a staged write to"
    if code in codes.DUPLICATE_KEY_CODES:
        reason = f"{_describe_key(refused.key_value)} ({reason_text})"
    else:
        reason = f"{reason_text} (code {code})" if code is not None else reason_text
    which = "" if spec or ops_in_group == 1 else f" (one of {ops_in_group} staged there)"
    if isinstance(refused, StaleVersion):
        expected = spec.get("expect_version")
        return VersionConflict(
            f"Version conflict in {task_name(node, task_id)} of thread {scope.thread_id!r}: "
            f"{what} collection {refused.collection!r} expected the record at version "
            f"{expected}, but {reason_text}. Nothing of the task was committed (neither its "
            f"business writes nor its task record): the thread stays at checkpoint "
            f"{checkpoint_id!r}. Resume the thread (graph.invoke(None, config)) to re-run "
            f"the task on the record as it is now.",
            expected=expected if isinstance(expected, int) else None,
            thread_id=scope.thread_id, checkpoint_id=checkpoint_id, task_id=task_id,
            node=node, collection=refused.collection, operation=operation, code=None,
            reason=reason_text,
        )  # fmt: skip
    message = (
        f"Business write failed in {task_name(node, task_id)} of thread "
        f"{scope.thread_id!r}: {what} collection {refused.collection!r}{which} was "
        f"refused: {reason}. Nothing of the task was committed (neither its business writes "
        f"nor its task record) and no later checkpoint of this run is saved on top of it: the "
        f"thread stays at checkpoint {checkpoint_id!r}. Fix the data or the node, then resume "
        f"the thread (graph.invoke(None, config)) to re-run the task."
    )
    return BusinessWriteError(
        message,
        thread_id=scope.thread_id,
        checkpoint_id=checkpoint_id,
        task_id=task_id,
        node=node,
        collection=refused.collection,
        operation=operation,
        code=code,
        reason=reason_text,
        key_value=dict(refused.key_value) if refused.key_value else None,
    )


def invalid_business_write(
    scope: Scope, task_id: str, node: str | None, err: Exception
) -> AccordError:
    """A staged business write the platform refused before sending it (tenancy)."""
    out = type(err)(
        f"A business write staged by {task_name(node, task_id)} of thread {scope.thread_id!r} "
        f"was refused before anything was sent: {err} Nothing of the task was committed; fix "
        f"the node, then resume the thread (graph.invoke(None, config))."
    )
    out.__cause__ = err
    return out  # type: ignore[return-value]


def step_not_saved(
    scope: Scope, checkpoint_id: str, parent_id: str, failed: FailedTask
) -> AccordError:
    """Why ``put`` of ``checkpoint_id`` is refused: a task of its parent was not recorded.

    Same class as the task's error when it is an accord error (so a BusinessWriteError
    stays one, with the same details), else :class:`TaskWriteError`.
    """
    prefix = (
        f"Checkpoint {checkpoint_id!r} of thread {scope.thread_id!r} was not saved: "
        f"{task_name(failed.node, failed.task_id)} of its parent checkpoint {parent_id!r} "
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


def unsaved_checkpoint(
    scope: Scope, checkpoint_id: str, task_id: str, put_error: BaseException | None
) -> AccordError:
    """Why a task's writes with business writes are refused: the checkpoint it ran from
    was never saved (its put failed, or never came)."""
    prefix = (
        f"The writes of task {task_id!r} of thread {scope.thread_id!r} were not committed: "
        f"the checkpoint it ran from, {checkpoint_id!r}, was not saved. "
    )
    out: AccordError
    if isinstance(put_error, BusinessWriteError):
        out = put_error.copy()
    elif isinstance(put_error, TaskWriteError | ConcurrentRunError):
        out = type(put_error)(prefix + str(put_error))
    elif put_error is not None:
        out = TaskWriteError(
            prefix + f"Its save failed with {type(put_error).__name__}: {put_error}. "
            f"Resume the thread (graph.invoke(None, config)) to re-run the task."
        )
    else:
        out = TaskWriteError(
            prefix + "Its business writes commit only with a saved checkpoint, so that a "
            "crash can never apply them twice; nothing of the task was committed. Resume "
            "the thread (graph.invoke(None, config)) to re-run the task."
        )
    out.__cause__ = put_error
    return out


def read_failed(exc: BaseException, collection: str, timeout: float) -> DatabaseError:
    """A read the driver could not complete, as an accord error."""
    if reachability.is_unreachable(exc):  # no server at all: say which, and what to check
        return reachability.unreachable(exc, reachability.hosts_in(exc), timeout)
    if getattr(exc, "timeout", False):
        err: DatabaseError = TransactionTimeout(
            f"Reading {collection!r} did not complete within {timeout:g}s "
            f"({type(exc).__name__}: {exc}). The database is unreachable or overloaded; "
            f"retry later, or raise the saver's timeout."
        )
    else:
        err = DatabaseError(
            f"Reading {collection!r} failed: {type(exc).__name__}: {exc}. Check that MongoDB "
            f"is reachable and that the saver's user may read its collections, then retry."
        )
    err.__cause__ = exc
    return err
