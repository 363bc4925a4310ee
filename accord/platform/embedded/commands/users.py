"""Authentication and user/role management commands, with mongod's arguments, checks,
error codes and reply shapes: ``saslStart``, ``saslContinue``, ``logout``,
``authenticate``; ``createUser``, ``updateUser``, ``dropUser``,
``dropAllUsersFromDatabase``, ``grantRolesToUser``, ``revokeRolesFromUser``, ``usersInfo``;
``createRole``, ``updateRole``, ``dropRole``, ``dropAllRolesFromDatabase``,
``grantRolesToRole``, ``revokeRolesFromRole``, ``grantPrivilegesToRole``,
``revokePrivilegesFromRole``, ``rolesInfo``.

Users and roles are documents of ``admin.system.users`` / ``admin.system.roles``
(auth/catalog.py), written by the command's own autocommitted transaction (these are
``AUTH_WRITE_COMMANDS``): durable when acknowledged, and seen by every privilege check
from the next command on. They work with or without ``--auth``, as in mongod; who may
run them is decided by auth/checks.py.
"""

from __future__ import annotations

import uuid
from typing import Any

import bson

from accord.platform.embedded import query
from accord.platform.embedded.auth import builtin_roles, handshake
from accord.platform.embedded.auth.catalog import (
    ROLES_NS,
    USERS_NS,
    AuthCatalog,
    RoleName,
    role_names,
)
from accord.platform.embedded.auth.privileges import Privileges, privileges_from_docs
from accord.platform.embedded.auth.scram import MECHANISMS, make_credentials
from accord.platform.embedded.commands.base import GENERIC_ARGS, Context, Doc, command
from accord.platform.embedded.commands.write import insert_one, replace_one, write_collection
from accord.platform.embedded.errors import Code, EngineError, type_mismatch
from accord.platform.embedded.values import bson_type_name


def _check_fields(cmd: Doc, allowed: set[str]) -> None:
    name = next(iter(cmd))
    for key in cmd:
        if key != name and key not in allowed and key not in GENERIC_ARGS:
            raise EngineError(
                Code.IDLUnknownField, f"BSON field '{name}.{key}' is an unknown field."
            )


def _required(cmd: Doc, field: str) -> Any:
    if field not in cmd:
        name = next(iter(cmd))
        raise EngineError(
            Code.IDLFailedToParse, f"BSON field '{name}.{field}' is missing but a required field"
        )
    return cmd[field]


def _string(cmd: Doc, field: str) -> str:
    value = cmd.get(field)
    if not isinstance(value, str):
        name = next(iter(cmd))
        raise type_mismatch(
            f"BSON field '{name}.{field}' is the wrong type '{_bson_type(value)}', "
            "expected type 'string'"
        )
    return value


def _bson_type(value: Any) -> str:
    return bson_type_name(value)


def _catalog(ctx: Context) -> AuthCatalog:
    assert ctx.authz is not None
    return ctx.authz.catalog


# -- role names ------------------------------------------------------------------------------


def parse_role_names(value: Any, db: str, where: str) -> list[RoleName]:
    """A command's roles (``"name"`` in the command's database, or ``{role, db}``)."""
    if not isinstance(value, list):
        raise type_mismatch(
            f"BSON field '{where}' is the wrong type '{_bson_type(value)}', expected type 'array'"
        )
    out: list[RoleName] = []
    for entry in value:
        if isinstance(entry, str):
            out.append((entry, db))
        elif isinstance(entry, dict):
            role, role_db = entry.get("role"), entry.get("db")
            if not isinstance(role, str):
                raise EngineError(Code.BadValue, 'Missing expected field "role"')
            if not isinstance(role_db, str):
                raise EngineError(Code.BadValue, 'Missing expected field "db"')
            extra = sorted(set(entry) - {"role", "db"})
            if extra:
                raise EngineError(
                    Code.IDLUnknownField, f"BSON field '{where}.{extra[0]}' is an unknown field."
                )
            out.append((role, role_db))
        else:
            raise EngineError(Code.BadValue, "Role names must be either strings or objects")
    for role, role_db in out:
        if not role:
            raise EngineError(Code.BadValue, "Role name must be non-empty")
        if not role_db:
            raise EngineError(Code.BadValue, "Role db must be non-empty")
    return list(dict.fromkeys(out))


