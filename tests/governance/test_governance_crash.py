"""Governance's batched operations, crashed: each test runs the real CLI command (``accord
...`` of this venv) in a subprocess against this module's engine, SIGKILLs it at several
points (polled from here: after so many documents or audit records went, expiries moved,
keys were re-wrapped, digests or export parts were written; or at random moments),
checks what a crash may leave after each kill, then runs the same command again to its
end and checks that the job is finished exactly once:

- ``accord governance sweep`` (keep-latest-N and expired threads): every thread whole or
  gone, every kept checkpoint restorable as it was, nothing held deleted, nothing left for
  a prune to collect, the chain verifying;
- ``accord governance apply`` of a policy with other periods (``expire_at`` recomputed in
  batches): every document's expiry moved exactly once, the stored version not claimed
  finished before it is;
- ``accord governance rewrap-keys`` and ``shred-tenant``: every data key re-wrapped once
  (same key bytes) / every key of the tenant gone and the others intact;
- the audit cut of the sweep and ``accord audit digest``: the chain verifies from its
  cuts, no kept record lost, the digests linked;
- ``accord audit export``: resumed to the uninterrupted export's bytes;
- ``accord governance erase``: each thread of the subject whole or gone, nothing of the
  subject left after the rerun, the chain verifying.

What is killed is the client; the engine is this module's, in this process. A killed
client's open transaction keeps its writes (and so conflicts with the rerun's) until the
server aborts it after ``transactionLifetimeLimitSeconds`` (60 s by default, in MongoDB and
in the engine): this module's engine aborts them after 2 s (against ``MONGODB_URI``, the
parameter is set to 2 for the module), so that the reruns need not wait a minute.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from accord import runtime
from accord.checkpointers import AccordSaver
from accord.governance.audit_cuts import CUTS
from accord.governance.audit_records import HEADS, RECORDS
from accord.governance.crypto import MASTER_KEY_ENV, PREVIOUS_MASTER_KEY_ENV, MasterKey
from accord.governance.digests import list_digests
from accord.governance.loading import parse_policy
from accord.governance.verify import verify_chain
from accord.platform.context import AUDITOR, Principal
from accord.runtime import Accord
from tests.governance import test_subjects as subjects
from tests.governance.test_audit_cuts import write as write_notes
from tests.governance.test_audit_digests import write
from tests.governance.test_audit_export import assert_same_export
from tests.test_kernel_doors import _graph

pytestmark = pytest.mark.slow

ACCORD = str(Path(sys.executable).parent / "accord")
THREAD_COLLECTIONS = ("accord_checkpoints", "accord_checkpoint_blobs", "accord_checkpoint_writes",
                      "short_term_memory", "runs", "accord_recorded_calls")  # fmt: skip


@pytest.fixture(scope="module")
def mongo_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server that aborts a killed client's open transaction after 2 s (module
    docstring)."""
    real = os.environ.get("MONGODB_URI")
    if real:
        admin = MongoClient(real).admin
        try:
            was = admin.command({"getParameter": 1, "transactionLifetimeLimitSeconds": 1})
            admin.command({"setParameter": 1, "transactionLifetimeLimitSeconds": 2})
        except OperationFailure as exc:  # Atlas does not let it be set
            admin.client.close()
            pytest.skip(f"needs transactionLifetimeLimitSeconds settable ({exc})")
        try:
            yield real
        finally:
            admin.command({"setParameter": 1, "transactionLifetimeLimitSeconds":
                           was["transactionLifetimeLimitSeconds"]})  # fmt: skip
            admin.client.close()
        return
    from accord.platform.embedded import EmbeddedServer

    server = EmbeddedServer(dbpath=tmp_path_factory.mktemp("crash"), port=0, sync=False,
                            ttl_interval=1.0, transaction_lifetime=2.0)  # fmt: skip
    server.start()
    try:
        yield server.uri
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(mongo_uri: str) -> Iterator[MongoClient]:
    c: MongoClient = MongoClient(mongo_uri)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(autouse=True)
