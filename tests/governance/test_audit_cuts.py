"""Expiring the audit trail (docs/governance.md, "Expiring the audit trail"): a stream's
prefix older than the audit class's period is cut, and everything that is kept still
verifies: ``verify_chain``, ``accord audit verify --live`` (with a digest kept outside),
an export checked offline, an inclusion proof, a digest extension. Tampering with a cut
(edited, re-hashed, deleted, forged) is found; a legal hold stops the cut, also one
placed after the sweep read the holds.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from bson import ObjectId
from pymongo import MongoClient
from typer.testing import CliRunner

from accord import runtime
from accord.errors import PermissionDenied
from accord.governance.audit_cuts import CUT_ACTION, CUTS, cut_expired, cut_hash, cut_plan
from accord.governance.audit_hook import AuditHook
from accord.governance.audit_records import GENESIS, RECORDS
from accord.governance.canonical import ms
from accord.governance.digests import external, write_digest
from accord.governance.export import export
from accord.governance.export_verify import verify_export
from accord.governance.holding import place
from accord.governance.holds import Hold, Holds
from accord.governance.loading import default_policy, parse_policy
from accord.governance.proofs import check_extends, check_live_against, check_proof, prove
from accord.governance.verify import verify_chain
from accord.platform.cli import app as cli
from accord.platform.context import AUDITOR, Principal, WriteContext
from accord.platform.plan import Group, Op, Plan

ORDERS = '["acme","collection","orders"]'
T1 = '["acme","thread","t1"]'
LATER = datetime.now(UTC) + timedelta(days=8 * 366)  # past the default 7 years
#: a sweep's ``now`` dates its cuts: the digests after it, and the verifier's now, follow
#: that clock (a digest taken at real time after a cut dated LATER would say it was
#: dated forward)
MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)
#: a policy whose audit records expire after a second
LAX = '[classes.audit]\nretention = { expire_after = "1s", after = "created" }\n'


def _uri(client: MongoClient) -> str:
    host, port = client.address  # type: ignore[misc]
    return f"mongodb://{host}:{port}/?directConnection=true"


def write(client: MongoClient, db: str, tenant: str, start: int, n: int, thread: str = "") -> None:
    """``n`` audited writes of ``tenant`` (a thread's messages when ``thread``)."""
    uow = runtime.kernel(client, audit="metadata")
    for i in range(start, start + n):
        if thread:
            ctx = WriteContext(tenant, thread_id=thread, operation="messages.write")
            group = Group("m", db, "t_notes", "short_term_memory", [
                Op("insert", doc={"_id": f"{thread}-{i}", "tenant_id": tenant, "n": i})])  # fmt: skip
        else:
            ctx = WriteContext(tenant, operation="orders.write")
            group = Group("w", db, "orders", "business", [
                Op("insert", doc={"_id": f"{tenant}-{i}", "tenant_id": tenant, "n": i})])  # fmt: skip
        uow.execute(Plan(ctx, [group]))


def _auditor(client: MongoClient) -> Any:
    return runtime.kernel(client, principal=Principal.service(AUDITOR), audit="metadata")


def _admin(client: MongoClient, clock: datetime | None = None) -> Any:
    """An admin's kernel; with ``clock``, its clock stands there (the audit hook refuses a
    cut dated ahead of its clock: a sweep dated years ahead runs on a kernel then)."""
    uow = runtime.kernel(client, principal=Principal.os_user(), audit="metadata")
    if clock is not None:
        hook = next(h for h in uow.hooks.all if isinstance(h, AuditHook))
        hook.clock = lambda: clock
    return uow


def _cut(
    client: MongoClient, db: str, holds: Holds | None = None, now: datetime = LATER,
    clock: datetime | None = None,
) -> Any:  # fmt: skip
    """The sweep's cuts dated ``now``, on a kernel whose clock is ``clock`` (default
    ``now``: the sweep runs then)."""
    admin = _admin(client, clock=clock or now)
    return cut_expired(admin, db, default_policy(), holds or Holds.of([]),
                       principal=Principal.os_user(), now=now)  # fmt: skip


def _seqs(client: MongoClient, db: str, stream: str) -> list[int]:
    return [r["seq"] for r in client[db][RECORDS].find({"stream": stream}).sort("seq", 1)]


def _setup(client: MongoClient, db: str) -> dict[str, Any]:
    write(client, db, "acme", 0, 6)
    write(client, db, "acme", 0, 3, thread="t1")
    write(client, db, "globex", 0, 2)
    first = write_digest(_auditor(client), db)
    write(client, db, "acme", 6, 2)  # after the digest: never cut
    return first


def test_a_cut_keeps_every_kept_record_verifiable(
    client: MongoClient, db_name: str, tmp_path: Path
) -> None:
    first = _setup(client, db_name)
    assert not _cut(client, db_name, now=datetime.now(UTC)).streams  # nothing is 7 years old
    report = _cut(client, db_name)
    assert (report.streams, report.records) == (3, 11)
    # the digest committed to seq 6: 1..6 go, 7 and 8 stay, 9 and 10 record the cut
    assert _seqs(client, db_name, ORDERS) == [7, 8, 9, 10]
    assert _seqs(client, db_name, T1) == [4, 5]
    cut = client[db_name][CUTS].find_one({"stream": ORDERS})
    assert (cut["n"], cut["seq"], cut["first_seq"], cut["count"]) == (1, 6, 1, 6)
    assert cut["cut_hash"] == cut_hash(cut)
    recorded = client[db_name][RECORDS].find_one({"stream": ORDERS, "seq": 9})
    assert recorded["action"] == CUT_ACTION and recorded["ops"][0]["doc_id"] == cut["_id"]
    auditor = _auditor(client)
    assert verify_chain(auditor, db_name, now=LATER).ok, verify_chain(auditor, db_name).breaks
    assert check_live_against(auditor, db_name, external(first)) == []
    # a second pass has nothing more to cut; a digest a period older lets the next go
    assert _cut(client, db_name).streams == 0
    second = write_digest(auditor, db_name, at=LATER + MINUTE)
    assert not check_extends(auditor, db_name, external(first), external(second)).problems
    write(client, db_name, "acme", 8, 1)
    assert _cut(client, db_name, now=LATER + 2 * MINUTE).streams == 0  # not a period old
    later = LATER + timedelta(days=8 * 366)
    report = _cut(client, db_name, now=later)
    assert report.streams == 3  # the prefixes up to the second digest's heads
    assert _seqs(client, db_name, ORDERS) == [11, 12, 13]
    cuts = list(client[db_name][CUTS].find({"stream": ORDERS}).sort("n", 1))
    assert [c["n"] for c in cuts] == [1, 2] and cuts[1]["prev_cut"] == cuts[0]["cut_hash"]
    assert verify_chain(auditor, db_name, now=later).ok, verify_chain(auditor, db_name).breaks
    third = write_digest(auditor, db_name, at=later + MINUTE)  # covers the second cut
    # the CLI (the clock's now: every cut is covered by a digest), with digests kept outside
    (tmp_path / "d1.json").write_text(json.dumps(external(first)))
    (tmp_path / "d2.json").write_text(json.dumps(external(second)))
    env = {"MONGODB_URI": _uri(client)}
    for kept in ("d1.json", "d2.json"):
        result = CliRunner().invoke(cli, ["audit", "verify", "--live", "--db", db_name,
                                          "--digest", str(tmp_path / kept)], env=env)  # fmt: skip
        assert result.exit_code == 0, result.output
    # an export after the cut verifies offline; a kept record's proof still holds
    out = tmp_path / "export"
    manifest = export(auditor, db_name, out, tenant="acme")
    assert manifest["streams"][ORDERS]["first_seq"] == 11 and ORDERS in manifest["cuts"]
    checked = verify_export(out, kept=external(third))
    assert checked.ok, [p.describe() for p in checked.problems]
    kept = client[db_name][RECORDS].find_one({"stream": ORDERS, "seq": 11})
    assert check_proof(prove(auditor, db_name, str(kept["_id"])), digest=external(third)) is None
    # an export whose cut was edited fails offline
    data = json.loads((out / "manifest.json").read_text())
    data["cuts"][ORDERS]["count"] = 1
    (out / "manifest.json").write_text(json.dumps(data))
    assert any("cut" in p.describe() for p in verify_export(out).problems)


def test_tampering_with_a_cut_is_found(client: MongoClient, db_name: str) -> None:
    _setup(client, db_name)
    _cut(client, db_name)
    cuts = client[db_name][CUTS]
    auditor = _auditor(client)
    original = cuts.find_one({"stream": ORDERS})

    def problems() -> list[str]:
        report = verify_chain(auditor, db_name, now=LATER)
        return [b.describe() for b in report.breaks if b.stream == ORDERS]

    assert problems() == []
    cuts.update_one({"_id": original["_id"]}, {"$set": {"count": 2}})  # edited
    assert any("does not hash to its cut_hash" in p for p in problems())
    edited = cuts.find_one({"_id": original["_id"]})
    cuts.update_one({"_id": original["_id"]}, {"$set": {"cut_hash": cut_hash(edited)}})
    assert any("not the one its chain recorded" in p for p in problems())  # ... re-hashed
    cuts.replace_one({"_id": original["_id"]}, original)
    assert problems() == []
    forged = {**original, "hash": "ab" * 32}  # another start, hashed right
    forged["cut_hash"] = cut_hash(forged)
    cuts.replace_one({"_id": original["_id"]}, forged)
    assert any("prev is not the previous record's hash" in p for p in problems())
    cuts.delete_one({"_id": original["_id"]})  # deleted
    assert any("a record is missing" in p for p in problems())
    cuts.insert_one(original)
    assert problems() == []
    # records removed behind a forged cut: the forgery is not what the chain recorded
    client[db_name][RECORDS].delete_many({"stream": '["globex","collection","orders"]'})
    client[db_name][RECORDS].delete_many({"stream": T1, "seq": {"$lte": 4}})
    assert not verify_chain(auditor, db_name).ok


def _manual_cut(client: MongoClient, db: str, k: int, at: datetime | None = None) -> dict[str, Any]:
    """A well-formed v1 cut of the orders stream at ``k`` (as the sweep would build it),
    dated ``at`` (default now)."""
    rows = list(client[db][RECORDS].find({"stream": ORDERS, "seq": {"$lte": k}}).sort("seq", 1))
    cut = {
        "_id": ObjectId(), "v": 1, "stream": ORDERS, "tenant_id": "acme", "n": 1, "seq": k,
        "hash": rows[-1]["hash"], "prev_cut": GENESIS, "first_seq": 1, "count": k,
        "first_at": rows[0]["at"], "last_at": rows[-1]["at"], "records_digest": "0" * 64,
        "at": ms(at or datetime.now(UTC)), "by": "test",
    }  # fmt: skip
    cut["cut_hash"] = cut_hash(cut)
    return cut


def test_only_an_admins_well_formed_cut_deletes_audit_records(
    client: MongoClient, db_name: str
) -> None:
    _setup(client, db_name)
    # an admin whose kernel enforces a 1 s audit period (a policy file of their own): the
    # kernel judges the cut by it; the verifier, by the policy stored (the default here)
    policy = parse_policy(LAX, "p.toml")
    service = runtime.kernel(client, principal=Principal.service(AUDITOR), audit="metadata",
                             policy=policy)  # fmt: skip
    admin = runtime.kernel(client, principal=Principal.os_user(), audit="metadata",
                           policy=policy)  # fmt: skip
    # dated 2 s on: the digest of _setup is then a period (1 s) old
    cut = _manual_cut(client, db_name, 2, at=datetime.now(UTC) + 2 * SECOND)
    with pytest.raises(PermissionDenied, match="may not remove audit"):  # the policy
        service.execute(cut_plan(db_name, cut, records=RECORDS,
                                 principal=Principal.service(AUDITOR)))  # fmt: skip
    more = cut_plan(db_name, cut, records=RECORDS, principal=Principal.os_user())
    more.groups[1].ops[0] = Op("delete_many", {"stream": ORDERS, "seq": {"$lte": 5}})
    with pytest.raises(PermissionDenied, match="may not remove audit"):  # not a cut
        admin.execute(more)
    assert _seqs(client, db_name, ORDERS) == list(range(1, 9))
    admin.execute(cut_plan(db_name, cut, records=RECORDS, principal=Principal.os_user()))
    assert _seqs(client, db_name, ORDERS) == [3, 4, 5, 6, 7, 8, 9, 10]
    # the chain links from the cut; but no digest a period old committed what it removed
    breaks = verify_chain(_auditor(client), db_name).breaks
    assert [(b.stream, b.seq) for b in breaks] == [(ORDERS, 2)], breaks
    assert "young records were cut" in breaks[0].problem


def test_a_legal_hold_stops_the_cut(client: MongoClient, db_name: str) -> None:
    _setup(client, db_name)
    policy = default_policy()
    admin = runtime.kernel(client, principal=Principal.os_user(), policy=policy)
    place(admin, db_name, Hold("thread", "t1", tenant_id="acme"), policy)
    place(admin, db_name, Hold("tenant", "globex"), policy)
    from accord.governance.holding import list_holds

    report = _cut(client, db_name, holds=Holds.of(list_holds(admin, db_name, policy)))
    assert (report.streams, report.held) == (1, 2)  # acme's orders only
    assert _seqs(client, db_name, T1) == [1, 2, 3]
    assert _seqs(client, db_name, '["globex","collection","orders"]') == [1, 2]
    # a hold the sweep did not know of (placed after it read the holds) is read inside
    # the cut's transaction by the hold guard: the cut is refused
    report = _cut(client, db_name, holds=Holds.of([]))
    assert report.streams == 0 and report.held == 2
    assert _seqs(client, db_name, T1) == [1, 2, 3]
    # the audit class held: nothing is cut
    place(admin, db_name, Hold("class", "audit"), policy)
    assert _cut(client, db_name, holds=Holds.of(list_holds(admin, db_name, policy))).streams == 0


def test_the_sweep_cuts_by_the_audit_class_period(
    client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ACCORD_POLICY", raising=False)
    _setup(client, db_name)
    import time

    time.sleep(1.2)
    report = runtime.sweep(client, db_name, policy=parse_policy(LAX, "p.toml"))
    assert (report.audit_streams, report.audit_records) == (3, 11), report.describe()
    assert "cut 11 expired audit records from 3 streams" in report.describe()
    assert verify_chain(_auditor(client), db_name, audit_period=timedelta(seconds=1)).ok


def test_a_prefix_that_does_not_link_is_not_cut(client: MongoClient, db_name: str) -> None:
    _setup(client, db_name)
    client[db_name][RECORDS].update_one({"stream": ORDERS, "seq": 3}, {"$set": {"action": "x"}})
    report = _cut(client, db_name)
    assert report.broken == [ORDERS] and report.streams == 2  # the other streams are cut
    assert _seqs(client, db_name, ORDERS) == list(range(1, 9))  # the break stays visible
    breaks = verify_chain(_auditor(client), db_name, now=LATER).breaks
    assert [(b.stream, b.seq) for b in breaks] == [(ORDERS, 3)]


def test_a_long_prefix_is_cut_in_batches_each_a_cut_of_its_own(
    client: MongoClient, db_name: str
) -> None:
    _setup(client, db_name)
    report = cut_expired(_admin(client, clock=LATER), db_name, default_policy(), Holds.of([]),
                         principal=Principal.os_user(), now=LATER, batch=4)  # fmt: skip
    assert (report.streams, report.records) == (3, 11)
    cuts = list(client[db_name][CUTS].find({"stream": ORDERS}).sort("n", 1))
    assert [(c["first_seq"], c["seq"]) for c in cuts] == [(1, 4), (5, 6)]
    assert _seqs(client, db_name, ORDERS) == [7, 8, 9, 10, 11, 12]  # two cuts, two records each
    assert verify_chain(_auditor(client), db_name, now=LATER).ok
