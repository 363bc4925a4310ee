"""Administrative and handshake commands."""

from __future__ import annotations

import datetime as dt
import time

import bson

from accord.platform.embedded.commands.base import (
    SERVER_VERSION,
    Context,
    Doc,
    command,
)
from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.wire import MAX_BSON_SIZE


@command("ping")
def cmd_ping(ctx: Context, cmd: Doc) -> Doc:
    return {"ok": 1.0}


@command("hello", "isMaster", "ismaster")
def cmd_hello(ctx: Context, cmd: Doc) -> Doc:
    return ctx.hello(cmd)


@command("buildInfo", "buildinfo")
def cmd_build_info(ctx: Context, cmd: Doc) -> Doc:
    return {
        "version": SERVER_VERSION, "versionArray": [8, 0, 4, 0], "gitVersion": "accord-embedded",
        "bits": 64, "maxBsonObjectSize": MAX_BSON_SIZE, "storageEngines": ["accord-sqlite"],
        "modules": [], "ok": 1.0,
    }  # fmt: skip


@command("endSessions", "killSessions")
def cmd_end_sessions(ctx: Context, cmd: Doc) -> Doc:
    name = "endSessions" if "endSessions" in cmd else "killSessions"
    lsids = cmd.get(name)
    if not isinstance(lsids, list):
        raise EngineError(
            Code.TypeMismatch,
            f"BSON field '{name}.{name}' is the wrong type '{type(lsids).__name__}', "
            "expected type 'array'",
        )
    for lsid in lsids:
        if not isinstance(lsid, dict) or not isinstance(lsid.get("id"), bson.Binary):
            raise EngineError(Code.TypeMismatch, f"each entry of '{name}' must be {{id: UUID}}")
    for lsid in lsids:
        key = bson.encode({"id": lsid["id"]})
        ctx.engine.end_session(key)
        ctx.cursors.kill_session(key)
    return {"ok": 1.0}


@command("killAllSessions")
def cmd_kill_all_sessions(ctx: Context, cmd: Doc) -> Doc:
    """Abort every session's open transaction and close its cursors (no users: all of them)."""
    users = cmd.get("killAllSessions")
    if not isinstance(users, list):
        raise EngineError(
            Code.TypeMismatch,
            "BSON field 'killAllSessions.killAllSessions' is the wrong type, expected type 'array'",
        )
    for key, session in list(ctx.engine.sessions.items()):
        if key == ctx.session_key:
            continue  # the session running this command
        if session.txn is not None and session.txn_state == "in_progress":
            ctx.engine.abort(session.txn, "killed by killAllSessions")
        ctx.cursors.kill_session(key)
    return {"ok": 1.0}


@command("whatsmyuri")
def cmd_whatsmyuri(ctx: Context, cmd: Doc) -> Doc:
    return {"you": "127.0.0.1:0", "ok": 1.0}


@command("getParameter")
def cmd_get_parameter(ctx: Context, cmd: Doc) -> Doc:
    """``getParameter: "*"`` answers every parameter; otherwise the ones named with a value."""
    known: Doc = {
        "featureCompatibilityVersion": {"version": "8.0"},
        "enableTestCommands": ctx.test_commands,
        "authenticationMechanisms": ["SCRAM-SHA-1", "SCRAM-SHA-256"],
    }
    if cmd.get("getParameter") == "*":
        return {**known, "ok": 1.0}
    wanted = [k for k in cmd if k != "getParameter" and k not in GENERIC_FIELDS]
    unknown = [k for k in wanted if k not in known]
    if unknown:
        raise EngineError(Code.InvalidOptions, f"no option found to get: {unknown[0]}")
    return {**{k: known[k] for k in wanted or known}, "ok": 1.0}


# Generic command arguments that getParameter must not take for parameter names.
GENERIC_FIELDS = {"lsid", "comment", "$db", "$clusterTime", "$readPreference", "apiVersion"}


