"""Authentication and roles, through real pymongo clients, on a server with auth enabled.

On the embedded engine a module-wide engine is started with ``--auth`` and a first root
user (``admin_user``). With ``MONGODB_URI`` the same tests run against that server when it
runs with authorization enabled and the URI's credentials are a root user's (skipped
otherwise, with that reason); each test works in its own database and removes its users and
roles. Tests that restart the engine or need an engine with no user yet are
``embedded_only``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pymongo import InsertOne, MongoClient
from pymongo.errors import ClientBulkWriteException, OperationFailure

REAL_URI = os.environ.get("MONGODB_URI")
ADMIN = ("accord_admin", "admin-secret")


@dataclass
class AuthServer:
    uri: str
    admin: MongoClient

    def connect(self, user: str, password: str, source: str, **kwargs: object) -> MongoClient:
        return MongoClient(self.uri, username=user, password=password, authSource=source, **kwargs)

    def anonymous(self) -> MongoClient:
        if REAL_URI:
            pytest.skip("an unauthenticated client needs a URI without credentials")
        return MongoClient(self.uri)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    if REAL_URI:
        admin: MongoClient = MongoClient(REAL_URI)
        opts = admin.admin.command("getCmdLineOpts")
        if opts.get("parsed", {}).get("security", {}).get("authorization") != "enabled":
            admin.close()
            pytest.skip("the MONGODB_URI server does not run with authorization enabled")
        yield AuthServer(REAL_URI, admin)
        admin.close()
        return
    from accord.platform.embedded import EmbeddedServer

    engine = EmbeddedServer(
        tmp_path_factory.mktemp("auth-engine"), port=0, sync=False, auth=True, admin_user=ADMIN
    ).start()
    admin = MongoClient(engine.uri, username=ADMIN[0], password=ADMIN[1])
    try:
        yield AuthServer(engine.uri, admin)
    finally:
        admin.close()
        engine.stop()


@pytest.fixture()
def dbname(server: AuthServer) -> Iterator[str]:
    """A fresh database per test; its users, roles and data are removed afterwards."""
    name = "auth_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        server.admin[name].command("dropAllUsersFromDatabase")
        server.admin[name].command("dropAllRolesFromDatabase")
        server.admin.drop_database(name)


def _code(exc: pytest.ExceptionInfo[OperationFailure]) -> int | None:
    return exc.value.code


def _find_one_role(server: AuthServer, db: str, coll: str = "allowed") -> None:
    server.admin[db].command(
        "createRole",
        "reader",
        privileges=[{"resource": {"db": db, "collection": coll}, "actions": ["find"]}],
        roles=[],
    )


def _user(server: AuthServer, db: str, name: str, roles: list, pwd: str = "pw") -> MongoClient:
    server.admin[db].command("createUser", name, pwd=pwd, roles=roles)
    return server.connect(name, pwd, db)


# -- authentication ---------------------------------------------------------------------------


def test_wrong_password_and_unknown_user_are_refused_with_18(server: AuthServer, dbname: str):
    server.admin[dbname].command("createUser", "alice", pwd="right", roles=[])
    for user, pwd in (("alice", "wrong"), ("nobody", "right")):
        client = server.connect(user, pwd, dbname)
        with pytest.raises(OperationFailure) as exc:
            client[dbname].command("ping")
        assert _code(exc) == 18
        assert exc.value.details["codeName"] == "AuthenticationFailed"
        client.close()
    good = server.connect("alice", "right", dbname)
    assert good[dbname].command("connectionStatus")["authInfo"]["authenticatedUsers"] == [
        {"user": "alice", "db": dbname}
    ]
    good.close()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_scram_mechanisms(server: AuthServer, dbname: str, mechanism: str):
    server.admin[dbname].command(
        "createUser", "m", pwd="pw", roles=["read"], mechanisms=[mechanism]
    )
    client = server.connect("m", "pw", dbname, authMechanism=mechanism)
    assert client[dbname].command("dbStats")["ok"] == 1
    other = "SCRAM-SHA-1" if mechanism == "SCRAM-SHA-256" else "SCRAM-SHA-256"
    refused = server.connect("m", "pw", dbname, authMechanism=other)
    with pytest.raises(OperationFailure) as exc:
        refused[dbname].command("dbStats")
    assert _code(exc) == 18
    client.close()
    refused.close()


def test_unauthenticated_commands_are_refused(server: AuthServer):
    anon = server.anonymous()
    for name in ("ping", "hello", "buildInfo"):
        assert anon.admin.command(name)["ok"] == 1  # the handshake needs no user
    with pytest.raises(OperationFailure) as exc:
        anon.test.coll.find_one()
    assert _code(exc) == 13
    assert "requires authentication" in exc.value.details["errmsg"]
    with pytest.raises(OperationFailure) as exc:
        anon.admin.command("listDatabases")
    assert _code(exc) == 13
    with pytest.raises(OperationFailure) as exc:  # the first user exists: no localhost exception
        anon.admin.command("createUser", "intruder", pwd="x", roles=["root"])
    assert _code(exc) == 13
    anon.close()


# -- a custom role that grants find on one collection ------------------------------------------


def test_custom_role_reads_one_collection_and_nothing_else(server: AuthServer, dbname: str):
    server.admin[dbname].allowed.insert_many([{"_id": 1}, {"_id": 2}])
    server.admin[dbname].other.insert_one({"_id": 1})
    _find_one_role(server, dbname)
    client = _user(server, dbname, "reader_user", ["reader"])
    db = client[dbname]
    assert [d["_id"] for d in db.allowed.find().sort("_id", 1)] == [1, 2]
    assert db.allowed.count_documents({}) == 2
    with pytest.raises(OperationFailure) as exc:
        db.other.find_one()
    assert _code(exc) == 13
    assert exc.value.details["errmsg"].startswith(
        f'not authorized on {dbname} to execute command {{ find: "other"'
    )
    with pytest.raises(OperationFailure) as exc:
        db.allowed.insert_one({"_id": 3})
    assert _code(exc) == 13
    for write in (
        lambda: db.allowed.update_one({"_id": 1}, {"$set": {"x": 1}}),
        lambda: db.allowed.delete_one({"_id": 1}),
        lambda: db.allowed.find_one_and_update({"_id": 1}, {"$set": {"x": 1}}),
        lambda: db.allowed.create_index("x"),
        lambda: db.allowed.drop(),
    ):
        with pytest.raises(OperationFailure) as exc:
            write()
        assert _code(exc) == 13
    assert server.admin[dbname].allowed.count_documents({}) == 2  # nothing was written
    client.close()


def test_privilege_check_inside_a_transaction(server: AuthServer, dbname: str):
    server.admin[dbname].allowed.insert_one({"_id": 1})
    server.admin[dbname].other.insert_one({"_id": 1})
    _find_one_role(server, dbname)
    client = _user(server, dbname, "txn_user", ["reader"])
    db = client[dbname]
    with client.start_session() as session:
        session.start_transaction()
        assert db.allowed.find_one({"_id": 1}, session=session) == {"_id": 1}
        with pytest.raises(OperationFailure) as exc:
            db.other.find_one({}, session=session)
        assert _code(exc) == 13
        session.abort_transaction()
    with client.start_session() as session:
        session.start_transaction()
        with pytest.raises(OperationFailure) as exc:
            db.allowed.insert_one({"_id": 2}, session=session)
        assert _code(exc) == 13
        session.abort_transaction()
    assert server.admin[dbname].allowed.count_documents({}) == 1
    client.close()


def test_privilege_check_on_every_namespace_of_a_client_bulk_write(server: AuthServer, dbname: str):
    server.admin[dbname].command(
        "createRole",
        "writer",
        privileges=[{"resource": {"db": dbname, "collection": "allowed"}, "actions": ["insert"]}],
        roles=[],
    )
    client = _user(server, dbname, "bulk_user", ["writer"])
    result = client.bulk_write([InsertOne({"_id": 1}, namespace=f"{dbname}.allowed")])
    assert result.inserted_count == 1
    with pytest.raises((ClientBulkWriteException, OperationFailure)) as exc:
        client.bulk_write(
            [
                InsertOne({"_id": 2}, namespace=f"{dbname}.allowed"),
                InsertOne({"_id": 1}, namespace=f"{dbname}.other"),
            ]
        )
    error = exc.value.error if isinstance(exc.value, ClientBulkWriteException) else exc.value
    assert isinstance(error, OperationFailure) and error.code == 13
    assert server.admin[dbname].allowed.count_documents({}) == 1  # refused whole
    assert server.admin[dbname].other.count_documents({}) == 0
    client.close()


def test_pipeline_sources_and_targets_are_checked(server: AuthServer, dbname: str):
    server.admin[dbname].allowed.insert_one({"_id": 1, "k": 1})
    server.admin[dbname].other.insert_one({"_id": 1, "k": 1})
    _find_one_role(server, dbname)
    client = _user(server, dbname, "pipe_user", ["reader"])
    coll = client[dbname].allowed
    assert list(coll.aggregate([{"$match": {}}])) == [{"_id": 1, "k": 1}]
    pipelines = [
        [{"$lookup": {"from": "other", "localField": "k", "foreignField": "k", "as": "o"}}],
        [{"$lookup": {"from": "other", "pipeline": [], "as": "o"}}],
        [{"$unionWith": "other"}],
        [{"$facet": {"a": [{"$lookup": {"from": "other", "pipeline": [], "as": "o"}}]}}],
        [{"$out": "target"}],
        [{"$merge": {"into": "target"}}],
    ]
    for pipeline in pipelines:
        with pytest.raises(OperationFailure) as exc:
            list(coll.aggregate(pipeline))
        assert _code(exc) == 13, pipeline
    assert "target" not in server.admin[dbname].list_collection_names()
    client.close()


def test_cursors_belong_to_their_user(server: AuthServer, dbname: str):
    server.admin[dbname].allowed.insert_many([{"_id": i} for i in range(10)])
    _find_one_role(server, dbname)
    owner = _user(server, dbname, "owner", ["reader"])
    thief = _user(server, dbname, "thief", ["reader"])
    reply = owner[dbname].command("find", "allowed", batchSize=2)
    cursor_id = reply["cursor"]["id"]
    assert cursor_id
    with pytest.raises(OperationFailure) as exc:
        thief[dbname].command("getMore", cursor_id, collection="allowed")
    assert _code(exc) == 13
    with pytest.raises(OperationFailure) as exc:
        thief[dbname].command("killCursors", "allowed", cursors=[cursor_id])
    assert _code(exc) == 13
    more = owner[dbname].command("getMore", cursor_id, collection="allowed", batchSize=2)
    assert [d["_id"] for d in more["cursor"]["nextBatch"]] == [2, 3]
    owner[dbname].command("killCursors", "allowed", cursors=[cursor_id])
    owner.close()
    thief.close()


def test_kill_any_cursor_counts_on_the_cursors_own_namespace(server: AuthServer, dbname: str):
    """mongod checks killAnyCursor on the cursor's namespace (checkAuthForKillCursors with
    cc.nss()), whatever collection the killCursors command names: before 2026-12-07 the
    engine checked the named one, so killAnyCursor on a collection of one's own killed
    another user's cursor on any collection."""
    server.admin[dbname].allowed.insert_many([{"_id": i} for i in range(10)])
    _find_one_role(server, dbname)
    server.admin[dbname].command(
        "createRole", "own_killer",
        privileges=[{"resource": {"db": dbname, "collection": "own"},
                     "actions": ["find", "killAnyCursor"]}],
        roles=[],
    )  # fmt: skip
    owner = _user(server, dbname, "owner", ["reader"])
    thief = _user(server, dbname, "killer", ["own_killer"])
    with owner.start_session() as opened, owner.start_session() as other:
        db = owner[dbname]
        cursor_id = db.command("find", "allowed", batchSize=2, session=opened)["cursor"]["id"]
        with pytest.raises(OperationFailure) as exc:
            thief[dbname].command("killCursors", "own", cursors=[cursor_id])
        assert _code(exc) == 13
        more = db.command("getMore", cursor_id, collection="allowed", batchSize=2,
                          session=opened)  # fmt: skip
        assert [d["_id"] for d in more["cursor"]["nextBatch"]] == [2, 3]  # alive
        # the same user in another logical session may kill it, as on mongod (which
        # checks the user, not the session: drivers kill collected cursors outside it)
        assert other.session_id != opened.session_id
        killed = db.command("killCursors", "allowed", cursors=[cursor_id], session=other)
        assert killed["cursorsKilled"] == [cursor_id]
    owner.close()
    thief.close()


