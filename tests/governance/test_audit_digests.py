"""Digests, inclusion proofs and extension checks (docs/governance.md, "Digests"):

- the RFC 6962 tree against hand-computed roots, and its audit paths for every leaf of
  trees of 1 to 17 leaves (a wrong index, leaf or path fails);
- ``accord audit digest`` stores a numbered, chained, signed digest and prints it; the
  digest collections take inserts only;
- an inclusion proof verifies, and fails for a forged or altered record, a record moved
  to another stream, a wrong key and a digest other than the one kept;
- ``verify --from A --to B`` holds after more writes, and fails once history before A is
  rewritten, even with every later hash and head recomputed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient
from typer.testing import CliRunner

from accord import runtime
from accord.errors import PermissionDenied
from accord.governance import merkle
from accord.governance.audit_records import HEADS, RECORDS, chain_hash
from accord.governance.digests import DIGEST_HEADS, DIGESTS, external, write_digest
from accord.governance.proofs import check_extends, check_proof, prove
from accord.governance.signing import generate, load_private, load_public
from accord.platform.cli import app as cli
from accord.platform.context import AUDITOR, Principal, WriteContext
from accord.platform.plan import Group, Op, Plan

ACME = '["acme","collection","orders"]'


def _uri(client: MongoClient) -> str:
    host, port = client.address  # type: ignore[misc]
    return f"mongodb://{host}:{port}/?directConnection=true"


def write(client: MongoClient, db: str, tenant: str, start: int, n: int, thread: str = "") -> None:
    """``n`` audited writes of ``tenant`` (a thread's messages when ``thread``)."""
    uow = runtime.kernel(client, audit="metadata")
    for i in range(start, start + n):
        if thread:
            ctx = WriteContext(tenant, thread_id=thread, operation="messages.write")
            group = Group("m", db, "short_term_memory", "short_term_memory", [
                Op("insert", doc={"_id": f"{thread}-{i}", "tenant_id": tenant, "n": i})])  # fmt: skip
        else:
            ctx = WriteContext(tenant, operation="orders.write")
            group = Group("w", db, "orders", "business", [
                Op("insert", doc={"_id": f"{tenant}-{i}", "tenant_id": tenant, "n": i})])  # fmt: skip
        uow.execute(Plan(ctx, [group]))


def _auditor(client: MongoClient) -> Any:
    return runtime.kernel(client, principal=Principal.service(AUDITOR), audit="metadata")


# --- the tree ------------------------------------------------------------------------


def _h(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


def test_the_tree_is_rfc_6962s() -> None:
    a, b, c = (merkle.leaf_hash(x) for x in (b"a", b"b", b"c"))
    assert a == _h(b"\x00a")
    assert merkle.root([]) == _h(b"")
    assert merkle.root([a]) == a
    # three leaves: the left subtree holds two (the largest power of two below 3)
    assert merkle.root([a, b, c]) == _h(b"\x01" + _h(b"\x01" + a + b) + c)


@pytest.mark.parametrize("size", range(1, 18))
def test_every_leafs_audit_path_proves_it_and_nothing_else(size: int) -> None:
    leaves = [merkle.leaf_hash(str(i).encode()) for i in range(size)]
    top = merkle.root(leaves)
    for i in range(size):
        path = merkle.inclusion_path(i, leaves)
        assert merkle.root_from_path(i, size, leaves[i], path) == top
        other = merkle.leaf_hash(b"forged")
        assert merkle.root_from_path(i, size, other, path) != top
        if size > 1:
            assert merkle.root_from_path((i + 1) % size, size, leaves[i], path) != top
            assert merkle.root_from_path(i, size, leaves[i], path[:-1]) != top
    assert merkle.root_from_path(size, size, leaves[0], []) is None


# --- digests -------------------------------------------------------------------------


def test_digests_are_numbered_chained_signed_and_printed(
    client: MongoClient, db_name: str, tmp_path: Path
) -> None:
    write(client, db_name, "acme", 0, 3)
    write(client, db_name, "globex", 0, 2, thread="t1")
    key_path = tmp_path / "audit.key"
    result = CliRunner().invoke(cli, ["audit", "keygen", str(key_path)])
    assert result.exit_code == 0, result.output
    assert (key_path.stat().st_mode & 0o777) == 0o600
    env = {"MONGODB_URI": _uri(client)}
    out = tmp_path / "d1.json"
    result = CliRunner().invoke(cli, ["audit", "digest", "--db", db_name, "--key",
                                      str(key_path), "--out", str(out)], env=env)  # fmt: skip
    assert result.exit_code == 0, result.output
    first = json.loads(out.read_text())
    assert json.loads(result.stdout) == first
    heads = list(client[db_name][HEADS].find())  # acme's, globex's t1 and the catalog's
    assert {h["tenant_id"] for h in heads} == {"acme", "globex", "*"}
    assert (first["seq"], first["tenants"], first["streams"]) == (1, 3, 3)
    assert first["records"] == sum(h["seq"] for h in heads)
    assert first["signature"]["alg"] == "Ed25519"
    stored = client[db_name][DIGESTS].find_one({"_id": 1})
    assert external(stored) == first
    # only the heads that changed are stored again
    write(client, db_name, "acme", 3, 1)
    second = write_digest(_auditor(client), db_name)
    assert (second["seq"], second["prev"]) == (2, first["hash"])
    assert second["records"] == first["records"] + 1
    assert client[db_name][DIGEST_HEADS].count_documents({"digest": 2}) == 1
    assert "signature" not in second
    # inserts only, for everybody
    uow = runtime.kernel(client, principal=Principal.os_user(), audit="metadata")
    with pytest.raises(PermissionDenied):
        uow.execute(Plan(WriteContext("*", operation="tamper"), [Group(
            "u", db_name, DIGESTS, "audit_digest", [Op("update", {"_id": 1},
                                                          {"$set": {"root": "0" * 64}})])]))  # fmt: skip


def test_an_inclusion_proof_verifies_and_fails_for_a_forged_record(
    client: MongoClient, db_name: str, tmp_path: Path
) -> None:
    write(client, db_name, "acme", 0, 6)
    write(client, db_name, "globex", 0, 3)
    for t in ("t1", "t2", "t3"):
        write(client, db_name, "acme", 0, 2, thread=t)
    generate(tmp_path / "k")
    key, public = load_private(tmp_path / "k"), load_public(tmp_path / "k.pub")
    uow = _auditor(client)
    digest = write_digest(uow, db_name, key=key)
    third = client[db_name][RECORDS].find_one({"stream": ACME, "seq": 3})
    proof = prove(uow, db_name, str(third["_id"]))
    assert [r["seq"] for r in proof["chain"]] == [4, 5, 6]
    assert check_proof(proof) is None
    assert check_proof(proof, digest=external(digest), pinned=public) is None

    def broken(change: Any) -> str | None:
        forged = json.loads(json.dumps(proof))
        change(forged)
        return check_proof(forged, pinned=public)

    def alter(p: dict[str, Any]) -> None:
        p["record"]["principal"]["name"] = "mallory"

    assert "altered" in str(broken(alter))

    def forge(p: dict[str, Any]) -> None:  # a forged record that hashes right
        p["record"]["action"] = "orders.forged"
        p["record"]["hash"] = chain_hash(p["record"])

    assert "does not link" in str(broken(forge))

    def rechain(p: dict[str, Any]) -> None:  # ... and every later hash recomputed
        forge(p)
        last = p["record"]
        for link in p["chain"]:
            link["prev"] = last["hash"]
            link["hash"] = chain_hash(link)
            last = link
        p["head"] = {"seq": last["seq"], "hash": last["hash"]}

    assert "not in the digest's Merkle tree" in str(broken(rechain))

    def drop(p: dict[str, Any]) -> None:
        del p["chain"][1]

    assert "skips or reorders" in str(broken(drop))

    def other_root(p: dict[str, Any]) -> None:  # a digest of the forger's own
        p["digest"]["root"] = "ab" * 32

    assert "altered" in str(broken(other_root))
    generate(tmp_path / "other")
    assert "not by the pinned key" in str(
        check_proof(proof, pinned=load_public(tmp_path / "other.pub"))
    )
    # a thread's record, proved through the CLI and checked from files
    record = client[db_name][RECORDS].find_one({"thread_id": "t2", "seq": 1})
    env = {"MONGODB_URI": _uri(client)}
    result = CliRunner().invoke(cli, ["audit", "prove", str(record["_id"]), "--db", db_name],
                                env=env)  # fmt: skip
    assert result.exit_code == 0, result.output
    (tmp_path / "proof.json").write_text(result.stdout)
    (tmp_path / "digest.json").write_text(json.dumps(external(digest)))
    result = CliRunner().invoke(cli, ["audit", "verify", "--proof", str(tmp_path / "proof.json"),
                                      "--digest", str(tmp_path / "digest.json"),
                                      "--public-key", str(tmp_path / "k.pub")])  # fmt: skip
    assert result.exit_code == 0, result.output
    # a record written after the digest has no proof against it
    write(client, db_name, "acme", 6, 1)
    late = client[db_name][RECORDS].find_one({"stream": ACME, "seq": 7})
    result = CliRunner().invoke(cli, ["audit", "prove", str(late["_id"]), "--db", db_name],
                                env=env)  # fmt: skip
    assert result.exit_code == 2 and "newer than digest 1" in result.output


def test_a_later_digest_extends_an_earlier_one_until_history_is_rewritten(
    client: MongoClient, db_name: str, tmp_path: Path
) -> None:
    write(client, db_name, "acme", 0, 5)
    write(client, db_name, "globex", 0, 2, thread="t1")
    uow = _auditor(client)
    a = external(write_digest(uow, db_name))
    write(client, db_name, "acme", 5, 3)
    write(client, db_name, "initech", 0, 2)
    write_digest(uow, db_name)
    b = external(write_digest(uow, db_name))  # three digests: the middle one links them
    report = check_extends(uow, db_name, a, b)
    assert report.ok, report.problems
    assert report.streams == 2
    env = {"MONGODB_URI": _uri(client)}
    (tmp_path / "a.json").write_text(json.dumps(a))
    result = CliRunner().invoke(cli, ["audit", "verify", "--db", db_name, "--from",
                                      str(tmp_path / "a.json"), "--to", "3"], env=env)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "digest 3 extends digest 1" in result.output

    # a DBA rewrites record 2 of acme's stream and recomputes every later hash and the head
    records = client[db_name][RECORDS]
    prev = records.find_one({"stream": ACME, "seq": 1})["hash"]
    for doc in records.find({"stream": ACME, "seq": {"$gte": 2}}).sort("seq", 1):
        if doc["seq"] == 2:
            doc["action"] = "orders.rewritten"
        doc["prev"] = prev
        doc["hash"] = prev = chain_hash(doc)
        records.replace_one({"_id": doc["_id"]}, doc)
    client[db_name][HEADS].update_one({"_id": ACME}, {"$set": {"hash": prev}})
    report = check_extends(uow, db_name, a, b)
    assert [(p.stream, p.seq) for p in report.problems] == [(ACME, 5)]
    assert "rewritten" in report.problems[0].problem
    result = CliRunner().invoke(cli, ["audit", "verify", "--db", db_name, "--json", "--from",
                                      str(tmp_path / "a.json"), "--to", "3"], env=env)  # fmt: skip
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["problems"][0]["stream"] == ACME
    # ... and, to hide it, the stored digests and their heads too: the digest kept outside
    # no longer matches the database's
    client[db_name][DIGEST_HEADS].update_many({"stream": ACME}, {"$set": {"hash": prev}})
    report = check_extends(uow, db_name, a, b)
    assert not report.ok
    assert "not the ones its root commits to" in report.problems[0].problem


def test_digests_at_intervals_each_to_its_own_file(
    client: MongoClient, db_name: str, tmp_path: Path
) -> None:
    write(client, db_name, "acme", 0, 2)
    env = {"MONGODB_URI": _uri(client)}
    result = CliRunner().invoke(cli, ["audit", "digest", "--db", db_name, "--every", "0.05s",
                                      "--count", "3", "--out", str(tmp_path / "d-{seq}.json")],
                                env=env)  # fmt: skip
    assert result.exit_code == 0, result.output
    files = sorted(tmp_path.glob("d-*.json"))
    assert [f.name for f in files] == ["d-000001.json", "d-000002.json", "d-000003.json"]
    kept = [json.loads(f.read_text()) for f in files]
    assert [d["prev"] for d in kept[1:]] == [d["hash"] for d in kept[:-1]]
    result = CliRunner().invoke(cli, ["audit", "digest", "--db", db_name, "--every", "soon"],
                                env=env)  # fmt: skip
    assert result.exit_code == 2 and "--every" in result.output
    # a directory that is not there: refused before a digest is taken (was a traceback
    # after digest 4 was stored)
    missing = str(tmp_path / "nowhere" / "d-{seq}.json")
    result = CliRunner().invoke(cli, ["audit", "digest", "--db", db_name, "--out", missing],
                                env=env)  # fmt: skip
    assert result.exit_code == 2 and "no directory" in result.output, result.output
    assert client[db_name].accord_audit_digests.count_documents({}) == 3
    # --out a directory: refused before a digest is taken (it stored one, then left a
    # temporary file beside the directory)
    result = CliRunner().invoke(cli, ["audit", "digest", "--db", db_name, "--out",
                                      str(tmp_path)], env=env)  # fmt: skip
    assert result.exit_code == 2 and "is a directory" in result.output, result.output
    assert client[db_name].accord_audit_digests.count_documents({}) == 3
    assert not list(tmp_path.parent.glob(f".{tmp_path.name}.tmp"))
    # a file that is no digest (a KeyError traceback); an export into a file
    fake = tmp_path / "fake.json"
    fake.write_text('{"not": "a digest"}')
    result = CliRunner().invoke(cli, ["audit", "verify", "--db", db_name, "--from", str(fake),
                                      "--to", "2"], env=env)  # fmt: skip
    assert result.exit_code == 2 and "is not an audit digest" in result.output, result.output
    result = CliRunner().invoke(cli, ["audit", "export", "--db", db_name, "--tenant", "acme",
                                      "--out", str(fake)], env=env)  # fmt: skip
    assert result.exit_code == 2 and "cannot write the export" in result.output, result.output
    # seconds as digits, as the message about a bad --every says they may be
    result = CliRunner().invoke(cli, ["audit", "digest", "--db", db_name, "--every", "60",
                                      "--count", "1"], env=env)  # fmt: skip
    assert result.exit_code == 0, result.output