@command("getCmdLineOpts")
def cmd_get_cmd_line_opts(ctx: Context, cmd: Doc) -> Doc:
    """The options the engine runs with, in mongod's shape (drivers' test runners read it)."""
    if ctx.db != "admin":
        raise EngineError(
            Code.Unauthorized, "getCmdLineOpts may only be run against the admin database."
        )
    argv = ["accord-engine"]
    parsed: Doc = {}
    if ctx.authz is not None and ctx.authz.enforced:
        argv.append("--auth")
        parsed["security"] = {"authorization": "enabled"}
    if ctx.test_commands:
        argv.append("--enable-test-commands")
        parsed["setParameter"] = {"enableTestCommands": "1"}
    return {"argv": argv, "parsed": parsed, "ok": 1.0}


@command("serverStatus")
def cmd_server_status(ctx: Context, cmd: Doc) -> Doc:
    return {
        "host": "localhost", "version": SERVER_VERSION, "process": "accord-engine",
        "localTime": dt.datetime.now(dt.UTC).replace(tzinfo=None),
        "transactions": {"currentOpen": sum(1 for t in ctx.engine.active.values() if t.explicit)},
        "accordEngine": ctx.engine.status(),
        "ok": 1.0,
    }  # fmt: skip


@command("dbStats", "dbstats")
def cmd_db_stats(ctx: Context, cmd: Doc) -> Doc:
    colls = ctx.engine.collections_in(ctx.db)
    objects = sum(c.count_visible(ctx.txn.snapshot) for c in colls)
    return {"db": ctx.db, "collections": len(colls), "objects": objects, "ok": 1.0}


@command("connectionStatus")
def cmd_connection_status(ctx: Context, cmd: Doc) -> Doc:
    """Who the connection is authenticated as, with every role it holds (mongod's shape)."""
    principal = ctx.auth.principal() if ctx.auth is not None else None
    users: list[Doc] = []
    roles: list[Doc] = []
    info: Doc = {"authenticatedUsers": users, "authenticatedUserRoles": roles}
    if principal is not None:
        users.append({"user": principal.user, "db": principal.db})
        for role, db in sorted(principal.all_roles, key=lambda r: (r[1], r[0])):
            roles.append({"role": role, "db": db})
        if cmd.get("showPrivileges"):
            info["authenticatedUserPrivileges"] = principal.privileges.to_docs()
    elif cmd.get("showPrivileges"):
        info["authenticatedUserPrivileges"] = []
    return {"authInfo": info, "ok": 1.0}


@command("commitTransaction", "abortTransaction")
def cmd_end_transaction(ctx: Context, cmd: Doc) -> Doc:
    # The dispatcher completes these itself; reaching here means no transaction was open.
    raise EngineError(
        Code.NotARetryableWriteCommand, f"{next(iter(cmd))} must be run within a transaction"
    )


@command("compact")
def cmd_compact(ctx: Context, cmd: Doc) -> Doc:
    """MongoDB's ``compact`` (``{compact: COLLECTION}``), for the whole store: the engine
    keeps every collection in one SQLite file, so it rebuilds that file with nothing
    deleted left in it and truncates its WAL (docs/engine.md, "Physical deletion").
    Every other command waits meanwhile."""
    if ctx.in_transaction:
        raise EngineError(
            Code.OperationNotSupportedInTransaction,
            "Cannot run 'compact' in a multi-document transaction.",
        )
    name = cmd.get("compact")
    if not isinstance(name, str) or not name:
        raise EngineError(
            Code.TypeMismatch, "BSON field 'compact.compact' is the wrong type, expected a "
            "collection name (string)",
        )  # fmt: skip
    started = time.monotonic()
    before, after = ctx.engine.committer.vacuum()
    return {
        "bytesFreed": max(0, before - after), "bytesBefore": before, "bytesAfter": after,
        "seconds": round(time.monotonic() - started, 3), "ok": 1.0,
    }  # fmt: skip
