"""What the sync and async units of work share: transaction settings and the default hooks
(the hook protocol and its phases: :mod:`accord.platform.hooks`)."""

from __future__ import annotations

from typing import Any

from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from accord.platform.outbox import OutboxHook
from accord.platform.tenancy import TenantGuard
from accord.platform.undo_log import UndoLogHook
from accord.platform.workflow_log import WorkflowLogHook

#: maxWireVersion of MongoDB 8.0, the first with the client-level ``bulkWrite`` command.
CLIENT_BULK_WRITE_WIRE_VERSION = 25
#: Ops per client-level ``bulkWrite`` command. Verbose results come back in a cursor;
#: staying within its first batch avoids a ``getMore``.
CLIENT_BULK_BATCH = 100
#: Commit only once a majority of the replica set has the transaction.
WRITE_CONCERN = WriteConcern(w="majority")
#: Reads inside a transaction see one consistent snapshot.
READ_CONCERN = ReadConcern("snapshot")
#: Default bound, in seconds, on one ``execute`` including all its retries.
DEFAULT_TIMEOUT = 30.0


def default_hooks() -> list[Any]:
    """Hooks every unit of work starts with: the tenancy guard (check), the outbox
    (derive), the workflow logs' numbering (seal), the business writes' undo log
    (seal)."""
    return [TenantGuard(), OutboxHook(), WorkflowLogHook(), UndoLogHook()]
