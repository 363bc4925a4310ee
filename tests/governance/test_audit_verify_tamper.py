"""Exports and live chains tampered with in the ways a review found to pass or to crash
the verifiers (docs/governance.md, "Verifying an export, without the database"): each is
now a problem naming what is wrong (exit 1), and each input the check cannot run on is a
clear error (exit 2), never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient
from typer.testing import CliRunner

from accord import runtime
from accord.errors import InvalidInputError
from accord.governance.audit_cuts import cut_hash
from accord.governance.audit_records import GENESIS, HEADS, RECORDS, chain_hash
from accord.governance.canonical import canonical
from accord.governance.digests import external, write_digest
from accord.governance.export import PROGRESS, export
from accord.governance.export_verify import verify_export
from accord.governance.proofs import check_proof, prove
from accord.governance.signing import generate, load_private
from accord.governance.verify import ChainChecker
from accord.platform.cli import app as cli
from accord.platform.context import AUDITOR, Principal, WriteContext
from accord.platform.plan import Group, Op, Plan
from tests.governance.test_audit_digests import write
from tests.governance.test_audit_export import (
    ACME,
    _find,
    _lines,
    _recompute_manifest,
    _uri,
    _write,
)

T2 = '["acme","thread","t2"]'


def _auditor(client: MongoClient) -> Any:
    return runtime.kernel(client, principal=Principal.service(AUDITOR), audit="metadata")


@pytest.fixture()
def trail(client: MongoClient, db_name: str, tmp_path: Path) -> dict[str, Any]:
    """acme: 12 orders and two threads; globex: 4 orders; a signed digest, also as a file."""
    write(client, db_name, "acme", 0, 12)
    write(client, db_name, "acme", 0, 5, thread="t1")
    write(client, db_name, "acme", 0, 3, thread="t2")
    write(client, db_name, "globex", 0, 4)
    generate(tmp_path / "k")
    uow = _auditor(client)
    digest = external(write_digest(uow, db_name, key=load_private(tmp_path / "k")))
    (tmp_path / "d.json").write_text(json.dumps(digest))
    return {"uow": uow, "db": db_name, "digest": digest, "file": tmp_path / "d.json"}


def _export(trail: dict[str, Any], out: Path, tenant: str = "acme", **kwargs: Any) -> Path:
    kwargs.setdefault("part_size", 7)
    export(trail["uow"], trail["db"], out, tenant=tenant, **kwargs)
    return out


def _cli(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli, ["audit", *args], env=env or {})


def _named(report: Any) -> list[tuple[str | None, int | None]]:
    return [(p.stream, p.seq) for p in report.problems if p.stream is not None]


def _edit_manifest(out: Path, **changes: Any) -> None:
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    manifest.pop("signature", None)
    path.write_text(json.dumps(manifest))


# --- streams, cuts, tenants, emptiness ------------------------------------------------


def test_a_stream_met_again_after_another_is_a_break() -> None:
    checker = ChainChecker(hash_of=lambda r: str(r["hash"]))
    a1 = {"stream": "a", "seq": 1, "prev": GENESIS, "hash": "h1"}
    for record in (a1, {"stream": "b", "seq": 1, "prev": GENESIS, "hash": "g1"}, a1):
        checker.feed(record)
    assert [(b.stream, b.seq) for b in checker.report.breaks] == [("a", 1)]
    assert "appear again after another stream" in checker.report.breaks[0].problem
    assert (checker.report.streams, checker.report.records) == (2, 3)


def test_a_whole_stream_repeated_later_in_an_export_is_found(
    trail: dict[str, Any], tmp_path: Path
) -> None:
    out = _export(trail, tmp_path / "x")
    parts = _lines(out)
    orders = [line for part in parts for line in part if json.loads(line)["stream"] == ACME]
    parts[-1].extend(orders)  # after the thread streams: each seq once more, in order
    _write(out, parts)
    _recompute_manifest(out)
    report = verify_export(out, kept=trail["digest"])
    assert _named(report) == [(ACME, 1)], report.as_dict()
    assert "appear again" in report.problems[0].problem
    assert report.problems[0].location == f"records-00002.jsonl:line {len(parts[-1]) - 11}"


def test_a_cut_forged_in_the_manifest_is_found(trail: dict[str, Any], tmp_path: Path) -> None:
    out = _export(trail, tmp_path / "x")
    parts = _lines(out)
    i, j = _find(parts, ACME, 5)
    fifth = json.loads(parts[i][j])
    parts = [[x for x in p if not (json.loads(x)["stream"] == ACME and json.loads(x)["seq"] < 5)]
             for p in parts]  # fmt: skip
    _write(out, parts)
    _recompute_manifest(out)
    # the cut hashes right (no key is needed for that) and fits where the records start
    cut = {"v": 1, "stream": ACME, "tenant_id": "acme", "n": 1, "seq": 4, "hash": fifth["prev"],
           "prev_cut": GENESIS, "first_seq": 1, "count": 4,
           "first_at": {"$date": "2019-01-01T00:00:00.000Z"},
           "last_at": {"$date": "2019-01-01T00:00:00.000Z"}, "records_digest": GENESIS,
           "at": {"$date": "2026-01-01T00:00:00.000Z"}, "by": "user:nobody"}  # fmt: skip
    cut["cut_hash"] = cut_hash(cut)
    _edit_manifest(out, cuts={ACME: cut})
    report = verify_export(out, kept=trail["digest"])
    assert _named(report) == [(ACME, 5)], report.as_dict()
    assert "audit cut is not recorded in its exported records" in report.problems[0].problem


@pytest.mark.parametrize("heads", [[], None], ids=["no-heads", "link-only"])
def test_an_emptied_export_does_not_verify(
    trail: dict[str, Any], tmp_path: Path, heads: list[Any] | None
) -> None:
    import hashlib

    out = _export(trail, tmp_path / "x")
    for f in out.glob("records-*"):
        f.unlink()
    digests = json.loads((out / "digests.json").read_text())
    digests[-1]["heads"] = heads  # "the tenant had no stream", "here for its link only"
    (out / "digests.json").write_text(json.dumps(digests))
    manifest = json.loads((out / "manifest.json").read_text())
    _edit_manifest(out, files=[], records=0, streams={}, digests_file=dict(
        manifest["digests_file"], sha256=hashlib.sha256((out / "digests.json").read_bytes())
        .hexdigest()))  # fmt: skip
    report = verify_export(out, kept=trail["digest"])
    assert not report.ok
    assert "lists none of the stream heads of tenant 'acme'" in report.problems[0].problem


def test_another_tenants_export_relabelled_is_found(trail: dict[str, Any], tmp_path: Path) -> None:
    out = _export(trail, tmp_path / "g", tenant="globex")
    _edit_manifest(out, tenant="acme")
    report = verify_export(out, kept=trail["digest"])
    problems = [p.problem for p in report.problems]
    assert "digest 1's entry is of tenant 'globex', not the manifest's 'acme'" in problems[0]
    assert "the stream is not of tenant 'acme'" in problems[1]
    # the records alone, relabelled too, still name another tenant
    parts = _lines(out)
    parts = [[x.replace('"tenant_id":"globex"', '"tenant_id":"acme"') for x in p] for p in parts]
    _write(out, parts)
    _recompute_manifest(out)
    assert any("not of tenant 'acme'" in p.problem for p in verify_export(out).problems)
    # the summary says whose export it is
    good = _export(trail, tmp_path / "a")
    result = _cli("verify", str(good), "--digest", str(trail["file"]))
    assert result.exit_code == 0, result.output
    assert f"export {good} of tenant 'acme': 20 records in 3 streams" in result.output
    assert json.loads(_cli("verify", str(good), "--json").stdout)["tenant"] == "acme"


def test_a_duplicate_key_in_a_record_line_is_found(trail: dict[str, Any], tmp_path: Path) -> None:
    out = _export(trail, tmp_path / "x")
    parts = _lines(out)
    i, j = _find(parts, ACME, 4)
    # a first, forged value: a last-wins parser hashes the real one, a reader sees this one
    parts[i][j] = parts[i][j].replace('{"_id":', '{"action":"orders.DELETE_ALL","_id":', 1)
    _write(out, parts)
    _recompute_manifest(out)
    report = verify_export(out, kept=trail["digest"])
    assert _named(report) == [(ACME, 4)], report.as_dict()
    assert "not the record's canonical JSON" in report.problems[0].problem
    assert report.problems[0].location == f"records-0000{i}.jsonl:line {j + 1}"


def test_a_filtered_export_says_what_filtered_it(trail: dict[str, Any], tmp_path: Path) -> None:
    out = _export(trail, tmp_path / "x", artifact="short_term_memory")
    report = verify_export(out, kept=trail["digest"])
    assert report.ok and report.filters == {"class": "short_term_memory"}
    result = _cli("verify", str(out))
    assert result.exit_code == 0, result.output
    assert "(filtered: --class short_term_memory; what the filter left out is not proved" in (
        " ".join(result.output.split())
    )
    assert json.loads(_cli("verify", str(out), "--json").stdout)["filters"] == {
        "class": "short_term_memory"
    }
    full = _export(trail, tmp_path / "full")
    assert "(filtered:" not in _cli("verify", str(full)).output


# --- shapes that crashed the verifiers --------------------------------------------------


def _canonical_line(record: dict[str, Any]) -> str:
    return canonical(record).decode() + "\n"


def test_one_bad_record_is_named_and_the_others_still_checked(
    trail: dict[str, Any], tmp_path: Path
) -> None:
    out = _export(trail, tmp_path / "x")
    parts = _lines(out)
    i, j = _find(parts, ACME, 4)
    record = json.loads(parts[i][j])
    record["images"] = 5  # outside the hash: only its shape can be wrong
    parts[i][j] = _canonical_line(record)
    k, m = _find(parts, T2, 2)
    record = json.loads(parts[k][m])
    record["images"] = {"filter": "{}"}  # one op's images, not a list of them
    parts[k][m] = _canonical_line(record)
    _write(out, parts)
    _recompute_manifest(out)
    report = verify_export(out)
    assert _named(report) == [(ACME, 4), (T2, 2)], report.as_dict()
    assert "its images are not a list" in report.problems[0].problem
    assert report.problems[1].location == f"records-0000{k}.jsonl:line {m + 1}"


def test_unreadable_files_are_named_not_raised(trail: dict[str, Any], tmp_path: Path) -> None:
    out = _export(trail, tmp_path / "x")
    deep = out / "records-00001.jsonl"
    deep.write_text(deep.read_text() + "[" * 100_000 + "]" * 100_000 + "\n")
    (out / "records-00002.jsonl").unlink()
    (out / "records-00002.jsonl").mkdir()
    problems = [p.describe() for p in verify_export(out).problems]
    assert "records-00001.jsonl:line 8: the record is not JSON (nested too deep)" in problems[1]
    assert "file records-00002.jsonl is not a regular file" in problems[2]
    (out / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deep" in verify_export(out).problems[0].problem


def test_a_corrupt_parquet_page_is_named(trail: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("pyarrow", reason="parquet needs the 'export' extra (pyarrow)")
    out = _export(trail, tmp_path / "x", fmt="parquet")
    path = out / "records-00000.parquet"
    data = bytearray(path.read_bytes())
    for at in range(8, len(data) - 8, 37):  # flips in pages, headers and the footer alike
        flipped = bytearray(data)
        flipped[at] ^= 0xFF
        path.write_bytes(bytes(flipped))
        assert not verify_export(out).ok, at
    path.write_bytes(bytes(data[: len(data) // 2]))
    assert any("is not a readable Parquet file" in p.problem for p in verify_export(out).problems)


def test_a_csv_export_of_a_record_over_128_kib_verifies(
    client: MongoClient, db_name: str, tmp_path: Path
) -> None:
    uow = runtime.kernel(client, audit="full")
    uow.execute(Plan(WriteContext("acme", operation="orders.write"), [Group(
        "w", db_name, "orders", "business",
        [Op("insert", doc={"_id": "big", "tenant_id": "acme", "blob": "x" * 200_000})],
    )]))  # fmt: skip
    auditor = _auditor(client)
    write_digest(auditor, db_name)
    out = tmp_path / "csv"
    export(auditor, db_name, out, tenant="acme", fmt="csv")
    report = verify_export(out)
    assert report.ok and report.records == 1, report.as_dict()


# --- versions, the command line ---------------------------------------------------------


def test_unknown_versions_are_refused(trail: dict[str, Any], tmp_path: Path) -> None:
    out = _export(trail, tmp_path / "x")
    _edit_manifest(out, v=99)
    report = verify_export(out, kept=trail["digest"])
    assert "export format version 99, which this verifier does not know" in (
        report.problems[0].problem
    )
    out = _export(trail, tmp_path / "y")
    digests = json.loads((out / "digests.json").read_text())
    digests[0]["digest"]["v"] = 2
    (out / "digests.json").write_text(json.dumps(digests))
    problems = [p.problem for p in verify_export(out).problems]
    assert any("digest 1's content does not hash" in p for p in problems)  # v is hashed
    # re-hashed by whoever edited it (unsigned export): the version is still refused
    from accord.governance.digests import digest_hash

    digests[0]["digest"].pop("signature", None)
    digests[0]["digest"]["hash"] = digest_hash(digests[0]["digest"])
    (out / "digests.json").write_text(json.dumps(digests))
    problems = [p.problem for p in verify_export(out).problems]
    assert any("digest 1 is of version 2, which this verifier does not know" in p
               for p in problems), problems  # fmt: skip


def test_the_verify_command_exits_2_when_it_cannot_run(tmp_path: Path) -> None:
    for target in (tmp_path / "nowhere", tmp_path / "file"):
        if target.name == "file":
            target.write_text("{}")
        result = _cli("verify", str(target), "--json")
        assert result.exit_code == 2, result.output
        assert "is not a directory" in result.output


def test_digest_numbers_out_of_range_are_clear_errors(
    client: MongoClient, trail: dict[str, Any]
) -> None:
    env = {"MONGODB_URI": _uri(client)}
    rid = str(client[trail["db"]][RECORDS].find_one({"tenant_id": "acme"})["_id"])
    db = ["--db", trail["db"]]
    for args in (
        ["prove", rid, *db, "--digest", "99999999999999999999"],
        ["verify", *db, "--from", "1", "--to", "99999999999999999999"],
        ["verify", *db, "--from", "\u00b2", "--to", "1"],  # '²'.isdigit() is true
        ["verify", *db, "--from", "0", "--to", "1"],
    ):
        result = _cli(*args, env=env)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output and "error:" in result.output, result.output
    assert _cli("verify", *db, "--from", "1", "--to", "1", env=env).exit_code == 0


def test_an_unreadable_export_progress_is_a_clear_error(
    client: MongoClient, trail: dict[str, Any], tmp_path: Path
) -> None:
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / PROGRESS).write_text('{"params": ')
    with pytest.raises(InvalidInputError, match="cannot be resumed"):
        _export(trail, torn)
    result = _cli("export", "--db", trail["db"], "--tenant", "acme", "--out", str(torn),
                  env={"MONGODB_URI": _uri(client)})  # fmt: skip
    assert result.exit_code == 2 and "cannot be resumed" in " ".join(result.output.split())
    # a finished part the progress lists, gone
    done = tmp_path / "done"
    _export(trail, done, part_size=100_000)
    params = json.loads((done / "manifest.json").read_text())
    keys = ("db", "tenant", "since", "until", "class", "records_format", "digest", "part_size")
    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / PROGRESS).write_text(json.dumps({
        "params": {k: params[k] for k in keys}, "after": [ACME, 1], "streams": {},
        "parts": [{"name": "records-00000.jsonl", "sha256": "0" * 64, "bytes": 1, "records": 7}],
    }))  # fmt: skip
    with pytest.raises(InvalidInputError, match="a finished part of the unfinished export"):
        _export(trail, gone, part_size=100_000)


# --- the live collection and proofs -----------------------------------------------------


def test_live_verify_names_a_malformed_record_and_head(
    client: MongoClient, trail: dict[str, Any]
) -> None:
    env = {"MONGODB_URI": _uri(client)}
    db = trail["db"]
    # what an administrator can write past the validator (images are outside the hash)
    client[db][RECORDS].update_one({"stream": ACME, "seq": 3}, {"$set": {"images": 5}},
                                   bypass_document_validation=True)  # fmt: skip
    client[db][HEADS].update_one({"_id": T2}, {"$set": {"seq": "five"}},
                                 bypass_document_validation=True)  # fmt: skip
    result = _cli("verify", "--live", "--db", db, "--json", env=env)
    assert result.exit_code == 1, result.output
    breaks = {(b["stream"], b["seq"]): b["problem"] for b in json.loads(result.stdout)["breaks"]}
    assert breaks == {(ACME, 3): "its images are not a list (altered)",
                      (T2, None): "its head is malformed (altered)"}  # fmt: skip


def test_live_verify_of_a_tenant_whose_name_json_escapes(
    client: MongoClient, db_name: str, tmp_path: Path
) -> None:
    tenant = 'o"ne\\il'
    write(client, db_name, tenant, 0, 4)
    kept = tmp_path / "d.json"
    kept.write_text(json.dumps(external(write_digest(_auditor(client), db_name))))
    records = client[db_name][RECORDS]
    stream = records.find_one({"tenant_id": tenant})["stream"]
    prev = None
    for r in records.find({"stream": stream}, sort=[("seq", 1)]):  # rewritten, re-hashed
        if r["seq"] >= 2:
            r.update(prev=prev, principal=dict(r["principal"], name="mallory"))
            r["hash"] = chain_hash(r)
            records.replace_one({"_id": r["_id"]}, r)
        prev = r["hash"]
    client[db_name][HEADS].update_one({"_id": stream}, {"$set": {"hash": prev}})
    result = _cli("verify", "--live", "--db", db_name, "--tenant", tenant, "--digest", str(kept),
                  "--json", env={"MONGODB_URI": _uri(client)})  # fmt: skip
    assert result.exit_code == 1, result.output
    assert [b["stream"] for b in json.loads(result.stdout)["breaks"]] == [stream]


def test_a_proof_carrying_another_record_than_it_names_fails(
    client: MongoClient, trail: dict[str, Any]
) -> None:
    records = client[trail["db"]][RECORDS]
    fourth, fifth = (records.find_one({"stream": ACME, "seq": s}) for s in (4, 5))
    proof = prove(trail["uow"], trail["db"], str(fourth["_id"]))
    assert check_proof(proof, digest=trail["digest"]) is None
    proof["record_id"] = str(fifth["_id"])  # the _id is outside the record's hash
    problem = check_proof(proof, digest=trail["digest"])
    assert problem is not None and "carries record" in problem
    # an id given in capitals names the same record: the proof holds
    proof = prove(trail["uow"], trail["db"], str(fourth["_id"]).upper())
    assert proof["record_id"] == str(fourth["_id"])
    assert check_proof(proof, digest=trail["digest"]) is None