def _role_docs(roles: list[RoleName]) -> list[Doc]:
    return [{"role": r, "db": d} for r, d in roles]


def _require_roles_exist(catalog: AuthCatalog, roles: list[RoleName]) -> None:
    for role, db in roles:
        if not catalog.role_exists(role, db):
            raise EngineError(Code.RoleNotFound, f"Could not find role: {role}@{db}")


def _user_id(db: str, name: str) -> str:
    return f"{db}.{name}"


# -- users -----------------------------------------------------------------------------------


def _mechanisms(cmd: Doc, default: tuple[str, ...] = MECHANISMS) -> tuple[str, ...]:
    if "mechanisms" not in cmd:
        return default
    value = cmd["mechanisms"]
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise type_mismatch("mechanisms must be an array of strings")
    if not value:
        raise EngineError(Code.BadValue, "mechanisms field must not be empty")
    for mech in value:
        if mech not in MECHANISMS:
            raise EngineError(Code.BadValue, f"Unknown auth mechanism '{mech}'")
    return tuple(m for m in MECHANISMS if m in value)


def _password(cmd: Doc, mechanisms: tuple[str, ...]) -> str:
    pwd = _string(cmd, "pwd")
    if not pwd:
        raise EngineError(Code.BadValue, "Password cannot be empty")
    if cmd.get("digestPassword") is False or cmd.get("passwordDigestor") == "client":
        raise EngineError(
            Code.BadValue,
            "Use of SCRAM-SHA-256 requires undigested passwords"
            if "SCRAM-SHA-256" in mechanisms
            else "client-digested passwords are not supported by the embedded engine: "
            "send the password and let the server digest it",
        )
    if cmd.get("passwordDigestor", "server") != "server":
        raise EngineError(Code.BadValue, "passwordDigestor must be 'server' or 'client'")
    return pwd


def _restrictions(cmd: Doc) -> None:
    value = cmd.get("authenticationRestrictions")
    if value is None or value == []:
        return
    raise EngineError(
        Code.BadValue,
        "authenticationRestrictions (clientSource / serverAddress) are not supported by the "
        "embedded engine; leave them out",
    )


def _custom_data(cmd: Doc) -> Doc | None:
    if "customData" not in cmd:
        return None
    value = cmd["customData"]
    if not isinstance(value, dict):
        raise type_mismatch(
            f"BSON field '{next(iter(cmd))}.customData' is the wrong type "
            f"'{_bson_type(value)}', expected type 'object'"
        )
    return value


def _user_name(ctx: Context, cmd: Doc) -> str:
    name = _string(cmd, next(iter(cmd)))
    if not name:
        raise EngineError(Code.BadValue, "User name must not be empty")
    if "\x00" in name:
        raise EngineError(Code.BadValue, "User name must not contain NUL characters")
    return name


def _load_user(ctx: Context, name: str) -> tuple[bytes, Doc]:
    key = query.id_key(_user_id(ctx.db, name))
    doc = ctx.engine.get(ctx.txn, USERS_NS, key)
    if doc is None:
        raise EngineError(Code.UserNotFound, f'Could not find user "{name}" for db "{ctx.db}"')
    return key, doc


@command("createUser")
def cmd_create_user(ctx: Context, cmd: Doc) -> Doc:
    _check_fields(
        cmd,
        {"pwd", "customData", "roles", "digestPassword", "authenticationRestrictions",
         "mechanisms", "passwordDigestor"},
    )  # fmt: skip
    name = _user_name(ctx, cmd)
    if ctx.db == "local":
        raise EngineError(Code.BadValue, "Cannot create users in the local database")
    roles = parse_role_names(_required(cmd, "roles"), ctx.db, "createUser.roles")
    mechanisms = _mechanisms(cmd)
    if "pwd" not in cmd:
        raise EngineError(
            Code.BadValue,
            "Must provide a 'pwd' field for all user documents, except those with "
            "'$external' as the user's source db",
        )
    pwd = _password(cmd, mechanisms)
    custom = _custom_data(cmd)
    _restrictions(cmd)
    _require_roles_exist(_catalog(ctx), roles)
    uid = _user_id(ctx.db, name)
    if ctx.engine.get(ctx.txn, USERS_NS, query.id_key(uid)) is not None:
        raise EngineError(Code.Location51003, f'User "{name}@{ctx.db}" already exists')
    doc: Doc = {
        "_id": uid,
        "userId": bson.Binary(uuid.uuid4().bytes, bson.binary.UUID_SUBTYPE),
        "user": name,
        "db": ctx.db,
        "credentials": make_credentials(name, pwd, mechanisms),
    }
    if custom is not None:
        doc["customData"] = custom
    doc["roles"] = _role_docs(roles)
    insert_one(ctx, write_collection(ctx, USERS_NS), doc, bypass=True)
    return {"ok": 1.0}


