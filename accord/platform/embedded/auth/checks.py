"""The privilege check every command passes when the engine runs with ``--auth``.

``Authorizer.check`` runs before a command does anything (inside a transaction too), with
mongod's rules and answers:

- a command other than the handshake and authentication ones (``NO_AUTH``), on a
  connection that has not authenticated, fails with 13 ``Unauthorized``
  ``Command NAME requires authentication`` (not under the localhost exception, whose
  connections get ``LOCALHOST_PRIVILEGES`` instead);
- a command whose privileges (``RULES``: actions on the namespaces it reads and writes,
  including ``$lookup``/``$unionWith``/``$graphLookup`` sources, ``$out``/``$merge``
  targets, every ``nsInfo`` namespace of a client ``bulkWrite``, the command an
  ``explain`` explains) the user lacks fails with 13
  ``not authorized on DB to execute command { ... }``, the command as mongod prints it
  (passwords as ``"xxx"``, document sequences left out as mongod's request body leaves
  them).

What a command shows (listCollections' ``authorizedCollections``, listDatabases) and who
may continue a cursor are decided where mongod decides them: the handlers and the
dispatcher (``cursor_owner_error``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from accord.platform.embedded import values
from accord.platform.embedded.auth.catalog import AuthCatalog
from accord.platform.embedded.auth.privileges import ANY_NORMAL, CLUSTER, Resource
from accord.platform.embedded.auth.session import AuthSession
from accord.platform.embedded.errors import Code, EngineError

Doc = dict[str, Any]

# Commands anyone may run without authenticating (mongod's requiresAuth() == false).
NO_AUTH = frozenset(
    {
        "hello", "isMaster", "ismaster", "saslStart", "saslContinue", "authenticate", "logout",
        "ping", "buildInfo", "buildinfo", "connectionStatus", "whatsmyuri", "endSessions",
        "getnonce", "listCommands",
        # Served only with --enable-test-commands; mongod asks no privilege for it either.
        "configureFailPoint",
    }
)  # fmt: skip


@dataclass
class Request:
    """What a rule sees: the connection, the command and the cursors."""

    sess: AuthSession
    name: str
    db: str
    cmd: Doc
    cursors: Any  # CursorManager

    def ns(self, field: str | None = None) -> str | None:
        value = self.cmd.get(field or self.name)
        return f"{self.db}.{value}" if isinstance(value, str) and value else None

    def on(self, ns: str | None, *actions: str) -> bool:
        return ns is None or self.sess.allows_ns(ns, *actions)

    def on_db(self, *actions: str) -> bool:
        return self.sess.allows_db(self.db, *actions)

    def on_cluster(self, *actions: str) -> bool:
        return self.sess.allows(CLUSTER, set(actions))


Rule = Callable[[Request], bool]
RULES: dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for name in names:
            RULES[name] = fn
        return fn

    return register


def _bypass(cmd: Doc) -> tuple[str, ...]:
    return ("bypassDocumentValidation",) if cmd.get("bypassDocumentValidation") else ()


# -- reads ----------------------------------------------------------------------------------


@rule("find", "count", "distinct")
def _find(r: Request) -> bool:
    return r.on(r.ns(), "find")


@rule("aggregate")
def _aggregate(r: Request) -> bool:
    target = r.cmd.get("aggregate")
    pipeline = r.cmd.get("pipeline")
    if not isinstance(pipeline, list):
        return r.on(r.ns(), "find")
    needs = pipeline_needs(r.db, target if isinstance(target, str) else None, pipeline, r.cmd)
    return all(r.sess.allows(res, acts) for res, acts in needs)


def pipeline_needs(
    db: str, coll: str | None, pipeline: list[Any], cmd: Doc, nested: bool = False
) -> list[tuple[Resource, set[str]]]:
    """The privileges a pipeline on ``db.coll`` (None: ``aggregate: 1``) needs."""
    needs: list[tuple[Resource, set[str]]] = []
    first = pipeline[0] if pipeline and isinstance(pipeline[0], dict) else {}
    stage = next(iter(first), None) if len(first) == 1 else None
    base = Resource("exact", db, coll) if coll else None
    if stage == "$changeStream":
        spec = first["$changeStream"] if isinstance(first["$changeStream"], dict) else {}
        if coll:
            where = base
        elif spec.get("allChangesForCluster"):
            where = ANY_NORMAL
        else:
            where = Resource.database(db)
        assert where is not None
        needs.append((where, {"changeStream", "find"}))
    elif stage in ("$collStats", "$indexStats", "$listSearchIndexes") and base is not None:
        action = {"$collStats": "collStats", "$indexStats": "indexStats"}.get(
            stage, "listSearchIndexes"
        )
        needs.append((base, {action}))
    elif stage == "$listLocalSessions":
        spec = first[stage] if isinstance(first[stage], dict) else {}
        if spec.get("allUsers") or spec.get("users"):
            needs.append((CLUSTER, {"listSessions"}))
    elif stage == "$currentOp":
        needs.append((CLUSTER, {"inprog"}))
    elif base is not None and not nested or base is not None:
        needs.append((base, {"find"}))
    for st in pipeline:
        if not isinstance(st, dict) or len(st) != 1:
            continue
        name, spec = next(iter(st.items()))
        needs.extend(_stage_needs(db, name, spec, cmd))
    return needs


def _foreign(db: str, spec: Any) -> str | None:
    """``db.coll`` of a ``from``/``coll``/``into`` that is a name or ``{db, coll}``."""
    if isinstance(spec, str) and spec:
        return f"{db}.{spec}"
    if isinstance(spec, dict):
        other_db, other = spec.get("db", db), spec.get("coll")
        if isinstance(other_db, str) and isinstance(other, str) and other:
            return f"{other_db}.{other}"
    return None


def _stage_needs(db: str, name: str, spec: Any, cmd: Doc) -> list[tuple[Resource, set[str]]]:
    out: list[tuple[Resource, set[str]]] = []
    if name in ("$lookup", "$graphLookup") and isinstance(spec, dict):
        ns = _foreign(db, spec.get("from"))
        sub = spec.get("pipeline")
        if ns is not None:
            out.append((Resource.exact(ns), {"find"}))
        if isinstance(sub, list):
            out += pipeline_needs(db, None, sub, cmd, nested=True)
    elif name == "$unionWith":
        ns = _foreign(db, spec if isinstance(spec, str) else (spec or {}).get("coll"))
        if ns is not None:
            out.append((Resource.exact(ns), {"find"}))
        sub = spec.get("pipeline") if isinstance(spec, dict) else None
        if isinstance(sub, list):
            out += pipeline_needs(db, None, sub, cmd, nested=True)
    elif name == "$facet" and isinstance(spec, dict):
        for sub in spec.values():
            if isinstance(sub, list):
                out += pipeline_needs(db, None, sub, cmd, nested=True)
    elif name == "$out":
        ns = _foreign(db, spec)
        if ns is not None:
            out.append((Resource.exact(ns), {"insert", "remove", *_bypass(cmd)}))
    elif name == "$merge":
        into = spec.get("into") if isinstance(spec, dict) else spec
        ns = _foreign(db, into)
        if ns is not None:
            opts = spec if isinstance(spec, dict) else {}
            actions = set(_bypass(cmd))
            if opts.get("whenMatched", "merge") != "fail":
                actions.add("update")
            if opts.get("whenNotMatched", "insert") == "insert":
                actions.add("insert")
            out.append((Resource.exact(ns), actions))
    return out


@rule("listIndexes")
def _list_indexes(r: Request) -> bool:
    return r.on(r.ns(), "listIndexes")


@rule("listCollections")
def _list_collections(r: Request) -> bool:
    # authorizedCollections + nameOnly: anyone with a privilege in the database may ask
    # (the handler then lists only those collections).
    wanted = r.cmd.get("authorizedCollections") and r.cmd.get("nameOnly")
    if wanted and (r.sess.unchecked or r.sess.privileges().any_action_in_db(r.db)):
        return True
    return r.on_db("listCollections")


@rule("listDatabases")
def _list_databases(r: Request) -> bool:
    return True  # any authenticated user; the handler shows what they may see (mongod)


@rule("compact")
def _compact(r: Request) -> bool:
    return r.on(r.ns(), "compact")


@rule("dbStats", "dbstats")
def _db_stats(r: Request) -> bool:
    return r.on_db("dbStats")


@rule("getMore")
def _get_more(r: Request) -> bool:
    coll = r.cmd.get("collection")
    if not isinstance(coll, str):
        return True  # the handler reports the malformed command
    if coll == "$cmd.listCollections":
        return r.on_db("listCollections")
    if coll.startswith("$cmd.listIndexes."):
        return r.on(f"{r.db}.{coll[len('$cmd.listIndexes.') :]}", "listIndexes")
    if coll.startswith("$cmd."):
        return True  # a command's cursor: its own privileges are checked (cursor_owner_error)
    return r.on(f"{r.db}.{coll}", "find")


@rule("killCursors")
def _kill_cursors(r: Request) -> bool:
    coll = r.cmd.get("killCursors")
    ids = r.cmd.get("cursors")
    if not isinstance(coll, str) or not isinstance(ids, list):
        return True  # the handler reports the malformed command
    for cid in ids:
        owner = r.cursors.owner_of(cid) if isinstance(cid, int) else None
        if owner is None:
            continue  # not found is not an authorization matter: the reply says so
        # killAnyCursor on the cursor's own namespace, as mongod's checkAuthForKillCursors
        # (cc.nss()): the command's namespace is not checked against the cursor's, so
        # killAnyCursor on a collection of one's own killed anyone's cursor (before
        # 2026-12-07). No session check: mongod kills by user, and pymongo kills the
        # cursors it garbage-collected without their session.
        ns = r.cursors.ns_of(cid) or f"{r.db}.{coll}"
        if owner[0] != r.sess.owner() and not r.sess.allows_ns(ns, "killAnyCursor"):
            return False
    return True


# -- writes ---------------------------------------------------------------------------------


@rule("insert")
def _insert(r: Request) -> bool:
    return r.on(r.ns(), "insert", *_bypass(r.cmd))


@rule("update")
def _update(r: Request) -> bool:
    actions = {"update", *_bypass(r.cmd)}
    ups = r.cmd.get("updates")
    if isinstance(ups, list) and any(isinstance(u, dict) and u.get("upsert") for u in ups):
        actions.add("insert")
    return r.on(r.ns(), *actions)


@rule("delete")
def _delete(r: Request) -> bool:
    return r.on(r.ns(), "remove")


@rule("findAndModify", "findandmodify")
def _find_and_modify(r: Request) -> bool:
    actions = {"find", *_bypass(r.cmd)}
    if r.cmd.get("remove"):
        actions.add("remove")
    else:
        actions.add("update")
        if r.cmd.get("upsert"):
            actions.add("insert")
    return r.on(r.ns(r.name), *actions)


@rule("bulkWrite")
def _bulk_write(r: Request) -> bool:
    ns_info, ops = r.cmd.get("nsInfo"), r.cmd.get("ops")
    if not isinstance(ns_info, list) or not isinstance(ops, list):
        return True  # the handler reports the malformed command
    names = [e.get("ns") if isinstance(e, dict) else None for e in ns_info]
    needs: dict[str, set[str]] = {}
    for op in ops:
        if not isinstance(op, dict) or not op:
            continue
        kind, index = next(iter(op.items()))
        if not isinstance(index, int) or not 0 <= index < len(names):
            continue
        ns = names[index]
        if not isinstance(ns, str):
            continue
        actions = needs.setdefault(ns, set(_bypass(r.cmd)))
        if kind == "insert":
            actions.add("insert")
        elif kind == "update":
            actions.add("update")
            if op.get("upsert"):
                actions.add("insert")
        elif kind == "delete":
            actions.add("remove")
    return all(r.sess.allows_ns(ns, *acts) for ns, acts in needs.items())


# -- collections and databases ----------------------------------------------------------------


@rule("create")
def _create(r: Request) -> bool:
    ns = r.ns()
    if ns is None:
        return True
    view_on = r.cmd.get("viewOn")
    if isinstance(view_on, str):
        stages = r.cmd.get("pipeline")
        needs = pipeline_needs(r.db, view_on, stages if isinstance(stages, list) else [], r.cmd)
        return r.on(ns, "createCollection") and all(r.sess.allows(a, b) for a, b in needs)
    coll = ns.split(".", 1)[1]
    # mongod: whoever may insert into a (non-system) namespace may create it.
    if not coll.startswith("system.") and r.on(ns, "insert"):
        return True
    return r.on(ns, "createCollection")


@rule("collMod")
def _coll_mod(r: Request) -> bool:
    ok = r.on(r.ns(), "collMod")
    view_on, pipeline = r.cmd.get("viewOn"), r.cmd.get("pipeline")
    if isinstance(view_on, str) or isinstance(pipeline, list):
        source = view_on if isinstance(view_on, str) else None
        needs = pipeline_needs(r.db, source, pipeline if isinstance(pipeline, list) else [], r.cmd)
        ok = ok and all(r.sess.allows(a, b) for a, b in needs)
    return ok


@rule("createIndexes")
def _create_indexes(r: Request) -> bool:
    return r.on(r.ns(), "createIndex")


@rule("dropIndexes", "deleteIndexes")
def _drop_indexes(r: Request) -> bool:
    return r.on(r.ns(), "dropIndex")


@rule("drop")
def _drop(r: Request) -> bool:
    return r.on(r.ns(), "dropCollection")


@rule("dropDatabase")
def _drop_database(r: Request) -> bool:
    return r.on_db("dropDatabase")


@rule("validate")
def _validate(r: Request) -> bool:
    return r.on(r.ns(), "validate")


@rule("createSearchIndexes")
def _create_search(r: Request) -> bool:
    return r.on(r.ns(), "createSearchIndexes")


@rule("dropSearchIndex")
def _drop_search(r: Request) -> bool:
    return r.on(r.ns(), "dropSearchIndex")


@rule("updateSearchIndex")
def _update_search(r: Request) -> bool:
    return r.on(r.ns(), "updateSearchIndex")


@rule("renameCollection")
def _rename(r: Request) -> bool:
    source, target = r.cmd.get("renameCollection"), r.cmd.get("to")
    if not isinstance(source, str) or not isinstance(target, str):
        return True  # the handler reports the malformed command
    drop_target = bool(r.cmd.get("dropTarget"))
    s_db, _, s_coll = source.partition(".")
    t_db, _, t_coll = target.partition(".")
    can = r.sess.allows_ns
    if s_db == t_db and not s_coll.startswith("system.") and not t_coll.startswith("system."):
        # mongod: renameCollectionSameDB, and reading both or neither of the two.
        same = r.sess.allows_db(s_db, "renameCollectionSameDB")
        drop_ok = not drop_target or can(target, "dropCollection")
        if same and drop_ok and (can(source, "find") or not can(target, "find")):
            return True
    source_ok = can(source, "find", "dropCollection", *_bypass(r.cmd))
    target_actions = {"insert", "createIndex", *_bypass(r.cmd)}
    if drop_target:
        target_actions.add("dropCollection")
    return source_ok and can(target, *target_actions)


# -- server ------------------------------------------------------------------------------------


@rule("serverStatus")
def _server_status(r: Request) -> bool:
    return r.on_cluster("serverStatus")


@rule("getParameter")
def _get_parameter(r: Request) -> bool:
    return r.on_cluster("getParameter")


@rule("getCmdLineOpts")
def _cmd_line(r: Request) -> bool:
    return r.on_cluster("getCmdLineOpts")


@rule("killAllSessions")
def _kill_all_sessions(r: Request) -> bool:
    return r.on_cluster("killAnySession")


@rule("commitTransaction", "abortTransaction", "killSessions")
def _authenticated(r: Request) -> bool:
    return True


@rule("explain")
def _explain(r: Request) -> bool:
    inner = r.cmd.get("explain")
    if not isinstance(inner, dict) or not inner:
        return True  # the handler reports the malformed command
    name = next(iter(inner))
    check = RULES.get(name)
    if check is None or name == "explain":
        return True  # the handler refuses what it cannot explain
    return check(Request(r.sess, name, r.db, inner, r.cursors))


# -- users and roles (commands/users.py) ------------------------------------------------------


def _role_dbs(value: Any, db: str) -> set[str]:
    """The databases of the roles a command names (malformed entries are the handler's)."""
    out = set()
    for entry in value if isinstance(value, list) else []:
        if isinstance(entry, str):
            out.add(db)
        elif isinstance(entry, dict) and isinstance(entry.get("db"), str):
            out.add(entry["db"])
    return out


def _grants(r: Request, field: str, action: str = "grantRole") -> bool:
    return all(r.sess.allows_db(d, action) for d in _role_dbs(r.cmd.get(field), r.db))


@rule("createUser")
def _create_user(r: Request) -> bool:
    return r.on_db("createUser") and _grants(r, "roles")


@rule("updateUser")
def _update_user(r: Request) -> bool:
    name = r.cmd.get("updateUser")
    own = isinstance(name, str) and r.sess.is_user(name, r.db)
    ok = True
    if "pwd" in r.cmd:
        ok = r.on_db("changePassword") or (own and r.on_db("changeOwnPassword"))
    if "customData" in r.cmd:
        ok = ok and (r.on_db("changeCustomData") or (own and r.on_db("changeOwnCustomData")))
    if "roles" in r.cmd:
        ok = ok and _grants(r, "roles")
    if "authenticationRestrictions" in r.cmd or "mechanisms" in r.cmd:
        ok = ok and r.on_db(
            "setAuthenticationRestriction" if "mechanisms" not in r.cmd else "changePassword"
        )
    return ok


@rule("dropUser")
def _drop_user(r: Request) -> bool:
    return r.on_db("dropUser")


@rule("dropAllUsersFromDatabase")
def _drop_all_users(r: Request) -> bool:
    return r.on_db("dropUser")


@rule("grantRolesToUser")
def _grant_roles_to_user(r: Request) -> bool:
    return _grants(r, "roles")


@rule("revokeRolesFromUser")
def _revoke_roles_from_user(r: Request) -> bool:
    return _grants(r, "roles", "revokeRole")


def _privilege_dbs(value: Any) -> set[str]:
    """Where granting these privileges is decided: their database, else admin."""
    out = set()
    for entry in value if isinstance(value, list) else []:
        res = entry.get("resource") if isinstance(entry, dict) else None
        db = res.get("db") if isinstance(res, dict) else None
        out.add(db if isinstance(db, str) and db else "admin")
    return out


@rule("createRole")
def _create_role(r: Request) -> bool:
    privs = _privilege_dbs(r.cmd.get("privileges"))
    return (
        r.on_db("createRole")
        and _grants(r, "roles")
        and all(r.sess.allows_db(d, "grantRole") for d in privs)
    )


@rule("updateRole")
def _update_role(r: Request) -> bool:
    privs = _privilege_dbs(r.cmd.get("privileges"))
    return (
        _grants(r, "roles")
        and all(r.sess.allows_db(d, "grantRole") for d in privs)
        and (("privileges" not in r.cmd and "roles" not in r.cmd) or r.on_db("revokeRole"))
    )


@rule("dropRole")
def _drop_role(r: Request) -> bool:
    return r.on_db("dropRole")


@rule("dropAllRolesFromDatabase")
def _drop_all_roles(r: Request) -> bool:
    return r.on_db("dropRole")


@rule("grantRolesToRole", "grantPrivilegesToRole")
def _grant_to_role(r: Request) -> bool:
    return _grants(r, "roles") and all(
        r.sess.allows_db(d, "grantRole") for d in _privilege_dbs(r.cmd.get("privileges"))
    )


@rule("revokeRolesFromRole", "revokePrivilegesFromRole")
def _revoke_from_role(r: Request) -> bool:
    return _grants(r, "roles", "revokeRole") and all(
        r.sess.allows_db(d, "revokeRole") for d in _privilege_dbs(r.cmd.get("privileges"))
    )


def _named(value: Any, db: str, key: str) -> Iterable[tuple[str, str]]:
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, str):
            yield item, db
        elif isinstance(item, dict) and isinstance(item.get(key), str):
            other = item.get("db", db)
            yield item[key], other if isinstance(other, str) else db


