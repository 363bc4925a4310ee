"""``check_extends`` (``accord audit verify --from A --to B``) judges the cuts it rests on
(since 2026-12-08): a stream whose records at A's head were cut extends only when the
digests justify that cut (docs/governance.md, "What a cut proves"). Before, an admin's cut
of young records between A and B, hashed right, verified as an extension.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pymongo import MongoClient
from typer.testing import CliRunner

from accord.governance.digests import external, write_digest
from accord.governance.proofs import check_extends
from accord.platform.cli import app as cli
from tests.governance.test_audit_cuts import (
    LATER,
    MINUTE,
    ORDERS,
    _auditor,
    _cut,
    _setup,
    _uri,
)
from tests.governance.test_audit_cuts_justified import SEVEN_YEARS, _forged, _unchecked


def test_an_extension_over_an_admins_cut_of_young_records_fails(
    client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _setup(client, db_name)  # the orders stream's head at the digest: seq 6
    _unchecked(monkeypatch)  # recorded as a kernel from before the seal's refusal did
    _forged(client, db_name, 6, at=datetime.now(UTC), period_s=int(SEVEN_YEARS.total_seconds()))
    second = write_digest(_auditor(client), db_name)
    report = check_extends(_auditor(client), db_name, external(first), external(second))
    assert [(p.stream, p.seq) for p in report.problems] == [(ORDERS, 6)], report.problems
    problem = report.problems[0].problem
    assert "through seq 6 that no digest older than its period 7 years" in problem
    assert "young records were cut" in problem
    result = CliRunner().invoke(
        cli, ["audit", "verify", "--from", "1", "--to", "2", "--db", db_name],
        env={"MONGODB_URI": _uri(client)},
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "young records were cut" in result.output and "does NOT extend" in result.output


def test_an_extension_over_the_sweeps_cut_holds_and_takes_the_period_given(
    client: MongoClient, db_name: str
) -> None:
    first = _setup(client, db_name)
    assert _cut(client, db_name).streams == 3  # dated LATER: the digest is a period older
    second = write_digest(_auditor(client), db_name, at=LATER + MINUTE)
    auditor = _auditor(client)
    assert check_extends(auditor, db_name, external(first), external(second)).ok
    # held to a period longer than the one the cut applied, the same cut is too young
    report = check_extends(auditor, db_name, external(first), external(second),
                           audit_period=timedelta(days=9 * 366))  # fmt: skip
    assert any("shorter than the" in p.problem for p in report.problems), report.problems
    result = CliRunner().invoke(
        cli, ["audit", "verify", "--from", "1", "--to", "2", "--db", db_name,
              "--audit-period", "9y"],
        env={"MONGODB_URI": _uri(client)},
    )  # fmt: skip
    assert result.exit_code == 1 and "shorter than the" in result.output, result.output
