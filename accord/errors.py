"""The one exception hierarchy of accord.

Every message says what happened and what to do about it.
"""

from __future__ import annotations


class AccordError(Exception):
    """Base class of every error accord raises on purpose."""


class ConfigurationError(AccordError, ValueError):
    """A setting, argument or policy value is invalid."""


class ForeignDataError(ConfigurationError):
    """A database holds another saver's data where accord would write or read threads: a
    collection of accord's with documents accord did not write, or MongoDBSaver threads
    that were not migrated. Nothing was written; the message names the migration."""


class PolicyError(ConfigurationError):
    """A governance policy was refused. ``problems`` lists each as (file, line, message);
    ``line`` is None when the problem has no line of its own (a file that cannot be read)."""

    def __init__(self, message: str, problems: list[tuple[str, int | None, str]]) -> None:
        super().__init__(message, problems)
        self.problems = problems

    def __str__(self) -> str:
        return str(self.args[0])


class InvalidInputError(AccordError, ValueError):
    """A caller passed a value accord refuses before touching the database."""


class EngineStartError(AccordError):
    """The embedded engine could not be started or reached."""


class PortInUseError(EngineStartError):
    """The embedded engine's port is taken by another process (another engine, a mongod)."""


class DataDirLockedError(EngineStartError):
    """Another engine process already owns the data directory."""


class MissingExtraError(AccordError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names the
    extra to install (``pip install 'accord[server]'``)."""


class ConcurrentRunError(AccordError):
    """Another worker advanced the same thread; this worker's step was not written."""


class PermissionDenied(AccordError):
    """The principal lacks the privilege for this action on this artifact class."""


class LegalHoldError(AccordError):
    """A thread (or what it owns) is under a legal hold, so it may not be deleted, pruned
    or swept; nothing was deleted. ``hold`` describes the hold (``thread 't-1' of tenant
    'acme'``), ``hold_id`` is its id in ``accord_holds``. Release the hold first
    (``accord governance release``) if the deletion is lawful."""

    def __init__(self, message: str, *, hold: str = "", hold_id: str = "") -> None:
        super().__init__(message)
        self.hold = hold
        self.hold_id = hold_id


class BundleMismatch(AccordError):
    """A run was started on a different code/prompt/model bundle than the one resuming it.

    ``changes`` names each part that differs (``code``, ``prompt:NAME``, ``model:NAME``,
    ``graph``...) with its old and new value, so a caller can decide programmatically;
    the message says how to go on (register a migration or give an override)."""

    def __init__(self, message: str, *, changes: dict[str, tuple[object, object]] | None = None):
        super().__init__(message)
        self.changes = dict(changes or {})


class NeedsReconciliation(AccordError):
    """A recorded tool or model call has an intent but no result: the process died (or the
    call raised) while the call was in flight, so nobody knows whether it took effect. The
    call is not declared idempotent, so accord refuses to make it again blindly; the run
    is parked until a human resolves the call (``accord runs calls``).

    Attributes: ``key`` (the call's idempotency key), ``name`` (the call), ``thread_id``,
    ``task_id``, ``position`` (the call's position within its task), ``status``."""

    def __init__(
        self,
        message: str,
        *,
        key: str,
        name: str,
        thread_id: str,
        task_id: str,
        position: int,
        status: str = "needs_reconciliation",
    ) -> None:
        super().__init__(message)
        self.key = key
        self.name = name
        self.thread_id = thread_id
        self.task_id = task_id
        self.position = position
        self.status = status

    def __reduce__(self) -> tuple[object, ...]:
        details = {
            "key": self.key, "name": self.name, "thread_id": self.thread_id,
            "task_id": self.task_id, "position": self.position, "status": self.status,
        }  # fmt: skip
        return (_rebuild_reconciliation, (str(self), details))


def _rebuild_reconciliation(message: str, details: dict[str, object]) -> NeedsReconciliation:
    return NeedsReconciliation(message, **details)  # type: ignore[arg-type]


class TaskWriteError(AccordError):
    """A task's writes could not be committed, so nothing of the task is recorded.

    The run stops at the last checkpoint saved before the task: no later checkpoint is
    saved on top of it, so resuming the thread (``graph.invoke(None, config)``) re-runs
    the task.
    """


class BusinessWriteError(TaskWriteError):
    """A business write staged by a task was refused by the database (e.g. a duplicate
    key). Nothing of the task was committed: neither its business writes nor its record.

    Attributes name what failed, for programmatic handling: ``thread_id``,
    ``checkpoint_id`` (the checkpoint the task ran from, where the thread stays),
    ``task_id``, ``node``, ``collection``, ``operation`` (``insert_one``, ...), ``code``
    (the server's error code), ``reason`` (the server's message) and ``key_value`` (the
    duplicate key, when that is the reason).
    """

    def __init__(
        self,
        message: str,
        *,
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
        task_id: str | None = None,
        node: str | None = None,
        collection: str | None = None,
        operation: str | None = None,
        code: int | None = None,
        reason: str | None = None,
        key_value: object = None,
    ) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.checkpoint_id = checkpoint_id
        self.task_id = task_id
        self.node = node
        self.collection = collection
        self.operation = operation
        self.code = code
        self.reason = reason
        self.key_value = key_value

    def details(self) -> dict[str, object]:
        """The keyword arguments this error was built with."""
        return {
            "thread_id": self.thread_id,
            "checkpoint_id": self.checkpoint_id,
            "task_id": self.task_id,
            "node": self.node,
            "collection": self.collection,
            "operation": self.operation,
            "code": self.code,
            "reason": self.reason,
            "key_value": self.key_value,
        }

    def copy(self) -> BusinessWriteError:
        """A new error with the same message and details (to raise from another call)."""
        return BusinessWriteError(str(self), **self.details())  # type: ignore[arg-type]

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_business_error, (str(self), self.details()))


