"""The unit of work, sync and async: one transaction per plan, hooks, guards, retries,
errors. Every test runs on both twins (the ``runner`` fixture)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from pymongo import MongoClient, monitoring

from accord.errors import (
    AccordError,
    DatabaseError,
    InvalidInputError,
    PermissionDenied,
    TransactionTimeout,
    WriteRefused,
)
from accord.platform import codes, write_errors
from accord.platform.plan import (
    Expect,
    Group,
    Op,
    OutboxEvent,
    Plan,
    PlanContext,
    insert_once,
)
from tests.platform.conftest import Runner

CTX = PlanContext(tenant_id="t1", operation="test")


def plan_of(*groups: Group, events: list[OutboxEvent] | None = None) -> Plan:
    return Plan(CTX, list(groups), events or [])


def test_plan_commits_every_group_atomically(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    result = runner.execute(
        plan_of(
            Group(
                "a",
                db_name,
                "alpha",
                "checkpoint",
                [Op("insert", doc={"_id": 1, "tenant_id": "t1"})],
            ),
            Group(
                "b",
                db_name,
                "beta",
                "checkpoint_blob",
                [insert_once({"_id": "x", "tenant_id": "t1"})],
            ),
            Group(
                "c",
                db_name,
                "gamma",
                "short_term_memory",
                [Op("insert", doc={"_id": 2, "tenant_id": "t1"})],
            ),
        )
    )
    assert result["a"].inserted == 1
    assert result["b"].upserted == 1
    assert result.attempts == 1
    db = client[db_name]
    assert (
        db.alpha.count_documents({})
        == db.beta.count_documents({})
        == db.gamma.count_documents({})
        == 1
    )


def test_a_refused_write_rolls_back_the_whole_plan(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    client[db_name].orders.insert_one({"_id": "o-1", "tenant_id": "t1"})
    staged = {"op": "insert_one", "node": "place_order"}
    with pytest.raises(WriteRefused) as info:
        runner.execute(
            plan_of(
                Group(
                    "first",
                    db_name,
                    "ledger",
                    "checkpoint",
                    [Op("insert", doc={"_id": 1, "tenant_id": "t1"})],
                ),
                Group(
                    "orders",
                    db_name,
                    "orders",
                    "business",
                    [
                        Op("insert", doc={"_id": "o-2", "tenant_id": "t1"}),
                        Op("insert", doc={"_id": "o-1", "tenant_id": "t1"}),
                    ],
                    sources=[{"op": "insert_one"}, staged],
                ),
            )
        )
    err = info.value
    assert (err.group, err.collection, err.index) == ("orders", "orders", 1)
    assert err.code == codes.DUPLICATE_KEY
    assert err.key_value == {"_id": "o-1"}
    assert err.source is staged
    assert "duplicate key _id='o-1'" in str(err) and "rolled back" in str(err)
    assert client[db_name].ledger.count_documents({}) == 0
    assert client[db_name].orders.count_documents({}) == 1


def test_a_violated_guard_aborts_and_raises_its_error(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    class Moved(AccordError):
        pass

    client[db_name].heads.insert_one({"_id": "h", "tenant_id": "t1", "at": "c2"})
    guard = Expect(matched=1, error=lambda counts: Moved(f"matched {counts.matched}"))
    with pytest.raises(Moved, match="matched 0"):
        runner.execute(
            plan_of(
                Group("head", db_name, "heads", "checkpoint_head",
                      [Op("update", {"_id": "h", "at": "c1"}, {"$set": {"at": "c3"}})], expect=guard),
                Group("cp", db_name, "cps", "checkpoint", [Op("insert", doc={"_id": "c3", "tenant_id": "t1"})]),
            )
        )  # fmt: skip
    assert client[db_name].cps.count_documents({}) == 0
    assert client[db_name].heads.find_one({"_id": "h"})["at"] == "c2"


def test_outbox_events_are_inserted_once(runner: Runner, client: MongoClient, db_name: str) -> None:
    def plan() -> Plan:
        return plan_of(
            Group(
                "cp", db_name, "cps", "checkpoint", [insert_once({"_id": "c1", "tenant_id": "t1"})]
            ),
            events=[
                OutboxEvent(
                    db_name, "outbox", "checkpoint", "t1", ("th", "", "c1"), {"thread_id": "th"}
                )
            ],
        )

    runner.execute(plan())
    runner.execute(plan())  # a replayed step
    events = list(client[db_name].outbox.find())
    assert len(events) == 1
    assert events[0]["status"] == "pending" and events[0]["thread_id"] == "th"
    assert events[0]["tenant_id"] == "t1" and events[0]["attempts"] == 0


@pytest.mark.parametrize("client_bulk", [True, False], ids=["client-bulkWrite", "per-collection"])
def test_round_trips(make_runner: Any, db_name: str, client_bulk: bool) -> None:
    seen: list[str] = []

    class Listener(monitoring.CommandListener):
        def started(self, event: monitoring.CommandStartedEvent) -> None:
            seen.append(event.command_name)

        def succeeded(self, event: Any) -> None: ...
        def failed(self, event: Any) -> None: ...

    runner: Runner = make_runner(
        client_bulk=client_bulk, client_options={"event_listeners": [Listener()]}
    )
    groups = [
        Group(
            n,
            db_name,
            n,
            "checkpoint",
            [insert_once({"_id": i, "tenant_id": "t1"}) for i in range(3)],
        )
        for n in ("a", "b", "c")
    ]
    runner.execute(plan_of(*groups))
    if client_bulk:
        assert seen == ["bulkWrite", "commitTransaction"]
    else:
        assert seen == ["update", "update", "update", "commitTransaction"]


def test_write_conflicts_are_retried_and_applied_once(
    make_runner: Any, client: MongoClient, db_name: str
) -> None:
    client[db_name].counters.insert_one({"_id": "n", "tenant_id": "t1", "value": 0})
    runners = [make_runner() for _ in range(4)]
    attempts: list[int] = []
    errors: list[BaseException] = []

    def work(r: Runner) -> None:
        for _ in range(15):
            try:
                res = r.execute(plan_of(Group("inc", db_name, "counters", "run",
                                              [Op("update", {"_id": "n"}, {"$inc": {"value": 1}})])))  # fmt: skip
                attempts.append(res.attempts)
            except BaseException as exc:  # collected, asserted below
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in runners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert client[db_name].counters.find_one({"_id": "n"})["value"] == 60
    assert len(attempts) == 60


def test_a_document_over_16_mib_is_refused_by_name(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    big = {"_id": "run-1", "tenant_id": "t1", "metadata": "x" * (17 * 1024 * 1024)}
    with pytest.raises(WriteRefused) as info:
        runner.execute(
            plan_of(
                Group(
                    "small",
                    db_name,
                    "small",
                    "checkpoint",
                    [Op("insert", doc={"_id": 1, "tenant_id": "t1"})],
                ),
                Group("checkpoint", db_name, "cps", "checkpoint", [Op("insert", doc=big)]),
            )
        )
    assert info.value.group == "checkpoint" and info.value.index == 0
    assert info.value.code == codes.BSON_OBJECT_TOO_LARGE
    assert "16 MiB" in str(info.value)
    assert client[db_name].small.count_documents({}) == 0


@pytest.mark.parametrize(
    ("code", "errmsg"),
    [
        (10334, "BSONObj size: 16777238 (0x1000016) is invalid."),
        (2, "object to insert too large. size in bytes: 16777238, max size: 16777216"),
        (10334, "Resulting document after update is larger than 16777216"),
        (17419, "Resulting document after update is larger than 16777216"),
        (17420, "Document to upsert is larger than 16777216"),
    ],
)
def test_every_refusal_of_a_document_over_16_mib_reads_alike(code: int, errmsg: str) -> None:
    """mongod refuses an oversized document with a different code per write path (an
    insert's is BadValue): each is the same accord error, named as such."""
    group = Group("cp", "db", "cps", "checkpoint", [Op("insert", doc={"_id": 1})])
    err = write_errors.refused(group, 0, {"code": code, "errmsg": errmsg}, Exception(errmsg))
    assert err.code == codes.BSON_OBJECT_TOO_LARGE
    assert "16 MiB" in str(err) and errmsg in str(err)
    other = write_errors.refused(group, 0, {"code": 2, "errmsg": "bad $set"}, Exception())
    assert other.code == 2 and "16 MiB" not in str(other)


def test_an_unreachable_server_fails_within_the_timeout(make_runner: Any) -> None:
    runner = make_runner(
        "mongodb://127.0.0.1:9/?directConnection=true", timeout=1.0, client_bulk=True
    )
    started = time.monotonic()
    with pytest.raises(TransactionTimeout, match="within 1s"):
        runner.execute(plan_of(Group("a", "x", "y", "checkpoint", [Op("insert", doc={"_id": 1})])))
    assert time.monotonic() - started < 10
    assert issubclass(TransactionTimeout, DatabaseError)


class Deny:
    name = "deny"

    def check(self, plan: Plan) -> None:
        for g in plan.groups:
            if g.artifact == "audit":
                raise PermissionDenied(f"{plan.context.principal} may not write audit")


class Audit:
    name = "audit"

    def derive(self, plan: Plan) -> None:
        touched = sorted(g.collection for g in plan.groups)
        plan.add(Group("audit", plan.groups[0].db, "audit_log", "audit",
                       [Op("insert", doc={"tenant_id": plan.context.tenant_id, "touched": touched})]))  # fmt: skip


def test_hooks_extend_plans_in_the_same_transaction(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    runner.uow.register(Audit())
    with pytest.raises(AccordError, match="registered already"):
        runner.uow.register(Audit())
    client[db_name].orders.insert_one({"_id": "o-1", "tenant_id": "t1"})
    with pytest.raises(WriteRefused):
        runner.execute(plan_of(Group("o", db_name, "orders", "business",
                                     [Op("insert", doc={"_id": "o-1", "tenant_id": "t1"})])))  # fmt: skip
    assert client[db_name].audit_log.count_documents({}) == 0  # rolled back with the plan
    runner.execute(plan_of(Group("o", db_name, "orders", "business",
                                 [Op("insert", doc={"_id": "o-2", "tenant_id": "t1"})])))  # fmt: skip
    assert client[db_name].audit_log.find_one({}, {"_id": 0}) == {
        "tenant_id": "t1",
        "touched": ["orders"],
    }


def test_a_hook_can_refuse_a_plan_before_anything_is_sent(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    runner.uow.register(Deny())
    with pytest.raises(PermissionDenied):
        runner.execute(plan_of(
            Group("x", db_name, "x", "checkpoint", [Op("insert", doc={"_id": 1, "tenant_id": "t1"})]),
            Group("a", db_name, "audit", "audit", [Op("insert", doc={"_id": 1, "tenant_id": "t1"})]),
        ))  # fmt: skip
    assert "x" not in client[db_name].list_collection_names()


HOSTILE_BUSINESS_OPS = [
    Op("update", {"tenant_id": "t1", "_id": 1}, {"$set": {"tenant_id": "acme"}}, upsert=True),
    Op("update", {"tenant_id": "t1", "_id": 1}, {"$rename": {"tenant_id": "t"}}),
    Op("update", {"tenant_id": "t1", "_id": 1}, {"$rename": {"x": "tenant_id"}}),
    Op("update", {"tenant_id": "t1", "_id": 1}, {"$unset": {"tenant_id": ""}}),
    Op("update", {"tenant_id": "t1", "_id": 1}, {"$setOnInsert": {"tenant_id.x": 1}}, upsert=True),
    Op("update", {"tenant_id": "t1", "_id": 1}, [{"$set": {"tenant_id": "acme"}}], upsert=True),
    Op("update", {"tenant_id": "t1", "_id": 1}, [{"$replaceWith": {"_id": 1}}]),
    Op("update", {"tenant_id": "t1", "_id": 1}, [{"$project": {"x": 1}}]),
    Op("update", {"tenant_id": "t1", "_id": 1}, [{"$unset": ["a", "tenant_id"]}]),
    Op("update", {"_id": 1}, {"$set": {"x": 1}}),
    Op("update", {"tenant_id": {"$ne": "t1"}}, {"$set": {"x": 1}}),
    Op("update_many", {"tenant_id": "acme"}, {"$set": {"x": 1}}),
    Op("replace", {"tenant_id": "t1", "_id": 1}, {"_id": 1, "tenant_id": "acme"}, upsert=True),
    Op("replace", {"tenant_id": "t1", "_id": 1}, {"_id": 1}),
    Op("insert", doc={"_id": 2, "tenant_id": "acme"}),
    Op("insert", doc={"_id": 2}),
    Op("delete", {"_id": 1}),
    Op("delete_many", {"tenant_id": {"$exists": True}}),
    # server-side JavaScript from tenant input (CPU, or a sleep holding the transaction)
    Op(
        "update", {"tenant_id": "t1", "_id": 1, "$where": "sleep(5000) || true"}, {"$set": {"x": 1}}
    ),
    Op("delete", {"tenant_id": "t1", "$or": [{"$where": "true"}]}),
    Op(
        "delete",
        {
            "tenant_id": "t1",
            "$expr": {
                "$function": {"body": "function() { return true }", "args": [], "lang": "js"}
            },
        },
    ),
    Op(
        "update",
        {"tenant_id": "t1", "_id": 1},
        [
            {
                "$set": {
                    "x": {
                        "$function": {"body": "function() { return 1 }", "args": [], "lang": "js"}
                    }
                }
            }
        ],
    ),
]


@pytest.mark.parametrize(
    "op", HOSTILE_BUSINESS_OPS, ids=lambda op: f"{op.kind}:{op.filter}:{op.doc}"
)
def test_tenant_input_cannot_cross_tenants(
    runner: Runner, client: MongoClient, db_name: str, op: Op
) -> None:
    client[db_name].orders.insert_one({"_id": 1, "tenant_id": "t1", "x": 0})
    before = list(client[db_name].orders.find())
    with pytest.raises(InvalidInputError, match="refused write #0 to 'orders' for tenant 't1'"):
        runner.execute(plan_of(Group("b", db_name, "orders", "business", [op])))
    assert list(client[db_name].orders.find()) == before


def test_tenant_input_within_its_tenant_is_written(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    ops = [
        Op("insert", doc={"_id": 1, "tenant_id": "t1", "qty": 5}),
        Op("update", {"tenant_id": "t1", "_id": 1}, {"$inc": {"qty": -1}, "$set": {"tenant": "x"}}),
        Op("update", {"tenant_id": "t1", "_id": 2}, [{"$set": {"qty": 1}}], upsert=True),
        Op("replace", {"tenant_id": "t1", "_id": 3}, {"tenant_id": "t1", "qty": 7}, upsert=True),
        Op("delete", {"tenant_id": "t1", "_id": 3}),
    ]
    runner.execute(plan_of(Group("b", db_name, "orders", "business", ops)))
    docs = {d["_id"]: d for d in client[db_name].orders.find()}
    assert docs[1]["qty"] == 4 and docs[2] == {"_id": 2, "tenant_id": "t1", "qty": 1}
    assert 3 not in docs


def test_internal_classes_are_not_checked_as_tenant_input(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    # accord's own plans address documents by deterministic _id; only tenant-writable
    # classes (business) get the filter check.
    runner.execute(
        plan_of(
            Group(
                "cp", db_name, "cps", "checkpoint", [insert_once({"_id": "c", "tenant_id": "t1"})]
            )
        )
    )
    assert client[db_name].cps.count_documents({}) == 1


def test_find_one_and_update_runs_in_the_transaction(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    client[db_name].jobs.insert_many(
        [{"_id": i, "tenant_id": "t1", "state": "new", "at": i} for i in (2, 1)]
    )
    result = runner.execute(
        plan_of(
            Group("claim", db_name, "jobs", "outbox",
                  [Op("find_one_and_update", {"state": "new"}, {"$set": {"state": "mine"}}, sort=[("at", 1)])],
                  expect=Expect(matched=1, error=lambda c: AccordError("nothing to claim"))),
            Group("log", db_name, "log", "audit", [Op("insert", doc={"_id": "claimed", "tenant_id": "t1"})]),
        )
    )  # fmt: skip
    assert result.found["claim"][0]["_id"] == 1 and result.found["claim"][0]["state"] == "mine"
    assert client[db_name].log.count_documents({}) == 1
    with pytest.raises(AccordError, match="mixes"):
        runner.execute(plan_of(Group("x", db_name, "jobs", "outbox", [
            Op("find_one_and_update", {"state": "new"}, {"$set": {"state": "mine"}}),
            Op("insert", doc={"_id": 9, "tenant_id": "t1"}),
        ])))  # fmt: skip


def test_hook_registration_keeps_defaults(runner: Runner) -> None:
    assert runner.uow.hooks.names() == ["tenancy", "outbox", "workflow_log", "undo_log"]


def test_timeout_must_be_positive(mongo_uri: str) -> None:
    from accord.platform.synchronous.unit_of_work import UnitOfWork

    with pytest.raises(AccordError, match="positive"):
        UnitOfWork(MongoClient(mongo_uri, connect=False), timeout=0)


def test_a_conflict_with_an_open_transaction_is_retried(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    client[db_name].counters.insert_one({"_id": "n", "tenant_id": "t1", "value": 0})
    with client.start_session() as other:
        other.start_transaction()
        client[db_name].counters.update_one({"_id": "n"}, {"$inc": {"value": 10}}, session=other)
        # the other transaction commits once an attempt failed on it (not after a timer a
        # loaded machine can outrun: an attempt that began after it would not conflict)
        original, failed = runner.uow._write, []

        def settle() -> None:
            failed.append(True)
            if len(failed) == 1:
                other.commit_transaction()

        if runner.kind == "async":

            async def write(*args: Any) -> Any:
                try:
                    return await original(*args)
                except Exception:
                    settle()
                    raise
        else:

            def write(*args: Any) -> Any:
                try:
                    return original(*args)
                except Exception:
                    settle()
                    raise

        runner.uow._write = write
        result = runner.execute(
            plan_of(
                Group(
                    "inc",
                    db_name,
                    "counters",
                    "run",
                    [Op("update", {"_id": "n"}, {"$inc": {"value": 1}})],
                )
            )  # fmt: skip
        )
    assert failed, "no attempt conflicted with the open transaction"
    assert result.attempts >= 2  # WriteConflict while the other transaction was open
    assert client[db_name].counters.find_one({"_id": "n"})["value"] == 11


class Operations:
    """Records the operation of every plan it sees (as governance's audit keys on it)."""

    name = "operations"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def check(self, plan: Plan) -> None:
        self.seen.append(plan.context.operation)


def test_several_plans_in_one_transaction(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    """``execute_all``: each plan passes the hooks as itself (its operation, its
    events), then all commit in one transaction, or none; a group named like one of an
    earlier plan is renamed ``<i>:<name>``."""
    ops = Operations()
    runner.uow.register(ops)

    def part(operation: str, doc_id: int, event: str) -> Plan:
        return Plan(
            PlanContext(tenant_id="t1", operation=operation),
            [
                Group(
                    "w",
                    db_name,
                    "alpha",
                    "checkpoint",
                    [Op("insert", doc={"_id": doc_id, "tenant_id": "t1"})],
                )
            ],  # fmt: skip
            [OutboxEvent(db_name, "outbox", "test", "t1", (event,))],
        )

    result = runner.call(runner.uow.execute_all, [part("one", 1, "e1"), part("two", 2, "e2")])
    assert ops.seen == ["one", "two"]
    assert result["w"].inserted == 1 and result["1:w"].inserted == 1
    db = client[db_name]
    assert db.alpha.count_documents({}) == 2 and db.outbox.count_documents({}) == 2
    # all or nothing: the second plan's duplicate rolls back the first one's write
    with pytest.raises(WriteRefused):
        runner.call(runner.uow.execute_all, [part("three", 3, "e3"), part("four", 1, "e4")])
    assert db.alpha.count_documents({}) == 2 and db.outbox.count_documents({}) == 2
    assert ops.seen == ["one", "two", "three", "four"]


def _drained(runner: Runner, iterator: Any) -> list[Any]:
    """Everything a sync or async iterator of the kernel yields."""
    if runner.loop is None:
        return list(iterator)

    async def drain() -> list[Any]:
        return [item async for item in iterator]

    return runner.loop.run_until_complete(drain())


def test_iterate_batches_reads_what_iterate_reads_a_batch_at_a_time(
    runner: Runner, client: MongoClient, db_name: str
) -> None:
    from bson.codec_options import CodecOptions
    from bson.son import SON

    from accord.platform.context import ReadContext

    client[db_name].orders.insert_many(
        [{"_id": i, "tenant_id": "t1", "x": i / 2} for i in range(25)]
        + [{"_id": 100, "tenant_id": "t2", "x": 0}]
    )
    ctx = ReadContext("t1")
    args = (ctx, "business", db_name, "orders", {"tenant_id": "t1"})
    batches = _drained(runner, runner.uow.iterate_batches(
        *args, sort=[("_id", -1)], batch_size=10, codec_options=CodecOptions(document_class=SON),
    ))  # fmt: skip
    assert [len(b) for b in batches] == [10, 10, 5]  # as the server returned them
    docs = [d for b in batches for d in b]
    assert [d["_id"] for d in docs] == list(range(24, -1, -1))
    assert all(type(d) is SON for d in docs)  # decoded with the options given
    assert docs == _drained(runner, runner.uow.iterate(*args, sort=[("_id", -1)], batch_size=10))
    default = _drained(runner, runner.uow.iterate_batches(*args, batch_size=10))
    assert all(type(d) is dict for b in default for d in b)  # else the client's