@rule("usersInfo")
def _users_info(r: Request) -> bool:
    arg = r.cmd.get("usersInfo")
    if isinstance(arg, dict) and arg.get("forAllDBs"):
        return r.on_cluster("viewUser")
    if isinstance(arg, int | float) and not isinstance(arg, bool):
        return r.on_db("viewUser")
    return all(
        r.sess.is_user(name, db) or r.sess.allows_db(db, "viewUser")
        for name, db in _named(arg, r.db, "user")
    )


@rule("rolesInfo")
def _roles_info(r: Request) -> bool:
    arg = r.cmd.get("rolesInfo")
    if isinstance(arg, dict) and arg.get("forAllDBs"):
        return r.on_cluster("viewRole")
    if isinstance(arg, int | float) and not isinstance(arg, bool):
        return r.on_db("viewRole")
    return all(
        r.sess.has_role(role) or r.sess.allows_db(role[1], "viewRole")
        for role in _named(arg, r.db, "role")
    )


# -- the check ---------------------------------------------------------------------------------


class Authorizer:
    """The engine's authorization: its catalog, and whether it is enforced (--auth)."""

    def __init__(self, catalog: AuthCatalog, *, enforced: bool) -> None:
        self.catalog = catalog
        self.enforced = enforced

    def new_session(self, *, local: bool) -> AuthSession:
        return AuthSession(local=local, enforced=self.enforced, catalog=self.catalog)

    def internal_session(self) -> AuthSession:
        return AuthSession(internal=True, catalog=self.catalog)

    def check(
        self, sess: AuthSession, name: str, db: str, cmd: Doc, cursors: Any,
        sequences: Collection[str] = (),
    ) -> None:  # fmt: skip
        """Raise 13 Unauthorized unless ``sess`` may run ``cmd`` (see the module doc)."""
        if sess.unchecked or name in NO_AUTH:
            return
        if not sess.localhost_bypass() and not sess.authenticated:
            raise EngineError(Code.Unauthorized, f"Command {name} requires authentication")
        check = RULES.get(name)
        if check is None or not check(Request(sess, name, db, cmd, cursors)):
            raise not_authorized(db, cmd, sequences)


