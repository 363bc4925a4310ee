"""Failed writes of a plan -> what the unit of work raises (pure; no I/O).

A write can fail in several shapes: a per-operation write error of a client-level
``bulkWrite`` (``ClientBulkWriteException.write_errors``) or of a collection's
``bulk_write`` (``BulkWriteError``); a top-level error of the command (pymongo wraps it in
a ``ClientBulkWriteException`` and drops its labels); an ``OperationFailure`` of a
``findAndModify``; or a refusal on the client (a document over 16 MiB). Whatever the
shape, :func:`translate` returns:

* an ``OperationFailure`` labelled ``TransientTransactionError`` when the transaction
  should run again (the label as sent, or a WriteConflict/LockTimeout/NoSuchTransaction
  reported as a write error without it), so ``with_transaction`` retries;
* :class:`~accord.errors.WriteRefused` naming the group and op when the database
  refused one write;
* :class:`~accord.errors.DatabaseError` otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import bson
from pymongo.errors import (
    BulkWriteError,
    ClientBulkWriteException,
    InvalidDocument,
    OperationFailure,
    PyMongoError,
)

from accord.errors import DatabaseError, TransactionTimeout, WriteRefused
from accord.platform import codes, reachability
from accord.platform.plan import Group

#: MongoDB's maximum BSON document size.
MAX_BSON_SIZE = 16 * 1024 * 1024


def retryable(exc: BaseException) -> bool:
    """Whether ``with_transaction`` retries ``exc`` (the transaction or its commit)."""
    return isinstance(exc, PyMongoError) and (
        exc.has_error_label(codes.TRANSIENT_TRANSACTION_ERROR)
        or exc.has_error_label(codes.UNKNOWN_TRANSACTION_COMMIT_RESULT)
    )


def transient(code: Any, message: str, cause: BaseException) -> OperationFailure:
    """A failure that means "run the transaction again", labelled so pymongo retries."""
    err = OperationFailure(
        message,
        code,
        {"errmsg": message, "code": code, "errorLabels": [codes.TRANSIENT_TRANSACTION_ERROR]},
    )
    err.__cause__ = cause
    return err


def locate(groups: Sequence[Group], position: int) -> tuple[Group, int] | None:
    """(group, index in the group) of op number ``position`` of the flattened groups."""
    for g in groups:
        if position < len(g.ops):
            return g, position
        position -= len(g.ops)
    return None


def namespace_in(message: str) -> str | None:
    """``db.coll`` named by a server message ("... collection: db.coll index: ...")."""
    marker = "collection: "
    at = message.find(marker)
    if at < 0:
        return None
    return message[at + len(marker) :].split(" ", 1)[0] or None


def oversized(groups: Sequence[Group]) -> tuple[Group, int, int] | None:
    """(group, index, size) of the first op whose document is over 16 MiB."""
    for g in groups:
        for i, op in enumerate(g.ops):
            for part in (op.doc, op.filter):
                if isinstance(part, Mapping):
                    size = len(bson.encode(dict(part)))
                    if size > MAX_BSON_SIZE:
                        return g, i, size
    return None


def too_large(code: Any, reason: str) -> bool:
    """Whether a server's refusal says the document is over 16 MiB: mongod says so with
    10334, 17419 or 17420, or, for an insert, with BadValue "object to insert too large"."""
    if code in codes.DOCUMENT_TOO_LARGE_CODES:
        return True
    return code == codes.BAD_VALUE and "too large" in reason


def refused(
    group: Group, index: int | None, info: Mapping[str, Any], cause: BaseException
) -> WriteRefused:
    code = info.get("code")
    reason = str(info.get("errmsg") or cause)
    key_value = info.get("keyValue")
    if code in codes.DUPLICATE_KEY_CODES:
        shown = (
            ", ".join(f"{k}={v!r}" for k, v in key_value.items())
            if isinstance(key_value, Mapping) and key_value
            else "?"
        )
        what = f"duplicate key {shown}"
    elif too_large(code, reason):
        what = f"the document is over MongoDB's 16 MiB limit ({reason})"
        code = codes.BSON_OBJECT_TOO_LARGE  # one code for every path mongod refuses it on
    elif code == codes.DOCUMENT_VALIDATION_FAILURE:
        what = "the document failed the collection's validation rules"
    else:
        what = reason if code is None else f"{reason} (code {code})"
    where = "an op" if index is None else f"op #{index}"
    err = WriteRefused(
        f"The database refused {where} of {group.name!r} on collection "
        f"{group.namespace!r}: {what}. The whole transaction was rolled back; nothing of "
        f"it was written.",
        group=group.name,
        collection=group.collection,
        index=index,
        code=code if isinstance(code, int) else None,
        reason=reason,
        key_value=dict(key_value) if isinstance(key_value, Mapping) else None,
        source=group.source(index),
    )
    err.__cause__ = cause
    return err


def _failure_info(exc: OperationFailure) -> dict[str, Any]:
    details = dict(exc.details or {})
    details.setdefault("code", exc.code)
    details.setdefault("errmsg", str(exc))
    return details


def _by_namespace(groups: Sequence[Group], message: str) -> tuple[Group, int | None] | None:
    """The group a top-level error names, or the only group."""
    ns = namespace_in(message)
    named = [g for g in groups if g.namespace == ns] if ns is not None else []
    if len(named) == 1:
        g = named[0]
        return g, (0 if len(g.ops) == 1 else None)
    if len(groups) == 1:
        return groups[0], (0 if len(groups[0].ops) == 1 else None)
    return None


def translate(exc: BaseException, groups: Sequence[Group], offset: int = 0) -> BaseException:
    """The error to raise for a failed write of ``groups`` (its ops numbered from
    ``offset`` in the failed command); see the module docstring."""
    if retryable(exc):
        return exc
    if isinstance(exc, PyMongoError) and exc.timeout:
        return exc  # the time bound ran out: execute() reports it as TransactionTimeout
    info: Mapping[str, Any]
    where: tuple[Group, int | None] | None
    if isinstance(exc, ClientBulkWriteException):
        inner = exc.error
        if inner is not None and retryable(inner):
            return inner
        errors = (exc.details or {}).get("writeErrors") or []
        if errors:
            info = dict(errors[0])
            loc = locate(groups, offset + int(info.get("idx", 0)))
            where = None if loc is None else (loc[0], loc[1])
        elif isinstance(inner, InvalidDocument):
            return _client_refusal(inner, groups)
        elif isinstance(inner, OperationFailure):
            info = _failure_info(inner)
            where = _by_namespace(groups, str(info.get("errmsg", "")))
        else:
            return _database_error(inner or exc)
    elif isinstance(exc, BulkWriteError):
        errors = (exc.details or {}).get("writeErrors") or []
        if not errors:
            return _database_error(exc)
        info = errors[0]
        loc = locate(groups, offset + int(info.get("index", 0)))
        where = None if loc is None else (loc[0], loc[1])
    elif isinstance(exc, InvalidDocument):
        return _client_refusal(exc, groups)
    elif isinstance(exc, OperationFailure):
        info = _failure_info(exc)
        where = _by_namespace(groups, str(info.get("errmsg", "")))
    else:
        return _database_error(exc)
    code = info.get("code")
    if code in codes.TRANSIENT_WRITE_CODES:
        return transient(code, str(info.get("errmsg") or exc), exc)
    if where is None:
        return _database_error(exc)
    return refused(where[0], where[1], info, exc)


def _client_refusal(exc: InvalidDocument, groups: Sequence[Group]) -> BaseException:
    """pymongo refused to send a document (too large, or not encodable)."""
    big = oversized(groups)
    if big is not None:
        g, i, size = big
        return refused(
            g,
            i,
            {
                "code": codes.BSON_OBJECT_TOO_LARGE,
                "errmsg": f"document of {size:,} bytes",
            },
            exc,
        )
    only = groups[0] if len(groups) == 1 else None
    if only is not None:
        return refused(only, None, {"errmsg": f"the document cannot be encoded: {exc}"}, exc)
    return _database_error(exc)


def _database_error(exc: BaseException) -> DatabaseError:
    err = DatabaseError(
        f"The database failed the transaction: {type(exc).__name__}: {exc}. Nothing of it "
        f"was committed. Check that MongoDB is reachable and is a replica set or Atlas "
        f"(transactions need one), then retry."
    )
    err.__cause__ = exc
    return err


def failure(exc: PyMongoError, timeout: float) -> DatabaseError:
    """What a driver error that escaped the transaction loop means for the caller."""
    if reachability.is_unreachable(exc):  # no server at all: say which, and what to check
        return reachability.unreachable(exc, reachability.hosts_in(exc), timeout)
    if exc.timeout:
        if exc.has_error_label(codes.UNKNOWN_TRANSACTION_COMMIT_RESULT):
            # the commit was sent and its reply lost: it may have been applied
            kept = (
                "Whether its commit was applied is unknown (its reply was lost); its writes "
                "are idempotent, so retrying applies them once."
            )
        else:
            kept = "Nothing of it was committed."
        err: DatabaseError = TransactionTimeout(
            f"The transaction did not complete within {timeout:g}s: the last attempt failed "
            f"with {type(exc).__name__}: {exc}. {kept} The database is unreachable, "
            f"overloaded, or another writer keeps conflicting with this one; retry later."
        )
        err.__cause__ = exc
        return err
    return _database_error(exc)


def read_failure(exc: PyMongoError, collection: str, timeout: float) -> DatabaseError:
    """A read the driver could not complete, as an accord error."""
    if reachability.is_unreachable(exc):  # no server at all: say which, and what to check
        return reachability.unreachable(exc, reachability.hosts_in(exc), timeout)
    if exc.timeout:
        err: DatabaseError = TransactionTimeout(
            f"Reading {collection!r} did not complete within {timeout:g}s "
            f"({type(exc).__name__}: {exc}). The database is unreachable or overloaded; "
            f"retry later, or raise the timeout."
        )
    else:
        err = DatabaseError(
            f"Reading {collection!r} failed: {type(exc).__name__}: {exc}. Check that MongoDB "
            f"is reachable and that this principal may read the collection, then retry."
        )
    err.__cause__ = exc
    return err