@command("updateUser")
def cmd_update_user(ctx: Context, cmd: Doc) -> Doc:
    _check_fields(
        cmd,
        {"pwd", "customData", "roles", "digestPassword", "authenticationRestrictions",
         "mechanisms", "passwordDigestor"},
    )  # fmt: skip
    name = _user_name(ctx, cmd)
    if not any(
        k in cmd for k in ("pwd", "customData", "roles", "authenticationRestrictions", "mechanisms")
    ):
        raise EngineError(Code.BadValue, "Must specify at least one field to update in updateUser")
    key, old = _load_user(ctx, name)
    new = dict(old)
    stored = old.get("credentials")
    creds: Doc = stored if isinstance(stored, dict) else {}
    if "pwd" in cmd:
        mechanisms = _mechanisms(cmd)
        new["credentials"] = make_credentials(name, _password(cmd, mechanisms), mechanisms)
    elif "mechanisms" in cmd:
        mechanisms = _mechanisms(cmd)
        if not set(mechanisms) <= set(creds):
            raise EngineError(
                Code.BadValue,
                "mechanisms field must be a subset of previously set mechanisms",
            )
        new["credentials"] = {m: creds[m] for m in mechanisms}
    if "customData" in cmd:
        new["customData"] = _custom_data(cmd)
    if "roles" in cmd:
        roles = parse_role_names(cmd["roles"], ctx.db, "updateUser.roles")
        _require_roles_exist(_catalog(ctx), roles)
        new["roles"] = _role_docs(roles)
    _restrictions(cmd)
    replace_one(ctx, write_collection(ctx, USERS_NS), key, old, new, True)
    return {"ok": 1.0}


@command("dropUser")
def cmd_drop_user(ctx: Context, cmd: Doc) -> Doc:
    _check_fields(cmd, set())
    name = _user_name(ctx, cmd)
    key = query.id_key(_user_id(ctx.db, name))
    coll = ctx.engine.get_collection(USERS_NS, ctx.txn)
    if coll is None or ctx.engine.get(ctx.txn, USERS_NS, key) is None:
        raise EngineError(Code.UserNotFound, f"User '{name}@{ctx.db}' not found")
    ctx.engine.write(ctx.txn, coll, key, None)
    return {"ok": 1.0}


@command("dropAllUsersFromDatabase")
def cmd_drop_all_users(ctx: Context, cmd: Doc) -> Doc:
    _check_fields(cmd, set())
    coll = ctx.engine.get_collection(USERS_NS, ctx.txn)
    n = 0
    if coll is not None:
        for key, doc in list(ctx.engine.scan(ctx.txn, USERS_NS)):
            if doc.get("db") == ctx.db:
                ctx.engine.write(ctx.txn, coll, key, None)
                n += 1
    return {"n": n, "ok": 1.0}


def _change_user_roles(ctx: Context, cmd: Doc, grant: bool) -> Doc:
    _check_fields(cmd, {"roles"})
    name = _user_name(ctx, cmd)
    where = f"{next(iter(cmd))}.roles"
    roles = parse_role_names(_required(cmd, "roles"), ctx.db, where)
    if not roles:
        raise EngineError(
            Code.BadValue, f'{next(iter(cmd))} command requires a non-empty "roles" array'
        )
    _require_roles_exist(_catalog(ctx), roles)
    key, old = _load_user(ctx, name)
    current = [(r, d) for r, d in _stored_roles(old.get("roles"))]
    if grant:
        updated = list(dict.fromkeys([*current, *roles]))
    else:
        updated = [r for r in current if r not in roles]
    new = {**old, "roles": _role_docs(updated)}
    replace_one(ctx, write_collection(ctx, USERS_NS), key, old, new, True)
    return {"ok": 1.0}


