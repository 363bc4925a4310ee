"""Workers as real processes (``accord worker``), killed and stopped:

* the fleet: 200 runs of a three-step graph (one business write per step) across two
  worker processes; one is SIGKILLed midway. Every run finishes, the business writes are
  exact (600, one per run and step), and no run is executed by two processes at once
  (from the steps' own log: who executed what, when). Twice: the workers told they are
  on two machines (``ACCORD_MACHINE_ID``), so the dead one's runs are taken over only
  when their lease expires (a worker dying on another machine), and on one machine,
  where the survivor sees the dead process is gone; the time from the kill to the first
  step of a taken-over run is measured against the lease (printed as ``FLEET {...}``);
* SIGTERM: a worker gives back what it cannot finish within its grace period, and
  another worker finishes it;
* an approval: a run waits in ``interrupt()``, its worker exits, nothing holds the run,
  ``accord runs approve`` queues it, and a new worker finishes it;
* ``accord worker --async`` (a graph with async nodes) SIGKILLed and taken over;
* ``--tenant-limit 1`` on two worker processes: never two runs of a tenant at once.

Engine-only: a dedicated embedded engine with a short transaction lifetime (2 s), so
the killed worker's open transaction (if the kill lands in one) is aborted quickly, as
``transactionLifetimeLimitSeconds`` does on mongod (60 s by default there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from accord.platform import queued_runs
from accord.platform.embedded import EmbeddedServer
from accord.runtime import Accord

pytestmark = [pytest.mark.embedded_only, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ACCORD = Path(sys.executable).parent / "accord"
STEPS = "tests.durable.queue_graphs:steps"
APPROVAL = "tests.durable.queue_graphs:approval"
RUNS = 200
LEASE = 2.0


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EmbeddedServer(dbpath=tmp_path_factory.mktemp("fleet"), port=0, sync=False,
                            transaction_lifetime=2.0)  # fmt: skip
    server.start()
    try:
        yield server.uri
    finally:
        server.stop()


def start_worker(
    uri: str, db: str, graph: str, log: Path, *, machine: str, step_s: float = 0.0,
    extra: tuple[str, ...] = (), hold: Path | None = None, lease: float = LEASE,
) -> subprocess.Popen[str]:  # fmt: skip
    """``hold``: each step waits until this file exists."""
    env = {**os.environ, "MONGODB_URI": uri, "ACCORD_TEST_LOG": str(log),
           "ACCORD_TEST_STEP_S": str(step_s), "ACCORD_MACHINE_ID": machine}  # fmt: skip
    if hold is not None:
        env["ACCORD_TEST_HOLD"] = str(hold)
    cmd = [str(ACCORD), "worker", "--graph", graph, "--db", db, "--lease", str(lease),
           "--poll", "0.1", *extra]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in log.read_text().splitlines() if x] if log.exists() else []


def stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


@pytest.mark.parametrize("machines", ["two", "one"])
def test_200_runs_across_two_workers_one_killed(engine: str, tmp_path: Path, machines: str) -> None:
    """``two``: the workers are on two machines (as far as they can tell): the dead one's
    runs are taken over when their lease expires. ``one``: on one machine, the survivor
    sees the dead worker's process is gone and takes its runs over at once."""
    client: MongoClient = MongoClient(engine)
    db = f"fleet_{machines}"
    log = tmp_path / "steps.jsonl"
    # on one machine, a lease far above the time a takeover "at once" may take on a
    # loaded machine: a takeover before it could have expired was not waiting for it
    lease = LEASE if machines == "two" else 10.0
    with Accord(client=client, db_name=db) as app:
        queue = app.runs()
        started = time.monotonic()
        ids = [queue.submit(STEPS, {"run": f"r{i:03d}"}).run_id for i in range(RUNS)]
        workers = [
            start_worker(engine, db, STEPS, log,
                         machine=f"machine-{i}" if machines == "two" else "machine", step_s=0.05,
                         extra=("--concurrency", "8"), lease=lease)
            for i in range(2)
        ]  # fmt: skip
        victim, survivor = workers
        runs = client[db]["accord_run_queue"]
        try:
            # midway: a third of the runs done, and the victim holds runs in flight
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                done = runs.count_documents({"status": "done"})
                held = runs.count_documents({"status": "running", "owner.holder_pid": victim.pid})
                if done >= RUNS // 3 and held:
                    break
                time.sleep(0.02)
            else:
                raise AssertionError(f"no midway point: {stop(victim)}\n{stop(survivor)}")
            victim.kill()
            killed_at = time.time()
            victim.wait()
            held_docs = list(runs.find({"status": "running", "owner.holder_pid": victim.pid}))
            orphans = {d["_id"] for d in held_docs}
            assert orphans
            # when the dead worker's first lease runs out (its last renewals are final)
            expiry = min(d["lease_expires"].replace(tzinfo=UTC).timestamp() for d in held_docs)
            deadline = time.monotonic() + 300
            while runs.count_documents({"status": "done"}) < RUNS:
                assert time.monotonic() < deadline, runs.count_documents({"status": "done"})
                assert survivor.poll() is None, stop(survivor)
                time.sleep(0.05)
            elapsed = time.monotonic() - started
        finally:
            for proc in workers:
                stop(proc)
        statuses = {d["_id"]: d["status"] for d in runs.find({}, {"status": 1})}
        assert set(statuses) == set(ids) and set(statuses.values()) == {"done"}
        results = [queue.result(i) for i in ids]
        assert all(r["done"] == ["a", "b", "c"] for r in results)
        writes = client[db]["fleet_writes"]
        assert writes.count_documents({}) == RUNS * 3  # exact: one per run and step
        names = {d["_id"] for d in writes.find({}, {"_id": 1})}
        assert names == {f"r{i:03d}:{s}" for i in range(RUNS) for s in "abc"}
        commits = [(c["run"], c["step"]) for c in client[db]["fleet_commits"].find()]
        assert len(commits) == len(set(commits)) == RUNS * 3  # each execution committed once

        # no run executed by two processes at once (a killed step ends at the kill)
        steps = lines(log)
        ends = {(e["run"], e["step"], e["pid"], e["start"]): e["end"] for e in steps if "end" in e}
        spans: dict[str, list[tuple[int, float, float]]] = {}
        for e in steps:
            if "end" in e:
                continue
            # a step that never returned was killed (the victim's) or is a bug
            end = ends.get((e["run"], e["step"], e["pid"], e["start"]))
            if end is None:
                assert e["pid"] == victim.pid, e
                end = killed_at
            spans.setdefault(e["run"], []).append((e["pid"], e["start"], end))
        for run, execs in spans.items():
            for pid, start, end in execs:
                for other, ostart, oend in execs:
                    if other != pid:
                        assert end <= ostart or oend <= start, (run, execs)
        taken = [d for d in runs.find({"_id": {"$in": sorted(orphans)}})]
        assert all(d["attempts"] >= 2 for d in taken)
        first_after = min(
            e["start"] for e in steps
            if e["pid"] == survivor.pid and e["start"] > killed_at and "end" not in e
            and ids[int(e["run"][1:])] in orphans
        )  # fmt: skip
        takeover = first_after - killed_at
        report = {
            "machines": machines, "runs": RUNS, "workers": 2, "concurrency": 8, "lease_s": lease,
            "fleet_s": round(elapsed, 2), "runs_per_s": round(RUNS / elapsed, 1),
            "steps_per_s": round(3 * RUNS / elapsed, 1),
            "orphans": len(orphans), "takeover_s": round(takeover, 2),
            "lease_left_at_kill_s": round(expiry - killed_at, 2),
            "step_executions": sum("end" in e for e in steps),
        }  # fmt: skip
        print("FLEET", json.dumps(report))
        # (how fast is a figure, docs/benchmarks.md; what is asserted is what it waited
        # for: the dead worker's leases as they were at the kill)
        if machines == "two":
            assert first_after >= expiry - 0.05, report  # it waited for the lease
        else:
            assert first_after < expiry, report  # at once: the next poll sees the pid gone
    client.close()