def _fast_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCORD_POLICY", raising=False)
    monkeypatch.setenv("ACCORD_POLICY_REFRESH", "0.2")


def _env(mongo_uri: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "MONGODB_URI": mongo_uri, "ACCORD_POLICY_REFRESH": "0.2", **extra}
    env.pop("ACCORD_POLICY", None)
    return env


def _run(command: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([ACCORD, *command], env=env, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _kill_when(
    command: list[str], env: dict[str, str], ready: Callable[[], bool], delay: float = 0.0
) -> bool:
    """Start ``accord COMMAND``; SIGKILL it ``delay`` seconds after ``ready()`` holds
    (polled). True when it was killed, False when it finished first (successfully)."""
    proc = subprocess.Popen([ACCORD, *command], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 120
    try:
        while proc.poll() is None:
            if ready():
                time.sleep(delay)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
            assert time.monotonic() < deadline, "the command neither finished nor got ready"
            time.sleep(0.001)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = proc.stdout.read().decode() if proc.stdout else ""
    assert proc.returncode == 0, output
    return False


def _crash_repeatedly(
    command: list[str], env: dict[str, str], progress: Callable[[], int],
    steps: list[int], check: Callable[[], None], delays: list[float] | None = None,
) -> int:  # fmt: skip
    """Kill ``command`` once ``progress()`` advanced by each of ``steps`` since it started
    (and ``delays[i]`` seconds more), one run per step, each continuing what the last
    left; ``check()`` after each kill, then run it to its end. Returns how many runs were
    killed."""
    kills = 0
    for i, step in enumerate(steps):
        start = progress()
        ready = lambda start=start, step=step: progress() >= start + step  # noqa: E731
        if not _kill_when(command, env, ready, delays[i] if delays else 0.0):
            break  # it finished before this point: nothing more to interrupt
        kills += 1
        check()
    _run(command, env)
    return kills


def _apply(mongo_uri: str, db: str, text: str, path: Path) -> None:
    path.write_text(text)
    _run(["governance", "apply", "--policy", str(path), "--db", db], _env(mongo_uri))


def _config(thread: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _turns(graph: Any, thread: str, n: int) -> None:
    for i in range(n):
        graph.invoke({"messages": [HumanMessage(f"{thread} turn {i}", id=uuid.uuid4().hex)],
                      "log": []}, _config(thread))  # fmt: skip


# --- 1. the retention sweep --------------------------------------------------------------


def test_a_sweep_killed_anywhere_leaves_whole_threads_and_a_rerun_finishes_it(
    client: MongoClient, mongo_uri: str, db_name: str, tmp_path: Path
) -> None:
    """Threads that keep their latest 2 checkpoints (``pruned``), expired ones
    (``expired``, pruned first, then deleted whole) and held expired ones; the sweep runs
    with ``--batch 8`` and is killed after 1..N more documents went, several times."""
    db = client[db_name]
    _apply(mongo_uri, db_name, "[classes.checkpoint]\nretention = { keep_latest = 2, "
           'expire_after = "1h", after = "last_activity" }\n', tmp_path / "p.toml")  # fmt: skip
    time.sleep(0.5)  # the test's own processes read the applied version
    graph = _graph(AccordSaver(client, db_name=db_name))
    pruned = [f"p-{i}" for i in range(5)]
    expired = [f"e-{i}" for i in range(10)]
    held = ["h-0", "h-1"]
    for thread in pruned:
        _turns(graph, thread, 3)
    for thread in expired + held:
        _turns(graph, thread, 2)
    for thread in held:
        _run(["governance", "hold", thread, "--by", "thread", "--tenant", "default",
              "--reason", "case 1", "--db", db_name], _env(mongo_uri))  # fmt: skip
    before: dict[str, dict[str, Any]] = {}
    for thread in pruned + expired + held:
        for snapshot in graph.get_state_history(_config(thread)):
            before[snapshot.config["configurable"]["checkpoint_id"]] = snapshot.values
    latest = {t: graph.get_state(_config(t)).values for t in pruned + held}
    held_docs = {t: {c: db[c].count_documents({"thread_id": t}) for c in THREAD_COLLECTIONS}
                 for t in held}  # fmt: skip
    # an hour passes for the expired and the held threads (the held ones have no expiry
    # while held: set one anyway, the sweep must still leave them)
    past = datetime.now(UTC) - timedelta(minutes=1)
    db.runs.update_many({"thread_id": {"$in": expired + held}}, {"$set": {"expire_at": past}})

    def gone() -> int:  # documents deleted so far (only the sweep deletes)
        return -sum(db[c].estimated_document_count() for c in THREAD_COLLECTIONS)

    def check() -> None:
        saver = AccordSaver(client, db_name=db_name)  # no cache of an earlier check
        view = _graph(saver)
        for thread in pruned + expired + held:
            counts = {c: db[c].count_documents({"thread_id": thread}) for c in THREAD_COLLECTIONS}
            if counts["accord_checkpoints"] == 0:  # gone: gone whole
                assert thread in expired, f"{thread} was deleted"
                counts.pop("runs")  # the registry keeps its fence (a ghost writer is refused)
                assert not any(counts.values()), (thread, counts)
                continue
            history = list(view.get_state_history(_config(thread)))
            assert len(history) == counts["accord_checkpoints"] >= 2, thread
            for snapshot in history:  # every kept checkpoint restores as it did
                cid = snapshot.config["configurable"]["checkpoint_id"]
                assert snapshot.values == before[cid], (thread, cid)
            cid = history[-1].config["configurable"]["checkpoint_id"]  # the oldest kept
            assert view.get_state(_config(thread, cid)).values == before[cid]
        for thread in held:
            now = {c: db[c].count_documents({"thread_id": thread}) for c in THREAD_COLLECTIONS}
            assert now == held_docs[thread], f"held {thread} lost documents"
        assert verify_chain(runtime.kernel(client), db_name).ok

    env = _env(mongo_uri, ACCORD_AUDIT="metadata")
    command = ["governance", "sweep", "--db", db_name, "--batch", "8"]
    rng = random.Random(7)
    steps = [rng.randint(1, 50) for _ in range(8)]
    kills = _crash_repeatedly(command, env, gone, steps, check)
    assert kills >= 4, f"only {kills} runs were killed before the sweep finished"
    check()
    for thread in expired:
        assert db.accord_checkpoints.count_documents({"thread_id": thread}) == 0, thread
    saver = AccordSaver(client, db_name=db_name)
    view = _graph(saver)
    for thread in pruned + held:
        assert view.get_state(_config(thread)).values == latest[thread]
    for thread in pruned:
        assert db.accord_checkpoints.count_documents({"thread_id": thread}) == 2
        # nothing left for a prune to collect: the killed runs' garbage went too
        counts = {c: db[c].count_documents({"thread_id": thread}) for c in THREAD_COLLECTIONS}
        saver.prune([thread], keep=2)
        again = {c: db[c].count_documents({"thread_id": thread}) for c in THREAD_COLLECTIONS}
        assert again == counts, f"{thread}: the sweep left garbage a prune collects"
    # the threads go on
    _turns(view, pruned[0], 1)
    assert len(view.get_state(_config(pruned[0])).values["messages"]) == 8


# --- 2. apply: expire_at recomputed in batches ---------------------------------------------


def test_an_apply_killed_while_recomputing_expiry_is_finished_exactly_once_by_a_rerun(
    client: MongoClient, mongo_uri: str, db_name: str, tmp_path: Path
) -> None:
    """600 orders stamped under a 1 h period; a policy of 3 h moves each ``expire_at`` by
    +2 h in batches of 20 (``--batch 20``); killed after 1..N more documents moved."""
    from accord.platform.context import WriteContext
    from accord.platform.plan import Group, Op, Plan

    one_hour = (
        '[classes."business:orders"]\nretention = { expire_after = "1h", after = "created" }\n'
    )
    _apply(mongo_uri, db_name, one_hour, tmp_path / "p1.toml")
    time.sleep(0.5)
    uow = runtime.kernel(client)
    for start in range(0, 600, 100):
        for tenant in ("acme", "globex"):
            uow.execute(Plan(WriteContext(tenant, operation="orders.write"), [
                Group("w", db_name, "orders", "business", [
                    Op("insert", doc={"_id": f"{tenant}-{i}", "tenant_id": tenant, "n": i})
                    for i in range(start, start + 50)
                ])]))  # fmt: skip
    orders = client[db_name].orders
    stamped = {d["_id"]: d["expire_at"] for d in orders.find({}, {"expire_at": 1})}
    assert len(stamped) == 600 and all(stamped.values())
    path = tmp_path / "p2.toml"
    path.write_text(one_hour.replace('"1h"', '"3h"'))
    policies = client[db_name].accord_policies

    def moved() -> int:
        return sum(
            1 for d in orders.find({}, {"expire_at": 1})
            if d["expire_at"] != stamped[d["_id"]]
        )  # fmt: skip

    def check() -> None:
        for d in orders.find({}, {"expire_at": 1}):  # each moved once or not yet
            assert d["expire_at"] - stamped[d["_id"]] in (timedelta(0), timedelta(hours=2)), d
        head = policies.find_one({"_id": "head"})
        if head["version"] == 2 and moved() < len(stamped):  # stored, not finished:
            assert policies.find_one({"_id": "v2"})["retention"] == "pending"  # not claimed

    env = _env(mongo_uri, ACCORD_AUDIT="metadata")
    command = ["governance", "apply", "--policy", str(path), "--db", db_name, "--batch", "20"]
    rng = random.Random(11)
    steps = [rng.randint(1, 90) for _ in range(8)]
    kills = _crash_repeatedly(command, env, moved, steps, check)
    assert kills >= 4, f"only {kills} runs were killed before apply finished"
    check()
    for d in orders.find({}, {"expire_at": 1}):
        assert d["expire_at"] - stamped[d["_id"]] == timedelta(hours=2), d
    head = policies.find_one({"_id": "head"})
    assert head["version"] == 2
    assert policies.find_one({"_id": "v2"})["retention"] == "done"
    assert policies.count_documents({"_id": {"$regex": "^v"}}) == 2
    # applied: a plan has nothing left, and another run changes nothing
    assert "nothing to change" in _run(["governance", "plan", "--policy", str(path), "--db",
                                        db_name], env)  # fmt: skip
    _run(command, env)
    for d in orders.find({}, {"expire_at": 1}):
        assert d["expire_at"] - stamped[d["_id"]] == timedelta(hours=2), d
    assert verify_chain(runtime.kernel(client), db_name).ok


# --- 3. keys: rewrap and shred ---------------------------------------------------------------


def _keys_policy(tmp_path: Path) -> Path:
    path = tmp_path / "enc.toml"
    path.write_text('[classes.long_term_memory]\nencryption = "subject"\n'
                    '[classes.memory_history]\nencryption = "subject"\n')  # fmt: skip
    return path


def _memories(client: MongoClient, db_name: str, tenants: int, subjects: int) -> dict[Any, Any]:
    """A memory per (tenant, subject): a data key each."""
    root = runtime.Accord(client=client, db_name=db_name)
    values = {}
    for t in range(tenants):
        store = root.store(f"t{t}")
        for s in range(subjects):
            value = {"food": f"secret {t}/{s}"}
            store.put(("memories", f"u-{s}"), "diet", value)
            values[(f"t{t}", f"u-{s}")] = value
    return values


def test_rewrap_keys_killed_midway_rewraps_every_key_exactly_once(
    client: MongoClient, mongo_uri: str, db_name: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """200 data keys in 20 tenants (a transaction per tenant); ``rewrap-keys`` killed
    after 1..N more keys carry the new master key's fingerprint."""
    old, new = MasterKey.generate(), MasterKey.generate()
    policy = _keys_policy(tmp_path)
    monkeypatch.setenv("ACCORD_POLICY", str(policy))
    monkeypatch.setenv(MASTER_KEY_ENV, old.text())
    monkeypatch.setenv(runtime.AUDIT_ENV, "metadata")
    values = _memories(client, db_name, 20, 10)
    keys = client[db_name].accord_keys
    plain = {d["_id"]: old.unwrap(d) for d in keys.find()}
    assert len(plain) == 200

    def rewrapped() -> int:
        return keys.count_documents({"master": new.fingerprint})

    monkeypatch.setenv(MASTER_KEY_ENV, new.text())
    monkeypatch.setenv(PREVIOUS_MASTER_KEY_ENV, old.text())
    current = MasterKey.from_env()

    def check() -> None:
        docs = list(keys.find())
        assert {d["_id"] for d in docs} == set(plain)  # none lost, none added
        for d in docs:  # under one master key or the other, the same data key
            assert d["master"] in (old.fingerprint, new.fingerprint)
            assert current.unwrap(d) == plain[d["_id"]]
        assert verify_chain(runtime.kernel(client), db_name).ok

    env = _env(mongo_uri, ACCORD_POLICY=str(policy), ACCORD_AUDIT="metadata",
               **{MASTER_KEY_ENV: new.text(), PREVIOUS_MASTER_KEY_ENV: old.text()})  # fmt: skip
    rng = random.Random(3)
    steps = [rng.randint(1, 30) for _ in range(8)]
    kills = _crash_repeatedly(["governance", "rewrap-keys", "--db", db_name], env, rewrapped,
                              steps, check)  # fmt: skip
    assert kills >= 4, f"only {kills} runs were killed before rewrap-keys finished"
    check()
    assert rewrapped() == 200
    # exactly once: one audited re-wrap per key, whatever the kills
    ops = [op["doc_id"] for r in client[db_name][RECORDS].find({"action": "encryption.rewrap"})
           for op in r["ops"]]  # fmt: skip
    assert sorted(map(str, ops)) == sorted(map(str, plain)), "a key re-wrapped twice or never"
    # the previous key retired: everything decrypts under the new one alone
    monkeypatch.delenv(PREVIOUS_MASTER_KEY_ENV)
    root = runtime.Accord(client=client, db_name=db_name)
    for (tenant, subject), value in values.items():
        item = root.store(tenant).get(("memories", subject), "diet")
        assert item is not None and item.value == value


def test_shred_tenant_killed_midway_destroys_only_that_tenants_keys(
    client: MongoClient, mongo_uri: str, db_name: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Tenant t0's 40 keys destroyed, t1's 40 kept; ``shred-tenant`` killed at random
    moments (0 to 1.5 s after its start: in its start-up, its reads or around its one
    transaction per 1,000 keys), then run again."""
    from accord.errors import KeyDestroyed

    master = MasterKey.generate()
    policy = _keys_policy(tmp_path)
    monkeypatch.setenv("ACCORD_POLICY", str(policy))
    monkeypatch.setenv(MASTER_KEY_ENV, master.text())
    monkeypatch.setenv(runtime.AUDIT_ENV, "metadata")
    values = _memories(client, db_name, 2, 40)
    keys = client[db_name].accord_keys
    kept = {d["_id"]: master.unwrap(d) for d in keys.find({"tenant_id": "t1"})}
    shredded = {d["_id"]: master.unwrap(d) for d in keys.find({"tenant_id": "t0"})}
    doomed = len(shredded)
    assert len(kept) == doomed == 40
    records = client[db_name][RECORDS]
    baseline = records.estimated_document_count()

    def check() -> None:
        assert {d["_id"]: master.unwrap(d) for d in keys.find({"tenant_id": "t1"})} == kept
        left = {d["_id"]: master.unwrap(d) for d in keys.find({"tenant_id": "t0"})}
        assert all(left[k] == shredded[k] for k in left)  # a key left is intact
        # a key deleted has its audit record (the same transaction), and only then
        erased = records.count_documents({"action": "governance.erase"})
        assert (erased > 0) == (len(left) < doomed), (erased, len(left))
        assert verify_chain(runtime.kernel(client), db_name).ok

    env = _env(mongo_uri, ACCORD_POLICY=str(policy), ACCORD_AUDIT="metadata",
               **{MASTER_KEY_ENV: master.text()})  # fmt: skip
    command = ["governance", "shred-tenant", "t0", "--yes", "--db", db_name]
    kills = 0
    rng = random.Random(5)
    for _ in range(6):  # a random moment after the command's start-up, while it runs
        started = time.monotonic()
        delay = rng.uniform(0.0, 1.5)
        if not _kill_when(command, env, lambda s=started, d=delay: time.monotonic() - s > d):
            break
        kills += 1
        check()
    _run(command, env)
    check()
    assert kills >= 1
    assert keys.count_documents({"tenant_id": "t0"}) == 0
    erased = list(records.find({"action": "governance.erase"}))
    assert sum(len(r["ops"]) for r in erased) >= 1 and records.estimated_document_count() > baseline
    root = runtime.Accord(client=client, db_name=db_name)
    for (tenant, subject), value in values.items():
        store = root.store(tenant)
        if tenant == "t1":
            item = store.get(("memories", subject), "diet")
            assert item is not None and item.value == value
        else:
            with pytest.raises(KeyDestroyed):
                store.get(("memories", subject), "diet")


# --- 4. audit cuts and digests ---------------------------------------------------------------


def _streams(client: MongoClient, db: str) -> dict[str, tuple[int, int, int]]:
    """Per stream: (head seq, records kept, seq of the latest cut)."""
    d = client[db]
    out = {}
    for head in d[HEADS].find():
        cuts = list(d[CUTS].find({"stream": head["_id"]}).sort("n", -1).limit(1))
        out[head["_id"]] = (head["seq"], d[RECORDS].count_documents({"stream": head["_id"]}),
                            cuts[0]["seq"] if cuts else 0)  # fmt: skip
    return out


def test_digests_and_audit_cuts_killed_midway_keep_every_chain_verifying(
    client: MongoClient, mongo_uri: str, db_name: str, tmp_path: Path
) -> None:
    """``accord audit digest --every 0.05s`` killed after 1..N more digests (writes in
    between), then the sweep cutting 5 records per transaction (``--batch 5``) through
    4 streams of 75 records, killed after 1..N more records went."""
    _apply(mongo_uri, db_name, '[classes.audit]\nretention = { expire_after = "2s" }\n',
           tmp_path / "p.toml")  # fmt: skip
    time.sleep(0.5)
    env = _env(mongo_uri, ACCORD_AUDIT="metadata")
    d = client[db_name]
    out = tmp_path / "digests"
    out.mkdir()
    # a count it never reaches before the kill (a run that ended on its own would leave
    # nothing to interrupt)
    digest = ["audit", "digest", "--db", db_name, "--every", "0.05s", "--count", "10000",
              "--out", str(out / "d-{seq}.json")]  # fmt: skip
    rng = random.Random(13)
    kills = 0
    for i in range(5):
        # (the applied policy validates short_term_memory: the notes go to t_notes)
        write_notes(client, db_name, "acme", i * 15, 15)
        write_notes(client, db_name, "acme", i * 15, 15, thread="t1")
        write_notes(client, db_name, "globex", i * 15, 15)
        write_notes(client, db_name, "globex", i * 15, 15, thread="t2")
        start = d.accord_audit_digests.count_documents({})
        step = rng.randint(1, 4)
        if _kill_when(digest, env,
                      lambda s=start, k=step: d.accord_audit_digests.count_documents({}) >= s + k):  # fmt: skip
            kills += 1
        auditor = runtime.kernel(client, principal=Principal.service(AUDITOR), audit="metadata")
        stored = list_digests(auditor, db_name)
        assert [x["seq"] for x in stored] == list(range(1, len(stored) + 1))
        # what reached a file is what was stored (a kill mid-write leaves only the hidden
        # ".d-N.json.tmp" it was writing, never a torn d-N.json)
        assert all(f.name.startswith(".") for f in out.iterdir() if not f.match("d-*.json"))
        for kept in out.glob("d-*.json"):
            doc = json.loads(kept.read_text())
            assert doc["hash"] == stored[doc["seq"] - 1]["hash"]
    _run(["audit", "digest", "--db", db_name], env)  # the newest digest covers every record
    n = d.accord_audit_digests.count_documents({})
    assert kills == 5, f"only {kills} digest runs were killed"
    extension = subprocess.run([ACCORD, "audit", "verify", "--live", "--db", db_name,
                                "--from", "1", "--to", str(n)], env=env,
                               capture_output=True, text=True)  # fmt: skip
    assert extension.returncode == 0, extension.stdout + extension.stderr
    kept_digest = tmp_path / "kept.json"
    kept_digest.write_text(_run(["audit", "digest", "--db", db_name], env))
    time.sleep(2.1)  # every record is past the audit period
    ours = ['["acme","collection","orders"]', '["acme","thread","t1"]',
            '["globex","collection","orders"]', '["globex","thread","t2"]']  # fmt: skip
    before = _streams(client, db_name)  # ours, and the stored policy's
    assert all(before[s] == (75, 75, 0) for s in ours), before

    def cut() -> int:  # records gone so far (5 per cut, less the 2 each cut records)
        return -d[RECORDS].estimated_document_count()

    def check() -> None:
        for stream, (seq, records, cut) in _streams(client, db_name).items():
            # the records after the latest cut are all there, each once
            assert records == seq - cut, (stream, seq, records, cut)
            seqs = sorted(r["seq"] for r in d[RECORDS].find({"stream": stream}, {"seq": 1}))
            assert seqs == list(range(cut + 1, seq + 1)), stream
        assert verify_chain(runtime.kernel(client), db_name).ok

    sweep = ["governance", "sweep", "--db", db_name, "--batch", "5"]
    steps = [rng.randint(1, 12) for _ in range(8)]
    cut_kills = _crash_repeatedly(sweep, env, cut, steps, check)
    assert cut_kills >= 4, f"only {cut_kills} sweeps were killed before the cuts ended"
    check()
    after = _streams(client, db_name)
    for stream in ours:
        # cut up to what the kept digest committed to, each record by one cut
        assert after[stream][2] == 75, (stream, after[stream])
        counts = [c["count"] for c in d[CUTS].find({"stream": stream}).sort("n", 1)]
        assert sum(counts) == 75 and all(c <= 5 for c in counts), counts
        # each cut left its two records (the cut's insert, the deletion) in the stream
        assert after[stream][0] == 75 + 2 * len(counts), (stream, after[stream])
    live = subprocess.run([ACCORD, "audit", "verify", "--live", "--db", db_name, "--digest",
                           str(kept_digest)], env=env, capture_output=True, text=True)  # fmt: skip
    assert live.returncode == 0, live.stdout + live.stderr


# --- 5. audit export -------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_an_export_killed_midway_resumes_to_the_uninterrupted_bytes(
    client: MongoClient, mongo_uri: str, db_name: str, tmp_path: Path, fmt: str
) -> None:
    """4,000 records of tenant acme in parts of 100 (``--part-size 100``); ``accord audit
    export`` killed 0-100 ms after 1 to 4 more parts were finished (at a part's end, or
    within the next), then run again."""
    from accord.governance.export_verify import verify_export

    for i in range(4):
        write(client, db_name, "acme", 0, 1000, thread=f"t{i}")
    env = _env(mongo_uri, ACCORD_AUDIT="metadata")
    _run(["audit", "digest", "--db", db_name], env)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    args = ["audit", "export", "--tenant", "acme", "--format", fmt, "--db", db_name,
            "--part-size", "100"]  # fmt: skip
    _run([*args, "--out", str(whole)], env)

    def parts() -> int:  # the parts the export recorded as finished
        try:
            return len(json.loads((resumed / ".export-progress.json").read_text())["parts"])
        except (OSError, ValueError):
            return 0

    def check() -> None:  # unfinished (its progress kept), or finished whole
        if (resumed / ".export-progress.json").exists():
            return
        assert verify_export(resumed).ok

    rng = random.Random(17)
    steps = [rng.randint(1, 4) for _ in range(6)]
    delays = [rng.uniform(0.0, 0.1) for _ in steps]  # a part boundary, or within a part
    kills = _crash_repeatedly([*args, "--out", str(resumed)], env, parts, steps, check, delays)
    assert kills >= 3, f"only {kills} exports were killed before it finished"
    assert_same_export(whole, resumed)
    b_manifest = (resumed / "manifest.json").read_bytes()
    assert verify_export(resumed).ok
    # killed after it finished, before it exited: the same command again is a no-op
    _run([*args, "--out", str(resumed)], env)
    assert (resumed / "manifest.json").read_bytes() == b_manifest
    verified = subprocess.run([ACCORD, "audit", "verify", str(resumed)], env=env,
                              capture_output=True, text=True)  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr


# --- 6. erasure -------------------------------------------------------------------------------


def test_an_erasure_killed_midway_is_finished_by_running_it_again(
    client: MongoClient, mongo_uri: str, db_name: str, tmp_path: Path
) -> None:
    """SIGKILL the ``accord governance erase`` process once part of the subject's threads
    are gone: what it committed stays committed, nothing is half-written, and running it
    again leaves nothing of the subject. (In this module: the kill may land inside a
    thread's transaction, which holds that thread until the server aborts it.)"""
    subject, other, secret = subjects.SUBJECT, subjects.OTHER, subjects.SECRET
    policy = parse_policy(subjects.POLICY, "p.toml")
    path = tmp_path / "policy.toml"
    path.write_text(subjects.POLICY)
    app = Accord(client=client, db_name=db_name, policy=policy, audit="metadata")
    graph = subjects._graph(app.checkpointer())
    threads = 60
    for i in range(threads):
        for user in (subject, other):
            thread = f"{'a' if user == subject else 'b'}-{i}"  # ids that do not name the user
            config = {"configurable": {"thread_id": thread, "user_id": user}}
            graph.invoke({"messages": [HumanMessage(f"{secret} {i}" if user == subject
                                                    else f"Oslo {i}", id=f"h-{user}-{i}")]},
                         config)  # fmt: skip
    db = client[db_name]

    def subject_threads() -> int:
        return len(db.accord_checkpoints.distinct("thread_id", {"meta.user_id": subject}))

    assert subject_threads() == threads
    env = {**os.environ, "ACCORD_POLICY": str(path), "ACCORD_AUDIT": "metadata"}
    command = [str(Path(sys.executable).parent / "accord"), "governance", "erase", subject,
               "--yes", "--no-compact", "--db", db_name, "--uri", mongo_uri]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while subject_threads() == threads and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = subject_threads()
    assert 0 < left < threads, f"the kill came too late or too early ({left} threads left)"
    # nothing half-written: a thread is either whole or gone (one transaction each)
    for thread in db.accord_checkpoints.distinct("thread_id", {"meta.user_id": subject}):
        assert db.short_term_memory.count_documents({"thread_id": thread}) > 0
    gone = {f"a-{i}" for i in range(threads)} - set(db.accord_checkpoints.distinct("thread_id"))
    for name in ("short_term_memory", "accord_checkpoint_blobs", "runs", "accord_recorded_calls"):
        assert db[name].count_documents({"thread_id": {"$in": sorted(gone)}}) == 0, name
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert subjects._mentions(client, db_name, secret) == {}
    assert subjects._mentions(client, db_name, subject) == {}
    assert subject_threads() == 0
    assert len(db.accord_checkpoints.distinct("thread_id")) == threads  # the other's, all kept
    assert verify_chain(runtime.kernel(client), db_name).ok