def _stored_roles(value: Any) -> list[RoleName]:
    return list(role_names(value))


@command("grantRolesToUser")
def cmd_grant_roles_to_user(ctx: Context, cmd: Doc) -> Doc:
    return _change_user_roles(ctx, cmd, grant=True)


@command("revokeRolesFromUser")
def cmd_revoke_roles_from_user(ctx: Context, cmd: Doc) -> Doc:
    return _change_user_roles(ctx, cmd, grant=False)


def _named_users(ctx: Context, arg: Any) -> list[tuple[str, str]] | None:
    """The users ``usersInfo`` asks for (None: every user of the database)."""
    if isinstance(arg, int | float) and not isinstance(arg, bool):
        return None
    items = arg if isinstance(arg, list) else [arg]
    out = []
    for item in items:
        if isinstance(item, str):
            out.append((item, ctx.db))
        elif isinstance(item, dict) and isinstance(item.get("user"), str):
            db = item.get("db", ctx.db)
            if not isinstance(db, str):
                raise EngineError(Code.BadValue, "usersInfo: 'db' must be a string")
            out.append((item["user"], db))
        else:
            raise EngineError(
                Code.BadValue,
                "usersInfo must be 1, a user name, a {user, db} document or an array of them",
            )
    return out


@command("usersInfo")
def cmd_users_info(ctx: Context, cmd: Doc) -> Doc:
    _check_fields(
        cmd,
        {"showCredentials", "showCustomData", "showPrivileges",
         "showAuthenticationRestrictions", "filter"},
    )  # fmt: skip
    catalog = _catalog(ctx)
    arg = cmd.get("usersInfo")
    filt = cmd.get("filter")
    if filt is not None and not isinstance(filt, dict):
        raise type_mismatch("usersInfo: 'filter' must be an object")
    if isinstance(arg, dict) and arg.get("forAllDBs"):
        docs = [doc for _, doc in sorted(catalog.users.items())]
    else:
        named = _named_users(ctx, arg)
        if filt is not None and named is not None:
            raise EngineError(Code.BadValue, "'filter' is only allowed with usersInfo: 1")
        if named is None:
            docs = [doc for (db, _), doc in sorted(catalog.users.items()) if db == ctx.db]
        else:
            docs = [d for n, db in named if (d := catalog.user(n, db)) is not None]
    show_privs = bool(cmd.get("showPrivileges"))
    show_restrictions = bool(cmd.get("showAuthenticationRestrictions")) or show_privs
    out = []
    for doc in docs:
        shown: Doc = {k: doc[k] for k in ("_id", "userId", "user", "db") if k in doc}
        if cmd.get("showCredentials"):
            shown["credentials"] = doc.get("credentials", {})
        if "customData" in doc and cmd.get("showCustomData", True):
            shown["customData"] = doc["customData"]
        direct = _stored_roles(doc.get("roles"))
        shown["roles"] = _role_docs(direct)
        shown["mechanisms"] = [m for m in MECHANISMS if m in (doc.get("credentials") or {})]
        if show_privs:
            reach, privileges = catalog.resolve(direct)
            shown["inheritedRoles"] = _role_docs(sorted(reach, key=lambda r: (r[1], r[0])))
            shown["inheritedPrivileges"] = privileges.to_docs()
            shown["inheritedAuthenticationRestrictions"] = []
        if show_restrictions:
            shown["authenticationRestrictions"] = []
        if filt is None or query.matches(filt, shown):
            out.append(shown)
    return {"users": out, "ok": 1.0}


# -- roles -----------------------------------------------------------------------------------


def _role_name(cmd: Doc) -> str:
    name = _string(cmd, next(iter(cmd)))
    if not name:
        raise EngineError(Code.BadValue, "Role name must be non-empty")
    return name


