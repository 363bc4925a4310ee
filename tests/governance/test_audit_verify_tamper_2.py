"""Exports, proofs and digests tampered with in the ways a second review (2026-12-07)
found to pass or to crash the verifiers (docs/governance.md, "Verifying an export,
without the database"): a record's ``_id`` given twice, a manifest naming files outside
the export, values past float's range, nesting too deep, digests made link-only to drop
what they commit to, a line with no end.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from accord.governance import export_verify
from accord.governance.audit_records import RECORDS, chain_hash
from accord.governance.canonical import canonical
from accord.governance.digests import Head, HeadTree, digest_hash, external, write_digest
from accord.governance.export_verify import verify_export
from accord.governance.proofs import check_proof, prove
from tests.governance.test_audit_digests import write
from tests.governance.test_audit_export import ACME, _find, _lines, _recompute_manifest, _write
from tests.governance.test_audit_verify_tamper import (
    T2,
    _cli,
    _edit_manifest,
    _export,
    _named,
    trail,
)

__all__ = ["trail"]  # the fixture, imported for pytest


def _line(record: dict[str, Any]) -> str:
    return canonical(record).decode() + "\n"


# --- a record's _id ---------------------------------------------------------------------


def test_two_records_sharing_an_id_are_found(trail: dict[str, Any], tmp_path: Path) -> None:
    out = _export(trail, tmp_path / "x")
    parts = _lines(out)
    i, j = _find(parts, ACME, 4)
    taken = json.loads(parts[i][j])["_id"]
    k, m = _find(parts, T2, 2)
    record = json.loads(parts[k][m])
    record["_id"] = taken  # outside the hash: the chain still verifies
    parts[k][m] = _line(record)
    _write(out, parts)
    _recompute_manifest(out)
    report = verify_export(out, kept=trail["digest"])
    assert _named(report) == [(T2, 2)], report.as_dict()
    problem = report.problems[0]
    assert problem.record_id == taken["$oid"]
    assert problem.location == f"records-0000{k}.jsonl:line {m + 1}"
    assert "shares its _id with" in problem.problem
    assert f"records-0000{i}.jsonl:line {j + 1}" in problem.problem
    result = _cli("verify", str(out))
    assert result.exit_code == 1 and "shares its _id" in result.output, result.output
    assert T2 in result.output and taken["$oid"] in result.output


@pytest.mark.parametrize("rid", [None, {"$oid": "A" * 24}, {"$oid": "12"}, "plain"])
def test_a_record_without_an_object_id_is_named(
    trail: dict[str, Any], tmp_path: Path, rid: Any
) -> None:
    out = _export(trail, tmp_path / "x")
    parts = _lines(out)
    i, j = _find(parts, ACME, 5)
    record = json.loads(parts[i][j])
    if rid is None:
        del record["_id"]
    else:
        record["_id"] = rid
    parts[i][j] = _line(record)
    _write(out, parts)
    _recompute_manifest(out)
    report = verify_export(out)
    assert _named(report) == [(ACME, 5)], report.as_dict()
    assert "_id is not an ObjectId" in report.problems[0].problem


# --- the manifest's file names ------------------------------------------------------------


def test_a_manifest_naming_files_outside_the_export_is_refused(
    trail: dict[str, Any], tmp_path: Path
) -> None:
    out = _export(trail, tmp_path / "x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    manifest = json.loads((out / "manifest.json").read_text())
    first = manifest["files"][0]["name"]
    shutil.move(out / first, elsewhere / first)
    shutil.move(out / "digests.json", elsewhere / "digests.json")
    files = [dict(f) for f in manifest["files"]]
    files[0]["name"] = f"../elsewhere/{first}"
    _edit_manifest(out, files=files,
                   digests_file=dict(manifest["digests_file"],
                                     name=str(elsewhere / "digests.json")))  # fmt: skip
    problems = [p.problem for p in verify_export(out, kept=trail["digest"]).problems]
    assert any(f"'../elsewhere/{first}' is not the name of a file in the export" in p
               for p in problems), problems  # fmt: skip
    assert any("digests.json' is not the name of a file in the export" in p
               for p in problems), problems  # fmt: skip


@pytest.mark.timeout(60)
def test_a_manifest_naming_a_device_or_a_fifo_does_not_hang(
    trail: dict[str, Any], tmp_path: Path
) -> None:
    out = _export(trail, tmp_path / "x")
    manifest = json.loads((out / "manifest.json").read_text())
    _edit_manifest(out, digests_file=dict(manifest["digests_file"], name="/dev/zero"))
    problems = [p.problem for p in verify_export(out).problems]
    assert any("'/dev/zero' is not the name of a file in the export" in p for p in problems)
    # a FIFO in the export's place of the digests (reading it would wait for a writer)
    (out / "digests.json").unlink()
    os.mkfifo(out / "digests.json")
    _edit_manifest(out, digests_file=manifest["digests_file"])
    problems = [p.problem for p in verify_export(out).problems]
    assert any("digests.json is not a regular file" in p for p in problems), problems
    (out / "manifest.json").rename(out / "m.json")
    os.mkfifo(out / "manifest.json")
    assert "not a regular file" in verify_export(out).problems[0].problem


# --- values no JSON number of the export holds ---------------------------------------------


def test_numbers_past_float_range_are_problems_not_tracebacks(
    trail: dict[str, Any], tmp_path: Path
) -> None:
    out = _export(trail, tmp_path / "x")
    manifest = json.loads((out / "manifest.json").read_text())
    streams = manifest["streams"]
    streams[ACME]["first_seq"] = 1e400  # json reads it as inf: int(inf) raised OverflowError
    (out / "manifest.json").write_text(json.dumps(manifest).replace("Infinity", "1e400"))
    report = verify_export(out)
    assert not report.ok and report.problems, report.as_dict()
    result = _cli("verify", str(out))
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    # in a digest entry's heads and tenant path index, the same
    out = _export(trail, tmp_path / "y")
    digests = json.loads((out / "digests.json").read_text())
    digests[0]["tenant_index"] = 1e400
    text = json.dumps(digests).replace("Infinity", "1e400")
    (out / "digests.json").write_text(text)
    _recompute_manifest(out)
    report = verify_export(out)
    assert not report.ok, report.as_dict()


def test_a_proof_with_a_seq_past_float_range_is_a_problem(
    client: MongoClient, trail: dict[str, Any]
) -> None:
    found = client[trail["db"]][RECORDS].find_one({"stream": ACME, "seq": 12})
    assert found is not None
    rid = str(found["_id"])
    proof = prove(trail["uow"], trail["db"], rid)
    assert check_proof(proof) is None
    record = proof["record"]
    record["seq"] = float("inf")  # hashed as {"$numberDouble": "Infinity"}: self-consistent
    record["hash"] = chain_hash(record)
    proof["head"] = {"seq": float("inf"), "hash": record["hash"]}
    problem = check_proof(proof)
    assert problem is not None and "malformed" in problem


def test_files_nested_too_deep_are_clear_errors(trail: dict[str, Any], tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    out = _export(trail, tmp_path / "x")
    for args in (("verify", "--proof", str(deep)), ("verify", str(out), "--digest", str(deep))):
        result = _cli(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output and "nested too deep" in result.output


# --- digests made link-only ------------------------------------------------------------------


def _rechain(parts: list[list[str]], stream: str, start: int) -> str:
    """Rewrite ``stream`` from seq ``start`` (its action changed) and re-hash every later
    record, as an administrator who can write the database does; the new last hash."""
    prev = ""
    for i, lines in enumerate(parts):
        for j, line in enumerate(lines):
            r = json.loads(line)
            if r["stream"] != stream or r["seq"] < start:
                continue
            if r["seq"] == start:
                r["action"] = "orders.rewritten"
            else:
                r["prev"] = prev
            r["hash"] = prev = chain_hash(r)
            parts[i][j] = _line(r)
    return prev


def _forge_covering(out: Path, digests: list[dict[str, Any]], heads: list[list[Any]]) -> None:
    """Make the export's last digest commit to ``heads`` (a tree of the tenant alone,
    unsigned, still linked to the digest before it) and the manifest name it."""
    entry = digests[-1]
    tree = HeadTree({s: Head("acme", seq, h) for s, seq, h in heads})
    index, size, path = tree.tenant_path("acme")
    entry.update(heads=heads, tenant_index=index, tenants=size, tenant_path=path)
    body = entry["digest"]
    body.pop("signature", None)
    body["root"] = tree.root
    body["hash"] = digest_hash(body)
    (out / "digests.json").write_text(json.dumps(digests))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["digest"]["hash"] = body["hash"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    _recompute_manifest(out)


@pytest.mark.parametrize("emptied", [None, []], ids=["link-only", "no-heads"])
def test_a_kept_digest_made_link_only_still_holds_the_records(
    client: MongoClient, trail: dict[str, Any], tmp_path: Path, emptied: list[Any] | None
) -> None:
    db = trail["db"]
    write(client, db, "acme", 12, 2)
    kept = external(write_digest(trail["uow"], db))  # 2: orders at seq 14
    write(client, db, "acme", 14, 2)
    write_digest(trail["uow"], db)  # 3, the export's covering digest: orders at 16
    out = _export(trail, tmp_path / "x")
    assert verify_export(out, kept=kept).ok
    # the administrator rewrites orders from seq 5 on, re-chains it to a new head, and
    # hides what digests 1 and 2 (kept outside) committed to: their entries in the export
    # say the tenant's heads did not move there (or that it had none), which nothing
    # checked; digest 3 is recomputed over the rewritten heads, linked to digest 2
    parts = _lines(out)
    last = _rechain(parts, ACME, 5)
    _write(out, parts)
    digests = json.loads((out / "digests.json").read_text())
    for entry in digests[:-1]:
        entry.update(heads=emptied, tenant_index=None, tenant_path=None,
                     tenants=None if emptied is None else entry["tenants"])  # fmt: skip
    heads = [[s, seq, last if s == ACME else h] for s, seq, h in digests[-1]["heads"]]
    _forge_covering(out, digests, heads)
    report = verify_export(out, kept=kept)
    assert not report.ok, report.as_dict()
    assert "digest 2" in report.problems[0].problem, report.as_dict()


def test_a_link_only_digest_in_a_real_export_proves_its_heads(
    client: MongoClient, trail: dict[str, Any], tmp_path: Path
) -> None:
    db = trail["db"]
    write(client, db, "globex", 4, 2)
    kept = external(write_digest(trail["uow"], db))  # 2: globex moved, acme did not
    write(client, db, "acme", 12, 1)
    write_digest(trail["uow"], db)  # 3
    out = _export(trail, tmp_path / "x")
    digests = json.loads((out / "digests.json").read_text())
    assert [e["heads"] is None for e in digests] == [False, True, False]
    assert digests[1]["tenant_path"] is not None  # where the tenant's leaf is at digest 2
    assert verify_export(out, kept=kept).ok
    # its path altered: the tenant's heads carried from digest 1 do not rebuild the root
    digests[1]["tenant_path"] = ["0" * 64 for _ in digests[1]["tenant_path"]]
    (out / "digests.json").write_text(json.dumps(digests))
    _recompute_manifest(out)
    report = verify_export(out, kept=kept)
    assert "digest 2: the tenant's stream heads" in report.problems[0].problem, report.as_dict()


# --- a line with no end ------------------------------------------------------------------------


def test_a_line_longer_than_any_record_is_named_without_holding_it(
    trail: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _export(trail, tmp_path / "x")
    monkeypatch.setattr(export_verify, "LINE_LIMIT", 1 << 16)
    path = out / "records-00001.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([lines[0], b"x" * (1 << 18) + b"\n", *lines[1:]]))
    _recompute_manifest_bytes(out)
    problems = [p.describe() for p in verify_export(out).problems]
    assert any("records-00001.jsonl:line 2: the line is longer than" in p
               for p in problems), problems  # fmt: skip


def _recompute_manifest_bytes(out: Path) -> None:
    """The manifest's file hashes and sizes made to match (the records left as they are)."""
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    for info in manifest["files"]:
        data = (out / info["name"]).read_bytes()
        info.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    manifest.pop("signature", None)
    path.write_text(json.dumps(manifest))


