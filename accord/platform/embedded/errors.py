"""MongoDB server errors as the embedded engine raises and reports them.

Codes and code names follow MongoDB's src/mongo/base/error_codes.yml so that drivers
(pymongo's retry logic in particular) treat them exactly as they treat a real server's.
"""

from __future__ import annotations

from typing import Any

CODE_NAMES: dict[int, str] = {
    1: "InternalError",
    2: "BadValue",
    4: "NoSuchKey",
    9: "FailedToParse",
    11: "UserNotFound",
    13: "Unauthorized",
    14: "TypeMismatch",
    18: "AuthenticationFailed",
    26: "NamespaceNotFound",
    28: "PathNotViable",
    27: "IndexNotFound",
    40: "ConflictingUpdateOperators",
    43: "CursorNotFound",
    48: "NamespaceExists",
    50: "MaxTimeMSExpired",
    51: "UnknownError",
    52: "DollarPrefixedFieldName",
    54: "NotSingleValueField",
    56: "EmptyFieldName",
    57: "DottedFieldName",
    59: "CommandNotFound",
    66: "ImmutableField",
    67: "CannotCreateIndex",
    72: "InvalidOptions",
    73: "InvalidNamespace",
    85: "IndexOptionsConflict",
    86: "IndexKeySpecsConflict",
    96: "OperationFailed",
    112: "WriteConflict",
    115: "CommandNotSupported",
    121: "DocumentValidationFailure",
    125: "CommandFailed",
    166: "CommandNotSupportedOnView",
    197: "InvalidIndexSpecificationOption",
    225: "TransactionTooOld",
    244: "TransactionTooLarge",
    251: "NoSuchTransaction",
    256: "TransactionCommitted",
    263: "OperationNotSupportedInTransaction",
    276: "IndexBuildAborted",
    11000: "DuplicateKey",
    10334: "BSONObjectTooLarge",
    17280: "KeyTooLong",
    40352: "Location40352",
    40353: "Location40353",
    40415: "Location40415",
    40324: "Location40324",
    31254: "Location31254",
}

TRANSIENT = "TransientTransactionError"


class EngineError(Exception):
    """A MongoDB error reply: ``{ok: 0, errmsg, code, codeName, errorLabels?}``."""

    def __init__(
        self,
        code: int,
        errmsg: str,
        *,
        labels: tuple[str, ...] = (),
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(errmsg)
        self.code = code
        self.errmsg = errmsg
        self.labels = labels
        self.extra = extra or {}

    @property
    def code_name(self) -> str:
        return CODE_NAMES.get(self.code, f"Location{self.code}")

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
    return EngineError(2, msg)


def type_mismatch(msg: str) -> EngineError:
    return EngineError(14, msg)


def failed_to_parse(msg: str) -> EngineError:
    return EngineError(9, msg)


def write_conflict() -> EngineError:
    return EngineError(
        112,
        "Write conflict during plan execution and yielding is disabled. :: Please retry your "
        "operation or multi-document transaction.",
        labels=(TRANSIENT,),
    )
