"""``apply`` sets a ``$jsonSchema`` validator per tenanted class: the database refuses a
document without its tenant (and thread, in a thread's classes) or with an expiry that
is not a date, whoever writes it; accord's own writes pass."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage
from pymongo import MongoClient
from pymongo.errors import WriteError

from accord import runtime
from accord.checkpointers import AccordSaver
from accord.governance.apply import apply, plan
from accord.governance.loading import default_policy, parse_policy
from accord.platform.context import Principal
from tests.test_kernel_doors import _graph

ORDERS = '[classes."business:orders"]\nroles = { runtime = ["find", "insert"], admin = ["find"] }\n'


def test_the_database_refuses_documents_without_their_tenant_or_thread(
    client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ACCORD_POLICY", raising=False)
    admin = runtime.kernel(client, principal=Principal.os_user(), policy=default_policy())
    changes = plan(admin, db_name, parse_policy(ORDERS, "orders.toml"))
    targets = {c.target.split(".", 1)[1] for c in changes.changes if c.kind == "set validator"}
    assert {"accord_checkpoints", "short_term_memory", "orders", "memory_vectors"} <= targets
    assert not targets & {"outbox", "audit", "accord_catalog", "accord_policies"}
    apply(admin, changes)
    assert not [c for c in plan(admin, db_name, parse_policy(ORDERS, "o")).changes
                if c.kind == "set validator"]  # fmt: skip
    db = client[db_name]
    for collection, doc in [
        ("accord_checkpoints", {"thread_id": "t"}),  # no tenant
        ("accord_checkpoints", {"tenant_id": "acme"}),  # no thread
        ("orders", {"tenant_id": 7}),
        ("orders", {"tenant_id": "acme", "expire_at": "tomorrow"}),  # never expires
    ]:
        with pytest.raises(WriteError) as refused:
            db[collection].insert_one(doc)
        assert refused.value.code == 121
    db.orders.insert_one({"tenant_id": "acme", "total": 3})
    saver = AccordSaver(client, db_name=db_name)  # accord's own writes pass
    saver.setup()
    _graph(saver).invoke({"messages": [HumanMessage("hi")], "log": []},
                         {"configurable": {"thread_id": "t-1"}})  # fmt: skip
    assert db.accord_checkpoints.count_documents({}) > 0
    assert db.runs.count_documents({}) == 1 and db.short_term_memory.count_documents({}) > 0