def test_sigterm_gives_back_what_it_cannot_finish(engine: str, tmp_path: Path) -> None:
    client: MongoClient = MongoClient(engine)
    db = "fleet_term"
    log = tmp_path / "steps.jsonl"
    with Accord(client=client, db_name=db) as app:
        queue = app.runs()
        ids = [queue.submit(STEPS, {"run": f"t{i}"}).run_id for i in range(2)]
        first = start_worker(engine, db, STEPS, log, machine="m1", step_s=1.5,
                             extra=("--grace", "0.2"))  # fmt: skip
        runs = client[db]["accord_run_queue"]
        deadline = time.monotonic() + 60
        while runs.count_documents({"status": "running"}) < 2:
            assert time.monotonic() < deadline and first.poll() is None, stop(first)
            time.sleep(0.05)
        time.sleep(0.5)
        out = stop(first)
        assert first.returncode == 0, out
        left = {d["_id"]: d["status"] for d in runs.find()}
        assert set(left.values()) <= {"queued", "done"}, left  # given back, not held
        assert "queued" in left.values(), left
        second = start_worker(engine, db, STEPS, log, machine="m1",
                              extra=("--until-idle",))  # fmt: skip
        assert second.wait(timeout=120) == 0, stop(second)
        assert all(queue.result(i)["done"] == ["a", "b", "c"] for i in ids)
        assert client[db]["fleet_writes"].count_documents({}) == 6
    client.close()