def test_listings_show_what_the_user_may_touch(server: AuthServer, dbname: str):
    server.admin[dbname].allowed.insert_one({})
    server.admin[dbname].other.insert_one({})
    _find_one_role(server, dbname)
    client = _user(server, dbname, "lister", ["reader"])
    db = client[dbname]
    names = db.list_collection_names(authorizedCollections=True)
    assert names == ["allowed"]
    with pytest.raises(OperationFailure) as exc:
        db.list_collection_names()  # the whole list needs listCollections
    assert _code(exc) == 13
    assert [d["name"] for d in client.list_databases()] == [dbname]
    with pytest.raises(OperationFailure) as exc:
        client.admin.command("listDatabases", authorizedDatabases=False)
    assert _code(exc) == 13
    client.close()


def test_change_streams_and_explain_need_the_privileges_of_what_they_read(
    server: AuthServer, dbname: str
):
    server.admin[dbname].allowed.insert_one({"_id": 1})
    _find_one_role(server, dbname)
    server.admin[dbname].command(
        "createRole",
        "watcher",
        privileges=[
            {
                "resource": {"db": dbname, "collection": "allowed"},
                "actions": ["find", "changeStream"],
            }
        ],
        roles=[],
    )
    reader = _user(server, dbname, "plain_reader", ["reader"])
    watcher = _user(server, dbname, "watcher_user", ["watcher"])
    with pytest.raises(OperationFailure) as exc:  # find alone does not open a stream
        reader[dbname].allowed.watch()
    assert _code(exc) == 13
    with watcher[dbname].allowed.watch() as stream:
        assert stream.try_next() is None
    with pytest.raises(OperationFailure) as exc:
        watcher[dbname].other.watch()
    assert _code(exc) == 13
    assert reader[dbname].command("explain", {"find": "allowed", "filter": {}})["ok"] == 1
    with pytest.raises(OperationFailure) as exc:
        reader[dbname].command("explain", {"find": "other", "filter": {}})
    assert _code(exc) == 13
    reader.close()
    watcher.close()


