"""The compliance export and its offline verification (issue 24's acceptance):

- an untouched export (jsonl, csv, parquet when pyarrow is installed) verifies from its
  files alone, signed manifest and digests included, through ``accord audit verify DIR``;
- one changed byte, a deleted record, an inserted forged record, two swapped records and
  a truncated tail are each found and the record named (stream, seq, id, file:line),
  both as is and with the manifest's hashes, counts and ranges recomputed;
- a history rewritten with every hash recomputed is caught by the digests in the export,
  and once those are recomputed too, by the digest kept outside or the pinned key;
- an export interrupted mid-part and run again is byte for byte the uninterrupted one;
- the same tampering on the live collection, with heads recomputed, is found by
  ``verify --live --digest``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pymongo import MongoClient
from typer.testing import CliRunner

from accord import runtime
from accord.governance import export as export_module
from accord.governance.audit_records import HEADS, RECORDS, chain_hash
from accord.governance.canonical import canonical
from accord.governance.digests import external, write_digest
from accord.governance.export import export
from accord.governance.export_verify import verify_export
from accord.governance.signing import generate, load_private, load_public
from accord.platform.cli import app as cli
from accord.platform.context import AUDITOR, Principal
from tests.governance.test_audit_digests import write

ACME = '["acme","collection","orders"]'


def assert_same_export(whole: Path, resumed: Path) -> None:
    """``resumed`` holds the files of ``whole``, byte for byte (the manifest but for its
    ``generated_at``)."""
    names = sorted(p.name for p in whole.iterdir())
    assert names == sorted(p.name for p in resumed.iterdir())
    for name in names:
        a, b = (whole / name).read_bytes(), (resumed / name).read_bytes()
        if name == "manifest.json":
            a_doc, b_doc = json.loads(a), json.loads(b)
            a_doc.pop("generated_at"), b_doc.pop("generated_at")
            assert a_doc == b_doc
        else:
            assert a == b, name


def _uri(client: MongoClient) -> str:
    host, port = client.address  # type: ignore[misc]
    return f"mongodb://{host}:{port}/?directConnection=true"


def _auditor(client: MongoClient) -> Any:
    return runtime.kernel(client, principal=Principal.service(AUDITOR), audit="metadata")


@pytest.fixture()
def trail(client: MongoClient, db_name: str, tmp_path: Path) -> dict[str, Any]:
    """acme: 12 orders and two threads; globex: 4 orders; a signed digest."""
    write(client, db_name, "acme", 0, 12)
    write(client, db_name, "acme", 0, 5, thread="t1")
    write(client, db_name, "acme", 0, 3, thread="t2")
    write(client, db_name, "globex", 0, 4)
    generate(tmp_path / "k")
    uow = _auditor(client)
    digest = external(write_digest(uow, db_name, key=load_private(tmp_path / "k")))
    return {"uow": uow, "digest": digest, "public": load_public(tmp_path / "k.pub"),
            "key": load_private(tmp_path / "k")}  # fmt: skip


def _export(trail: dict[str, Any], db: str, out: Path, **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("part_size", 7)
    return export(trail["uow"], db, out, tenant="acme", **kwargs)


def test_an_untouched_export_verifies_offline(
    client: MongoClient, db_name: str, trail: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "x"
    manifest = _export(trail, db_name, out, key=trail["key"])
    assert manifest["records"] == 20 and len(manifest["files"]) == 3  # 7 + 7 + 6
    assert manifest["streams"][ACME] == {
        "first_seq": 1, "first_prev": "0" * 64, "last_seq": 12, "count": 12,
        "last_hash": client[db_name][RECORDS].find_one({"stream": ACME, "seq": 12})["hash"],
    }  # fmt: skip
    assert manifest["generator"].startswith("accord ") and manifest["signature"]
    lines = [json.loads(x) for f in sorted(out.glob("records-*.jsonl")) for x in f.open()]
    assert all(r["tenant_id"] == "acme" for r in lines) and len(lines) == 20
    report = verify_export(out, kept=trail["digest"], pinned=trail["public"])
    assert report.ok, [p.describe() for p in report.problems]
    assert (report.records, report.streams, report.digests) == (20, 3, 1)
    # the database is not needed: a copy elsewhere verifies through the CLI
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (tmp_path / "d.json").write_text(json.dumps(trail["digest"]))
    (tmp_path / "k.pub").exists()
    result = CliRunner().invoke(cli, ["audit", "verify", str(copy), "--digest",
                                      str(tmp_path / "d.json"), "--public-key",
                                      str(tmp_path / "k.pub"), "--json"], env={})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ok"] is True
    # a signed manifest changed by anyone without the key
    manifest_path = copy / "manifest.json"
    changed = json.loads(manifest_path.read_text())
    changed["tenant"] = "globex"
    manifest_path.write_text(json.dumps(changed))
    report = verify_export(copy, pinned=trail["public"])
    assert "manifest.json: the signature" in report.problems[0].problem


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_csv_and_parquet_exports_verify_and_their_columns_are_checked(
    db_name: str, trail: dict[str, Any], tmp_path: Path, fmt: str
) -> None:
    if fmt == "parquet":
        pytest.importorskip("pyarrow", reason="parquet needs the 'export' extra (pyarrow)")
    out = tmp_path / fmt
    manifest = _export(trail, db_name, out, fmt=fmt)
    assert [f["name"] for f in manifest["files"]] == [f"records-0000{i}.{fmt}" for i in range(3)]
    assert verify_export(out, kept=trail["digest"]).ok
    if fmt == "csv":  # a column changed, the record column left alone
        path = out / "records-00000.csv"
        text = path.read_text().replace(",orders.write,", ",orders.erased,", 1)
        path.write_text(text)
        report = verify_export(out)
        named = [p for p in report.problems if p.stream]
        assert "action column(s) disagree" in named[0].problem
        assert named[0].location == "records-00000.csv:line 2"


# --- tampering -----------------------------------------------------------------------


def _lines(out: Path) -> list[list[str]]:
    return [f.read_text().splitlines(keepends=True) for f in sorted(out.glob("records-*.jsonl"))]


def _write(out: Path, parts: list[list[str]]) -> None:
    for f, lines in zip(sorted(out.glob("records-*.jsonl")), parts, strict=True):
        f.write_text("".join(lines))


def _find(parts: list[list[str]], stream: str, seq: int) -> tuple[int, int]:
    for i, lines in enumerate(parts):
        for j, line in enumerate(lines):
            r = json.loads(line)
            if (r["stream"], r["seq"]) == (stream, seq):
                return i, j
    raise AssertionError((stream, seq))


def _recompute_manifest(out: Path) -> None:
    """What an attacker without the key can do: make the manifest match the files."""
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    streams: dict[str, Any] = {}
    total = 0
    for info in manifest["files"]:
        data = (out / info["name"]).read_bytes()
        records = [json.loads(x) for x in data.splitlines()]
        info.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data), records=len(records))
        total += len(records)
        for r in records:
            s = streams.setdefault(r["stream"], {"first_seq": r["seq"], "first_prev": r["prev"],
                                                 "count": 0})  # fmt: skip
            s.update(last_seq=r["seq"], last_hash=r["hash"], count=s["count"] + 1)
    digests = (out / "digests.json").read_bytes()
    manifest["digests_file"]["sha256"] = hashlib.sha256(digests).hexdigest()
    manifest.update(records=total, streams=streams)
    manifest.pop("signature", None)
    path.write_text(json.dumps(manifest))


def _change_byte(parts: list[list[str]]) -> None:
    i, j = _find(parts, ACME, 4)
    parts[i][j] = parts[i][j].replace('"orders.write"', '"orders.writE"')


def _delete(parts: list[list[str]]) -> None:
    i, j = _find(parts, ACME, 6)
    del parts[i][j]


def _forge(parts: list[list[str]]) -> None:
    """A forged record after seq 3 that hashes right and links to seq 3."""
    i, j = _find(parts, ACME, 3)
    third = json.loads(parts[i][j])
    forged = dict(third, seq=4, prev=third["hash"], action="orders.forged",
                  _id={"$oid": "f" * 24})  # fmt: skip
    forged["hash"] = chain_hash(forged)
    parts[i].insert(j + 1, canonical(forged).decode() + "\n")


def _swap(parts: list[list[str]]) -> None:
    i, j = _find(parts, ACME, 7)
    k, m = _find(parts, ACME, 8)
    parts[i][j], parts[k][m] = parts[k][m], parts[i][j]


def _truncate(parts: list[list[str]]) -> None:
    for seq in (12, 11):
        i, j = _find(parts, ACME, seq)
        del parts[i][j]


TAMPER: dict[str, tuple[Callable[[list[list[str]]], None], int, str]] = {
    "one changed byte": (_change_byte, 4, "altered"),
    "a deleted record": (_delete, 6, "a record is missing"),
    "an inserted forged record": (_forge, 5, "appears twice, the other is record ffffffff"),
    "two swapped records": (_swap, 7, "a record is missing"),
    "a truncated tail": (_truncate, 11, "records after seq 10 are missing"),
}


@pytest.mark.parametrize("recompute", [False, True], ids=["as-is", "manifest-recomputed"])
@pytest.mark.parametrize("kind", list(TAMPER))
def test_tampering_an_export_is_found_naming_the_record(
    db_name: str, trail: dict[str, Any], tmp_path: Path, kind: str, recompute: bool
) -> None:
    out = tmp_path / "x"
    _export(trail, db_name, out)
    tamper, seq, words = TAMPER[kind]
    parts = _lines(out)
    tamper(parts)
    _write(out, parts)
    if recompute:
        _recompute_manifest(out)
    report = verify_export(out, kept=trail["digest"])
    assert not report.ok
    named = [p for p in report.problems if p.stream is not None]
    assert [(p.stream, p.seq) for p in named] == [(ACME, seq)], report.as_dict()
    assert words in named[0].problem or words in named[0].describe()
    files = [p for p in report.problems if "does not hash to the manifest" in p.problem]
    assert bool(files) is not recompute  # the file hashes only catch a lazy attacker
    if kind != "a truncated tail":
        assert named[0].location is not None and named[0].location.startswith("records-")
    result = CliRunner().invoke(cli, ["audit", "verify", str(out), "--json"], env={})
    assert result.exit_code == 1
    assert [(p["stream"], p["seq"]) for p in json.loads(result.stdout)["problems"]
            if p["stream"]] == [(ACME, seq)]  # fmt: skip


def test_a_rewritten_history_is_caught_by_the_digests_and_the_digest_kept(
    db_name: str, trail: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "x"
    _export(trail, db_name, out)
    parts = _lines(out)
    prev = None
    for i, lines in enumerate(parts):  # rewrite seq 4 and re-chain everything after it
        for j, line in enumerate(lines):
            r = json.loads(line)
            if r["stream"] != ACME or r["seq"] < 4:
                continue
            if r["seq"] == 4:
                r["action"] = "orders.rewritten"
            else:
                r["prev"] = prev
            r["hash"] = prev = chain_hash(r)
            parts[i][j] = canonical(r).decode() + "\n"
    _write(out, parts)
    _recompute_manifest(out)
    report = verify_export(out)
    assert [(p.stream, p.seq) for p in report.problems] == [(ACME, 12)]
    assert "digest 1 holds another hash" in report.problems[0].problem

    # the attacker edits the digest's heads in the export: the root no longer matches
    digests_path = out / "digests.json"
    digests = json.loads(digests_path.read_text())
    for head in digests[0]["heads"]:
        if head[0] == ACME:
            head[2] = prev
    digests_path.write_text(json.dumps(digests))
    _recompute_manifest(out)
    assert "do not rebuild its Merkle root" in verify_export(out).problems[0].problem

    # ... and recomputes the digest itself: only the digest kept outside (or the key) tells
    from accord.governance.digests import HeadTree, digest_hash

    entry = digests[0]
    from accord.governance.digests import Head

    tree = HeadTree({s: Head("acme", seq, h) for s, seq, h in entry["heads"]})
    index, size, path = tree.tenant_path("acme")
    entry.update(tenant_index=index, tenants=size, tenant_path=path)
    entry["digest"]["root"] = tree.root
    entry["digest"]["hash"] = digest_hash(entry["digest"])
    entry["digest"].pop("signature")
    digests_path.write_text(json.dumps(digests))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["digest"]["hash"] = entry["digest"]["hash"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    _recompute_manifest(out)
    assert verify_export(out).ok  # without anything kept outside, a full rewrite passes
    report = verify_export(out, kept=trail["digest"])
    assert "is not the digest kept" in report.problems[0].problem
    report = verify_export(out, pinned=trail["public"])
    assert "not signed" in report.problems[0].problem


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_an_interrupted_export_resumes_to_the_same_bytes(
    db_name: str, trail: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    fmt: str,
) -> None:  # fmt: skip
    if fmt == "parquet":
        pytest.importorskip("pyarrow", reason="parquet needs the 'export' extra (pyarrow)")
    whole = tmp_path / "whole"
    _export(trail, db_name, whole, part_size=4, fmt=fmt)
    resumed = tmp_path / "resumed"
    real_add = export_module._Part.add
    calls = {"n": 0}

    def crash_on_the_11th(self: Any, records: Any) -> None:  # records come in batches
        calls["n"] += len(records)
        if calls["n"] > 10:  # mid-part: parts 0 and 1 are done, part 2 half written
            real_add(self, records[: len(records) - (calls["n"] - 10)])
            raise KeyboardInterrupt
        real_add(self, records)

    monkeypatch.setattr(export_module._Part, "add", crash_on_the_11th)
    with pytest.raises(KeyboardInterrupt):
        _export(trail, db_name, resumed, part_size=4, fmt=fmt)
    monkeypatch.setattr(export_module._Part, "add", real_add)
    assert (resumed / ".export-progress.json").exists()
    assert not (resumed / "manifest.json").exists()
    with open(resumed / f"records-00002.{fmt}", "ab") as f:
        f.write(b'{"half a record')  # a crash's torn write
    # other arguments are refused, not mixed in
    with pytest.raises(Exception, match="other arguments"):
        _export(trail, db_name, resumed, part_size=5, fmt=fmt)
    _export(trail, db_name, resumed, part_size=4, fmt=fmt)
    assert_same_export(whole, resumed)
    assert verify_export(resumed, kept=trail["digest"]).ok


def test_since_starts_each_stream_later_and_until_picks_an_earlier_digest(
    client: MongoClient, db_name: str, trail: dict[str, Any], tmp_path: Path
) -> None:
    import time
    from datetime import UTC, datetime

    time.sleep(0.01)
    since = datetime.now(UTC)
    time.sleep(0.01)
    write(client, db_name, "acme", 12, 3)  # orders 13..15, after `since`
    second = external(write_digest(trail["uow"], db_name))
    out = tmp_path / "since"
    manifest = _export(trail, db_name, out, since=since)
    assert manifest["digest"]["seq"] == 2
    assert {s: (v["first_seq"], v["last_seq"]) for s, v in manifest["streams"].items()} == {
        ACME: (13, 15)
    }  # the threads wrote nothing since: not exported
    assert verify_export(out, kept=second).ok
    # with --since, a stream's first record links to the manifest's first_prev
    path = out / "manifest.json"
    changed = json.loads(path.read_text())
    changed["streams"][ACME]["first_prev"] = "e" * 64
    path.write_text(json.dumps(changed))
    report = verify_export(out, kept=second)
    assert [(p.stream, p.seq) for p in report.problems] == [(ACME, 13)]
    assert "prev" in report.problems[0].problem
    # --until before the second digest: covered by the first, up to its heads
    until = datetime.fromisoformat(trail["digest"]["at"].replace("Z", "+00:00"))
    out = tmp_path / "until"
    manifest = _export(trail, db_name, out, until=until)
    assert manifest["digest"]["seq"] == 1 and manifest["streams"][ACME]["last_seq"] == 12
    report = verify_export(out, kept=trail["digest"])
    assert report.ok, report.as_dict()
    # the later digest kept outside says the export stops short of it
    report = verify_export(out, kept=second)
    assert "does not reach the digest kept" in report.problems[0].problem


def test_digests_that_left_the_tenant_alone_are_exported_for_their_link(
    client: MongoClient, db_name: str, trail: dict[str, Any], tmp_path: Path
) -> None:
    write(client, db_name, "globex", 4, 2)
    write_digest(trail["uow"], db_name)  # 2: globex moved, acme did not
    write(client, db_name, "acme", 12, 1)
    last = external(write_digest(trail["uow"], db_name))  # 3
    out = tmp_path / "x"
    _export(trail, db_name, out)
    digests = json.loads((out / "digests.json").read_text())
    assert [e["heads"] is None for e in digests] == [False, True, False]
    assert verify_export(out, kept=last).ok
    # a digest in the middle removed: the links break
    del digests[1]
    (out / "digests.json").write_text(json.dumps(digests))
    _recompute_manifest(out)
    assert "does not link" in verify_export(out).problems[0].problem
    # a file of another shape fails, naming what could not be read
    (out / "digests.json").write_text("[1]")
    _recompute_manifest(out)
    assert "malformed" in verify_export(out).problems[0].problem


def test_the_export_command_filters_and_needs_a_digest(
    client: MongoClient, db_name: str, trail: dict[str, Any], tmp_path: Path
) -> None:
    env = {"MONGODB_URI": _uri(client)}
    out = tmp_path / "cls"
    result = CliRunner().invoke(cli, ["audit", "export", "--db", db_name, "--tenant", "acme",
                                      "--class", "short_term_memory", "--out", str(out)],
                                env=env)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "exported 8 records of tenant 'acme' in 2 streams" in result.output
    assert verify_export(out).ok
    result = CliRunner().invoke(cli, ["audit", "export", "--db", db_name, "--tenant", "acme",
                                      "--until", "2000-01-01", "--out", str(tmp_path / "u")],
                                env=env)  # fmt: skip
    assert result.exit_code == 2
    assert "run `accord audit digest` first" in " ".join(result.output.split())


# --- the live collection -------------------------------------------------------------


def _live(client: MongoClient, db: str, digest_file: Path) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["audit", "verify", "--live", "--db", db, "--tenant", "acme",
                                      "--digest", str(digest_file), "--json"],
                                env={"MONGODB_URI": _uri(client)})  # fmt: skip
    assert result.exit_code in (0, 1), result.output
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def _rehead(client: MongoClient, db: str) -> None:
    """The attacker's recomputation on the live side: the head names the last record."""
    last = client[db][RECORDS].find_one({"stream": ACME}, sort=[("seq", -1)])
    client[db][HEADS].update_one({"_id": ACME}, {"$set": {"seq": last["seq"],
                                                          "hash": last["hash"]}})  # fmt: skip