def test_an_approval_holds_no_process(engine: str, tmp_path: Path) -> None:
    client: MongoClient = MongoClient(engine)
    db = "fleet_approval"
    log = tmp_path / "steps.jsonl"
    env = {**os.environ, "MONGODB_URI": engine}
    with Accord(client=client, db_name=db) as app:
        queue = app.runs()
        run = queue.submit(APPROVAL, {"run": "wire-500"})
        first = start_worker(engine, db, APPROVAL, log, machine="m1")
        deadline = time.monotonic() + 60
        while queue.get(run.run_id).status != queued_runs.WAITING:
            assert time.monotonic() < deadline and first.poll() is None, stop(first)
            time.sleep(0.05)
        stop(first)
        assert first.returncode == 0
        waiting = queue.get(run.run_id)
        assert waiting.status == queued_runs.WAITING and waiting.lease_expires is None
        # no process holds the run, nor its thread
        thread = client[db]["runs"].find_one({"thread_id": run.thread_id})
        assert thread is not None and thread.get("lease_expires") is None
        shown = subprocess.run([str(ACCORD), "runs", "show", run.run_id, "--db", db], env=env,
                               capture_output=True, text=True, cwd=ROOT)  # fmt: skip
        assert shown.returncode == 0 and "waiting" in shown.stdout, shown.stderr
        assert "wire the money?" in shown.stdout
        approved = subprocess.run([str(ACCORD), "runs", "approve", run.run_id, "--db", db],
                                  env=env, capture_output=True, text=True, cwd=ROOT)  # fmt: skip
        assert approved.returncode == 0, approved.stderr
        again = subprocess.run([str(ACCORD), "runs", "approve", run.run_id, "--db", db],
                               env=env, capture_output=True, text=True, cwd=ROOT)  # fmt: skip
        assert again.returncode == 1 and "not waiting" in again.stdout + again.stderr
        second = start_worker(engine, db, APPROVAL, log, machine="m2",
                              extra=("--until-idle",))  # fmt: skip
        assert second.wait(timeout=120) == 0, stop(second)
        assert queue.wait(run.run_id, timeout=5)["acted"] == "wired"
        assert client[db]["approvals"].count_documents({}) == 1
    client.close()