def _rebuild_business_error(message: str, details: dict[str, object]) -> BusinessWriteError:
    return BusinessWriteError(message, **details)  # type: ignore[arg-type]


class VersionConflict(BusinessWriteError):
    """A business write staged with ``expect_version=n`` found the record at another
    version (or gone): another agent changed it first. Nothing of the task was committed;
    resuming the thread re-runs the task on the record as it is now. ``expected`` is the
    version the task expected; the other attributes are :class:`BusinessWriteError`'s."""

    def __init__(self, message: str, *, expected: int | None = None, **details: object) -> None:
        super().__init__(message, **details)  # type: ignore[arg-type]
        self.expected = expected

    def details(self) -> dict[str, object]:
        return {**super().details(), "expected": self.expected}

    def copy(self) -> VersionConflict:
        return VersionConflict(str(self), **self.details())  # type: ignore[arg-type]

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_version_conflict, (str(self), self.details()))


def _rebuild_version_conflict(message: str, details: dict[str, object]) -> VersionConflict:
    return VersionConflict(message, **details)  # type: ignore[arg-type]


class EmbeddingDimensionError(ConfigurationError):
    """An embedder's vectors do not have the dimensions the vector index was built with."""


class DatabaseError(AccordError):
    """The database failed or could not be reached; nothing of the operation was committed
    unless the message says otherwise."""


class TransactionTimeout(DatabaseError):
    """A transaction kept failing with retryable errors (write conflicts, a lost connection,
    an unknown commit result) until its time bound ran out. Nothing of it was committed."""


class DatabaseUnreachable(TransactionTimeout):
    """No MongoDB server answered within the client's server-selection timeout (or the
    operation's bound, if shorter). The message names the hosts tried (never the
    credentials), their errors and the likely fix; nothing was written."""


class WriteRefused(AccordError):
    """The database refused one write of a transaction (a duplicate key, a validation rule,
    a document over 16 MiB, a bad update). The whole transaction was rolled back.

    Components re-raise it with their own context (the checkpointer as
    :class:`BusinessWriteError`). Attributes: ``group`` (the plan group's name),
    ``collection``, ``index`` (position of the op in its group, None when the server did
    not say), ``code`` (the server's error code, None for a client-side refusal),
    ``reason`` (the server's message), ``key_value`` (the duplicate key, when that is the
    reason) and ``source`` (what the op came from, as the plan recorded it).
    """

    def __init__(
        self,
        message: str,
        *,
        group: str,
        collection: str,
        index: int | None = None,
        code: int | None = None,
        reason: str = "",
        key_value: dict[str, object] | None = None,
        source: object = None,
    ) -> None:
        super().__init__(message)
        self.group = group
        self.collection = collection
        self.index = index
        self.code = code
        self.reason = reason
        self.key_value = key_value
        self.source = source


class LeaseLost(AccordError):
    """A worker's lease (on an outbox event, a run) expired and another worker took over
    before this one committed; nothing of this worker's commit was written."""