def _live_change(records: Any) -> None:
    records.update_one({"stream": ACME, "seq": 4}, {"$set": {"principal.name": "mallory"}})


def _live_delete(records: Any) -> None:
    records.delete_one({"stream": ACME, "seq": 6})


def _live_forge(records: Any) -> None:
    third = records.find_one({"stream": ACME, "seq": 3})
    third.pop("_id")
    forged = dict(third, seq=4, prev=third["hash"], action="orders.forged")
    forged["hash"] = chain_hash(forged)
    records.insert_one(forged)


def _live_swap(records: Any) -> None:
    a = records.find_one({"stream": ACME, "seq": 7})
    b = records.find_one({"stream": ACME, "seq": 8})
    records.update_one({"_id": a["_id"]}, {"$set": {"seq": 8}})
    records.update_one({"_id": b["_id"]}, {"$set": {"seq": 7}})


def _live_truncate(records: Any) -> None:
    records.delete_many({"stream": ACME, "seq": {"$gte": 11}})


LIVE: dict[str, tuple[Callable[[Any], None], list[int], str]] = {
    "one changed field": (_live_change, [4], "altered"),
    "a deleted record": (_live_delete, [6], "missing"),
    # the forged seq 4 sorts after the real one: the chain breaks where it stands
    "an inserted forged record": (_live_forge, [4, 5], "out of place"),
    "two swapped records": (_live_swap, [7], "prev"),
    # as is, the head names seq 12 and the chain stops at 10; head recomputed, only the
    # digest kept still holds seq 12
    "a truncated tail": (_live_truncate, [11, 12], "remove"),
}


