"""The audit chains under concurrency (docs/governance.md, "Audit trail"):

8 threads x 100 steps on 2 thread streams (4 writers per stream head, so head updates
conflict) with transient errors injected on commits and bulk writes (so transactions are
retried and sealed again on fresh heads) leave gap-free, duplicate-free chains that
verify, with exactly one record per document written; a transaction aborted midway (a
guard that does not hold) leaves neither its write nor its record.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict

import pytest
from pymongo import MongoClient

from accord import runtime
from accord.errors import AccordError
from accord.governance.audit_records import HEADS, RECORDS
from accord.governance.verify import verify_chain
from accord.platform.plan import Expect, Group, Plan, WriteContext, insert_once
from tests.failpoints import fail_command

THREADS, STEPS = 8, 100


def _step(db: str, thread: str, doc_id: str, *, fail: bool = False) -> Plan:
    """A step of ``thread``: a checkpoint and a message (two records in its stream)."""
    checkpoint = Group("checkpoint", db, "accord_checkpoints", "checkpoint",
                       [insert_once({"_id": doc_id, "tenant_id": "t", "thread_id": thread})])  # fmt: skip
    message = Group("message", db, "short_term_memory", "short_term_memory",
                    [insert_once({"_id": f"m-{doc_id}", "tenant_id": "t", "thread_id": thread})])  # fmt: skip
    if fail:  # a guard that cannot hold: the transaction aborts after its writes were sent
        message.expect = Expect(error=lambda c: AccordError("refused by the test"), inserted=5)
    return Plan(WriteContext("t", thread_id=thread, operation="test.step"), [checkpoint, message])


def test_chains_stay_gap_free_under_conflicts_and_retries(
    client: MongoClient, db_name: str
) -> None:
    uow = runtime.kernel(client, audit="metadata", timeout=120)
    attempts: Counter[int] = Counter()
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(STEPS):
                result = uow.execute(_step(db_name, f"thread-{t % 2}", f"{t}-{i}"))
                attempts[result.attempts] += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    transient = {"error_code": 112, "error_labels": ["TransientTransactionError"]}
    with fail_command(client, ["commitTransaction"], times=30, **transient), \
            fail_command(client, ["bulkWrite"], times=30, **transient):  # fmt: skip
        threads = [threading.Thread(target=writer, args=(t,)) for t in range(THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    with pytest.raises(AccordError, match="refused by the test"):
        uow.execute(_step(db_name, "thread-0", "aborted", fail=True))

    assert errors == []
    assert sum(attempts.values()) == THREADS * STEPS
    assert sum(n for a, n in attempts.items() if a > 1) > 0, "no transaction was retried"
    db = client[db_name]
    seqs: dict[str, list[int]] = defaultdict(list)
    named: Counter[object] = Counter()
    for r in db[RECORDS].find({"action": "test.step"}):
        seqs[r["stream"]].append(r["seq"])
        named.update(op["doc_id"] for op in r["ops"])
    per_stream = THREADS // 2 * STEPS * 2  # 4 writers x 100 steps x 2 ops
    for stream in ('["t","thread","thread-0"]', '["t","thread","thread-1"]'):
        assert sorted(seqs[stream]) == list(range(1, per_stream + 1)), f"{stream}: gaps/dups"
        assert db[HEADS].find_one({"_id": stream})["seq"] == per_stream
    written = [d["_id"] for d in db.accord_checkpoints.find()] + [
        d["_id"] for d in db.short_term_memory.find()
    ]
    assert len(written) == THREADS * STEPS * 2
    assert "aborted" not in written and "m-aborted" not in written
    assert set(named) == set(written) and set(named.values()) == {1}
    # one transaction id per step, the same for both of its records, whatever its attempts
    txns = Counter(r["txn"] for r in db[RECORDS].find({"action": "test.step"}))
    assert len(txns) == THREADS * STEPS and set(txns.values()) == {2}
    report = verify_chain(uow, db_name)
    assert report.ok, report.breaks
    assert report.records == db[RECORDS].count_documents({})


def test_two_processes_alternating_on_one_stream_retry_on_stale_cached_heads(
    client: MongoClient, db_name: str
) -> None:
    """Two kernels (two processes' head caches) take turns on one stream: each turn's
    cached head is stale (the other moved it), its compare-and-set guard retries the
    attempt on heads read in the transaction, and the chain stays whole."""
    kernels = [runtime.kernel(client, audit="metadata") for _ in range(2)]
    attempts = [
        kernels[i % 2].execute(_step(db_name, "shared", f"s-{i}")).attempts for i in range(20)
    ]
    assert attempts[:2] == [1, 1]  # nothing cached yet: both read
    assert all(a == 2 for a in attempts[2:]), attempts  # stale every time after
    seqs = [r["seq"] for r in client[db_name][RECORDS].find({"action": "test.step"})]
    assert sorted(seqs) == list(range(1, 41))
    assert verify_chain(kernels[0], db_name).ok
    # one kernel alone again: its cache is right, no retry
    assert [kernels[0].execute(_step(db_name, "shared", f"t-{i}")).attempts
            for i in range(3)][1:] == [1, 1]  # fmt: skip