def test_system_collections_need_privileges_that_name_them(server: AuthServer, dbname: str):
    """A database-wide role does not reach system.* (mongod): a readWrite user of admin
    cannot read the stored credentials; root can."""
    name = f"adm_{dbname}"
    server.admin.admin.command("createUser", name, pwd="pw", roles=["readWrite"])
    try:
        client = server.connect(name, "pw", "admin")
        client.admin.plain.find_one()  # a normal collection of admin: allowed
        with pytest.raises(OperationFailure) as exc:
            client.admin["system.users"].find_one()
        assert _code(exc) == 13
        assert server.admin.admin["system.users"].find_one({"user": name})["db"] == "admin"
        client.close()
    finally:
        server.admin.admin.command("dropUser", name)


# -- managing users and roles -----------------------------------------------------------------


def test_grant_and_revoke_take_effect_on_open_connections(server: AuthServer, dbname: str):
    server.admin[dbname].command("createUser", "grantee", pwd="pw", roles=[])
    client = server.connect("grantee", "pw", dbname)
    coll = client[dbname].coll
    with pytest.raises(OperationFailure) as exc:
        coll.insert_one({"_id": 1})
    assert _code(exc) == 13
    server.admin[dbname].command("grantRolesToUser", "grantee", roles=["readWrite"])
    coll.insert_one({"_id": 1})
    assert coll.find_one() == {"_id": 1}
    server.admin[dbname].command("revokeRolesFromUser", "grantee", roles=["readWrite"])
    with pytest.raises(OperationFailure) as exc:
        coll.find_one()
    assert _code(exc) == 13
    client.close()