def test_lines_spanning_blocks_are_whole_and_a_long_one_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JSONL reader joins a line that spans its 4 MiB blocks once, at its end, and
    holds none longer than the limit (it joined the line at every block: quadratic)."""
    block = 1 << 22
    lines = [b"a" * 10, b"b" * (2 * block + 5), b"", b"c" * (block - 11), b"d" * (3 * block)]
    path = tmp_path / "f"
    path.write_bytes(b"\n".join(lines) + b"\n" + b"tail")
    hashed = hashlib.sha256()
    with open(path, "rb") as f:
        assert list(export_verify._lines(f, hashed)) == [*lines, b"tail"]
    assert hashed.hexdigest() == hashlib.sha256(path.read_bytes()).hexdigest()
    monkeypatch.setattr(export_verify, "LINE_LIMIT", block)
    with open(path, "rb") as f:
        found = list(export_verify._lines(f, hashlib.sha256()))
    assert found == [lines[0], None, b"", lines[3], None, b"tail"]


# --- the live collection's cuts ----------------------------------------------------------------


def test_a_malformed_audit_cut_is_a_break_not_a_traceback(
    client: MongoClient, trail: dict[str, Any]
) -> None:
    from accord.governance.audit_cuts import CUTS
    from tests.governance.test_audit_export import _uri

    db = trail["db"]
    kept = trail["file"]
    # what an administrator can write past the validator
    client[db][CUTS].insert_one({"stream": ACME, "tenant_id": "acme", "n": 1, "seq": "x"},
                                bypass_document_validation=True)  # fmt: skip
    env = {"MONGODB_URI": _uri(client)}
    for args in (("verify", "--live", "--db", db, "--digest", str(kept), "--json"),
                 ("verify", "--db", db, "--from", "1", "--to", "1", "--json")):  # fmt: skip
        result = _cli(*args, env=env)
        assert result.exit_code == 1, (args, result.output)
        found = json.loads(result.stdout)
        assert [b["stream"] for b in found.get("breaks", found.get("problems"))] == [ACME]
