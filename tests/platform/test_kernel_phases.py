"""The kernel's hooks run in phases (accord/platform/hooks.py, docs/platform.md "Hooks").

- Phases run in their order (check, derive, seal) whatever the order of registration, and a
  seal hook sees every group the derive hooks added, with the names they are written under.
- A seal hook that keeps a per-stream sequence in the transaction (read the head, write
  head + 1, write a record), under 8 threads x 200 steps with write conflicts and injected
  transient errors, leaves gap-free, duplicate-free sequences: one record per committed
  write, none for an aborted one.
- Read hooks narrow and refuse reads; a refusal reaches the refused hooks, whose plan is
  written on its own.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from pymongo import MongoClient

from accord.errors import AccordError, ConfigurationError, PermissionDenied
from accord.platform.context import Principal, ReadContext
from accord.platform.hooks import ReadRequest, Refusal, SealBatch, SealRead
from accord.platform.plan import Expect, Group, Op, Plan, PlanContext, insert_once
from tests.failpoints import fail_command
from tests.platform.conftest import Runner


class Sequencer:
    """A seal hook: one record per committed plan, numbered per stream (the thread), the
    head of each stream read and advanced inside the transaction (an audit chain's shape)."""

    name = "sequencer"

    def __init__(self, db: str) -> None:
        self.db = db
        self.calls = 0

    def seal_reads(self, batch: SealBatch) -> Sequence[SealRead]:
        streams = sorted({p.context.thread_id for p in batch.plans if p.context.thread_id})
        return [SealRead("heads", self.db, "heads", {"_id": {"$in": streams}})] if streams else []

    def seal(self, batch: SealBatch, found: Mapping[str, list[Any]]) -> Sequence[Group]:
        self.calls += 1
        heads = {d["_id"]: d["seq"] for d in found.get("heads", [])}
        records: list[Op] = []
        for plan in batch.plans:
            stream = plan.context.thread_id
            if stream is None:
                continue
            seq = heads.get(stream, 0) + 1
            heads[stream] = seq
            data = [op.filter["_id"] for g in plan.groups if g.name == "data" for op in g.ops
                    if op.filter is not None]  # fmt: skip
            records.append(Op("insert", doc={
                "_id": f"{stream}:{seq}", "stream": stream, "seq": seq, "data": data,
                "txn": batch.transaction_id,
            }))  # fmt: skip
        advance = [
            Op("update", {"_id": s}, {"$set": {"seq": n}}, upsert=True) for s, n in heads.items()
        ]
        return [
            Group("sequencer:records", self.db, "records", "audit", records),
            Group("sequencer:heads", self.db, "heads", "audit", advance),
        ]


class Order:
    """Records which phase ran when, and what the seal phase saw."""

    name = "order"

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.sealed_groups: list[str] = []

    def check(self, plan: Plan) -> None:
        self.log.append("check")

    def seal_reads(self, batch: SealBatch) -> Sequence[SealRead]:
        return []

    def seal(self, batch: SealBatch, found: Mapping[str, list[Any]]) -> Sequence[Group]:
        self.log.append("seal")
        self.sealed_groups = [g.name for _, g in batch.groups()]
        return []


class Deriver:
    name = "deriver"

    def __init__(self, log: list[str], db: str) -> None:
        self.log = log
        self.db = db

    def derive(self, plan: Plan) -> None:
        self.log.append("derive")
        plan.add(Group("derived", self.db, "side", "outbox", [Op("insert", doc={"x": 1})]))


def _plan(db: str, stream: str, doc_id: str, *, fail: bool = False) -> Plan:
    data = Group("data", db, "data", "checkpoint", [insert_once({"_id": doc_id, "tenant_id": "t"})])
    if fail:  # a guard that cannot hold: the transaction aborts
        data.expect = Expect(error=lambda c: AccordError("refused by the test"), inserted=5)
    return Plan(PlanContext("t", thread_id=stream, operation="test.step"), [data])


def test_phases_run_in_order_whatever_the_registration_order(
    make_runner: Any, db_name: str
) -> None:
    runner: Runner = make_runner()
    log: list[str] = []
    order = Order(log)
    runner.uow.register(order)  # registered first, its seal still runs last
    runner.uow.register(Deriver(log, db_name))
    runner.execute(_plan(db_name, "s", "a"))
    assert log == ["check", "derive", "seal"]
    assert order.sealed_groups == ["data", "derived"]


def test_a_hook_without_a_phase_is_refused(make_runner: Any) -> None:
    runner: Runner = make_runner()

    class Nothing:
        name = "nothing"

    class HalfSeal:
        name = "half"

        def seal(self, batch: Any, found: Any) -> list[Any]:
            return []

    with pytest.raises(ConfigurationError, match="no phase"):
        runner.uow.register(Nothing())
    with pytest.raises(ConfigurationError, match="seal_reads"):
        runner.uow.register(HalfSeal())
    runner.uow.register(Order([]))
    with pytest.raises(ConfigurationError, match="registered already"):
        runner.uow.register(Order([]))


def test_a_sealed_sequence_stays_gap_free_under_conflicts_and_retries(
    client: MongoClient, mongo_uri: str, db_name: str
) -> None:
    """8 threads x 200 steps on 2 streams (4 writers per stream head: write conflicts),
    with transient errors injected on commits and bulk writes (retries)."""
    runner = Runner("sync", mongo_uri, timeout=120)
    sequencer = Sequencer(db_name)
    runner.uow.register(sequencer)
    attempts: Counter[int] = Counter()
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(200):
                result = runner.execute(_plan(db_name, f"stream-{t % 2}", f"{t}-{i}"))
                attempts[result.attempts] += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    transient = {"error_code": 112, "error_labels": ["TransientTransactionError"]}
    try:
        with fail_command(client, ["commitTransaction"], times=40, **transient), \
                fail_command(client, ["bulkWrite"], times=40, **transient):  # fmt: skip
            threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        # an aborted transaction: neither its write nor its record
        with pytest.raises(AccordError, match="refused by the test"):
            runner.execute(_plan(db_name, "stream-0", "aborted", fail=True))
    finally:
        runner.close()
    assert errors == []
    assert sum(attempts.values()) == 1600
    assert sum(n for a, n in attempts.items() if a > 1) > 0, "no transaction was retried"
    db = client[db_name]
    by_stream: dict[str, list[int]] = defaultdict(list)
    recorded: Counter[str] = Counter()
    for rec in db.records.find():
        by_stream[rec["stream"]].append(rec["seq"])
        recorded.update(rec["data"])
    for stream in ("stream-0", "stream-1"):
        seqs = sorted(by_stream[stream])
        assert seqs == list(range(1, 801)), f"{stream}: gaps or duplicates"
        assert db.heads.find_one({"_id": stream})["seq"] == 800
    data_ids = {d["_id"] for d in db.data.find()}
    assert len(data_ids) == 1600 and "aborted" not in data_ids
    assert set(recorded) == data_ids and set(recorded.values()) == {1}
    assert sequencer.calls > 1600  # sealed again on every retried attempt


def test_execute_all_seals_every_plan_from_one_head(make_runner: Any, client: MongoClient,
                                                    db_name: str) -> None:  # fmt: skip
    runner: Runner = make_runner()
    runner.uow.register(Sequencer(db_name))
    plans = [_plan(db_name, "s", f"d{i}") for i in range(8)]
    runner.call(runner.uow.execute_all, plans)
    runner.execute(_plan(db_name, "s", "d8"))
    seqs = sorted(r["seq"] for r in client[db_name].records.find({"stream": "s"}))
    assert seqs == list(range(1, 10))


def test_a_single_op_plan_a_seal_hook_extends_runs_in_a_transaction(
    make_runner: Any, client: MongoClient, db_name: str
) -> None:
    runner: Runner = make_runner()
    runner.uow.register(Sequencer(db_name))
    plan = _plan(db_name, "single", "only")
    runner.call(runner.uow.execute, plan, transaction=False)
    assert client[db_name].records.count_documents({"stream": "single"}) == 1


class Reads:
    """A read hook: narrows every read to the context's tenant; refuses the audit class to
    principals of role memory-api. A refused hook records the denial."""

    name = "reads"

    def __init__(self, db: str) -> None:
        self.db = db
        self.seen: list[tuple[str, str]] = []

    def read(self, request: ReadRequest) -> ReadRequest:
        principal = request.context.principal
        assert principal is not None  # the kernel names its default principal
        self.seen.append((principal.name, request.artifact))
        if request.artifact == "audit" and principal.role == "memory-api":
            raise PermissionDenied(f"{principal.name} may not read audit")
        return request.narrowed({"tenant_id": request.context.tenant_id})

    def refused(self, refusal: Refusal) -> Plan | None:
        who = refusal.context.principal.name
        return Plan(PlanContext(refusal.context.tenant_id, operation="denial"),
                    [Group("denial", self.db, "denials", "audit",
                           [Op("insert", doc={"who": who, "why": str(refusal.error)})])])  # fmt: skip


def test_read_hooks_narrow_refuse_and_record(
    make_runner: Any, client: MongoClient, db_name: str
) -> None:
    runner: Runner = make_runner()
    hook = Reads(db_name)
    runner.uow.register(hook)
    client[db_name].notes.insert_many(
        [{"_id": i, "tenant_id": "a" if i % 2 else "b"} for i in range(6)]
    )
    ctx = ReadContext("a", operation="test.read")
    found = runner.call(runner.uow.find, ctx, "business", db_name, "notes", {})
    assert sorted(d["_id"] for d in found) == [1, 3, 5]
    assert (
        runner.call(runner.uow.count, ctx, "business", db_name, "notes", {"_id": {"$gt": 2}}) == 2
    )
    assert hook.seen[0] == ("runtime", "business")
    api = ReadContext(
        "a", principal=Principal.api_key("k1", tenant_id="a", scopes=frozenset({"read"}))
    )
    with pytest.raises(PermissionDenied, match="may not read audit"):
        runner.call(runner.uow.find, api, "audit", db_name, "audit", {})
    assert client[db_name].denials.find_one({}, {"_id": 0}) == {
        "who": "key:k1", "why": "key:k1 may not read audit",
    }  # fmt: skip
    pipeline = [{"$match": {"_id": {"$lt": 5}}}]
    out = runner.call(runner.uow.aggregate, ctx, "business", db_name, "notes", pipeline)
    assert sorted(d["_id"] for d in out) == [1, 3]


def test_seal_groups_must_not_reuse_a_plan_group_name(make_runner: Any, db_name: str) -> None:
    runner: Runner = make_runner()

    class Clash:
        name = "clash"

        def seal_reads(self, batch: Any) -> list[Any]:
            return []

        def seal(self, batch: Any, found: Any) -> list[Group]:
            return [Group("data", db_name, "x", "audit", [Op("insert", doc={"a": 1})])]

    runner.uow.register(Clash())
    with pytest.raises(ConfigurationError, match="name seal groups after the hook"):
        runner.execute(_plan(db_name, "s", "z"))


def test_decode_hooks_turn_what_a_read_returned_back_with_reads_of_their_own(
    make_runner: Any, client: MongoClient, db_name: str
) -> None:
    """The decode phase (governance's decryption uses it): after find, find_one and
    aggregate, a hook names reads (made through the read path, as the reader) and
    returns the documents to hand back."""
    from accord.platform.hooks import RefreshRead

    runner: Runner = make_runner()
    seen: list[tuple[str | None, str]] = []

    class Words:
        name = "words"

        def decode_reads(self, request: ReadRequest, docs: list[Any]) -> list[RefreshRead]:
            codes = sorted({d["code"] for d in docs if "code" in d})
            if request.collection != "coded" or not codes:
                return []
            return [RefreshRead("business", "words", {"_id": {"$in": codes}}, "test.words",
                                tenant_id=request.context.tenant_id)]  # fmt: skip

        def decode(self, request: ReadRequest, docs: list[Any], found: list[Any]) -> list[Any]:
            if request.collection == "words":
                return docs
            words = {w["_id"]: w["word"] for w in found}
            return [{**d, "code": words.get(d.get("code"), "?")} for d in docs]

    class Watch:  # sees every read, the decode hook's own included
        name = "watch"

        def read(self, request: ReadRequest) -> ReadRequest:
            seen.append((request.context.principal and request.context.principal.name,
                         request.collection))  # fmt: skip
            return request

    runner.uow.register(Words())
    runner.uow.register(Watch())
    client[db_name].coded.insert_many([{"_id": 1, "code": 10}, {"_id": 2, "code": 20}])
    client[db_name].words.insert_many([{"_id": 10, "word": "ten"}, {"_id": 20, "word": "twenty"}])
    api = Principal.api_key("k1", tenant_id="a", scopes=frozenset({"read"}))
    ctx = ReadContext("a", principal=api, operation="test.read")
    found = runner.call(runner.uow.find, ctx, "business", db_name, "coded", {})
    assert [d["code"] for d in found] == ["ten", "twenty"]
    one = runner.call(runner.uow.find_one, ctx, "business", db_name, "coded", {"_id": 2})
    assert one["code"] == "twenty"
    out = runner.call(runner.uow.aggregate, ctx, "business", db_name, "coded",
                      [{"$match": {"_id": 1}}])  # fmt: skip
    assert out == [{"_id": 1, "code": "ten"}]
    assert ("key:k1", "words") in seen  # the decode's read, through the read path, as the reader

    class HalfDecode:
        name = "half-decode"

        def decode(self, request: Any, docs: Any, found: Any) -> Any:
            return docs

    with pytest.raises(ConfigurationError, match="decode_reads"):
        runner.uow.register(HalfDecode())