class RunStateError(AccordError):
    """A queued run is not in a state that allows what was asked (approving a run that is
    not waiting, cancelling one that ended, ...). Nothing was changed.

    Attributes: ``run_id``, ``status`` (the run's status when it was refused)."""

    def __init__(self, message: str, *, run_id: str, status: str | None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.status = status


class CredentialsExpired(RunStateError):
    """A run waiting for a human holds credentials (tokens) whose expiry passed during the
    pause: it is not resumed until they are refreshed (``RunQueue.refresh_credentials``,
    ``accord runs refresh``). Nothing was changed.

    Attributes: ``run_id``, ``status``, ``expired`` (credential name -> its expiry)."""

    def __init__(
        self, message: str, *, run_id: str, status: str | None, expired: dict[str, object]
    ) -> None:
        super().__init__(message, run_id=run_id, status=status)
        self.expired = expired


class RunFailed(AccordError):
    """A queued run ended without a result: it failed (its graph raised, or its wait's
    deadline failed it) or it was cancelled.

    Attributes: ``run_id``, ``status`` (``failed`` or ``cancelled``), ``error`` (what the
    run recorded, or None)."""

    def __init__(self, message: str, *, run_id: str, status: str, error: str | None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.status = status
        self.error = error


class RunTimeout(AccordError, TimeoutError):
    """Waiting for a queued run gave up before the run ended; the run goes on (wait again,
    or cancel it). Attributes: ``run_id``, ``status`` (its status when the wait ended)."""

    def __init__(self, message: str, *, run_id: str, status: str | None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.status = status


class ArtifactNotFound(AccordError):
    """No artifact with this id exists for the tenant: it was never stored, its thread was
    deleted, or it was collected as an orphan (its step never committed). Nothing was
    read; store the data again."""


class ArtifactPending(ArtifactNotFound):
    """The artifact exists but is pending: the step that stored it has not committed (its
    task is still running, failed, or its process died; or a rollback undid the step).
    Nothing was read; a reader never sees an artifact before its step commits. Read it
    again once the step committed; one that never commits is collected by
    ``gc_artifacts``. (A subclass of :class:`ArtifactNotFound`: code that handles a
    missing artifact handles this too.)"""


class ArtifactCorrupted(AccordError):
    """An artifact's stored bytes do not match its reference (length or SHA-256 digest),
    or chunks are missing. Nothing is returned; the stored copy is kept for inspection
    (``accord_artifacts.files`` / ``.chunks``)."""


class RollbackRefused(AccordError):
    """A thread cannot be rolled back: a business record the rollback would restore was
    changed since by another writer (another thread), or the rollback's target is not
    one of the thread's checkpoints. Nothing was changed.

    Attributes: ``collection`` and ``record_id`` of the record (None when the refusal is
    not about one record)."""

    def __init__(
        self, message: str, *, collection: str | None = None, record_id: object = None
    ) -> None:
        super().__init__(message)
        self.collection = collection
        self.record_id = record_id


class MemoryConflictError(AccordError):
    """Other writers kept changing the same memories while they were being written; nothing
    of this write was committed. Retry it."""


class ExtractionError(AccordError):
    """A memory extractor could not turn a conversation into memories (e.g. a chat model's
    reply was not the JSON asked for). The aggregator retries the event with backoff and
    dead-letters it after its last attempt."""


class SubjectHeld(AccordError):
    """A legal hold covers data of the data subject asked to be erased; the erasure was
    refused before anything was deleted. Release the hold (``accord governance
    release``) once the case it serves allows, then erase again."""


class EncryptionError(AccordError):
    """A value of an encrypted class could not be encrypted or decrypted: a ciphertext
    that does not belong where it was found (moved to another document, collection or
    field, or altered), or a write accord cannot bind to one document. Nothing was
    written (a write) or returned (a read)."""


class KeyDestroyed(EncryptionError):
    """A value is encrypted under a data key that no longer exists: its data subject or
    tenant was erased (crypto-shredding), so the value is unreadable by design. ``kid``
    names the destroyed key."""

    def __init__(self, message: str, *, kid: str | None = None) -> None:
        super().__init__(message)
        self.kid = kid


class MasterKeyError(EncryptionError, ConfigurationError):
    """The master key that wraps the data keys is missing, malformed, or not the one the
    data keys were wrapped under (``ACCORD_MASTER_KEY``: 32 random bytes, base64)."""