def test_update_role_changes_what_its_users_may_do(server: AuthServer, dbname: str):
    server.admin[dbname].other.insert_one({"_id": 1})
    _find_one_role(server, dbname)
    client = _user(server, dbname, "follower", ["reader"])
    with pytest.raises(OperationFailure):
        client[dbname].other.find_one()
    server.admin[dbname].command(
        "updateRole",
        "reader",
        privileges=[{"resource": {"db": dbname, "collection": "other"}, "actions": ["find"]}],
    )
    assert client[dbname].other.find_one() == {"_id": 1}
    client.close()


def test_role_inheritance(server: AuthServer, dbname: str):
    server.admin[dbname].allowed.insert_one({"_id": 1})
    _find_one_role(server, dbname)
    server.admin[dbname].command(
        "createRole",
        "inserter",
        privileges=[{"resource": {"db": dbname, "collection": "allowed"}, "actions": ["insert"]}],
        roles=["reader"],
    )
    client = _user(server, dbname, "heir", ["inserter"])
    client[dbname].allowed.insert_one({"_id": 2})
    assert client[dbname].allowed.count_documents({}) == 2
    info = server.admin[dbname].command("rolesInfo", "inserter")["roles"][0]
    assert info["inheritedRoles"] == [{"role": "reader", "db": dbname}]
    with pytest.raises(OperationFailure) as exc:  # a cycle
        server.admin[dbname].command("grantRolesToRole", "reader", roles=["inserter"])
    assert _code(exc) == 49
    client.close()