def test_a_paused_worker_cannot_commit_after_its_run_was_taken_over(
    engine: str, tmp_path: Path
) -> None:
    """A zombie: the worker is paused (SIGSTOP) inside a step past its lease; another
    worker takes the run over and finishes it; the paused one wakes up (SIGCONT) and
    finishes its step: its commit is refused by the thread's fence, its queue writes by
    the run's, and every business write exists once."""
    client: MongoClient = MongoClient(engine)
    db = "fleet_zombie"
    log = tmp_path / "steps.jsonl"
    with Accord(client=client, db_name=db) as app:
        queue = app.runs()
        run = queue.submit(STEPS, {"run": "z"})
        # its steps wait for the file ``go``: the pause lands inside step a, however late
        go = tmp_path / "go"
        zombie = start_worker(engine, db, STEPS, log, machine="m1", hold=go)
        try:
            deadline = time.monotonic() + 60
            while not lines(log):
                assert time.monotonic() < deadline and zombie.poll() is None, stop(zombie)
                time.sleep(0.01)
            zombie.send_signal(signal.SIGSTOP)  # inside step a, before its commit
            time.sleep(LEASE + 0.3)  # its lease runs out (a worker --until-idle exits
            # at once when nothing is claimable)
            taken_by = start_worker(engine, db, STEPS, log, machine="m2", step_s=0.0,
                                    extra=("--until-idle",))  # fmt: skip
            assert taken_by.wait(timeout=120) == 0, stop(taken_by)
            assert queue.get(run.run_id).status == "done"
            fence = queue.get(run.run_id).fence
            zombie.send_signal(signal.SIGCONT)
            go.touch()
            # the zombie's step ends, its commit is refused, its heartbeat finds the run
            # lost; it writes nothing more
            deadline = time.monotonic() + 30
            while not any(e.get("pid") == zombie.pid and "end" in e for e in lines(log)):
                assert time.monotonic() < deadline, lines(log)
                time.sleep(0.05)
            time.sleep(1.0)
        finally:
            zombie.send_signal(signal.SIGCONT)
            go.touch()
            stop(zombie)
        commits = list(client[db]["fleet_commits"].find())
        assert len(commits) == 3 and {c["pid"] for c in commits} == {taken_by.pid}, commits
        after = queue.get(run.run_id)
        assert after.status == "done" and after.fence == fence == 2
        assert queue.result(run.run_id)["done"] == ["a", "b", "c"]
        writes = sorted(d["_id"] for d in client[db]["fleet_writes"].find())
        assert writes == ["z:a", "z:b", "z:c"]
    client.close()


def test_a_worker_killed_mid_call_parks_its_run_for_reconciliation(
    engine: str, tmp_path: Path
) -> None:
    """The worker dies inside a recorded call that is not idempotent (the bank got the
    request; no result recorded). The run is taken over, its task executed again: the
    call is parked, the run waits (kind ``reconcile``) and the bank is not asked again.
    A human settles the call (`accord runs resolve`) and resumes the run (`accord runs
    resume`); a worker finishes it with the settled result."""
    client: MongoClient = MongoClient(engine)
    db = "fleet_reconcile"
    bank = tmp_path / "bank.jsonl"
    env = {**os.environ, "MONGODB_URI": engine, "ACCORD_TEST_BANK": str(bank)}
    os.environ["ACCORD_TEST_BANK"] = str(bank)  # the workers inherit it
    try:
        with Accord(client=client, db_name=db) as app:
            queue = app.runs()
            run = queue.submit("tests.durable.queue_graphs:wire", {"run": "w"})
            first = start_worker(engine, db, "tests.durable.queue_graphs:wire",
                                 tmp_path / "log", machine="m1", step_s=30.0)  # fmt: skip
            deadline = time.monotonic() + 60
            while not lines(bank):
                assert time.monotonic() < deadline and first.poll() is None, stop(first)
                time.sleep(0.02)
            first.kill()  # mid-call: the bank has the request, no result is recorded
            first.wait()
            second = start_worker(engine, db, "tests.durable.queue_graphs:wire",
                                  tmp_path / "log", machine="m1",
                                  extra=("--until-idle",))  # fmt: skip
            assert second.wait(timeout=120) == 0, stop(second)
            parked = queue.get(run.run_id)
            assert parked.status == queued_runs.WAITING, parked.events
            assert parked.wait["kind"] == "reconcile"
            key = parked.wait["interrupts"][0]["reconcile"]["key"]
            assert len(lines(bank)) == 1  # never asked twice
            settled = subprocess.run(
                [str(ACCORD), "runs", "resolve", run.thread_id, key, "--db", db,
                 "--result", '"wired by hand"'],
                env=env, capture_output=True, text=True, cwd=ROOT,
            )  # fmt: skip
            assert settled.returncode == 0, settled.stdout + settled.stderr
            resumed = subprocess.run([str(ACCORD), "runs", "resume", run.run_id, "--db", db],
                                     env=env, capture_output=True, text=True, cwd=ROOT)  # fmt: skip
            assert resumed.returncode == 0, resumed.stdout + resumed.stderr
            third = start_worker(engine, db, "tests.durable.queue_graphs:wire",
                                 tmp_path / "log", machine="m1",
                                 extra=("--until-idle",))  # fmt: skip
            assert third.wait(timeout=120) == 0, stop(third)
            assert queue.wait(run.run_id, timeout=5)["acted"] == "wired by hand"
            assert len(lines(bank)) == 1
    finally:
        os.environ.pop("ACCORD_TEST_BANK", None)
        client.close()


