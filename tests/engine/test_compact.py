"""Physical deletion in the embedded engine (docs/engine.md, "Physical deletion"):
``PRAGMA secure_delete`` on its SQLite files and the ``compact`` command (``VACUUM``,
the WAL truncated), reached with ``db.command("compact", COLLECTION)`` and by
``accord.runtime.compact_storage``.

The erasure test of issue 24 at the byte level: after a data subject's erasure and the
compaction that follows it, no byte of any file of the engine's data directory holds the
subject's identifier or its words, while they were there before; the other subject's
data survives the compaction and a restart.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from accord import runtime
from accord.platform.embedded import EmbeddedServer

pytestmark = pytest.mark.embedded_only

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "governance"))
import test_subjects as subjects  # noqa: E402  (the scenario of the erasure tests)


def _files_holding(dbpath: Path, needle: bytes) -> list[str]:
    """The files under ``dbpath`` whose bytes contain ``needle`` (as stored, or as UTF-16
    would hold it: SQLite stores text as written, BSON as UTF-8)."""
    return sorted(
        str(p.relative_to(dbpath))
        for p in dbpath.rglob("*")
        if p.is_file() and needle in p.read_bytes()
    )


@pytest.fixture()
def engine(tmp_path: Path) -> Iterator[tuple[EmbeddedServer, Path]]:
    dbpath = tmp_path / "data"
    dbpath.mkdir()
    server = EmbeddedServer(dbpath=dbpath, port=0, sync=True)
    server.start()
    try:
        yield server, dbpath
    finally:
        server.stop()


def test_compact_command_rebuilds_the_store_and_keeps_its_data(
    engine: tuple[EmbeddedServer, Path],
) -> None:
    server, dbpath = engine
    client: MongoClient = MongoClient(server.uri)
    coll = client["c"]["docs"]
    coll.insert_many([{"_id": i, "pad": "x" * 2000} for i in range(500)])
    coll.delete_many({"_id": {"$gte": 100}})
    reply = client["c"].command("compact", "docs")
    assert reply["ok"] == 1.0
    assert reply["bytesAfter"] < reply["bytesBefore"] and reply["bytesFreed"] > 0
    assert (dbpath / "accord-engine.sqlite3-wal").stat().st_size == 0  # truncated
    assert coll.count_documents({}) == 100
    coll.insert_one({"_id": "after"})  # commits go on
    with pytest.raises(OperationFailure) as bad:
        client["c"].command("compact", 7)
    assert bad.value.code == 14
    client.close()
    server.stop()
    again = EmbeddedServer(dbpath=dbpath, port=0, sync=True)
    again.start()
    try:
        reopened: MongoClient = MongoClient(again.uri)
        assert reopened["c"]["docs"].count_documents({}) == 101
        reopened.close()
    finally:
        again.stop()


def test_no_byte_of_an_erased_subject_stays_in_the_data_files(
    engine: tuple[EmbeddedServer, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    server, dbpath = engine
    policy = tmp_path / "policy.toml"
    policy.write_text(subjects.POLICY)
    monkeypatch.setenv("ACCORD_POLICY", str(policy))
    monkeypatch.setenv(runtime.AUDIT_ENV, "full")
    client: MongoClient = MongoClient(server.uri)
    subjects._populate(client, "app")
    client["app"].command("compact", "x")  # what was written is in the tables, not the WAL
    secret, subject = subjects.SECRET.encode(), subjects.SUBJECT.encode()
    assert _files_holding(dbpath, secret) and _files_holding(dbpath, subject)  # it can fail

    report = runtime.erase_subject_data(client, subjects.SUBJECT, "app", compact=False)
    assert report.compacted is None
    # Deleted; whether the files still hold them now depends on timing (the journal's rows
    # and the WAL's old frames hold them until the housekeeping thread moves and copies
    # them, secure_delete zeroing what it frees): compaction is what guarantees it.
    said = runtime.compact_storage(client, "app")
    assert said.startswith("storage compacted")
    assert _files_holding(dbpath, secret) == []
    assert _files_holding(dbpath, subject) == []
    assert _files_holding(dbpath, subjects.OTHER.encode())  # the other subject's data is kept
    assert client["app"].accord_checkpoints.count_documents({"thread_id": "chat-b"}) > 0
    client.close()
    server.stop()  # a clean shutdown writes the index image: nothing erased in it either
    assert _files_holding(dbpath, secret) == [] and _files_holding(dbpath, subject) == []


def test_compact_storage_on_the_engine_and_its_words(
    engine: tuple[EmbeddedServer, Path],
) -> None:
    server, _ = engine
    client: MongoClient = MongoClient(server.uri)
    client["c"]["docs"].insert_one({"_id": 1})
    said = runtime.compact_storage(client, "c")
    assert said.startswith("storage compacted (") and " bytes, " in said
    client.close()


def test_compact_is_refused_in_a_transaction(engine: tuple[EmbeddedServer, Path]) -> None:
    server, _ = engine
    client: MongoClient = MongoClient(server.uri)
    client["c"]["docs"].insert_one({"_id": 1})
    with (
        client.start_session() as session,
        session.start_transaction(),
        pytest.raises(OperationFailure) as refused,
    ):
        client["c"].command("compact", "docs", session=session)
    assert refused.value.code == 263
    client.close()


def test_compact_needs_the_compact_action_under_auth(tmp_path: Path) -> None:
    admin_user = ("root-user", "root-secret")
    server = EmbeddedServer(tmp_path / "auth", port=0, sync=False, auth=True,
                            admin_user=admin_user).start()  # fmt: skip
    admin: MongoClient = MongoClient(server.uri, username=admin_user[0], password=admin_user[1])
    try:
        admin["app"]["docs"].insert_one({"_id": 1})
        admin["app"].command("createUser", "writer", pwd="pw", roles=["readWrite"])
        admin["app"].command("createUser", "dba", pwd="pw", roles=["dbAdmin"])
        writer: MongoClient = MongoClient(server.uri, username="writer", password="pw",
                                          authSource="app")  # fmt: skip
        with pytest.raises(OperationFailure) as refused:
            writer["app"].command("compact", "docs")
        assert refused.value.code == 13
        dba: MongoClient = MongoClient(server.uri, username="dba", password="pw", authSource="app")
        assert dba["app"].command("compact", "docs")["ok"] == 1.0
        writer.close()
        dba.close()
    finally:
        admin.close()
        server.stop()
