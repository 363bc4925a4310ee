"""An audit cut must be justified by the digests (docs/governance.md, "Expiring the audit
trail"): a digest taken at least the cut's period before it committed every record it
removed, its period is the one expected, and it is not dated after a digest that already
held it. A legitimate sweep's cuts verify, live and offline; a cut an admin forges
through the kernel to remove young records, one claiming a tiny period, and one dated
forward are each named by ``verify --live`` and by the export verifier.

Since 2026-12-07 the kernel refuses such a cut in its transaction (the audit hook's
seal reads the digests that could justify it): young records, a period shorter than the
policy's, a date ahead of the kernel's clock, a witness digest that does not hash to its
hash: each refused, nothing deleted, no cut written. Since 2026-12-08 each refusal is
recorded, as a ``PermissionDenied`` is: one record (``outcome: "refused"``) in the
tenant's stream of the cuts collection, written after the cut's transaction aborted,
once however many attempts it took. The verifier's tests then record
their cuts as a kernel from before that did (:func:`_unchecked`), or through a kernel
enforcing a policy of its own (a 1 s period).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient
from typer.testing import CliRunner

from accord import runtime
from accord.errors import InvalidInputError
from accord.governance import audit_hook
from accord.governance.audit_cuts import (
    CUTS,
    Commit,
    cut_expired,
    cut_hash,
    cut_plan,
    justify_cut,
)
from accord.governance.audit_records import HEADS, RECORDS
from accord.governance.canonical import ms
from accord.governance.digests import write_digest
from accord.governance.export import export
from accord.governance.export_verify import verify_export
from accord.governance.holds import Holds
from accord.governance.loading import default_policy, parse_policy
from accord.governance.verify import verify_chain
from accord.platform.cli import app as cli
from accord.platform.context import Principal
from accord.platform.hooks import SealConflict
from tests.governance.test_audit_cuts import (
    LATER,
    LAX,
    MINUTE,
    ORDERS,
    _admin,
    _auditor,
    _cut,
    _manual_cut,
    _seqs,
    _setup,
    _uri,
)

SEVEN_YEARS = timedelta(days=7 * 365)
#: The stream a refused cut of tenant acme is recorded in.
REFUSALS = '["acme","collection","accord_audit_cuts"]'


def _forged(
    client: MongoClient, db: str, k: int, *, at: datetime, period_s: int, uow: Any = None
) -> Any:
    """An admin's well-formed v2 cut of the orders stream through seq ``k``, dated
    ``at``, claiming ``period_s``, run through the kernel ``uow`` (default an admin's)."""
    cut = {**_manual_cut(client, db, k), "v": 2, "at": ms(at), "period_s": period_s}
    cut["cut_hash"] = cut_hash(cut)
    uow = uow or _admin(client)
    uow.execute(cut_plan(db, cut, records=RECORDS, principal=Principal.os_user()))
    return cut


def _unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels as they were before 2026-12-07: the audit hook lets any well-formed cut
    through (a cut recorded then is still named by the verifier)."""
    monkeypatch.setattr(audit_hook, "refuse_unjustified", lambda *args, **kwargs: None)


def _lax_admin(client: MongoClient) -> Any:
    """An admin's kernel enforcing a policy of its own, whose audit period is 1 s."""
    return runtime.kernel(client, principal=Principal.os_user(), audit="metadata",
                          policy=parse_policy(LAX, "p.toml"))  # fmt: skip


def _untouched(client: MongoClient, db: str, heads: dict[str, Any], refused: int = 1) -> None:
    """Nothing of a refused cut was written: the orders stream whole, no cut, every
    audit head where it was but those of the streams the refusals are recorded in, which
    hold ``refused`` records, each of a refused cut."""
    assert _seqs(client, db, ORDERS) == list(range(1, 9))
    assert client[db][CUTS].count_documents({}) == 0
    now = {h["_id"]: h["seq"] for h in client[db][HEADS].find()}
    assert {k: v for k, v in now.items() if CUTS not in k} == heads
    assert len(_refusals(client, db)) == refused
    assert verify_chain(_auditor(client), db).ok


def _refusals(client: MongoClient, db: str) -> list[dict[str, Any]]:
    """The audit records of refused cuts, in the order they were written."""
    return list(client[db][RECORDS].find({"action": "audit.cut", "outcome": "refused"})
                .sort([("at", 1), ("stream", 1), ("seq", 1)]))  # fmt: skip


def _heads(client: MongoClient, db: str) -> dict[str, Any]:
    return {h["_id"]: h["seq"] for h in client[db][HEADS].find()}


def _live(client: MongoClient, db: str, **options: Any) -> list[str]:
    return [b.describe() for b in verify_chain(_auditor(client), db, **options).breaks]


def _offline(client: MongoClient, db: str, out: Path, **options: Any) -> list[str]:
    export(_auditor(client), db, out, tenant="acme")
    return [p.describe() for p in verify_export(out, **options).problems]


def test_a_sweeps_cuts_are_justified_live_and_offline(
    client: MongoClient, db_name: str, tmp_path: Path
) -> None:
    _setup(client, db_name)
    report = _cut(client, db_name)  # dated LATER: the digest is a period older
    assert report.streams == 3
    cut = client[db_name][CUTS].find_one({"stream": ORDERS})
    assert cut is not None
    assert (cut["v"], cut["period_s"]) == (2, int(SEVEN_YEARS.total_seconds()))
    assert cut["at"].replace(tzinfo=UTC) == ms(LATER)
    assert _live(client, db_name, now=LATER) == []
    write_digest(_auditor(client), db_name, at=LATER + MINUTE)  # holds the cuts' records
    assert _live(client, db_name) == []  # every cut is covered: the clock's now is not asked
    assert _offline(client, db_name, tmp_path / "x") == []
    manifest = (tmp_path / "x" / "manifest.json").read_text()
    assert f'"audit_period_s": {int(SEVEN_YEARS.total_seconds())}' in manifest


def test_the_sweep_cuts_only_what_a_digest_a_period_old_committed(
    client: MongoClient, db_name: str
) -> None:
    _setup(client, db_name)  # its digest is taken now
    young = cut_expired(_admin(client), db_name, default_policy(), Holds.of([]),
                        principal=Principal.os_user(), now=datetime.now(UTC) + SEVEN_YEARS
                        - timedelta(days=1))  # fmt: skip
    assert young.streams == 0  # the digest is not yet a period old at that now


def test_an_admins_cut_of_young_records_is_named_live_and_offline(
    client: MongoClient, db_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _setup(client, db_name)
    _unchecked(monkeypatch)  # recorded as before 2026-12-07 (the kernel refuses it now)
    _forged(client, db_name, 5, at=datetime.now(UTC), period_s=int(SEVEN_YEARS.total_seconds()))
    live = [p for p in _live(client, db_name) if ORDERS in p]
    assert len(live) == 1, live
    assert "audit cut 1 of stream" in live[0] and "through seq 5" in live[0]
    assert "young records were cut" in live[0] and "7 years" in live[0]
    result = CliRunner().invoke(cli, ["audit", "verify", "--live", "--db", db_name],
                                env={"MONGODB_URI": _uri(client)})  # fmt: skip
    assert result.exit_code == 1 and "young records were cut" in result.output, result.output
    write_digest(_auditor(client), db_name)
    offline = _offline(client, db_name, tmp_path / "x")
    assert any("young records were cut" in p and "seq 5" in p for p in offline), offline


def test_a_cut_claiming_a_tiny_period_fails_against_the_period_expected(
    client: MongoClient, db_name: str, tmp_path: Path
) -> None:
    _setup(client, db_name)
    # a second past the digest: by its own 1s period, the digest committed what it cut;
    # a kernel enforcing a 1 s period of its own lets it through
    _forged(client, db_name, 5, at=datetime.now(UTC) + timedelta(seconds=2), period_s=1,
            uow=_lax_admin(client))  # fmt: skip
    live = _live(client, db_name)
    assert any("applied a period of 1 seconds, shorter than the 7 years expected" in p
               for p in live), live  # fmt: skip
    assert _live(client, db_name, audit_period=timedelta(seconds=1)) == []  # as stated
    result = CliRunner().invoke(
        cli, ["audit", "verify", "--live", "--db", db_name, "--audit-period", "1s"],
        env={"MONGODB_URI": _uri(client)},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    write_digest(_auditor(client), db_name, at=datetime.now(UTC) + timedelta(seconds=3))
    offline = _offline(client, db_name, tmp_path / "x")
    assert any("shorter than the 7 years expected" in p for p in offline), offline
    assert verify_export(tmp_path / "x", audit_period=timedelta(seconds=1)).ok


def test_a_cut_dated_after_the_digest_that_holds_it_fails(
    client: MongoClient, db_name: str, tmp_path: Path
) -> None:
    _setup(client, db_name)
    _cut(client, db_name)  # dated LATER, a period after the digest: justified by (b)
    write_digest(_auditor(client), db_name)  # taken now: the cut existed now, not LATER
    live = [p for p in _live(client, db_name, now=LATER) if ORDERS in p]
    assert len(live) == 1 and "after digest 2" in live[0] and "moved forward" in live[0], live
    offline = _offline(client, db_name, tmp_path / "x", now=LATER)
    assert any("after digest 2" in p and "moved forward" in p for p in offline), offline


# --- the kernel refuses an unjustified cut, in its transaction (since 2026-12-07) ----------


def test_the_kernel_refuses_an_admins_cut_of_young_records(
    client: MongoClient, db_name: str
) -> None:
    _setup(client, db_name)
    heads = _heads(client, db_name)
    seven_years = int(SEVEN_YEARS.total_seconds())
    with pytest.raises(InvalidInputError) as refused:
        _forged(client, db_name, 5, at=datetime.now(UTC), period_s=seven_years)
    text = str(refused.value)
    assert text.startswith("audit cut refused, nothing was cut: audit cut 1 of stream")
    assert "through seq 5 that no digest older than its period 7 years committed" in text
    _untouched(client, db_name, heads)
    # a v1 cut (no period stated) is held to the policy's
    with pytest.raises(InvalidInputError, match="no digest older than its period 7 years"):
        _admin(client).execute(cut_plan(db_name, _manual_cut(client, db_name, 2),
                                        records=RECORDS, principal=Principal.os_user()))  # fmt: skip
    _untouched(client, db_name, heads, refused=2)
    # the sweep's cuts, a period after the digest, still go
    assert (_cut(client, db_name).streams, _seqs(client, db_name, ORDERS)[0]) == (3, 7)
    assert _live(client, db_name, now=LATER) == []


def test_the_kernel_refuses_a_cut_claiming_a_period_shorter_than_the_policys(
    client: MongoClient, db_name: str
) -> None:
    _setup(client, db_name)
    heads = _heads(client, db_name)
    with pytest.raises(InvalidInputError, match="applied a period of 1 seconds, shorter than "
                       "the 7 years expected"):  # fmt: skip
        _forged(client, db_name, 5, at=datetime.now(UTC) + timedelta(seconds=2), period_s=1)
    _untouched(client, db_name, heads)


def test_the_kernel_refuses_a_cut_dated_ahead_of_its_clock(
    client: MongoClient, db_name: str
) -> None:
    _setup(client, db_name)
    heads = _heads(client, db_name)
    seven_years = int(SEVEN_YEARS.total_seconds())
    with pytest.raises(InvalidInputError, match=r"is dated .*, in the future"):
        _forged(client, db_name, 5, at=LATER, period_s=seven_years)
    _untouched(client, db_name, heads)
    # a sweep dated LATER on a kernel whose clock says now: each cut refused, and said
    report = _cut(client, db_name, clock=datetime.now(UTC))
    assert report.streams == 0 and len(report.refused) == 3, report
    assert all("in the future" in r for r in report.refused), report.refused
    _untouched(client, db_name, heads, refused=4)  # the admin's, the sweep's 3
    assert sorted(r["reason"] for r in _refusals(client, db_name)[1:]) == sorted(report.refused)


def test_a_digest_that_does_not_hash_to_its_hash_justifies_no_cut(
    client: MongoClient, db_name: str
) -> None:
    digest = _setup(client, db_name)
    heads = _heads(client, db_name)
    # its date moved back 8 years in the database (not re-hashed): it does not count
    moved = digest["at"].replace(digest["at"][:4], str(int(digest["at"][:4]) - 8), 1)
    client[db_name]["accord_audit_digests"].update_one({"_id": 1}, {"$set": {"at": moved}})
    with pytest.raises(InvalidInputError, match="no digest older than its period"):
        _forged(client, db_name, 5, at=datetime.now(UTC), period_s=int(SEVEN_YEARS.total_seconds()))
    _untouched(client, db_name, heads)


def test_a_refused_cut_is_recorded_outside_its_transaction(
    client: MongoClient, db_name: str
) -> None:
    """The refusal of a cut is recorded as a ``PermissionDenied`` is (Issue 24): one
    record, ``outcome: "refused"``, naming the principal, the action (``audit.cut``), the
    cut (its insert: the cut's ``_id``) and the refusal's message, in a transaction of its
    own after the cut's aborted (which wrote nothing: no record of it, none deleted). Before
    2026-12-08 a cut refused in the hook's seal left no record."""
    _setup(client, db_name)
    heads = _heads(client, db_name)
    records = client[db_name][RECORDS].count_documents({})
    cut = {**_manual_cut(client, db_name, 5), "v": 2, "at": ms(datetime.now(UTC)),
           "period_s": int(SEVEN_YEARS.total_seconds())}  # fmt: skip
    cut["cut_hash"] = cut_hash(cut)
    with pytest.raises(InvalidInputError) as refused:
        _admin(client).execute(cut_plan(db_name, cut, records=RECORDS,
                                        principal=Principal.os_user()))  # fmt: skip
    _untouched(client, db_name, heads)
    # the refused transaction recorded nothing: the refusal's record is the one more
    assert client[db_name][RECORDS].count_documents({}) == records + 1
    (record,) = _refusals(client, db_name)
    assert (record["stream"], record["seq"], record["tenant_id"]) == (REFUSALS, 1, "acme")
    assert (record["outcome"], record["action"]) == ("refused", "audit.cut")
    assert record["principal"] == {"name": Principal.os_user().name, "role": "admin",
                                   "kind": "user"}  # fmt: skip
    assert (record["collection"], record["artifact"]) == (CUTS, "audit_digest")
    assert record["reason"] == str(refused.value)
    assert record["reason"].startswith("audit cut refused, nothing was cut: audit cut 1 of")
    assert [(op["op"], op["doc_id"]) for op in record["ops"]] == [("insert", cut["_id"])]


def test_a_refused_cut_retried_is_recorded_once(
    client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut's transaction is attempted again (a write conflict on its first attempt),
    and refused on the second: one refusal record, none for the first attempt."""
    _setup(client, db_name)
    heads = _heads(client, db_name)
    judged: list[int] = []
    real = audit_hook.refuse_unjustified

    def conflicted_once(*args: Any, **kwargs: Any) -> None:
        judged.append(1)
        if len(judged) == 1:
            raise SealConflict("a concurrent writer (test)")
        real(*args, **kwargs)

    monkeypatch.setattr(audit_hook, "refuse_unjustified", conflicted_once)
    with pytest.raises(InvalidInputError, match="no digest older than its period 7 years"):
        _forged(client, db_name, 5, at=datetime.now(UTC),
                period_s=int(SEVEN_YEARS.total_seconds()))  # fmt: skip
    assert len(judged) == 2  # attempted twice, refused on the second
    _untouched(client, db_name, heads, refused=1)


def test_the_check_itself() -> None:
    """(a) the period, (b) a digest a period old, (c) not dated after the first digest
    that held the cut's record (skew allowed), nor after now when none did; a v1 cut is
    held to the period expected."""
    t0 = datetime(2020, 1, 1, tzinfo=UTC)
    day = timedelta(days=1)
    cut = {"v": 2, "n": 1, "stream": "s", "seq": 10, "period_s": 86400, "at": t0 + 3 * day}
    commits = [Commit(1, t0, 4), Commit(2, t0 + day, 12), Commit(3, t0 + 3 * day, 15)]

    def check(c: dict[str, Any] = cut, period: timedelta = day, by: int = 13) -> str | None:
        return justify_cut(c, commits, recorded_by=by, now=t0 + 9 * day, min_period=period).problem

    assert check() is None
    assert "young records were cut" in str(check({**cut, "seq": 13}))  # digest 2 held 12
    assert "shorter than" in str(check(period=2 * day))
    assert "moved forward" in str(check({**cut, "at": t0 + 4 * day}))  # digest 3 held it
    assert check({**cut, "at": t0 + 3 * day + timedelta(minutes=4)}) is None  # skew
    assert check(by=16) is None and "in the future" in str(
        check({**cut, "at": t0 + 10 * day}, by=16)
    )  # no digest holds its record yet: now bounds it
    v1 = {k: v for k, v in cut.items() if k != "period_s"} | {"v": 1}
    assert check(v1) is None and "young" in str(check(v1, period=3 * day))