def test_drop_user_revokes_at_once(server: AuthServer, dbname: str):
    server.admin[dbname].coll.insert_one({"_id": 1})
    client = _user(server, dbname, "leaver", ["read"])
    assert client[dbname].coll.find_one() == {"_id": 1}
    server.admin[dbname].command("dropUser", "leaver")
    fresh = server.connect("leaver", "pw", dbname)
    with pytest.raises(OperationFailure) as exc:
        fresh[dbname].coll.find_one()
    assert _code(exc) == 18
    with pytest.raises(OperationFailure) as exc:  # the open connection lost the user too
        client[dbname].coll.find_one()
    assert _code(exc) == 13
    fresh.close()
    client.close()


def test_user_management_errors(server: AuthServer, dbname: str):
    db = server.admin[dbname]
    db.command("createUser", "dup", pwd="pw", roles=[])
    cases = [
        (lambda: db.command("createUser", "dup", pwd="pw", roles=[]), 51003),
        (lambda: db.command("dropUser", "missing"), 11),
        (lambda: db.command("grantRolesToUser", "missing", roles=["read"]), 11),
        (lambda: db.command("grantRolesToUser", "dup", roles=["nosuchrole"]), 31),
        (lambda: db.command("createUser", "u2", pwd="pw", roles=["nosuchrole"]), 31),
        (lambda: db.command("createUser", "u3", pwd="", roles=[]), 2),
        (lambda: db.command("createUser", "u4", pwd="pw", roles=[], mechanisms=["MD5"]), 2),
        (lambda: db.command("createUser", "u5", pwd="pw"), 40414),
        (lambda: db.command("updateUser", "dup"), 2),
        (lambda: db.command("createRole", "read", privileges=[], roles=[]), 2),
        (lambda: db.command("createRole", "r", privileges=[], roles=["nosuchrole"]), 31),
        (lambda: db.command("dropRole", "nosuchrole"), 31),
        (
            lambda: db.command(
                "createRole",
                "r",
                privileges=[
                    {"resource": {"db": "elsewhere", "collection": "c"}, "actions": ["find"]}
                ],
                roles=[],
            ),
            49,
        ),
        (
            lambda: db.command(
                "createRole",
                "r",
                privileges=[{"resource": {"db": dbname, "collection": "c"}, "actions": ["fly"]}],
                roles=[],
            ),
            9,
        ),
    ]
    for call, code in cases:
        with pytest.raises(OperationFailure) as exc:
            call()
        assert _code(exc) == code, (exc.value.details, code)
    db.command("createRole", "r", privileges=[], roles=[])
    with pytest.raises(OperationFailure) as exc:
        db.command("createRole", "r", privileges=[], roles=[])
    assert _code(exc) == 51002


