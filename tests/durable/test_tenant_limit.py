"""``--tenant-limit`` holds for the fleet: two workers (threads of this process, each with
``limit`` slots) never run more than the limit of one tenant at once between them. Each
claim counts the tenant's running runs in its transaction and writes the tenant's claims
document, so two concurrent claims for one tenant conflict."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from accord.checkpointers.worker import Worker
from accord.platform import queued_runs
from accord.runtime import Accord

STEPS = "tests.durable.queue_graphs:steps"


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "tlim_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, step in points:
        now += step
        most = max(most, now)
    return most


def _spans(path: Any) -> dict[str, tuple[float, float]]:
    """Each run's first start and last end, from the steps' log."""
    spans: dict[str, tuple[float, float]] = {}
    for line in path.read_text().splitlines():
        e = json.loads(line)
        start, end = spans.get(e["run"], (e["start"], e.get("end", e["start"])))
        spans[e["run"]] = (min(start, e["start"]), max(end, e.get("end", e["start"])))
    return spans


@pytest.mark.parametrize("limit", [1, 2])
def test_the_tenant_limit_holds_across_two_workers(
    client: MongoClient, db_name: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv("ACCORD_TEST_LOG", str(log))
    monkeypatch.setenv("ACCORD_TEST_STEP_S", "0.05")
    with Accord(client=client, db_name=db_name) as app:
        queue = app.runs()
        for i in range(8):
            queue.submit(STEPS, {"run": f"a-{i}"}, tenant_id="a")
        for i in range(4):
            queue.submit(STEPS, {"run": f"b-{i}"}, tenant_id="b")
        # each worker holds at most ``limit`` runs: the first one's are all of tenant a
        # (submitted first), so the second must claim too, and finds a at its limit
        workers = [
            Worker(STEPS, client=app.client, uow=app.uow, db=app.db_name, poll=0.02, lease=10.0,
                   concurrency=limit, tenant_limit=limit)
            for _ in range(2)
        ]  # fmt: skip
        sampled: dict[str, int] = {"a": 0, "b": 0}
        samples = 0
        done = threading.Event()

        def sample() -> None:  # the queue's own view, every few milliseconds
            nonlocal samples
            runs = client[db_name]["accord_run_queue"]
            while not done.is_set():
                for tenant in sampled:
                    n = runs.count_documents({"tenant_id": tenant, "status": "running"})
                    sampled[tenant] = max(sampled[tenant], n)
                samples += 1
                time.sleep(0.003)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        threads = [threading.Thread(target=w.run) for w in workers]
        for t in threads:
            t.start()
        runs = client[db_name]["accord_run_queue"]
        deadline = time.monotonic() + 120
        while runs.count_documents({"status": "done"}) < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        for w in workers:
            w.stop()
        for t in threads:
            t.join(timeout=30)
        done.set()
        sampler.join(timeout=5)
        for tenant in "ab":
            runs = queue.list(tenant_id=tenant)
            assert {r.status for r in runs} == {queued_runs.DONE}, tenant
        assert sum(w.completed for w in workers) == 12
        assert all(w.completed > 0 for w in workers)  # both workers claimed
        spans = _spans(log)
        for tenant in "ab":
            executed = _most_at_once([v for k, v in spans.items() if k.startswith(tenant)])
            assert executed == limit, (tenant, executed)  # reached, never exceeded
            assert 1 <= sampled[tenant] <= limit, (tenant, sampled, samples)
        # the tenants' claims documents are not runs
        assert len(queue.list(tenant_id="a")) == 8
