"""MongoDB server errors as the embedded engine raises and reports them.

Codes and code names follow MongoDB's src/mongo/base/error_codes.yml so that drivers
(pymongo's retry logic in particular) treat them exactly as they treat a real server's.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class Code(IntEnum):
    """MongoDB error codes by name; each member's name is the ``codeName`` mongod reports.

    Assertion codes without a name in error_codes.yml are reported by mongod as
    ``Location<code>``; they are listed the same way, with what they mean.
    """

    InternalError = 1
    BadValue = 2
    NoSuchKey = 4
    GraphContainsCycle = 5
    HostUnreachable = 6
    HostNotFound = 7
    UnknownError = 8
    FailedToParse = 9
    UserNotFound = 11
    Unauthorized = 13
    TypeMismatch = 14
    ProtocolError = 17
    Overflow = 15
    InvalidLength = 16
    AuthenticationFailed = 18
    IllegalOperation = 20
    LockTimeout = 24
    NamespaceNotFound = 26
    IndexNotFound = 27
    PathNotViable = 28
    RoleNotFound = 31
    ConflictingUpdateOperators = 40
    CursorNotFound = 43
    NoMatchingDocument = 47
    NamespaceExists = 48
    InvalidRoleModification = 49
    MaxTimeMSExpired = 50
    DollarPrefixedFieldName = 52
    InvalidIdField = 53
    NotSingleValueField = 54
    EmptyFieldName = 56
    DottedFieldName = 57
    CommandNotFound = 59
    WriteConcernFailed = 64
    ImmutableField = 66
    CannotCreateIndex = 67
    IndexAlreadyExists = 68
    InvalidOptions = 72
    InvalidNamespace = 73
    UnknownReplWriteConcern = 79
    IndexOptionsConflict = 85
    IndexKeySpecsConflict = 86
    NetworkTimeout = 89
    ShutdownInProgress = 91
    OperationFailed = 96
    UnsatisfiableWriteConcern = 100
    WriteConflict = 112
    CommandNotSupported = 115
    DocumentValidationFailure = 121
    CommandFailed = 125
    ReadConcernMajorityNotAvailableYet = 134
    ViewDepthLimitExceeded = 165
    CommandNotSupportedOnView = 166
    OptionNotSupportedOnView = 167
    InvalidPipelineOperator = 168
    QueryPlanKilled = 175
    InvalidViewDefinition = 182
    PrimarySteppedDown = 189
    InvalidIndexSpecificationOption = 197
    NoSuchSession = 206
    InvalidUUID = 207
    TransactionTooOld = 225
    CursorKilled = 237
    NotImplemented = 238
    SnapshotTooOld = 239
    ConversionFailure = 241
    SnapshotUnavailable = 246
    NoSuchTransaction = 251
    TransactionCommitted = 256
    TransactionTooLarge = 257
    ExceededTimeLimit = 262
    OperationNotSupportedInTransaction = 263
    FailPointSetFailed = 266
    PreparedTransactionInProgress = 267
    IndexBuildAborted = 276
    ChangeStreamHistoryLost = 286
    TransactionExceededLifetimeLimitSeconds = 290
    CursorInUse = 292
    APIStrictError = 323
    MechanismUnavailable = 334
    SocketException = 9001
    NotWritablePrimary = 10107
    BSONObjectTooLarge = 10334
    DuplicateKey = 11000
    InterruptedAtShutdown = 11600
    Interrupted = 11601
    InterruptedDueToReplStateChange = 11602
    NotPrimaryNoSecondaryOk = 13435
    NotPrimaryOrSecondary = 13436
    KeyTooLong = 17280
    MergeStageNoMatchingDocument = 13113
    OutOfDiskSpace = 14031
    IDLDuplicateField = 40413
    IDLFailedToParse = 40414
    IDLUnknownField = 40415
    ClientMarkedKilled = 46841
    NotARetryableWriteCommand = 50768
    BackupCursorOpenConflictWithCheckpoint = 50915
    # Assertion codes (mongod reports them as Location<code>):
    Location15947 = 15947  # $facet: fields must be specified in an object
    Location15958 = 15958  # $limit / $skip: bad argument
    Location15975 = 15975  # $sort: key ordering must be 1 or -1
    Location15976 = 15976  # $sort: needs at least one key
    Location15981 = 15981  # $unwind: spec must be a string or an object
    Location16610 = 16610  # $mod: divisor is zero
    Location16493 = 16493  # an expression made a string of 16 MB or more
    Location16764 = 16764  # a hashed index cannot be unique
    Location16410 = 16410  # field path references must be prefixed with '$' / not start with $
    Location17217 = 17217  # distinct: the values would exceed 16 MB
    Location17276 = 17276  # $$var use of an undefined variable
    Location17420 = 17420  # an upsert would insert a document over 16 MB
    Location28809 = 28809  # $unwind: preserveNullAndEmptyArrays must be a boolean
    Location28810 = 28810  # $unwind: includeArrayIndex must be a non-empty string
    Location28811 = 28811  # $unwind: unrecognized option
    Location28818 = 28818  # $unwind: path must start with '$'
    Location28822 = 28822  # $unwind: includeArrayIndex must not start with '$'
    Location31002 = 31002  # $unset: spec must be a string or an array
    Location31119 = 31119  # $unset: spec must name at least one field
    Location31254 = 31254  # projection mixes inclusion and exclusion
    Location31320 = 31320  # $merge into an internal database (admin, local, config)
    Location31321 = 31321  # $out to an internal database (admin, local, config)
    Location40156 = 40156  # $count: bad field name
    Location40319 = 40319  # $lookup: 'as' is required
    Location51002 = 51002  # createRole: the role already exists
    Location51003 = 51003  # createUser: the user already exists
    Location5626701 = 5626701  # a connection authenticates once (another database)
    Location5626702 = 5626702  # a connection authenticates once (another user)
    Location40321 = 40321  # $lookup: localField and foreignField go together
    Location40323 = 40323  # a pipeline stage must have exactly one field
    Location40324 = 40324  # unrecognized pipeline stage name
    Location40352 = 40352  # FieldPath cannot be constructed with empty string
    Location40353 = 40353  # FieldPath must not end with a '.'
    Location40571 = 40571  # OP_MSG requests require a $db argument
    Location40600 = 40600  # stage not allowed within a $facet stage
    Location40601 = 40601  # stage only valid as the last stage of a pipeline
    Location40602 = 40602  # stage only valid as the first stage of a pipeline
    Location51173 = 51173  # find min()/max() without a hint
    Location51174 = 51174  # find min()/max() not the hinted index's fields
    Location50736 = 50736  # getMore in a session on a cursor opened outside one
    Location50737 = 50737  # getMore without an lsid on a cursor opened in a session
    Location50738 = 50738  # getMore in another session than the cursor's
    Location50739 = 50739  # getMore in a transaction on a cursor opened outside one
    Location50740 = 50740  # getMore outside a transaction on a transaction's cursor
    Location50741 = 50741  # getMore in another transaction than the cursor's
    Location50889 = 50889  # a txnNumber on a command that needs no authentication
    Location50911 = 50911  # a transaction with this txnNumber was already started
    Location51047 = 51047  # stage not allowed within a $lookup's sub-pipeline
    Location51156 = 51156  # error executing a regular expression (mongod: PCRE's match limit)
    Location51183 = 51183  # $merge 'on' fields need a unique index
    Location51185 = 51185  # $merge 'on' field missing, repeated or an array
    Location51091 = 51091  # invalid regular expression
    Location7912700 = 7912700  # $vectorSearch: limit must be positive (mongod's own check)
    Location8575100 = 8575100  # $vectorSearch: limit must be a number (mongod's own check)


TRANSIENT = "TransientTransactionError"
RETRYABLE_WRITE = "RetryableWriteError"

# error_codes.yml's RetriableError category: a retryable write (or a transaction's commit
# or abort) that fails with one of these may be retried by the driver.
RETRYABLE_CODES = frozenset({
    Code.HostUnreachable, Code.HostNotFound, Code.NetworkTimeout, Code.ShutdownInProgress,
    Code.ReadConcernMajorityNotAvailableYet, Code.PrimarySteppedDown, Code.ExceededTimeLimit,
    Code.SocketException, Code.NotWritablePrimary, Code.InterruptedAtShutdown,
    Code.InterruptedDueToReplStateChange, Code.NotPrimaryNoSecondaryOk,
    Code.NotPrimaryOrSecondary, Code.BackupCursorOpenConflictWithCheckpoint,
})  # fmt: skip
# NotPrimaryError category: a reply with one of these carries the server's
# topologyVersion, so a driver can tell a stale error from a real state change. (mongod
# adds it to ShutdownError replies only while really shutting down, so a shutdown error a
# fail point injects makes drivers clear their pool, as drivers' tests expect.)
STATE_CHANGE_CODES = frozenset({
    Code.NotWritablePrimary, Code.NotPrimaryNoSecondaryOk, Code.NotPrimaryOrSecondary,
    Code.InterruptedDueToReplStateChange, Code.PrimarySteppedDown,
})  # fmt: skip
# Errors after which a whole transaction may be retried (besides the retryable ones).
_TRANSIENT_CODES = frozenset({
    Code.WriteConflict, Code.LockTimeout, Code.PreparedTransactionInProgress,
    Code.SnapshotTooOld, Code.SnapshotUnavailable,
})  # fmt: skip


def server_error_labels(cmd: dict[str, Any], code: int | None, wc_code: int | None) -> list[str]:
    """The labels mongod adds to a reply (its ErrorLabelBuilder).

    ``code`` is the command's error code (None if it succeeded), ``wc_code`` that of its
    ``writeConcernError``. Inside a transaction (``autocommit`` present) transient errors
    get TransientTransactionError; a retryable write (``txnNumber`` without ``autocommit``)
    or a transaction's commit/abort failing with a retryable code gets RetryableWriteError.
    """
    name = next(iter(cmd), "")
    has_txn_number = cmd.get("txnNumber") is not None
    in_transaction = has_txn_number and "autocommit" in cmd
    commit_or_abort = name in ("commitTransaction", "abortTransaction")
    if code is not None and in_transaction:
        transient = code in _TRANSIENT_CODES
        if commit_or_abort:
            transient |= code == Code.NoSuchTransaction and wc_code is None
        else:
            transient |= code in RETRYABLE_CODES or code == Code.NoSuchTransaction
        if transient:
            return [TRANSIENT]
    retryable = (has_txn_number and "autocommit" not in cmd) or (in_transaction and commit_or_abort)
    if retryable and (code in RETRYABLE_CODES or wc_code in RETRYABLE_CODES):
        return [RETRYABLE_WRITE]
    return []


def code_name(code: int) -> str:
    """The ``codeName`` mongod reports for ``code``."""
    try:
        return Code(code).name
    except ValueError:
        return f"Location{code}"


class EngineError(Exception):
    """A MongoDB error reply: ``{ok: 0, errmsg, code, codeName, errorLabels?}``."""

    def __init__(
        self,
        code: int | Code,
        errmsg: str,
        *,
        labels: tuple[str, ...] = (),
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(errmsg)
        self.code = int(code)
        self.errmsg = errmsg
        self.labels = labels
        self.extra = extra or {}

    @property
    def code_name(self) -> str:
        return code_name(self.code)

    def to_reply(self) -> dict[str, Any]:
        reply: dict[str, Any] = {
            "ok": 0.0,
            "errmsg": self.errmsg,
            "code": self.code,
            "codeName": self.code_name,
        }
        reply.update(self.extra)
        if self.labels:
            reply["errorLabels"] = list(self.labels)
        return reply

    def to_write_error(self, index: int) -> dict[str, Any]:
        """The shape of one entry of a write command's ``writeErrors`` array."""
        entry: dict[str, Any] = {"index": index, "code": self.code, "errmsg": self.errmsg}
        entry.update(self.extra)
        return entry


def bad_value(msg: str) -> EngineError:
    return EngineError(Code.BadValue, msg)


def type_mismatch(msg: str) -> EngineError:
    return EngineError(Code.TypeMismatch, msg)


def failed_to_parse(msg: str) -> EngineError:
    return EngineError(Code.FailedToParse, msg)


def write_conflict() -> EngineError:
    return EngineError(
        Code.WriteConflict,
        "Write conflict during plan execution and yielding is disabled. :: Please retry your "
        "operation or multi-document transaction.",
        labels=(TRANSIENT,),
    )