def test_users_info_and_roles_info_shapes(server: AuthServer, dbname: str):
    db = server.admin[dbname]
    _find_one_role(server, dbname)
    db.command("createUser", "shown", pwd="pw", roles=["reader", "read"], customData={"team": "a"})
    users = db.command("usersInfo", "shown")["users"]
    assert len(users) == 1
    user = users[0]
    assert {"_id", "userId", "user", "db", "roles", "mechanisms", "customData"} <= set(user)
    assert "credentials" not in user
    assert user["_id"] == f"{dbname}.shown" and user["user"] == "shown" and user["db"] == dbname
    assert sorted(user["mechanisms"]) == ["SCRAM-SHA-1", "SCRAM-SHA-256"]
    assert sorted(user["roles"], key=lambda r: r["role"]) == [
        {"role": "read", "db": dbname},
        {"role": "reader", "db": dbname},
    ]
    assert user["customData"] == {"team": "a"}
    detailed = db.command("usersInfo", {"user": "shown", "db": dbname}, showPrivileges=True)
    detailed_user = detailed["users"][0]
    assert {"inheritedRoles", "inheritedPrivileges"} <= set(detailed_user)
    assert {"resource": {"db": dbname, "collection": "allowed"}, "actions": ["find"]} in (
        detailed_user["inheritedPrivileges"]
    )
    assert db.command("usersInfo", "nobody")["users"] == []
    assert [u["user"] for u in db.command("usersInfo", 1)["users"]] == ["shown"]

    role = db.command("rolesInfo", "reader", showPrivileges=True)["roles"][0]
    assert role["role"] == "reader" and role["db"] == dbname and role["isBuiltin"] is False
    assert role["roles"] == [] and role["inheritedRoles"] == []
    assert role["privileges"] == [
        {"resource": {"db": dbname, "collection": "allowed"}, "actions": ["find"]}
    ]
    assert role["inheritedPrivileges"] == role["privileges"]
    plain = db.command("rolesInfo", "reader")["roles"][0]
    assert "privileges" not in plain
    builtin = db.command("rolesInfo", "read")["roles"][0]
    assert builtin["isBuiltin"] is True
    everything = db.command("rolesInfo", 1, showBuiltinRoles=True)["roles"]
    names = {r["role"] for r in everything}
    assert {"read", "readWrite", "dbAdmin", "userAdmin", "dbOwner", "reader"} <= names


def test_a_user_sees_its_own_info_without_view_privileges(server: AuthServer, dbname: str):
    client = _user(server, dbname, "self", [])
    assert client[dbname].command("usersInfo", "self")["users"][0]["user"] == "self"
    server.admin[dbname].command("createUser", "neighbour", pwd="pw", roles=[])
    with pytest.raises(OperationFailure) as exc:
        client[dbname].command("usersInfo", "neighbour")
    assert _code(exc) == 13
    client.close()


def test_built_in_roles(server: AuthServer, dbname: str):
    admin = server.admin
    admin[dbname].coll.insert_one({"_id": 1})
    reader = _user(server, dbname, "r", ["read"])
    assert reader[dbname].coll.find_one() == {"_id": 1}
    with pytest.raises(OperationFailure):
        reader[dbname].coll.insert_one({})
    user_admin = _user(server, dbname, "ua", ["userAdmin"])
    user_admin[dbname].command("createUser", "made_by_ua", pwd="pw", roles=["read"])
    with pytest.raises(OperationFailure):
        user_admin[dbname].coll.find_one()
    db_admin = _user(server, dbname, "da", ["dbAdmin"])
    db_admin[dbname].coll.create_index("x")
    with pytest.raises(OperationFailure):
        db_admin[dbname].coll.find_one()
    admin.admin.command(
        "createUser", f"any_{dbname}", pwd="pw", roles=[{"role": "readAnyDatabase", "db": "admin"}]
    )
    try:
        any_reader = server.connect(f"any_{dbname}", "pw", "admin")
        assert any_reader[dbname].coll.find_one() == {"_id": 1}
        with pytest.raises(OperationFailure):
            any_reader[dbname].coll.insert_one({})
        any_reader.close()
    finally:
        admin.admin.command("dropUser", f"any_{dbname}")
    for c in (reader, user_admin, db_admin):
        c.close()


def test_without_auth_users_work_and_nothing_is_refused(client: MongoClient, db):
    """On a server without --auth (the test session's), users can be created and used, and
    an unauthenticated client may still do everything (mongod's behaviour)."""
    opts = client.admin.command("getCmdLineOpts")
    if opts.get("parsed", {}).get("security", {}).get("authorization") == "enabled":
        pytest.skip("the server runs with authorization enabled")
    db.command("createUser", "plain", pwd="pw", roles=["read"])
    try:
        db.coll.insert_one({"_id": 1})  # no user, no refusal
        assert db.coll.find_one() == {"_id": 1}
        host = client.address
        authed = MongoClient(
            host[0], host[1], username="plain", password="pw", authSource=db.name,
            directConnection=True,
        )  # fmt: skip
        status = authed[db.name].command("connectionStatus")["authInfo"]
        assert status["authenticatedUsers"] == [{"user": "plain", "db": db.name}]
        authed.close()
    finally:
        db.command("dropAllUsersFromDatabase")


# -- the embedded engine's own start-up ------------------------------------------------------------


