"""MongoDB server error codes accord reacts to, by name (pymongo's ``helpers_shared`` model).

accord code outside the embedded engine names codes from here and never writes a bare
number. The engine's own table (every code it can answer with) is
``accord/platform/embedded/errors.py``.
"""

from __future__ import annotations

#: Internal server error (a bug, or a state the server could not handle).
INTERNAL_ERROR = 1
#: A command argument was malformed.
BAD_VALUE = 2
#: A command or operation took longer than its ``maxTimeMS``.
MAX_TIME_MS_EXPIRED = 50
#: The server does not know the command.
COMMAND_NOT_FOUND = 59
#: The authenticated user lacks a privilege the command needs (e.g. ``collMod``).
UNAUTHORIZED = 13
#: Collection or view already exists (``create`` racing another ``create``).
NAMESPACE_EXISTS = 48
#: Collection does not exist.
NAMESPACE_NOT_FOUND = 26
#: An index with the same name exists with other options.
INDEX_OPTIONS_CONFLICT = 85
#: An index with the same keys exists under another name or with other options.
INDEX_KEY_SPECS_CONFLICT = 86
#: The document to insert or update is larger than the 16 MiB BSON limit.
BSON_OBJECT_TOO_LARGE = 10334
#: mongod's other refusals of a document over 16 MiB: an update's result (17419), an
#: upsert's document (17420); an insert's is ``BadValue`` (2, "object to insert too
#: large"), told apart by its message (``write_errors.too_large``).
DOCUMENT_TOO_LARGE_CODES = frozenset({BSON_OBJECT_TOO_LARGE, 17419, 17420})
#: The document failed the collection's ``$jsonSchema`` validator.
DOCUMENT_VALIDATION_FAILURE = 121
#: An update operator was applied to a field of the wrong type (``$inc`` on a string).
TYPE_MISMATCH = 14
#: An update would change ``_id`` (immutable).
IMMUTABLE_FIELD = 66
#: An update path is invalid or conflicts with another path of the same update.
CONFLICTING_UPDATE_OPERATORS = 40
#: Another transaction wrote the same document first (retry the whole transaction).
WRITE_CONFLICT = 112
#: A lock could not be taken in time inside a transaction (retry the transaction).
LOCK_TIMEOUT = 24
#: The transaction is gone on the server (aborted, expired) (retry the transaction).
NO_SUCH_TRANSACTION = 251
#: The transaction's ``txnNumber`` is older than the session's latest.
TRANSACTION_TOO_OLD = 225
#: A write targeted a collection inside a transaction that may not be written there.
OPERATION_NOT_SUPPORTED_IN_TRANSACTION = 263
#: Duplicate key on insert.
DUPLICATE_KEY = 11000
#: Duplicate key (legacy code some servers report on update).
DUPLICATE_KEY_ON_UPDATE_LEGACY = 11001
#: Duplicate key raised from an update (older servers).
DUPLICATE_KEY_ON_UPDATE = 12582
#: The server is not primary (any more); retryable.
NOT_WRITABLE_PRIMARY = 10107
#: The server is shutting down; retryable.
INTERRUPTED_AT_SHUTDOWN = 11600
#: The operation was killed (e.g. ``killOp``, session killed).
INTERRUPTED = 11601
#: The server refused a write because its disk is full (or another storage failure).
OUT_OF_DISK_SPACE = 14031

#: Codes that mean "this key already exists", whichever form the server reports.
DUPLICATE_KEY_CODES = frozenset(
    {DUPLICATE_KEY, DUPLICATE_KEY_ON_UPDATE_LEGACY, DUPLICATE_KEY_ON_UPDATE}
)

#: Codes that mean "run the whole transaction again", even when they arrive as a write
#: error of a bulk write, which carries no ``TransientTransactionError`` label.
TRANSIENT_WRITE_CODES = frozenset({WRITE_CONFLICT, LOCK_TIMEOUT, NO_SUCH_TRANSACTION})

#: Labels pymongo and the server attach to errors worth retrying.
TRANSIENT_TRANSACTION_ERROR = "TransientTransactionError"
UNKNOWN_TRANSACTION_COMMIT_RESULT = "UnknownTransactionCommitResult"
