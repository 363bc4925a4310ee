"""The long-term memory collection has an index for each search the memory service makes
(issue 22, item 4): a search without a query reads a tenant's memories newest first
(``updated_at`` desc, then ``_id``) off an index, without sorting them, so a tenant with
100,000 memories costs a walk of the index, not a sort of all of them. Checked on the
plan the server picks (``explain``), against the engine or a real MongoDB alike.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import ASCENDING, DESCENDING

from accord.memory import model
from accord.memory.embedders import HashingEmbedder
from accord.memory.synchronous.service import MemoryService


@pytest.fixture()
def svc(client: Any) -> Iterator[MemoryService]:
    db = "mem_" + uuid.uuid4().hex[:10]
    s = MemoryService(client, tenant_id="A", db_name=db, embedder=HashingEmbedder(64))
    s.setup()
    yield s
    client.drop_database(db)


def _stages(plan: Any) -> Iterator[dict[str, Any]]:
    """Every stage of an explain plan, whatever the server's nesting."""
    if isinstance(plan, dict):
        if "stage" in plan:
            yield plan
        for value in plan.values():
            yield from _stages(value)
    elif isinstance(plan, list):
        for value in plan:
            yield from _stages(value)


def test_a_search_without_a_query_reads_newest_first_off_an_index(svc: MemoryService) -> None:
    for i in range(30):
        svc.put(("users", f"u{i % 3}"), f"k{i}", {"n": i}, embed=False)
    # The query and order of the service's search without a query (``_scan``).
    cursor = svc.memories.find(model.scope_filter("A", ()), model.PROJECTION).sort(
        [("updated_at", DESCENDING), ("_id", ASCENDING)]
    )
    plan = cursor.explain()["queryPlanner"]["winningPlan"]
    stages = [s["stage"] for s in _stages(plan)]
    assert "SORT" not in stages, f"the memories are sorted in memory: {plan}"
    assert "IXSCAN" in stages, plan
    # And the service returns them in that order.
    got = [m.key for m in svc.search((), limit=30)]
    assert got == [d["key"] for d in cursor.clone()]
