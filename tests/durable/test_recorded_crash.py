"""Acceptance: recorded calls survive SIGKILL (issue 25, item 2).

A real LangGraph graph with an accord saver calls a nondeterministic fake model (a new
random transfer id every call) and a counter-backed fake bank
(``tests/durable/recorded_worker.py``). The worker process SIGKILLs itself:

* after the bank call returned, before the node returned: a new process resumes the
  thread; the bank saw the charge once and the model's recorded decision (the transfer
  id it charged) was replayed, not asked again;
* inside the bank call, after the money moved (an intent without a result): a call not
  declared idempotent raises ``NeedsReconciliation`` and is parked (the bank is never
  asked twice); an idempotent one is retried once, with the same idempotency key, and the
  bank (which dedupes on it) moves the money once.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from bson import json_util
from pymongo import MongoClient

from accord.checkpointers import AccordSaver
from accord.checkpointers.bundles import MIGRATION_KEY
from accord.platform import calls

pytestmark = pytest.mark.slow  # worker processes killed and restarted

WORKER = Path(__file__).with_name("recorded_worker.py")
ROOT = Path(__file__).resolve().parents[2]
SAVERS = ["sync", "async"]


def run_worker(
    uri: str, db: str, thread: str, books: Path, saver: str, *extra: str
) -> tuple[int, dict[str, Any] | None, str]:
    lsids = books / f"lsids-{thread}"
    proc = subprocess.run(
        [sys.executable, str(WORKER), "--uri", uri, "--db", db, "--thread", thread,
         "--dir", str(books), "--saver", saver, "--lsid-file", str(lsids), *extra],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ},
    )  # fmt: skip
    if proc.returncode == -9:
        with MongoClient(uri) as client:
            end_open_transactions(client, lsids)
    lsids.unlink(missing_ok=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, json.loads(lines[-1]) if lines else None, proc.stderr


def end_open_transactions(client: MongoClient, lsids: Path) -> None:
    """What a supervisor does for a dead worker: end the sessions it logged to ``lsids``
    (``--lsid-file``), so that a transaction it left open (a background save) does not
    hold its thread until the server's transaction lifetime ends."""
    if lsids.exists():
        sessions = [json_util.loads(x) for x in lsids.read_text().splitlines() if x]
        client.admin.command("killSessions", sessions)
        lsids.unlink()