def _refuse_builtin(role: str, db: str) -> None:
    if builtin_roles.is_builtin(role, db):
        raise EngineError(
            Code.InvalidRoleModification,
            f"{role}@{db} is a built-in role and cannot be modified",
        )


def _check_privileges_for(role_db: str, privileges: Privileges) -> None:
    """A role of a database other than admin may only hold privileges on that database."""
    if role_db == "admin":
        return
    for resource, _ in privileges:
        if resource.targets_db() != role_db:
            raise EngineError(
                Code.InvalidRoleModification,
                f"Roles on the '{role_db}' database cannot be granted privileges that target "
                "other databases or the cluster",
            )


def _check_subroles(catalog: AuthCatalog, role: RoleName, subroles: list[RoleName]) -> None:
    for sub in subroles:
        if sub == role:
            raise EngineError(
                Code.InvalidRoleModification, f"Cannot grant role {role[0]}@{role[1]} to itself."
            )
        if role[1] != "admin" and sub[1] != role[1]:
            raise EngineError(
                Code.InvalidRoleModification,
                f"Roles on the '{role[1]}' database cannot be granted roles from other databases",
            )
        if not catalog.role_exists(*sub):
            raise EngineError(Code.RoleNotFound, f"Cannot grant nonexistent role {sub[0]}@{sub[1]}")
        if role in catalog.inherited_roles(sub):
            raise EngineError(
                Code.InvalidRoleModification,
                f"Granting {sub[0]}@{sub[1]} to {role[0]}@{role[1]} would introduce a cycle in "
                "the role graph.",
            )


def _parse_privileges(cmd: Doc, field: str = "privileges") -> tuple[Privileges, list[Doc]]:
    value = cmd.get(field)
    if not isinstance(value, list):
        raise type_mismatch(
            f"BSON field '{next(iter(cmd))}.{field}' is the wrong type "
            f"'{_bson_type(value)}', expected type 'array'"
        )
    privileges = privileges_from_docs(value, f"{next(iter(cmd))}.{field}")
    return privileges, privileges.to_docs()


def _load_role(ctx: Context, role: str) -> tuple[bytes, Doc]:
    _refuse_builtin(role, ctx.db)
    key = query.id_key(_user_id(ctx.db, role))
    doc = ctx.engine.get(ctx.txn, ROLES_NS, key)
    if doc is None:
        raise EngineError(Code.RoleNotFound, f"Role '{role}@{ctx.db}' not found")
    return key, doc


@command("createRole")
def cmd_create_role(ctx: Context, cmd: Doc) -> Doc:
    _check_fields(cmd, {"privileges", "roles", "authenticationRestrictions"})
    name = _role_name(cmd)
    if builtin_roles.reserved_name(name):
        raise EngineError(
            Code.BadValue, "Cannot create roles with the same name as a built-in role"
        )
    _required(cmd, "privileges")
    roles = parse_role_names(_required(cmd, "roles"), ctx.db, "createRole.roles")
    privileges, privilege_docs = _parse_privileges(cmd)
    _restrictions(cmd)
    _check_privileges_for(ctx.db, privileges)
    catalog = _catalog(ctx)
    _check_subroles(catalog, (name, ctx.db), roles)
    rid = _user_id(ctx.db, name)
    if ctx.engine.get(ctx.txn, ROLES_NS, query.id_key(rid)) is not None:
        raise EngineError(Code.Location51002, f'Role "{name}@{ctx.db}" already exists')
    doc = {"_id": rid, "role": name, "db": ctx.db, "privileges": privilege_docs,
           "roles": _role_docs(roles)}  # fmt: skip
    insert_one(ctx, write_collection(ctx, ROLES_NS), doc, bypass=True)
    return {"ok": 1.0}


