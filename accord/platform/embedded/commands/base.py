"""Command plumbing: the handler registry, the per-command context, argument parsing."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accord.platform.embedded.cursors import CursorManager
from accord.platform.embedded.engine import Engine, Txn
from accord.platform.embedded.errors import Code, EngineError, type_mismatch
from accord.platform.embedded.failpoints import FailPoints
from accord.platform.embedded.values import bson_type_name

if TYPE_CHECKING:
    from accord.platform.embedded.auth.checks import Authorizer
    from accord.platform.embedded.auth.session import AuthSession

Doc = dict[str, Any]
SERVER_VERSION = "8.0.4"
MAX_WIRE_VERSION = 25


@dataclass
class Context:
    engine: Engine
    cursors: CursorManager
    db: str
    txn: Txn
    in_transaction: bool
    session_key: bytes | None
    hello: Callable[[Doc], Doc]
    failpoints: FailPoints = field(default_factory=FailPoints)
    # Whether the engine serves TEST_COMMANDS (--enable-test-commands).
    test_commands: bool = False
    # The connection's authentication (who, and whether privileges are checked) and the
    # engine's users and roles (auth/).
    auth: AuthSession | None = None
    authz: Authorizer | None = None

    @property
    def txn_number(self) -> int | None:
        """The txnNumber of the multi-document transaction the command runs in (None:
        outside one; a retryable write's txnNumber is not a transaction's)."""
        return self.txn.txn_number if self.in_transaction else None


Handler = Callable[[Context, Doc], Doc]
COMMANDS: dict[str, Handler] = {}
# Aggregation stages that write their input to a collection ($out, $merge; commands/output).
OutputStage = Callable[[Context, list[Doc], Any], None]
PIPELINE_OUTPUTS: dict[str, OutputStage] = {}


def writes_output(name: str, cmd: Doc) -> bool:
    """True for an aggregate whose last stage writes ($out, $merge): it runs as a write."""
    if name != "aggregate":
        return False
    pipeline = cmd.get("pipeline")
    last = pipeline[-1] if isinstance(pipeline, list) and pipeline else None
    return isinstance(last, dict) and len(last) == 1 and next(iter(last)) in PIPELINE_OUTPUTS


# Arguments any command may carry besides its own fields (mongod's generic arguments).
GENERIC_ARGS = {
    "$db", "lsid", "txnNumber", "autocommit", "startTransaction", "readConcern", "writeConcern",
    "$clusterTime", "$readPreference", "apiVersion", "apiStrict", "apiDeprecationErrors",
    "maxTimeMS", "comment", "$audit", "$client", "mayBypassWriteBlocking",
}  # fmt: skip

# Commands that write: outside a transaction they run in their own autocommitted txn.
WRITE_COMMANDS = {"insert", "update", "delete", "findAndModify", "bulkWrite"}
# User and role management: outside a transaction they run in their own autocommitted
# transaction (their documents live in admin.system.users / admin.system.roles).
AUTH_WRITE_COMMANDS = {
    "createUser", "updateUser", "dropUser", "dropAllUsersFromDatabase", "grantRolesToUser",
    "revokeRolesFromUser", "createRole", "updateRole", "dropRole", "dropAllRolesFromDatabase",
    "grantRolesToRole", "revokeRolesFromRole", "grantPrivilegesToRole",
    "revokePrivilegesFromRole",
}  # fmt: skip
# Test commands (commands/testing.py): served only when the engine runs with
# --enable-test-commands; CommandNotFound otherwise, as in mongod.
TEST_COMMANDS: set[str] = set()
# Commands allowed inside a multi-document transaction (as in mongod).
TXN_COMMANDS = {
    "find", "getMore", "killCursors", "insert", "update", "delete", "findAndModify",
    "aggregate", "distinct", "bulkWrite", "commitTransaction", "abortTransaction",
    "create", "createIndexes", "ping", "hello", "isMaster", "buildInfo", "connectionStatus",
}  # fmt: skip


def command(*names: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for n in names:
            COMMANDS[n] = fn
        return fn

    return register


# -- argument helpers -----------------------------------------------------------------------

_DB_BAD = re.compile(r'[/\\. "$\x00]')


def check_db_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) >= 64 or _DB_BAD.search(name):
        raise EngineError(Code.InvalidNamespace, f"Invalid database name: '{name}'")
    return name


def coll_name(cmd: Doc, field_name: str) -> str:
    name = cmd.get(field_name)
    if not isinstance(name, str):
        raise EngineError(
            Code.InvalidNamespace,
            f"collection name has invalid type {type(name).__name__}; expected a string",
        )
    if not name or "\x00" in name or name.startswith(".") or "$" in name:
        raise EngineError(Code.InvalidNamespace, f"Invalid collection name: '{name}'")
    return name


#: mongod's bound on a namespace (``db.collection``), in bytes.
MAX_NS_BYTES = 255
#: The ``system.`` collections a client may write as documents (mongod's
#: ``isLegalClientSystemNS``; users and roles go through their own commands).
_CLIENT_SYSTEM = frozenset({"system.js"})


def ns_of(ctx: Context, cmd: Doc, field_name: str) -> str:
    return checked_ns(f"{ctx.db}.{coll_name(cmd, field_name)}")


def checked_ns(ns: str) -> str:
    """``ns``, refused (73) past mongod's 255 bytes."""
    if len(ns.encode("utf-8", "surrogatepass")) > MAX_NS_BYTES:
        raise EngineError(
            Code.InvalidNamespace,
            f"Fully qualified namespace is too long ({len(ns.encode('utf-8', 'surrogatepass')):,}"
            f" bytes; at most {MAX_NS_BYTES}): '{ns[:100]}...'",
        )
    return ns


