"""Transaction settings shared by the sync and async savers.

Transactions run through pymongo's ``with_transaction``, which retries the whole callback
on ``TransientTransactionError`` (e.g. WriteConflict) and the commit on
``UnknownTransactionCommitResult``. Callbacks only build and send documents: no model or
tool call ever runs inside one.
"""

from __future__ import annotations

from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

#: Commit only once a majority of the replica set has the step.
WRITE_CONCERN = WriteConcern(w="majority")
#: Reads inside a step transaction (the head check) see one consistent snapshot.
READ_CONCERN = ReadConcern("snapshot")