@command("updateRole")
def cmd_update_role(ctx: Context, cmd: Doc) -> Doc:
    _check_fields(cmd, {"privileges", "roles", "authenticationRestrictions"})
    name = _role_name(cmd)
    if not any(k in cmd for k in ("privileges", "roles", "authenticationRestrictions")):
        raise EngineError(Code.BadValue, "Must specify at least one field to update in updateRole")
    key, old = _load_role(ctx, name)
    new = dict(old)
    if "privileges" in cmd:
        privileges, new["privileges"] = _parse_privileges(cmd)
        _check_privileges_for(ctx.db, privileges)
    if "roles" in cmd:
        roles = parse_role_names(cmd["roles"], ctx.db, "updateRole.roles")
        _check_subroles(_catalog(ctx), (name, ctx.db), roles)
        new["roles"] = _role_docs(roles)
    _restrictions(cmd)
    replace_one(ctx, write_collection(ctx, ROLES_NS), key, old, new, True)
    return {"ok": 1.0}


def _change_role(ctx: Context, cmd: Doc, field: str, grant: bool) -> Doc:
    _check_fields(cmd, {field})
    name = _role_name(cmd)
    key, old = _load_role(ctx, name)
    new = dict(old)
    if field == "roles":
        roles = parse_role_names(_required(cmd, "roles"), ctx.db, f"{next(iter(cmd))}.roles")
        current = _stored_roles(old.get("roles"))
        if grant:
            _check_subroles(_catalog(ctx), (name, ctx.db), roles)
            new["roles"] = _role_docs(list(dict.fromkeys([*current, *roles])))
        else:
            _require_roles_exist(_catalog(ctx), roles)
            new["roles"] = _role_docs([r for r in current if r not in roles])
    else:
        _required(cmd, "privileges")
        change, _ = _parse_privileges(cmd)
        _check_privileges_for(ctx.db, change)
        current_privs = privileges_from_docs(old.get("privileges", []))
        if grant:
            result = current_privs.union(change)
        else:
            result = Privileges((res, acts - change.actions_on(res)) for res, acts in current_privs)
        new["privileges"] = result.to_docs()
    replace_one(ctx, write_collection(ctx, ROLES_NS), key, old, new, True)
    return {"ok": 1.0}


@command("grantRolesToRole")
def cmd_grant_roles_to_role(ctx: Context, cmd: Doc) -> Doc:
    return _change_role(ctx, cmd, "roles", grant=True)


@command("revokeRolesFromRole")
def cmd_revoke_roles_from_role(ctx: Context, cmd: Doc) -> Doc:
    return _change_role(ctx, cmd, "roles", grant=False)


@command("grantPrivilegesToRole")
def cmd_grant_privileges_to_role(ctx: Context, cmd: Doc) -> Doc:
    return _change_role(ctx, cmd, "privileges", grant=True)


@command("revokePrivilegesFromRole")
def cmd_revoke_privileges_from_role(ctx: Context, cmd: Doc) -> Doc:
    return _change_role(ctx, cmd, "privileges", grant=False)


def _forget_role(ctx: Context, role: RoleName) -> None:
    """Take ``role`` out of every user's and every role's roles (mongod does on dropRole)."""
    entry = {"role": role[0], "db": role[1]}
    for ns in (USERS_NS, ROLES_NS):
        coll = ctx.engine.get_collection(ns, ctx.txn)
        if coll is None:
            continue
        for key, doc in list(ctx.engine.scan(ctx.txn, ns)):
            roles = doc.get("roles")
            if isinstance(roles, list) and entry in roles:
                new = {**doc, "roles": [r for r in roles if r != entry]}
                replace_one(ctx, coll, key, doc, new, True)


@command("dropRole")
def cmd_drop_role(ctx: Context, cmd: Doc) -> Doc:
    _check_fields(cmd, set())
    name = _role_name(cmd)
    key, _ = _load_role(ctx, name)
    coll = ctx.engine.get_collection(ROLES_NS, ctx.txn)
    assert coll is not None
    ctx.engine.write(ctx.txn, coll, key, None)
    _forget_role(ctx, (name, ctx.db))
    return {"ok": 1.0}


@command("dropAllRolesFromDatabase")
def cmd_drop_all_roles(ctx: Context, cmd: Doc) -> Doc:
    _check_fields(cmd, set())
    coll = ctx.engine.get_collection(ROLES_NS, ctx.txn)
    dropped = []
    if coll is not None:
        for key, doc in list(ctx.engine.scan(ctx.txn, ROLES_NS)):
            if doc.get("db") == ctx.db:
                ctx.engine.write(ctx.txn, coll, key, None)
                dropped.append((doc.get("role"), ctx.db))
    for role in dropped:
        _forget_role(ctx, role)  # type: ignore[arg-type]
    return {"n": len(dropped), "ok": 1.0}