def writable_ns(ns: str) -> str:
    """``ns``, refused (73) when it names a ``system.`` collection a client may not write
    (the engine's own catalog, ``system.views``, ``system.profile``...), as mongod does."""
    name = ns.split(".", 1)[1] if "." in ns else ns
    if name.startswith("system.") and name not in _CLIENT_SYSTEM:
        raise EngineError(Code.InvalidNamespace, f"cannot write to '{ns[:300]}'")
    if ns.startswith("local.oplog."):  # the replica set's oplog (the engine is one)
        raise EngineError(Code.InvalidNamespace, f"cannot write to '{ns[:300]}'")
    return checked_ns(ns)


def opt_doc(cmd: Doc, key: str, default: Doc | None = None) -> Doc:
    value = cmd.get(key, default)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise type_mismatch(
            f"BSON field '{key}' is the wrong type '{type(value).__name__}', expected type 'object'"
        )
    return value


def opt_int(cmd: Doc, key: str, default: int | None = None) -> int | None:
    value = cmd.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise type_mismatch(
            f"BSON field '{key}' is the wrong type '{type(value).__name__}', expected a number"
        )
    # mongod's parseIntegerElementToLong: NaN, infinities and values past 64 bits cannot be
    # counts; a fractional double is not an integer.
    if not -(2**63) <= value < 2**63 or value != value:
        raise EngineError(Code.BadValue, f"Cannot represent as a 64-bit integer: {key}: {value}")
    if isinstance(value, float) and not value.is_integer():
        raise EngineError(Code.BadValue, f"Expected an integer: {key}: {value}")
    return int(value)


def opt_bool(cmd: Doc, key: str, default: bool = False, *, strict: bool = False) -> bool:
    """A boolean flag. mongod's ``safeBool`` fields take a number too; its ``bool`` and
    ``optionalBool`` fields (``strict``: ``ordered``, ``multi``, ``upsert``, find's flags)
    only a boolean."""
    value = cmd.get(key, default)
    if value is None and strict:
        return default
    if not isinstance(value, bool) if strict else not isinstance(value, bool | int | float):
        raise type_mismatch(
            f"BSON field '{key}' is the wrong type '{bson_type_name(value)}', expected type 'bool'"
        )
    return bool(value)


def opt_list(cmd: Doc, key: str) -> list[Any]:
    value = cmd.get(key)
    if not isinstance(value, list):
        raise type_mismatch(f"BSON field '{key}' is missing or not an array")
    return value
