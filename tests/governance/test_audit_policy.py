"""The policy's per-class audit modes (docs/governance.md, "Turning it on"):

- ``ACCORD_AUDIT=policy``: through a real graph run, a class the applied policy audits
  ``off`` gets no record, one in ``metadata`` gets records without images, one in
  ``full`` records with their images; the chains verify;
- a newer policy version is picked up by a running saver without a restart;
- ``metadata`` / ``full`` are a floor: a class the policy leaves ``off`` is still
  recorded, one it audits ``full`` keeps its images;
- ``policy`` without a policy to read is a configuration error.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from pymongo import MongoClient, monitoring

from accord import runtime
from accord.checkpointers import AccordSaver
from accord.errors import ConfigurationError
from accord.governance.apply import apply, plan
from accord.governance.audit_hook import AuditHook
from accord.governance.audit_records import RECORDS
from accord.governance.loading import default_policy, parse_policy
from accord.governance.verify import verify_chain
from accord.platform.context import Principal
from tests.test_kernel_doors import _graph

REFRESH = 0.2
#: checkpoints not audited, their pending writes in metadata, business records in full
MIXED = """
[classes.checkpoint]
audit = "off"
[classes.checkpoint_blob]
audit = "off"
[classes.checkpoint_write]
audit = "metadata"
[classes.business]
audit = "full"
"""
#: the next version: business records no longer audited, checkpoints in full
SWAPPED = """
[classes.checkpoint]
audit = "full"
[classes.checkpoint_blob]
audit = "off"
[classes.checkpoint_write]
audit = "metadata"
[classes.business]
audit = "off"
"""


@pytest.fixture(autouse=True)
def _fast_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCORD_POLICY", raising=False)
    monkeypatch.setenv("ACCORD_POLICY_REFRESH", str(REFRESH))


def _apply(client: MongoClient, db: str, text: str) -> int:
    admin = runtime.kernel(client, principal=Principal.os_user(), policy=default_policy())
    changes = plan(admin, db, parse_policy(text, f"{db}.toml"))
    apply(admin, changes)
    return changes.version


def _turn(graph: Any, thread: str) -> None:
    graph.invoke({"messages": [HumanMessage("hi")], "log": []},
                 {"configurable": {"thread_id": thread}})  # fmt: skip


def _records(client: MongoClient, db: str, thread: str) -> dict[str, Counter[str]]:
    """Per artifact class: the modes of the applied records of ``thread``'s run (and
    ``images`` counted when a record keeps them)."""
    found: dict[str, Counter[str]] = {}
    for r in client[db][RECORDS].find({"outcome": "applied", "thread_id": thread}):
        seen = found.setdefault(r["artifact"], Counter())
        seen[r["mode"]] += 1
        seen["images"] += "images" in r
    return found


def _saver(client: MongoClient, db: str) -> Any:
    saver = AccordSaver(client, db_name=db)
    saver.setup()
    return _graph(saver)


def test_each_class_is_recorded_in_its_policy_mode_through_a_graph_run(
    client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _apply(client, db_name, MIXED)
    monkeypatch.setenv(runtime.AUDIT_ENV, "policy")
    graph = _saver(client, db_name)
    _turn(graph, "t-1")
    _turn(graph, "t-1")
    seen = _records(client, db_name, "t-1")
    assert client[db_name].accord_checkpoints.count_documents({}) > 0
    assert "checkpoint" not in seen and "checkpoint_blob" not in seen  # off: no record
    assert "run" not in seen  # the default policy leaves the run registry off
    writes = seen["checkpoint_write"]
    assert writes["metadata"] > 0 and writes["full"] == 0 and writes["images"] == 0
    orders = seen["business"]
    assert orders["full"] == 2 and orders["metadata"] == 0 and orders["images"] == 2
    record = client[db_name][RECORDS].find_one({"artifact": "business", "thread_id": "t-1"})
    assert record is not None and '"tenant_id":"default"' in record["images"][0]["image"]
    report = verify_chain(runtime.kernel(client), db_name)
    assert report.ok, report.breaks


def test_a_newer_policy_version_is_picked_up_without_a_restart(
    client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _apply(client, db_name, MIXED)
    monkeypatch.setenv(runtime.AUDIT_ENV, "policy")
    graph = _saver(client, db_name)
    _turn(graph, "t-1")
    assert _apply(client, db_name, SWAPPED) == 2
    time.sleep(REFRESH * 1.5)
    _turn(graph, "t-2")
    before, after = _records(client, db_name, "t-1"), _records(client, db_name, "t-2")
    assert "checkpoint" not in before and before["business"]["full"] == 1
    assert "business" not in after  # version 2: business records are no longer audited
    assert after["checkpoint"]["full"] > 0 and after["checkpoint"]["images"] > 0
    assert after["checkpoint_write"]["metadata"] > 0
    assert client[db_name].orders.count_documents({}) == 2  # both turns wrote their order
    report = verify_chain(runtime.kernel(client), db_name)
    assert report.ok, report.breaks


def test_an_explicit_mode_is_a_floor_under_the_policy(
    client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _apply(client, db_name, MIXED)
    monkeypatch.setenv(runtime.AUDIT_ENV, "metadata")
    _turn(_saver(client, db_name), "t-1")
    seen = _records(client, db_name, "t-1")
    assert seen["checkpoint"]["metadata"] > 0  # off in the policy, metadata by the floor
    assert seen["checkpoint"]["images"] == 0
    assert seen["business"]["full"] == 1 and seen["business"]["images"] == 1  # the policy's
    assert seen["run"]["metadata"] > 0
    assert verify_chain(runtime.kernel(client), db_name).ok


class _Claims(monitoring.CommandListener):
    """Whether each lease claim (findAndModify on the run registry) ran in a transaction."""

    def __init__(self) -> None:
        self.in_transaction: list[bool] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "findAndModify" and event.command.get("findAndModify") == "runs":
            self.in_transaction.append("autocommit" in event.command)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.mark.parametrize(("mode", "transaction"), [("policy", False), ("full", True)])
def test_a_lease_claim_needs_a_transaction_only_when_the_run_registry_is_audited(
    mongo_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch, mode: str, transaction: bool
) -> None:
    monkeypatch.setenv(runtime.AUDIT_ENV, mode)
    claims = _Claims()
    watched: MongoClient = MongoClient(mongo_uri, event_listeners=[claims])
    try:
        graph = _saver(watched, db_name)
        _turn(graph, "t-1")
        _turn(graph, "t-1")
    finally:
        watched.close()
    assert claims.in_transaction == [transaction, transaction]


def test_policy_mode_needs_a_policy() -> None:
    with pytest.raises(ConfigurationError, match="needs the policy"):
        runtime.audit_hooks("policy")
    with pytest.raises(ConfigurationError, match="pass policy="):
        AuditHook("policy")
    with pytest.raises(ConfigurationError, match="off, metadata, full, policy"):
        runtime.audit_hooks("everything")
    hook = AuditHook("policy", policy=lambda db: default_policy())
    assert hook.mode_of("db", "long_term_memory") == "full"
    assert hook.mode_of("db", "checkpoint") == "metadata"
    assert hook.mode_of("db", "run") is None
    assert AuditHook("full", policy=lambda db: default_policy()).mode_of("db", "run") == "full"