@pytest.mark.embedded_only
def test_roles_and_users_survive_a_restart(tmp_path: Path):
    from accord.platform.embedded import EmbeddedServer

    engine = EmbeddedServer(tmp_path, port=0, sync=True, auth=True, admin_user=ADMIN).start()
    admin = MongoClient(engine.uri, username=ADMIN[0], password=ADMIN[1])
    admin.app.allowed.insert_one({"_id": 1})
    admin.app.other.insert_one({"_id": 1})
    admin.app.command(
        "createRole",
        "reader",
        privileges=[{"resource": {"db": "app", "collection": "allowed"}, "actions": ["find"]}],
        roles=[],
    )
    admin.app.command("createUser", "svc", pwd="pw", roles=["reader"])
    admin.close()
    engine.stop()

    engine = EmbeddedServer(tmp_path, port=0, sync=True, auth=True).start()
    try:
        svc = MongoClient(engine.uri, username="svc", password="pw", authSource="app")
        assert svc.app.allowed.find_one() == {"_id": 1}
        with pytest.raises(OperationFailure) as exc:
            svc.app.other.find_one()
        assert exc.value.code == 13
        svc.close()
        anon = MongoClient(engine.uri)
        with pytest.raises(OperationFailure) as exc:  # users exist: no localhost exception
            anon.admin.command("createUser", "x", pwd="x", roles=["root"])
        assert "requires authentication" in exc.value.details["errmsg"]
        anon.close()
    finally:
        engine.stop()


@pytest.mark.embedded_only
def test_localhost_exception_creates_the_first_user_only(tmp_path: Path):
    from accord.platform.embedded import EmbeddedServer

    engine = EmbeddedServer(tmp_path, port=0, sync=False, auth=True).start()
    try:
        anon = MongoClient(engine.uri)
        with pytest.raises(OperationFailure) as exc:  # it creates users, nothing else
            anon.app.coll.find_one()
        assert exc.value.code == 13 and "not authorized on app" in exc.value.details["errmsg"]
        with pytest.raises(OperationFailure) as exc:  # on admin only
            anon.app.command("createUser", "x", pwd="x", roles=[])
        assert exc.value.code == 13
        anon.admin.command("createUser", "first", pwd="pw", roles=["root"])
        with pytest.raises(OperationFailure) as exc:  # closed once a user exists
            anon.admin.command("createUser", "second", pwd="pw", roles=["root"])
        assert "requires authentication" in exc.value.details["errmsg"]
        first = MongoClient(engine.uri, username="first", password="pw")
        first.app.coll.insert_one({"_id": 1})
        first.close()
        anon.close()
    finally:
        engine.stop()


@pytest.mark.embedded_only
def test_cli_start_with_auth_and_the_admin_user_from_the_environment(tmp_path: Path):
    env = {
        **os.environ,
        "ACCORD_ENGINE_ADMIN_USER": "boss",
        "ACCORD_ENGINE_ADMIN_PASSWORD": "s3cret",
    }
    cli = [sys.executable, "-m", "accord.platform.cli", "engine"]
    started = subprocess.run(
        [*cli, "start", "--auth", "--dbpath", str(tmp_path), "--port", "0", "--no-sync"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr + started.stdout
    from accord.platform.connection import engine_uri, read_lock, stop_engine

    found = read_lock(tmp_path)
    assert found is not None
    uri = engine_uri(found[1])
    try:
        boss = MongoClient(uri, username="boss", password="s3cret")
        boss.app.coll.insert_one({"_id": 1})
        assert boss.admin.command("getCmdLineOpts")["parsed"]["security"] == {
            "authorization": "enabled"
        }
        boss.close()
        anon = MongoClient(uri)
        with pytest.raises(OperationFailure) as exc:
            anon.app.coll.find_one()
        assert exc.value.code == 13
        anon.close()
    finally:
        stop_engine(tmp_path)


@pytest.mark.embedded_only
def test_every_command_has_a_privilege_rule():
    """A command the engine serves without a rule would be refused to everyone but the
    unchecked; one served to anyone must be listed as such on purpose."""
    from accord.platform.embedded.auth.checks import NO_AUTH, RULES
    from accord.platform.embedded.commands import COMMANDS

    missing = sorted(name for name in COMMANDS if name not in RULES and name not in NO_AUTH)
    assert missing == []
