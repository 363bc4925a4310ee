"""The kernel's ``refresh`` phase (docs/platform.md, "Hooks"): a hook names a read that is
due; the kernel makes it through its own read path, before the checks (writes) and the
read hooks (reads), outside any transaction, and hands back the documents or the error."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import MongoClient

from accord.errors import ConfigurationError, PermissionDenied
from accord.platform.context import ReadContext
from accord.platform.hooks import ReadRequest, RefreshRead
from accord.platform.plan import Group, Op, Plan, PlanContext
from tests.platform.conftest import Runner


class Settings:
    """Keeps ``settings`` of each database fresh, reading it when told it is due."""

    name = "settings"

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.due = True
        self.seen: dict[str, Any] = {}

    def refresh_read(self, db: str) -> RefreshRead | None:
        if not self.due:
            return None
        self.due = False  # the kernel's own read of it asks again: nothing is due then
        return RefreshRead("catalog", "settings", {"_id": "s"}, "test.refresh")

    def refreshed(self, db: str, found: list[Any] | None, error: BaseException | None) -> None:
        self.log.append(f"refreshed:{db}")
        self.seen[db] = error if error is not None else found

    def check(self, plan: Plan) -> None:
        self.log.append("check")


class Reads:
    name = "reads"

    def __init__(self, log: list[str], refuse: bool = False) -> None:
        self.log, self.refuse = log, refuse

    def read(self, request: ReadRequest) -> ReadRequest:
        self.log.append(f"read:{request.context.operation}")
        if self.refuse and request.context.operation == "test.refresh":
            raise PermissionDenied("no settings for you")
        return request


def _plan(db: str) -> Plan:
    return Plan(PlanContext("t", operation="test.write"),
                [Group("data", db, "data", "checkpoint", [Op("insert", doc={"tenant_id": "t"})])])  # fmt: skip


def test_a_due_read_runs_first_through_the_read_hooks(
    make_runner: Any, client: MongoClient, db_name: str
) -> None:
    runner: Runner = make_runner()
    client[db_name].settings.insert_one({"_id": "s", "mode": "strict"})
    log: list[str] = []
    settings = Settings(log)
    runner.uow.register(Reads(log))
    runner.uow.register(settings)
    runner.execute(_plan(db_name))
    assert log == ["read:test.refresh", f"refreshed:{db_name}", "check"]
    assert settings.seen[db_name] == [{"_id": "s", "mode": "strict"}]
    log.clear()
    runner.call(runner.uow.find, ReadContext("t", operation="test.find"), "checkpoint",
                db_name, "data", {})  # fmt: skip
    assert log == ["read:test.find"]  # nothing due: no read of its own
    settings.due = True
    log.clear()
    runner.call(runner.uow.find, ReadContext("t", operation="test.find"), "checkpoint",
                db_name, "data", {})  # fmt: skip
    assert log == ["read:test.refresh", f"refreshed:{db_name}", "read:test.find"]


def test_a_refused_refresh_read_reaches_the_hook_not_the_caller(
    make_runner: Any, db_name: str
) -> None:
    runner: Runner = make_runner()
    log: list[str] = []
    settings = Settings(log)
    runner.uow.register(Reads(log, refuse=True))
    runner.uow.register(settings)
    runner.execute(_plan(db_name))  # the write goes on
    assert isinstance(settings.seen[db_name], PermissionDenied)


def test_a_hook_with_half_the_refresh_phase_is_refused(make_runner: Any) -> None:
    runner: Runner = make_runner()

    class Half:
        name = "half"

        def refresh_read(self, db: str) -> None:
            return None

    with pytest.raises(ConfigurationError, match="refreshed"):
        runner.uow.register(Half())
