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


# -- a class hold on any class of a thread's data holds every thread -------------------------


def _held_saver(client: MongoClient, db: str, hold_class: str, turns: int = 4) -> Any:
    import uuid

    from langchain_core.messages import HumanMessage

    from accord.checkpointers import AccordSaver
    from tests.test_kernel_doors import _graph

    saver = AccordSaver(client, db_name=db)
    graph = _graph(saver)
    for i in range(turns):
        graph.invoke({"messages": [HumanMessage(f"turn {i}", id=uuid.uuid4().hex)], "log": []},
                     {"configurable": {"thread_id": "t1"}, "metadata": {"run_id": f"r{i}"}})  # fmt: skip
    admin = runtime.kernel(client, principal=Principal.os_user())
    place(admin, db, Hold("class", hold_class), runtime.effective_policy(admin, db))
    return saver


def _snapshot(client: MongoClient, db: str) -> dict[str, int]:
    return {c: client[db][c].count_documents({"thread_id": "t1"}) for c in (
        "accord_checkpoints", "accord_checkpoint_blobs", "accord_checkpoint_writes",
        "short_term_memory",
    )}  # fmt: skip


@pytest.mark.parametrize("hold_class", ["short_term_memory", "run", "checkpoint_blob"])
def test_prune_of_a_thread_held_by_a_thread_class_is_refused_at_once(
    client: MongoClient, db_name: str, hold_class: str
) -> None:
    """prune's and delete_for_runs' first transaction deletes checkpoints and writes, no
    messages or values: a hold on short_term_memory (or any class of a thread's data)
    still refuses it, deleting nothing (before 2026-12-07 the checkpoints went)."""
    saver = _held_saver(client, db_name, hold_class)
    before = _snapshot(client, db_name)
    with pytest.raises(LegalHoldError, match=f"class '{hold_class}'"):
        saver.prune(["t1"], keep=1)
    run_ids = [r for r in client[db_name].accord_checkpoints.distinct("run_id") if r]
    assert run_ids
    with pytest.raises(LegalHoldError, match="nothing was deleted"):
        saver.delete_for_runs(run_ids[:1])
    assert _snapshot(client, db_name) == before


def test_a_big_thread_held_by_a_class_of_its_values_is_not_deleted_in_part(
    client: MongoClient, db_name: str
) -> None:
    """A thread too big for one transaction is deleted checkpoints first, values later:
    a hold on checkpoint_blob refuses the first transaction (the checkpoints went, and
    the values' batches were refused, before 2026-12-07)."""
    import uuid

    from langchain_core.messages import HumanMessage

    from accord.checkpointers import AccordSaver
    from tests.test_kernel_doors import _graph

    saver = AccordSaver(client, db_name=db_name)
    _graph(saver).invoke(
        {"messages": [HumanMessage(f"m{i}", id=uuid.uuid4().hex) for i in range(1100)],
         "log": []}, {"configurable": {"thread_id": "t1"}},
    )  # fmt: skip
    admin = runtime.kernel(client, principal=Principal.os_user())
    place(
        admin, db_name, Hold("class", "checkpoint_blob"), runtime.effective_policy(admin, db_name)
    )
    before = _snapshot(client, db_name)
    with pytest.raises(LegalHoldError, match="checkpoint_blob"):
        saver.delete_thread("t1")
    assert _snapshot(client, db_name) == before


def test_an_audit_cut_is_not_held_by_a_thread_class() -> None:
    from accord.governance.hold_guard import covering_hold

    hold = Hold("class", "short_term_memory")
    assert covering_hold([hold], "acme", "t1") is hold
    assert covering_hold([hold], "acme", "") is None  # an audit stream's cut
    assert covering_hold([Hold("class", "queued_run")], "acme", "t1") is None