def books(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture()
def db_name(client: MongoClient) -> Any:
    name = "rc_" + uuid.uuid4().hex[:12]
    try:
        yield name
    finally:
        client.drop_database(name)


@pytest.mark.parametrize("durability", ["async", "sync"])
@pytest.mark.parametrize("saver", SAVERS)
def test_crash_after_the_call_replays_the_model_and_charges_once(
    mongo_uri: str,
    client: MongoClient,
    db_name: str,
    tmp_path: Path,
    saver: str,
    durability: str,
) -> None:
    thread = f"pay-{saver}"
    code, out, err = run_worker(mongo_uri, db_name, thread, tmp_path, saver, "--kill",
                                "after_charge", "--durability", durability)  # fmt: skip
    assert code == -9, (code, out, err)
    # the worker died with the bank's charge made and recorded, the node unfinished
    assert [e["charged"] for e in books(tmp_path / "bank.jsonl")] == [True]
    model_calls = books(tmp_path / "model.jsonl")
    assert len(model_calls) == 1

    code, out, err = run_worker(mongo_uri, db_name, thread, tmp_path, saver, "--durability",
                                durability)  # fmt: skip
    assert code == 0, (code, out, err)
    assert out is not None
    state = out["state"]
    charges = books(tmp_path / "bank.jsonl")
    assert len(charges) == 1, charges  # the bank was not called again
    # the model was not asked again: its first (recorded) decision was replayed
    assert len(books(tmp_path / "model.jsonl")) == 1
    assert state["transfer_id"] == model_calls[0]["transfer_id"] == charges[0]["transfer_id"]
    assert state["confirmed"] is True
    assert client[db_name]["transfers"].count_documents({}) == 1
    docs = list(client[db_name]["accord_recorded_calls"].find({}, sort=[("position", 1)]))
    assert [(d["name"], d["position"], d["status"], d["attempts"]) for d in docs] == [
        ("model.decide", 0, calls.DONE, 1),
        ("bank.charge", 1, calls.DONE, 1),
    ]
    assert all(d["divergences"] == 0 for d in docs)
    assert all(d["thread_id"] == thread and d["run_id"] for d in docs)


@pytest.mark.parametrize("saver", SAVERS)
def test_crash_mid_call_parks_a_call_that_is_not_idempotent(
    mongo_uri: str, client: MongoClient, db_name: str, tmp_path: Path, saver: str
) -> None:
    thread = f"mid-{saver}"
    code, out, err = run_worker(mongo_uri, db_name, thread, tmp_path, saver, "--kill",
                                "mid_charge")  # fmt: skip
    assert code == -9, (code, out, err)
    assert len(books(tmp_path / "bank.jsonl")) == 1

    for _ in range(2):  # parked: every resume refuses again, never calls the bank
        code, out, err = run_worker(mongo_uri, db_name, thread, tmp_path, saver)
        assert code == 3, (code, out, err)
        assert out is not None and out["error"] == "NeedsReconciliation", out
        assert "bank.charge" in out["message"] and "position 1" in out["message"]
    assert len(books(tmp_path / "bank.jsonl")) == 1
    assert len(books(tmp_path / "model.jsonl")) == 1
    doc = client[db_name]["accord_recorded_calls"].find_one({"_id": out["key"]})
    assert doc is not None and doc["status"] == calls.PARKED and doc["name"] == "bank.charge"
    run_doc = client[db_name]["runs"].find_one({"thread_id": thread})
    assert run_doc is not None and run_doc["parked"]["call"] == out["key"]  # the run waits
    assert client[db_name]["transfers"].count_documents({}) == 0


@pytest.mark.parametrize("saver", SAVERS)
def test_crash_mid_call_retries_an_idempotent_call_once_with_the_same_key(
    mongo_uri: str, client: MongoClient, db_name: str, tmp_path: Path, saver: str
) -> None:
    thread = f"idem-{saver}"
    code, out, err = run_worker(mongo_uri, db_name, thread, tmp_path, saver, "--kill",
                                "mid_charge", "--idempotent")  # fmt: skip
    assert code == -9, (code, out, err)
    code, out, err = run_worker(mongo_uri, db_name, thread, tmp_path, saver, "--idempotent")
    assert code == 0, (code, out, err)
    requests = books(tmp_path / "bank.jsonl")
    # asked twice (the retry), with the same key; the money moved once
    assert len(requests) == 2 and requests[0]["key"] == requests[1]["key"] is not None
    assert [r["charged"] for r in requests] == [True, False]
    assert requests[0]["transfer_id"] == requests[1]["transfer_id"]  # the replayed decision
    assert len(books(tmp_path / "model.jsonl")) == 1
    doc = client[db_name]["accord_recorded_calls"].find_one({"name": "bank.charge"})
    assert doc is not None and doc["_id"] == requests[0]["key"]
    assert doc["status"] == calls.DONE and doc["attempts"] == 2
    assert client[db_name]["transfers"].count_documents({}) == 1


@pytest.mark.parametrize("saver", SAVERS)
def test_a_run_crashed_on_bundle_v1_is_refused_on_v2_and_resumes(
    mongo_uri: str, client: MongoClient, db_name: str, tmp_path: Path, saver: str
) -> None:
    """Bundle pinning across a real crash: the run SIGKILLed on v1 is refused by a worker
    on v2 (nothing runs, the bank is not called), then resumes on v1 unchanged; a second
    thread crashed on v1 resumes on v2 once a migration is registered."""
    for thread in ("pinned-a", "pinned-b"):
        code, out, err = run_worker(mongo_uri, db_name, f"{thread}-{saver}", tmp_path, saver,
                                    "--kill", "after_charge", "--bundle", "v1")  # fmt: skip
        assert code == -9, (code, out, err)
        code, out, err = run_worker(mongo_uri, db_name, f"{thread}-{saver}", tmp_path, saver,
                                    "--bundle", "v2")  # fmt: skip
        assert code == 3 and out is not None and out["error"] == "BundleMismatch", (out, err)
        assert "pinned to bundle 'v1'" in out["message"] and "model:chat" in out["message"]
    assert len(books(tmp_path / "bank.jsonl")) == 2  # one charge per thread, none since

    code, out, err = run_worker(mongo_uri, db_name, f"pinned-a-{saver}", tmp_path, saver,
                                "--bundle", "v1")  # fmt: skip
    assert code == 0, (out, err)
    assert out is not None and out["state"]["confirmed"] and "migrated" not in out["state"]
    code, out, err = run_worker(mongo_uri, db_name, f"pinned-b-{saver}", tmp_path, saver,
                                "--bundle", "v2", "--migrate")  # fmt: skip
    assert code == 0, (out, err)
    assert out is not None and out["state"]["confirmed"] and out["state"]["migrated"] is True
    assert len(books(tmp_path / "bank.jsonl")) == 2  # still one charge per thread
    assert len(books(tmp_path / "model.jsonl")) == 2
    pin = client[db_name]["runs"].find_one({"thread_id": f"pinned-b-{saver}"})
    assert pin is not None and pin["bundle"]["version"] == "v2"
    assert [e["kind"] for e in pin["bundle_history"]] == ["pinned", "migrated"]


@pytest.mark.parametrize("saver", SAVERS)
def test_a_worker_killed_between_a_migration_and_its_carry_charges_once(
    mongo_uri: str, client: MongoClient, db_name: str, tmp_path: Path, saver: str
) -> None:
    """A run SIGKILLed on v1 after its bank call; a worker on v2 migrates the thread and
    is SIGKILLed once the migration's state update committed, before the carry-over of
    the paused task's calls was written (``carry_start``). The next worker on v2 migrates
    again from the migration's checkpoint and carries the calls from behind it: the
    model's decision and the bank's receipt are replayed, the bank is charged once
    (before 2026-12-07 it was charged twice: the calls were not found under the task's
    new id). Another thread, the same crash, then a worker on v1 (the pin had not moved):
    charged once too."""
    for thread, then in (("carry-v2", "v2"), ("carry-v1", "v1")):
        name = f"{thread}-{saver}"
        code, out, err = run_worker(mongo_uri, db_name, name, tmp_path, saver,
                                    "--kill", "after_charge", "--bundle", "v1")  # fmt: skip
        assert code == -9, (code, out, err)
        code, out, err = run_worker(mongo_uri, db_name, name, tmp_path, saver, "--bundle", "v2",
                                    "--migrate", "--kill-at", "carry_start:1")  # fmt: skip
        assert code == -9, (code, out, err)
        latest = AccordSaver(client, db_name=db_name).get_tuple(
            {"configurable": {"thread_id": name}}
        )  # the migration's update was committed before the kill
        assert latest is not None and latest.metadata.get(MIGRATION_KEY) == "v1->v2"
        pin = client[db_name]["runs"].find_one({"thread_id": name})
        assert pin is not None and pin["bundle"]["version"] == "v1"  # the pin did not move
        extra = ("--migrate",) if then == "v2" else ()
        code, out, err = run_worker(mongo_uri, db_name, name, tmp_path, saver,
                                    "--bundle", then, *extra)  # fmt: skip
        assert code == 0, (out, err)
        assert out is not None and out["state"]["confirmed"] and out["state"]["migrated"]
        charges = [e for e in books(tmp_path / "bank.jsonl") if e["account"] == "acme"]
        assert len(charges) == (1 if then == "v2" else 2), charges  # once per thread
        assert len(books(tmp_path / "model.jsonl")) == len(charges)
        assert client[db_name]["transfers"].count_documents({}) == len(charges)


STEPS = 10
#: kills aimed at each run; a worker that finishes first ends the series
RANDOM_KILLS = 5
#: seconds each fake call of the random-kill workers sleeps: STEPS steps sleeping three
#: times each (6 s) outlast RANDOM_KILLS kills of at most _KILL_AFTER[1] s after the
#: worker's first transaction (4 s), whatever the machine's speed, so the kills land
_PAUSE = 0.2
_KILL_AFTER = (0.05, 0.8)


def _first_transaction(proc: subprocess.Popen[str], lsids: Path, timeout: float) -> bool:
    """Wait until the worker began its first transaction (its session log exists: the
    imports and setup are behind it); False when it exited first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lsids.exists():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    raise AssertionError(f"the worker began no transaction within {timeout} s")


@pytest.mark.parametrize("saver", SAVERS)
def test_random_kills_charge_each_step_once(
    mongo_uri: str, client: MongoClient, db_name: str, tmp_path: Path, saver: str
) -> None:
    """The worker is SIGKILLed from outside at random moments (inside a call, inside a
    transaction, between steps) again and again while it runs STEPS payments, each a
    model decision, an idempotent bank charge and a business write; a supervisor ends
    the dead worker's open transaction. After the last (unkilled) worker: every step's
    money moved exactly once, for the transfer the step's recorded decision named, and
    every business write exists once."""
    # ACCORD_TEST_SEED: another series of kill times (the default series is fixed)
    rng = random.Random(f"recorded-{saver}-{os.environ.get('ACCORD_TEST_SEED', '')}")
    thread = f"random-{saver}"
    lsids = tmp_path / "lsids"
    cmd = [sys.executable, str(WORKER), "--uri", mongo_uri, "--db", db_name, "--thread",
           thread, "--dir", str(tmp_path), "--saver", saver, "--idempotent", "--steps",
           str(STEPS), "--pause", str(_PAUSE), "--lsid-file", str(lsids)]  # fmt: skip
    killed = 0
    for attempt in range(RANDOM_KILLS + 10):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT)  # fmt: skip
        try:
            if killed < RANDOM_KILLS and _first_transaction(proc, lsids, 120):
                try:
                    proc.wait(timeout=rng.uniform(*_KILL_AFTER))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    killed += 1
                    end_open_transactions(client, lsids)
                    continue
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, (attempt, out, err)
        break
    assert killed >= 3, killed  # the kills landed (the seed fixes when)
    state = json.loads(out.splitlines()[-1])["state"]
    assert state["count"] == STEPS and state["confirmed"] is True
    charged = [e for e in books(tmp_path / "bank.jsonl") if e["charged"]]
    assert len(charged) == STEPS, charged  # the money moved once per step
    assert len({e["key"] for e in charged}) == STEPS
    decisions = {d["_id"]: d for d in client[db_name]["accord_recorded_calls"].find(
        {"name": "model.decide", "status": calls.DONE})}  # fmt: skip
    writes = {d["_id"] for d in client[db_name]["charges"].find()}
    # each business write names a charged transfer: the decision that was replayed
    assert writes == {e["transfer_id"] for e in charged} and len(writes) == STEPS
    assert len(decisions) >= STEPS
    assert client[db_name]["transfers"].count_documents({}) == 1
