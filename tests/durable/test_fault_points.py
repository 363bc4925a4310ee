"""Acceptance: the fault-point suite of durable execution (issue 25).

One real LangGraph graph (``tests/durable/recorded_worker.py``: ``pay`` three times, then
``confirm``) on an accord saver: each ``pay`` asks a nondeterministic fake model for a
transfer (a new random id every call), charges a fake bank that books every request in a
file (the outside world: it survives the worker), and stages a business write; ``confirm``
stages one more. The worker SIGKILLs itself at a named fault point, at its first, second
and third occurrence, on a thread of its own each time; a supervisor ends the dead
worker's open transaction (``killSessions``) and a new worker resumes the thread:

* F1 ``node_start``: before a node runs;
* F2 ``after_charge``: after the external call returned, before the node returned;
* F3 ``put_writes_after``: after the task's writes were saved, before the next ``put``;
* F4 ``commit_start``: inside a transaction (a step's, or a recorded call's), before its
  commit reached the server;
* F6: a zombie: the worker is SIGSTOPped inside the bank call for longer than its lease,
  another worker takes the thread over and finishes it, then the zombie is SIGCONTed and
  tries to record its call and commit its step.

F5 (a kill during the aggregator's commit) is the aggregator's own crash suite,
``tests/memory/test_aggregator_crash.py``: the aggregator is not part of this graph.

With an idempotent bank (it dedupes on the idempotency key accord derives), every run
finishes. With a plain bank, a run whose bank call has an intent and no result (the
kill came between the money moving and the result's commit) is parked with
``NeedsReconciliation`` naming the call instead. Either way: the money moved at most once
per step (exactly once for a finished run), for the transfer the step's recorded decision
named; every business write exists once and names a charged transfer; no zombie commit
was accepted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from bson import json_util
from pymongo import MongoClient

from tests.durable.test_recorded_crash import WORKER, books, end_open_transactions

pytestmark = [pytest.mark.slow]  # worker processes killed and restarted

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
POINTS = ["node_start", "after_charge", "put_writes_after", "commit_start"]


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    """A prefix: each case has a database of its own (its business collections too)."""
    name = "fp_" + uuid.uuid4().hex[:12]
    try:
        yield name
    finally:
        for db in client.list_database_names():
            if db.startswith(name):
                client.drop_database(db)


def _cmd(uri: str, db: str, thread: str, books_dir: Path, saver: str, *extra: str) -> list[str]:
    return [sys.executable, str(WORKER), "--uri", uri, "--db", db, "--thread", thread,
            "--dir", str(books_dir), "--saver", saver, "--steps", str(STEPS),
            "--durability", "sync", "--lsid-file", str(books_dir / "lsids"),
            *extra]  # fmt: skip


def _run(cmd: list[str]) -> tuple[int, dict[str, Any] | None, str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={**os.environ})  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, json.loads(lines[-1]) if lines else None, proc.stderr


def _check_books(client: MongoClient, db: str, books_dir: Path, *, finished: bool) -> None:
    """The invariants of every case: money moved at most once per step (once per step
    when the run finished), each business write names a charged transfer, once."""
    charged = [e for e in books(books_dir / "bank.jsonl") if e["charged"]]
    keys = [e["key"] for e in charged if e["key"]]  # a plain call is given no key
    assert len(set(keys)) == len(keys), charged  # never twice for one step
    transfers = [e["transfer_id"] for e in charged]
    assert len(set(transfers)) == len(transfers), charged
    writes = [d["_id"] for d in client[db]["charges"].find()]
    assert set(writes) <= set(transfers), (writes, transfers)  # no write for unpaid money
    if finished:
        assert len(charged) == STEPS, charged
        assert sorted(writes) == sorted(transfers)  # each business write once
        assert client[db]["transfers"].count_documents({}) == 1


def _case(
    uri: str,
    client: MongoClient,
    db: str,
    root: Path,
    saver: str,
    point: str,
    n: int,
    idempotent: bool,
) -> str:
    """Kill at the n-th ``point``, resume until the run finishes or is parked; check."""
    thread = f"{point}-{n}-{saver}-{'idem' if idempotent else 'plain'}"
    db = f"{db}_{n}{'i' if idempotent else 'p'}"
    books_dir = root / thread
    books_dir.mkdir()
    bank = ["--idempotent"] if idempotent else []
    code, out, err = _run(_cmd(uri, db, thread, books_dir, saver, "--kill-at", f"{point}:{n}",
                               *bank))  # fmt: skip
    assert code == -9, (thread, code, out, err)  # the fault point was reached
    end_open_transactions(client, books_dir / "lsids")
    # LangGraph saves a task's writes from a background thread while its loop goes on, so
    # a kill at a fault point may land after the next task asked the model and before
    # that answer was recorded: what was asked and what was recorded, at the kill
    asked = len(books(books_dir / "model.jsonl"))
    recorded = client[db]["accord_recorded_calls"].count_documents(
        {"thread_id": thread, "name": "model.decide", "status": "done"}
    )
    assert asked - recorded in (0, 1), (asked, recorded)  # at most the one in flight
    code, out, err = _run(_cmd(uri, db, thread, books_dir, saver, *bank))
    if code == 3 and out is not None and out["error"] == "NeedsReconciliation":
        # only a plain bank, killed between the money moving and the result's commit
        assert not idempotent and point == "commit_start", (thread, out)
        assert "bank.charge" in out["message"], out
        run = client[db]["runs"].find_one({"thread_id": thread})
        assert run is not None and run["parked"]["call"] == out["key"]  # the run waits
        _check_books(client, db, books_dir, finished=False)
        return "parked"
    assert code == 0, (thread, code, out, err)
    assert out is not None
    assert out["state"]["count"] == STEPS and out["state"]["confirmed"] is True
    _check_books(client, db, books_dir, finished=True)
    # a decision, once recorded, is replayed; only the steps without one asked the model
    assert len(books(books_dir / "model.jsonl")) == asked + STEPS - recorded
    return "finished"


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("saver", ["sync", "async"])
def test_a_kill_at_each_fault_point_loses_nothing_and_charges_once(
    mongo_uri: str, client: MongoClient, db_name: str, tmp_path: Path, saver: str, point: str
) -> None:
    cases = [(n, idem) for n in range(1, STEPS + 1) for idem in (True, False)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        outcomes = list(pool.map(
            lambda c: _case(mongo_uri, client, db_name, tmp_path, saver, point, c[0], c[1]),
            cases,
        ))  # fmt: skip
    # an idempotent bank always finishes; only F4 can leave a plain call unresolved
    assert all(o == "finished" for (_, idem), o in zip(cases, outcomes, strict=True) if idem)
    if point != "commit_start":
        assert set(outcomes) == {"finished"}, outcomes


def _wait_for_lines(path: Path, count: int, proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(books(path)) >= count:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the worker exited first: {proc.communicate()}")
        time.sleep(0.01)
    raise AssertionError(f"{path.name} did not reach {count} lines in {timeout} s")


@pytest.mark.parametrize("saver", ["sync", "async"])
def test_a_zombie_paused_past_its_lease_commits_nothing(
    mongo_uri: str, client: MongoClient, db_name: str, tmp_path: Path, saver: str
) -> None:
    """F6: SIGSTOP the worker inside its second bank call (the money moved, the result
    not recorded) for longer than its lease; a new worker takes the thread over, retries
    the call with the same key (the bank dedupes) and finishes the run; SIGCONT: the
    zombie's result and its step are refused, nothing of it is written after takeover."""
    thread = f"zombie-{saver}"
    # its second bank request, once the money moved, waits for the file ``go``: the
    # pause lands between the money moving and the result's record, however late
    cmd = _cmd(mongo_uri, db_name, thread, tmp_path, saver, "--idempotent", "--lease", "1",
               "--hold-charge", "2")  # fmt: skip
    zombie = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT)  # fmt: skip
    try:
        _wait_for_lines(tmp_path / "bank.jsonl", 2, zombie, timeout=120)
        zombie.send_signal(signal.SIGSTOP)  # its heartbeat included
        try:
            time.sleep(2.0)  # past its lease
            # no kill, no killSessions: the zombie is alive and sits outside any
            # transaction (sync durability: nothing is saved in the background)
            code, out, err = _run(_cmd(mongo_uri, db_name, thread, tmp_path, saver,
                                       "--idempotent"))  # fmt: skip
            assert code == 0, (code, out, err)
            assert out is not None and out["state"]["confirmed"] is True
            before = {
                name: sorted(map(json_util.dumps, client[db_name][name].find()))
                for name in ("charges", "transfers", "accord_recorded_calls")
            }
            checkpoints = client[db_name]["accord_checkpoints"].count_documents({})
        finally:
            zombie.send_signal(signal.SIGCONT)
            (tmp_path / "go").touch()
        zout, zerr = zombie.communicate(timeout=120)
    finally:
        if zombie.poll() is None:
            zombie.kill()
            zombie.wait()
    lines = [line for line in zout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else None
    assert zombie.returncode == 3 and result is not None, (zombie.returncode, zout, zerr)
    # the zombie's first write after waking, its call's result, was refused by the fence
    assert result["error"] == "LeaseLost", result
    assert "while its call was under way" in result["message"], result
    after = {
        name: sorted(map(json_util.dumps, client[db_name][name].find()))
        for name in ("charges", "transfers", "accord_recorded_calls")
    }
    assert after == before  # no zombie commit was accepted
    assert client[db_name]["accord_checkpoints"].count_documents({}) == checkpoints
    _check_books(client, db_name, tmp_path, finished=True)
    requests = books(tmp_path / "bank.jsonl")
    # the paused call was asked again by the new worker, with the same key; money once
    assert [r["charged"] for r in requests].count(False) == 1, requests