def test_an_async_worker_killed_midway_is_taken_over(engine: str, tmp_path: Path) -> None:
    """``accord worker --async`` (AsyncWorker, a graph with async nodes) SIGKILLed with
    runs in flight: a new async worker takes them over; every run done, every business
    write once."""
    client: MongoClient = MongoClient(engine)
    db = "fleet_async"
    log = tmp_path / "steps.jsonl"
    graph = "tests.durable.queue_graphs:async_steps"
    with Accord(client=client, db_name=db) as app:
        queue = app.runs()
        ids = [queue.submit(graph, {"run": f"r{i}"}).run_id for i in range(20)]
        first = start_worker(engine, db, graph, log, machine="m1", step_s=0.05,
                             extra=("--async", "--concurrency", "4"))  # fmt: skip
        runs = client[db]["accord_run_queue"]
        deadline = time.monotonic() + 60
        while runs.count_documents({"status": "done"}) < 5:
            assert time.monotonic() < deadline and first.poll() is None, stop(first)
            time.sleep(0.02)
        first.kill()
        first.wait()
        held = runs.count_documents({"status": "running"})
        second = start_worker(engine, db, graph, log, machine="m1",
                              extra=("--async", "--until-idle"))  # fmt: skip
        assert second.wait(timeout=120) == 0, stop(second)
        out = stop(second)
        assert "claiming failed" not in out, out
        assert all(queue.result(i)["done"] == ["a", "b", "c"] for i in ids)
        assert client[db]["fleet_writes"].count_documents({}) == 60
        assert held >= 1  # the kill left runs in flight, taken over
        taken = [d for d in runs.find() if d["attempts"] > 1]
        assert len(taken) == held, (held, [d["_id"] for d in taken])
    client.close()


def test_the_tenant_limit_holds_across_worker_processes(engine: str, tmp_path: Path) -> None:
    """Two ``accord worker --tenant-limit 1`` processes: sampling the queue, never two
    runs of one tenant running at once; the steps' log agrees."""
    client: MongoClient = MongoClient(engine)
    db = "fleet_tenant_limit"
    log = tmp_path / "steps.jsonl"
    with Accord(client=client, db_name=db) as app:
        queue = app.runs()
        for i in range(6):
            queue.submit(STEPS, {"run": f"a-{i}"}, tenant_id="a")
        for i in range(3):
            queue.submit(STEPS, {"run": f"b-{i}"}, tenant_id="b")
        extra = ("--concurrency", "1", "--tenant-limit", "1")
        # the steps wait for ``go`` until each worker holds a run: one that started late
        # (a loaded machine) would otherwise find the other had run them all
        go = tmp_path / "go"
        workers = [start_worker(engine, db, STEPS, log, machine=f"m{n}", step_s=0.05,
                                extra=extra, hold=go) for n in (1, 2)]  # fmt: skip
        runs = client[db]["accord_run_queue"]
        most = {"a": 0, "b": 0}
        deadline = time.monotonic() + 120
        while runs.count_documents({"status": "running"}) < 2:
            assert time.monotonic() < deadline, [stop(w) for w in workers]
            for tenant in most:
                n = runs.count_documents({"tenant_id": tenant, "status": "running"})
                most[tenant] = max(most[tenant], n)
            time.sleep(0.01)
        go.touch()
        while runs.count_documents({"status": "done"}) < 9:
            assert time.monotonic() < deadline, [stop(w) for w in workers]
            for tenant in most:
                n = runs.count_documents({"tenant_id": tenant, "status": "running"})
                most[tenant] = max(most[tenant], n)
            time.sleep(0.003)
        outs = [stop(w) for w in workers]
        assert most == {"a": 1, "b": 1}, (most, outs)
        spans: dict[str, list[float]] = {}
        for e in lines(log):
            span = spans.setdefault(e["run"], [e["start"], e.get("end", e["start"])])
            span[0], span[1] = min(span[0], e["start"]), max(span[1], e.get("end", e["start"]))
        pids = {e["pid"] for e in lines(log)}
        assert len(pids) == 2, pids  # both processes executed runs
        for tenant in "ab":
            mine = sorted(v for k, v in spans.items() if k.startswith(tenant))
            assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:], strict=False)), tenant
    client.close()
