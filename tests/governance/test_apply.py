"""``accord governance plan | apply | show | check`` (issue 23, item 2 in part): the policy's
roles created and kept up to date idempotently, service users, the applied policy stored
and versioned; and, on an engine started with ``--auth``, the database itself refusing
what the policy forbids (error 13) to a service user connecting with its own credentials,
while accord refuses it first (``PermissionDenied``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from pymongo import MongoClient
from pymongo.errors import OperationFailure
from typer.testing import CliRunner

from accord import runtime
from accord.checkpointers import AccordSaver
from accord.errors import PermissionDenied
from accord.governance.apply import apply, plan
from accord.governance.loading import default_policy, parse_policy
from accord.platform.cli import app as cli
from accord.platform.context import Principal, ReadContext
from tests.test_kernel_doors import _graph


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "gov_" + uuid.uuid4().hex[:10]
    yield name
    client[name].command("dropAllRolesFromDatabase")
    client[name].command("dropAllUsersFromDatabase")
    client.drop_database(name)


def _admin(client: MongoClient) -> Any:
    return runtime.kernel(client, principal=Principal.os_user())


def _privileges(client: MongoClient, db: str, role: str) -> dict[str, list[str]]:
    info = client[db].command({"rolesInfo": role, "showPrivileges": True})["roles"][0]
    return {p["resource"]["collection"]: sorted(p["actions"]) for p in info["privileges"]}


def test_apply_creates_the_roles_and_stores_the_policy_once(
    client: MongoClient, db_name: str
) -> None:
    uow = _admin(client)
    first = plan(uow, db_name, default_policy())
    kinds = [c.kind for c in first.changes]
    assert kinds.count("create role") == 5 and kinds[-1] == "store policy"
    apply(uow, first)
    assert not plan(uow, db_name, default_policy())  # applied: nothing to change
    memory_api = _privileges(client, db_name, "accord_memory-api")
    assert set(memory_api) == {
        "long_term_memory",
        "memory_history",
        "memory_vectors",
        "accord_catalog",
        "accord_policies",
        "accord_holds",
        "accord_keys",
        "",
    }  # fmt: skip  (keys: to decrypt)
    assert memory_api["accord_catalog"] == ["find"] and memory_api[""] == ["listCollections"]
    assert memory_api["accord_policies"] == ["find"]  # every process reads the applied policy
    auditor = _privileges(client, db_name, "accord_auditor")
    setup = ["collMod", "createCollection", "createIndex", "listIndexes"]
    assert auditor == {  # finds records; finds and appends digests (Governance II)
        # the records and their streams' heads (it was "audit", a collection nobody writes)
        "accord_audit": ["find"], "accord_audit_heads": ["find"],
        "accord_audit_digests": sorted(["find", "insert", *setup]),
        # the digests' heads and the trail's cuts, which a verifier reads with the digests
        "accord_audit_digest_heads": sorted(["find", "insert", *setup]),
        "accord_audit_cuts": sorted(["find", "insert", *setup]),
        "accord_policies": ["find"], "accord_holds": ["find"],  # what every process reads
        "": ["listCollections"],
    }  # fmt: skip
    runtime_role = _privileges(client, db_name, "accord_runtime")
    assert "accord_audit" not in runtime_role
    # audit records expire by cuts, never by a TTL index (nor is an "audit" collection made)
    assert "audit" not in client[db_name].list_collection_names()
    assert not [c for c in first.changes if c.kind == "create index" and "audit" in c.target]
    stored = client[db_name].accord_policies.find_one({"_id": "head"})
    assert stored["version"] == 1 and stored["applied_by"].startswith("user:")
    # a changed policy: the role it changes is updated, version 2 stored, version 1 kept
    all_four = '["find", "insert", "update", "remove"]'
    changed = parse_policy(
        f"[classes.short_term_memory.roles]\nruntime = {all_four}\nadmin = {all_four}\n",
        "team.toml",
    )  # the aggregator's read gone
    second = plan(uow, db_name, changed)
    assert [(c.kind, c.target) for c in second.changes] == [
        ("update role", f"{db_name}.accord_aggregator"), ("store policy", f"{db_name}.accord_policies")
    ]  # fmt: skip
    apply(uow, second)
    assert "short_term_memory" not in _privileges(client, db_name, "accord_aggregator")
    assert client[db_name].accord_policies.find_one({"_id": "head"})["version"] == 2
    assert client[db_name].accord_policies.count_documents({"_id": {"$in": ["v1", "v2"]}}) == 2
    assert not plan(uow, db_name, changed)


def test_the_runtime_cannot_apply_a_policy(client: MongoClient, db_name: str) -> None:
    uow = runtime.kernel(client)  # the runtime may read policies, not store them
    changes = plan(uow, db_name, default_policy())
    with pytest.raises(PermissionDenied, match="runtime may not insert policy"):
        apply(uow, changes)


def test_a_policy_whose_expiry_recompute_the_admin_may_not_make_is_refused_whole(
    client: MongoClient, db_name: str
) -> None:
    """The docs' example policy (admin = ["find"] on business:orders, a retention) on a
    database with orders: roles, validators and the version were written, then the
    recompute was refused, and every apply after it failed the same way."""
    uow = _admin(client)
    text = (
        '[classes."business:orders"]\nretention = { expire_after = "7y", after = "created" }\n'
        'roles = { runtime = ["find", "insert", "update"], admin = ["find"] }\n'
    )
    policy = parse_policy(text, "p.toml")
    apply(uow, plan(uow, db_name, parse_policy(text.replace('"find"]', '"find", "update"]'),
                                               "empty.toml")))  # fmt: skip
    client[db_name].orders.insert_one(
        {"_id": "o1", "tenant_id": "acme", "expire_at": datetime.now(UTC)}  # as stamped
    )
    roles = client[db_name].command("rolesInfo", 1)["roles"]
    versions = client[db_name].accord_policies.count_documents({})
    changes = plan(uow, db_name, parse_policy(text.replace("7y", "8y"), "p.toml"))
    with pytest.raises(PermissionDenied, match=r"roles\.admin.*nothing was applied"):
        apply(uow, changes)
    assert client[db_name].command("rolesInfo", 1)["roles"] == roles
    assert client[db_name].accord_policies.count_documents({}) == versions  # no new version
    # with no document to update, the same grants are fine
    client[db_name].orders.delete_many({})
    apply(uow, plan(uow, db_name, policy))
    assert client[db_name].accord_policies.count_documents({}) == versions + 1


def test_the_cli_shows_checks_and_plans(
    client: MongoClient, mongo_uri: str, db_name: str, tmp_path: Path
) -> None:
    runner = CliRunner()
    shown = runner.invoke(cli, ["governance", "show", "--toml"])
    assert shown.exit_code == 0, shown.output
    assert parse_policy(shown.output, "shown", base=None).classes == default_policy().classes
    bad = tmp_path / "bad.toml"
    bad.write_text("# ours\n\n[classes.audit.roles]\nadmin = ['find', 'remove']\n")
    checked = runner.invoke(cli, ["governance", "check", str(bad)])
    assert checked.exit_code == 1
    problem = [line for line in checked.output.splitlines() if f"{bad}:4:" in line]
    assert problem and problem[0].endswith("(find and insert only)")  # one line, never cut
    good = tmp_path / "good.toml"
    good.write_text('[classes.checkpoint]\naudit = "full"\n')
    assert runner.invoke(cli, ["governance", "check", str(good)]).exit_code == 0
    env = {"MONGODB_URI": mongo_uri}
    planned = runner.invoke(cli, ["governance", "plan", "--db", db_name], env=env)
    assert planned.exit_code == 0, planned.output
    assert "create role" in planned.output and "store policy" in planned.output
    applied = runner.invoke(cli, ["governance", "apply", "--db", db_name], env=env)
    assert applied.exit_code == 0, applied.output
    again = runner.invoke(cli, ["governance", "apply", "--db", db_name], env=env)
    assert "nothing to change" in again.output
    # what the database's processes enforce: the stored policy (show read the file only)
    stored = runner.invoke(cli, ["governance", "apply", "--db", db_name, "--policy", str(good)],
                           env=env)  # fmt: skip
    assert stored.exit_code == 0, stored.output
    shown = runner.invoke(cli, ["governance", "show", "--db", db_name, "--toml"], env=env)
    assert shown.exit_code == 0, shown.output
    assert parse_policy(shown.output, "shown", base=None).classes["checkpoint"].audit == "full"
    both = runner.invoke(cli, ["governance", "show", "--db", db_name, "--policy", str(good)])
    assert both.exit_code == 2
    atlas = tmp_path / "atlas"
    written = runner.invoke(cli, ["governance", "plan", "--db", "app", "--atlas-roles",
                                  str(atlas)])  # fmt: skip
    assert written.exit_code == 0, written.output
    role = json.loads((atlas / "accord_memory-api.json").read_text())
    assert role["roleName"] == "accord_memory-api"
    finds = next(a for a in role["actions"] if a["action"] == "FIND")["resources"]
    assert {"db": "app", "collection": "long_term_memory"} in finds
    assert all(r["collection"] != "accord_checkpoints" for r in finds)


ADMIN = ("gov_admin", "gov-admin-secret")
PASSWORDS = {"runtime": "rt-pw", "memory-api": "api-pw", "auditor": "aud-pw"}


@pytest.fixture(scope="module")
def auth_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from accord.platform.embedded import EmbeddedServer

    engine = EmbeddedServer(tmp_path_factory.mktemp("gov-auth"), port=0, sync=False, auth=True,
                            admin_user=ADMIN).start()  # fmt: skip
    try:
        yield engine.uri
    finally:
        engine.stop()


def _as(uri: str, db: str, role: str) -> MongoClient:
    return MongoClient(uri, username=f"accord-{role}", password=PASSWORDS[role], authSource=db)


@pytest.mark.embedded_only
def test_with_auth_the_database_refuses_what_the_policy_forbids(auth_uri: str) -> None:
    db = "gov_auth"
    admin = MongoClient(auth_uri, username=ADMIN[0], password=ADMIN[1])
    uow = _admin(admin)
    # business collections get database privileges when the policy names them
    policy = parse_policy('[classes."business:orders"]\nroles = { runtime = ["find", '
                          '"insert", "update"] }\n', "orders.toml")  # fmt: skip
    apply(uow, plan(uow, db, policy, users=PASSWORDS))
    # the runtime, with its own credentials, runs a graph through accord (setup included)
    rt = _as(auth_uri, db, "runtime")
    config = {"configurable": {"thread_id": "t1"}}
    _graph(AccordSaver(rt, db_name=db, uow=runtime.kernel(rt, policy=policy))).invoke({"messages": [HumanMessage("hi", id="h1")]},
                                               config)  # fmt: skip
    admin[db].accord_audit.insert_one({"_id": "r1", "tenant_id": "default"})
    for tamper in (lambda: rt[db].accord_audit.update_one({"_id": "r1"}, {"$set": {"x": 1}}),
                   lambda: rt[db].accord_audit.delete_one({"_id": "r1"})):  # fmt: skip
        with pytest.raises(OperationFailure) as refused:
            tamper()
        assert refused.value.code == 13
    # the memory API's user: no checkpoints, no messages, from the database itself
    api = _as(auth_uri, db, "memory-api")
    for collection in ("accord_checkpoints", "short_term_memory", "outbox", "accord_audit"):
        with pytest.raises(OperationFailure) as refused:
            api[db][collection].find_one()
        assert refused.value.code == 13, collection
    api[db].long_term_memory.find_one()  # its own class: allowed
    # and accord refuses first, before anything is sent
    who = Principal.api_key("ops", tenant_id="default", scopes=frozenset({"read"}))
    kernel = runtime.kernel(api, policy=policy).acting_as(who)
    for artifact, collection in (("checkpoint", "accord_checkpoints"),
                                 ("short_term_memory", "short_term_memory")):  # fmt: skip
        with pytest.raises(PermissionDenied, match=f"memory-api\\) may not find {artifact} "):
            kernel.find(ReadContext("default"), artifact, db, collection, {"thread_id": "t1"})
    # the auditor reads audit records and nothing else
    auditor = _as(auth_uri, db, "auditor")
    assert auditor[db].accord_audit.find_one({"_id": "r1"}) is not None
    auditor[db].accord_audit_heads.find_one()  # verify reads the streams' heads
    auditor[db].accord_audit_cuts.find_one()  # a verifier starts streams at their cuts
    auditor[db].accord_audit_digest_heads.find_one()
    for collection in ("accord_checkpoints", "long_term_memory", "short_term_memory"):
        with pytest.raises(OperationFailure) as refused:
            auditor[db][collection].find_one()
        assert refused.value.code == 13, collection
    view = runtime.kernel(auditor).acting_as(Principal.service("auditor"))
    assert view.find(ReadContext("default"), "audit", db, "accord_audit", {}) != []
    for c in (rt, api, auditor, admin):
        c.close()
