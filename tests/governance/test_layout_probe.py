"""The saver's layout check at setup reads through the kernel's read hooks
(docs/governance.md, "What is enforced, and where"): a principal the policy does not let
read checkpoints is refused by accord (``PermissionDenied``, naming the rule) before the
database is asked, not by the database's error 13.
"""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import MongoClient

from accord import runtime
from accord.checkpointers import AccordSaver
from accord.errors import PermissionDenied
from accord.governance.apply import apply, plan
from accord.governance.loading import default_policy
from accord.platform.context import MEMORY_API, Principal
from accord.platform.hooks import ReadRequest


class Reads:
    """A read hook that notes each read's class, collection and filter."""

    name = "test-reads"

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []

    def read(self, request: ReadRequest) -> ReadRequest:
        self.seen.append((request.artifact, request.collection, dict(request.filter or {})))
        return request


def test_the_layout_check_reads_through_the_read_hooks(client: MongoClient, db_name: str) -> None:
    AccordSaver(client, db_name=db_name).setup()  # the collections exist: each is checked
    reads = Reads()
    saver = AccordSaver(client, db_name=db_name, uow=runtime.kernel(client, hooks=[reads]))
    saver.setup()
    probed = {(a, c) for a, c, f in reads.seen if f == {"tenant_id": None}}
    assert ("checkpoint", "accord_checkpoints") in probed
    assert ("short_term_memory", "short_term_memory") in probed
    assert any(a == "catalog" for a, _c, _f in reads.seen)


def test_a_principal_that_may_not_read_checkpoints_is_refused_by_accord(
    client: MongoClient, db_name: str
) -> None:
    AccordSaver(client, db_name=db_name).setup()
    policy = default_policy()
    api = runtime.kernel(client, principal=Principal.service(MEMORY_API), policy=policy)
    with pytest.raises(PermissionDenied, match=r"memory-api may not find checkpoint .*"
                       r"checkpoint\.setup\.layout"):  # fmt: skip
        AccordSaver(client, db_name=db_name, uow=api).setup()


ADMIN = ("probe_admin", "probe-admin-secret")
PASSWORDS = {"runtime": "rt-pw", "memory-api": "api-pw", "auditor": "aud-pw"}


@pytest.mark.embedded_only
def test_with_auth_accord_refuses_before_the_database_would(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from accord.platform.embedded import EmbeddedServer

    engine = EmbeddedServer(tmp_path_factory.mktemp("probe-auth"), port=0, sync=False,
                            auth=True, admin_user=ADMIN).start()  # fmt: skip
    db = "probe_auth"
    try:
        admin = MongoClient(engine.uri, username=ADMIN[0], password=ADMIN[1])
        uow = runtime.kernel(admin, principal=Principal.os_user(), policy=default_policy())
        apply(uow, plan(uow, db, default_policy(), users=PASSWORDS))
        AccordSaver(admin, db_name=db, uow=uow).setup()
        api_client = MongoClient(engine.uri, username="accord-memory-api",
                                 password=PASSWORDS["memory-api"], authSource=db)  # fmt: skip
        api = runtime.kernel(api_client, principal=Principal.service(MEMORY_API),
                             policy=default_policy())  # fmt: skip
        with pytest.raises(PermissionDenied, match="may not find checkpoint"):
            AccordSaver(api_client, db_name=db, uow=api).setup()
        for c in (admin, api_client):
            c.close()
    finally:
        engine.stop()
