"""The run registry (``accord.platform.runs``): claims, leases, fences, guards.

Driven through the unit of work (sync and async), as the savers use it: claims, renewals
and releases as single atomic commands (``transaction=False``, one round trip), guards as
the first op of a commit's transaction.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pymongo import MongoClient, monitoring

from accord.errors import AccordError, WriteRefused
from accord.platform import codes, hosts, runs
from accord.platform.plan import Counts, Expect, Group, Op, Plan, PlanContext, insert_once
from tests.platform.conftest import Runner

TENANT, THREAD = "t1", "th"


def _plan(db: str, *groups: Group) -> Plan:
    return Plan(PlanContext(TENANT, THREAD, operation="test"), list(groups))


def _claim(runner: Runner, db: str, run_id: str, at: Any, lease: float = 30.0) -> runs.Lease:
    filt, update = runs.claim(
        TENANT, THREAD, run_id, holder=hosts.current(), at=at, lease_seconds=lease
    )
    op = Op("find_one_and_update", filt, update, upsert=True)
    result = runner.call(
        runner.uow.execute, _plan(db, Group("claim", db, "runs", "run", [op])), transaction=False
    )
    return runs.lease_from(result.found["claim"][0])


def _commit(runner: Runner, db: str, guard: Op, expect: Expect, marker: str) -> None:
    runner.execute(
        _plan(
            db,
            Group("run", db, "runs", "run", [guard], expect=expect),
            Group(
                "data",
                db,
                "data",
                "checkpoint",
                [insert_once({"_id": marker, "tenant_id": TENANT})],
            ),
        )
    )


class Fenced(AccordError):
    pass


def _fenced(counts: Counts) -> BaseException:
    return Fenced("fenced")


def test_claims_leases_and_fences(runner: Runner, client: MongoClient, db_name: str) -> None:
    at = runs.now()
    a = _claim(runner, db_name, "run-a", at)
    assert (a.run_id, a.fence, a.version) == ("run-a", 1, None)
    # a live lease: another run is refused (DuplicateKey on the registry document)
    with pytest.raises(WriteRefused) as info:
        _claim(runner, db_name, "run-b", at + timedelta(seconds=1))
    assert info.value.code in codes.DUPLICATE_KEY_CODES
    holder = runs.holder_of(client[db_name].runs.find_one())
    assert holder.live(at + timedelta(seconds=1)) and holder.run_id == "run-a"
    assert "run 'run-a'" in holder.describe()
    # the holder commits with its guard, which sets the version
    guard = runs.owner_guard(a, "v1", at=at, lease_seconds=30)
    _commit(runner, db_name, guard, Expect(matched=1, error=_fenced), "a1")
    assert client[db_name].runs.find_one()["version"] == "v1"
    # past its lease another run takes over with a larger fence...
    later = at + timedelta(seconds=31)
    b = _claim(runner, db_name, "run-b", later)
    assert b.fence == 2 and b.version == "v1"
    # ...and the stale holder's next commit is refused before anything is written
    with pytest.raises(WriteRefused) as info:
        _commit(runner, db_name, guard, Expect(matched=1, error=_fenced), "a2")
    assert info.value.group == "run" and info.value.code in codes.DUPLICATE_KEY_CODES
    assert client[db_name].data.count_documents({"_id": "a2"}) == 0
    # a write of no run is refused while the lease is live, accepted once released
    free = runs.free_guard(TENANT, THREAD, "v2", at=later)
    with pytest.raises(WriteRefused):
        _commit(runner, db_name, free, Expect(touched=1, error=_fenced), "x1")
    filt, update = runs.release(b, at=later)
    runner.call(
        runner.uow.execute,
        _plan(db_name, Group("release", db_name, "runs", "run", [Op("update", filt, update)])),
        transaction=False,
    )
    assert client[db_name].runs.find_one()["lease_expires"] is None
    _commit(runner, db_name, free, Expect(touched=1, error=_fenced), "x1")
    # the same run id may re-enter (a retried run): a new fence
    again = _claim(runner, db_name, "run-b", later)
    assert again.fence == 3


def test_renewal_and_takeover(runner: Runner, client: MongoClient, db_name: str) -> None:
    at = runs.now()
    a = _claim(runner, db_name, "run-a", at, lease=10)
    filt, update = runs.renew(a, at=at + timedelta(seconds=9), lease_seconds=10)
    op = Op("update", filt, update)
    res = runner.call(
        runner.uow.execute,
        _plan(db_name, Group("renew", db_name, "runs", "run", [op])),
        transaction=False,
    )
    assert res["renew"].matched == 1
    # renewed: still held 15 s after the claim
    with pytest.raises(WriteRefused):
        _claim(runner, db_name, "run-b", at + timedelta(seconds=15))
    # an administrative takeover ends the lease and moves the fence on
    take = runs.takeover(TENANT, THREAD, "v9", at=at)
    runner.execute(_plan(db_name, Group("run", db_name, "runs", "run", [take])))
    doc = client[db_name].runs.find_one()
    assert doc["fence"] == 2 and doc["lease_expires"] is None
    guard = runs.owner_guard(a, "v10", at=at, lease_seconds=10)
    with pytest.raises(WriteRefused):
        _commit(runner, db_name, guard, Expect(matched=1, error=_fenced), "late")
    res = runner.call(
        runner.uow.execute,
        _plan(db_name, Group("renew", db_name, "runs", "run", [op])),
        transaction=False,
    )
    assert res["renew"].matched == 0  # the lease is lost


def test_single_op_plans_take_one_round_trip(make_runner: Any, db_name: str) -> None:
    seen: list[str] = []

    class Listener(monitoring.CommandListener):
        def started(self, event: monitoring.CommandStartedEvent) -> None:
            seen.append(event.command_name)

        def succeeded(self, event: Any) -> None: ...
        def failed(self, event: Any) -> None: ...

    runner: Runner = make_runner(client_options={"event_listeners": [Listener()]})
    _claim(runner, db_name, "run-a", runs.now())
    assert seen == ["findAndModify"]
    seen.clear()
    # a plan of more than one op still runs in a transaction
    at = runs.now()
    filt, update = runs.renew(
        runs.Lease(TENANT, THREAD, "run-a", 1, "test", at, None), at=at, lease_seconds=5
    )
    runner.call(
        runner.uow.execute,
        _plan(
            db_name,
            Group("renew", db_name, "runs", "run", [Op("update", filt, update)]),
            Group(
                "x", db_name, "data", "checkpoint", [insert_once({"_id": 1, "tenant_id": TENANT})]
            ),
        ),
        transaction=False,
    )
    assert seen[-1] == "commitTransaction"