@pytest.mark.parametrize("rehead", [False, True], ids=["as-is", "head-recomputed"])
@pytest.mark.parametrize("kind", list(LIVE))
def test_tampering_the_live_collection_is_found_with_the_digest_kept(
    client: MongoClient, db_name: str, trail: dict[str, Any], tmp_path: Path, kind: str,
    rehead: bool,
) -> None:  # fmt: skip
    kept = tmp_path / "d.json"
    kept.write_text(json.dumps(trail["digest"]))
    assert _live(client, db_name, kept)["ok"] is True
    tamper, seqs, words = LIVE[kind]
    tamper(client[db_name][RECORDS])
    if rehead:
        _rehead(client, db_name)
    found = _live(client, db_name, kept)
    assert not found["ok"]
    named = [(b["stream"], b["seq"]) for b in found["breaks"]]
    assert len(named) == 1 and named[0][0] == ACME and named[0][1] in seqs, found
    problem = found["breaks"][0]["problem"]
    assert words in problem, problem


@given(st.lists(st.fixed_dictionaries({
    "action": st.text(max_size=8), "seq": st.integers(), "thread_id": st.text(max_size=3),
    "record": st.dictionaries(st.text(max_size=4), st.text(max_size=6), max_size=3).map(
        lambda d: canonical(d).decode()) | st.text(max_size=8),
}), max_size=4))  # fmt: skip
def test_csv_rows_are_the_bytes_csv_writes(values: list[dict[str, Any]]) -> None:
    """The export's CSV lines (the record column quoted by hand) are csv.writer's."""
    import csv
    import io

    rows = [{c: v.get(c, f'{c},"x"') for c in export_module.COLUMNS} for v in values]
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(
        [[r[c] for c in export_module.COLUMNS] for r in rows]
    )
    assert export_module._csv_rows(rows) == buffer.getvalue().encode()