def _named_roles(ctx: Context, arg: Any) -> list[RoleName] | None:
    if isinstance(arg, int | float) and not isinstance(arg, bool):
        return None
    items = arg if isinstance(arg, list) else [arg]
    out = []
    for item in items:
        if isinstance(item, str):
            out.append((item, ctx.db))
        elif isinstance(item, dict) and isinstance(item.get("role"), str):
            db = item.get("db", ctx.db)
            if not isinstance(db, str):
                raise EngineError(Code.BadValue, "rolesInfo: 'db' must be a string")
            out.append((item["role"], db))
        else:
            raise EngineError(
                Code.BadValue,
                "rolesInfo must be 1, a role name, a {role, db} document or an array of them",
            )
    return out


@command("rolesInfo")
def cmd_roles_info(ctx: Context, cmd: Doc) -> Doc:
    _check_fields(cmd, {"showPrivileges", "showBuiltinRoles", "showAuthenticationRestrictions"})
    catalog = _catalog(ctx)
    show = cmd.get("showPrivileges", False)
    if show == "asUserFragment":
        raise EngineError(
            Code.BadValue,
            "showPrivileges: 'asUserFragment' is not supported by the embedded engine",
        )
    arg = cmd.get("rolesInfo")
    named = _named_roles(ctx, arg)
    if named is None:
        names = [(r, d) for (d, r) in sorted(catalog.roles) if d == ctx.db]
        if cmd.get("showBuiltinRoles"):
            names = [(r, ctx.db) for r in builtin_roles.builtin_names(ctx.db)] + names
    else:
        names = [n for n in named if catalog.role_exists(*n)]
    out = [
        _describe_role(catalog, name, bool(show), bool(cmd.get("showAuthenticationRestrictions")))
        for name in names
    ]
    return {"roles": out, "ok": 1.0}


def _describe_role(catalog: AuthCatalog, name: RoleName, show: bool, restrictions: bool) -> Doc:
    role, db = name
    builtin = builtin_roles.is_builtin(role, db)
    doc: Doc = {} if builtin else {"_id": _user_id(db, role)}
    doc |= {"role": role, "db": db}
    if show:
        doc["privileges"] = catalog.own_privileges(role, db).to_docs()
    doc["roles"] = _role_docs(catalog.direct_subroles(role, db))
    if restrictions or show:
        doc["authenticationRestrictions"] = []
    doc["isBuiltin"] = builtin
    inherited = sorted(catalog.inherited_roles(name), key=lambda r: (r[1], r[0]))
    doc["inheritedRoles"] = _role_docs(inherited)
    if show:
        _, privileges = catalog.resolve([name])
        doc["inheritedPrivileges"] = privileges.to_docs()
    if restrictions or show:
        doc["inheritedAuthenticationRestrictions"] = []
    return doc


# -- authentication --------------------------------------------------------------------------


@command("saslStart")
def cmd_sasl_start(ctx: Context, cmd: Doc) -> Doc:
    assert ctx.authz is not None and ctx.auth is not None
    return handshake.sasl_start(ctx.authz, ctx.auth, ctx.db, cmd)


@command("saslContinue")
def cmd_sasl_continue(ctx: Context, cmd: Doc) -> Doc:
    assert ctx.auth is not None
    return handshake.sasl_continue(ctx.auth, cmd)


@command("logout")
def cmd_logout(ctx: Context, cmd: Doc) -> Doc:
    sess = ctx.auth
    if sess is not None and sess.user is not None and sess.user[1] == ctx.db:
        sess.logout()
    return {"ok": 1.0}


@command("authenticate")
def cmd_authenticate(ctx: Context, cmd: Doc) -> Doc:
    mechanism = cmd.get("mechanism")
    raise EngineError(
        Code.MechanismUnavailable,
        f"Received authentication for mechanism {mechanism} which is not enabled: the "
        "embedded engine authenticates with SCRAM-SHA-256 and SCRAM-SHA-1 (saslStart)",
    )
