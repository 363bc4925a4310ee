"""A legal hold committed while a deletion's transaction runs stops that deletion
(docs/governance.md, "Legal holds"): the deletion writes its tenant's fence document,
which placing a hold writes too, so one of the two transactions meets a write conflict
and is retried, and the retried deletion reads the hold.

Each test holds the deleting transaction at a barrier (a seal hook registered after the
hold guard: after the guard has read the holds in the transaction's snapshot, before
anything is written), places the hold from another thread meanwhile, then lets the
deletion go on.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from pymongo import MongoClient

from accord import runtime
from accord.errors import LegalHoldError
from accord.governance.holding import place
from accord.governance.holds import Hold
from accord.governance.loading import default_policy
from accord.platform.context import Principal, WriteContext
from accord.platform.hooks import SealBatch, SealRead
from accord.platform.plan import Group, Op, Plan

DELETE = "checkpoint.delete_thread"


class Barrier:
    """A seal hook that stops the first attempt of a deletion until ``go`` is set."""

    name = "test-barrier"

    def __init__(self) -> None:
        self.attempts = 0
        self.reached = threading.Event()
        self.go = threading.Event()

    def seal_reads(self, batch: SealBatch) -> Sequence[SealRead]:
        if any(p.context.operation == DELETE for p in batch.plans):
            self.attempts += 1  # not reached by an attempt the hold guard refuses
        return []

    def seal(self, batch: SealBatch, found: Mapping[str, list[Any]]) -> Sequence[Group]:
        if any(p.context.operation == DELETE for p in batch.plans) and self.attempts == 1:
            self.reached.set()
            assert self.go.wait(20)
        return []


def _seed(client: MongoClient, db: str, tenant: str, thread: str) -> None:
    client[db].t_notes.insert_many(
        [{"_id": f"{thread}-{i}", "tenant_id": tenant, "thread_id": thread} for i in range(3)]
    )


def _delete(uow: Any, db: str, tenant: str, thread: str) -> Plan:
    return Plan(WriteContext(tenant, thread_id=thread, operation=DELETE), [
        Group("rm", db, "t_notes", "short_term_memory",
              [Op("delete_many", {"tenant_id": tenant, "thread_id": thread})]),
    ])  # fmt: skip


@pytest.mark.parametrize(
    "hold",
    [
        Hold("thread", "t1", tenant_id="acme"),
        Hold("tenant", "acme"),
        Hold("class", "short_term_memory"),  # a database-wide hold
    ],
    ids=["thread", "tenant", "class"],
)
def test_a_hold_placed_during_a_deletion_stops_it(
    client: MongoClient, db_name: str, hold: Hold
) -> None:
    policy = default_policy()
    admin = runtime.kernel(client, principal=Principal.os_user(), policy=policy)
    place(admin, db_name, Hold("thread", "other", tenant_id="acme"), policy)  # fences exist
    _seed(client, db_name, "acme", "t1")
    barrier = Barrier()
    deleter = runtime.kernel(client, principal=Principal.os_user(), policy=policy,
                             hooks=[barrier])  # fmt: skip
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            deleter.execute(_delete(deleter, db_name, "acme", "t1"))
            outcome["done"] = True
        except Exception as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    assert barrier.reached.wait(20)
    place(admin, db_name, hold, policy)  # commits while the deletion's transaction is open
    barrier.go.set()
    worker.join(30)
    assert isinstance(outcome.get("error"), LegalHoldError), outcome
    # the first attempt passed the guard (it reached the barrier, after the guard's seal),
    # so the refusal is a retried attempt's: the hold's fence write made the first fail
    assert barrier.attempts == 1
    assert client[db_name].t_notes.count_documents({"thread_id": "t1"}) == 3


def test_a_first_deletion_of_a_tenant_meets_a_database_wide_hold(
    client: MongoClient, db_name: str
) -> None:
    """No fence document exists yet for the tenant: the deletion writes the database's."""
    policy = default_policy()
    admin = runtime.kernel(client, principal=Principal.os_user(), policy=policy)
    _seed(client, db_name, "globex", "t9")
    barrier = Barrier()
    deleter = runtime.kernel(client, principal=Principal.os_user(), policy=policy,
                             hooks=[barrier])  # fmt: skip
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            deleter.execute(_delete(deleter, db_name, "globex", "t9"))
            outcome["done"] = True
        except Exception as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    assert barrier.reached.wait(20)
    place(admin, db_name, Hold("class", "short_term_memory"), policy)
    barrier.go.set()
    worker.join(30)
    assert isinstance(outcome.get("error"), LegalHoldError), outcome
    assert client[db_name].t_notes.count_documents({"thread_id": "t9"}) == 3


def test_deletions_without_a_hold_still_commit(client: MongoClient, db_name: str) -> None:
    policy = default_policy()
    uow = runtime.kernel(client, principal=Principal.os_user(), policy=policy)
    for tenant in ("acme", "globex"):
        _seed(client, db_name, tenant, "t1")
        uow.execute(_delete(uow, db_name, tenant, "t1"))
    assert client[db_name].t_notes.count_documents({}) == 0