def not_authorized(db: str, cmd: Doc, sequences: Collection[str] = ()) -> EngineError:
    """mongod's ``not authorized on DB to execute command { ... }``."""
    shown = {k: ("xxx" if k == "pwd" else v) for k, v in cmd.items() if k not in sequences}
    return EngineError(
        Code.Unauthorized,
        f"not authorized on {db} to execute command {values.format_value(shown)}",
    )


def recheck(name: str, db: str, cmd: Doc, cursors: Any) -> Callable[[AuthSession], bool] | None:
    """What a cursor's getMore re-checks: the privileges of the command that opened it
    (None for a client ``bulkWrite``'s results, which carry no data of a collection)."""
    check = RULES.get(name)
    if check is None or name == "bulkWrite":
        return None
    kept = {k: v for k, v in cmd.items() if k not in ("documents", "updates", "deletes")}
    return lambda sess: sess.unchecked or check(Request(sess, name, db, kept, cursors))


def cursor_owner_error(sess: AuthSession, cursor_id: int, owner: Any) -> EngineError | None:
    """getMore on a cursor: refused unless the connection's user created it and still has
    the privileges that created it (mongod's getMore checks, in that order). ``owner`` is
    ``(user, recheck)`` as the dispatcher recorded it."""
    if sess.unchecked or owner is None:
        return None
    user, again = owner
    if user != sess.owner():
        return EngineError(
            Code.Unauthorized, f"cursor id {cursor_id} was not created by the authenticated user"
        )
    if again is not None and not again(sess):
        return EngineError(
            Code.Unauthorized, f"not authorized for getMore with cursor id {cursor_id}"
        )
    return None
