"""An audit cut must be justified by the digests (docs/governance.md, "Expiring the audit
trail"): a digest taken at least the cut's period before it committed every record it
removed, its period is the one expected, and it is not dated after a digest that already
held it. A legitimate sweep's cuts verify, live and offline; a cut an admin forges
through the kernel to remove young records, one claiming a tiny period, and one dated
forward are each named by ``verify --live`` and by the export verifier.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pymongo import MongoClient
from typer.testing import CliRunner

from accord.governance.audit_cuts import (
    CUTS,
    Commit,
    cut_expired,
    cut_hash,
    cut_justification,
    cut_plan,
)
from accord.governance.audit_records import RECORDS
from accord.governance.canonical import ms
from accord.governance.digests import write_digest
from accord.governance.export import export
from accord.governance.export_verify import verify_export
from accord.governance.holds import Holds
from accord.governance.loading import default_policy
from accord.governance.verify import verify_chain
from accord.platform.cli import app as cli
from accord.platform.context import Principal
from tests.governance.test_audit_cuts import (
    LATER,
    MINUTE,
    ORDERS,
    _admin,
    _auditor,
    _cut,
    _manual_cut,
    _setup,
    _uri,
)

SEVEN_YEARS = timedelta(days=7 * 365)


def _forged(client: MongoClient, db: str, k: int, *, at: datetime, period_s: int) -> Any:
    """An admin's well-formed v2 cut of the orders stream through seq ``k``, dated
    ``at``, claiming ``period_s``, run through the kernel (the hooks let it through)."""
    cut = {**_manual_cut(client, db, k), "v": 2, "at": ms(at), "period_s": period_s}
    cut["cut_hash"] = cut_hash(cut)
    _admin(client).execute(cut_plan(db, cut, records=RECORDS, principal=Principal.os_user()))
    return cut


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
    client: MongoClient, db_name: str, tmp_path: Path
) -> None:
    _setup(client, db_name)
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
    # a second past the digest: by its own 1s period, the digest committed what it cut
    _forged(client, db_name, 5, at=datetime.now(UTC) + timedelta(seconds=2), period_s=1)
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


def test_the_check_itself() -> None:
    """(a) the period, (b) a digest a period old, (c) not dated after the first digest
    that held the cut's record (skew allowed), nor after now when none did; a v1 cut is
    held to the period expected."""
    t0 = datetime(2020, 1, 1, tzinfo=UTC)
    day = timedelta(days=1)
    cut = {"v": 2, "n": 1, "stream": "s", "seq": 10, "period_s": 86400, "at": t0 + 3 * day}
    commits = [Commit(1, t0, 4), Commit(2, t0 + day, 12), Commit(3, t0 + 3 * day, 15)]

    def check(c: dict[str, Any] = cut, period: timedelta = day, by: int = 13) -> str | None:
        return cut_justification(c, commits, recorded_by=by, now=t0 + 9 * day, min_period=period)

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
