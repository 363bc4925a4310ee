"""The commit-observer interface derived indexes (vector search) build on: told every
durable commit of the collections they observe, in commit order, with the old and new
document; never told about aborted or failed commits; able to see a transaction's own
uncommitted writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from accord.platform.embedded import EmbeddedServer
from accord.platform.embedded.engine import Engine

pytestmark = pytest.mark.embedded_only


class Recorder:
    def __init__(self, engine: Engine, ns: str) -> None:
        self.engine = engine
        self.ns = ns
        self.commits: list[tuple[int, list[tuple[str, Any, Any, Any]]]] = []
        self.dropped: list[str] = []
        self.renamed: list[tuple[str, str]] = []
        self.visible_at_call: list[bool] = []

    def observes(self, ns: str) -> bool:
        return ns == self.ns

    def on_commit(self, ts: int, changes: list[tuple[str, bytes, Any, Any]]) -> None:
        self.visible_at_call.append(self.engine.visible < ts)  # told just before visible
        self.commits.append((ts, [(ns, k, old, new) for ns, k, old, new in changes]))

    def on_drop(self, ns: str) -> None:
        self.dropped.append(ns)

    def on_rename(self, old: str, new: str) -> None:
        self.renamed.append((old, new))


def test_observer_sees_durable_commits_in_order(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "db", port=0, sync=False).start()
    client: MongoClient = MongoClient(server.uri)
    engine = server.engine
    assert engine is not None
    rec = Recorder(engine, "t.watched")
    with engine.locked():
        engine.commit_observers.append(rec)
    try:
        w, other = client.t.watched, client.t.other
        w.insert_one({"_id": 1, "v": 1})
        other.insert_one({"_id": 1})  # not observed
        w.update_one({"_id": 1}, {"$set": {"v": 2}})
        with client.start_session() as s:
            s.start_transaction()
            w.insert_one({"_id": 2, "v": 0}, session=s)
            w.delete_one({"_id": 1}, session=s)
            other.insert_one({"_id": 2}, session=s)
            with engine.locked():
                txn = engine.sessions[
                    next(iter(k for k, v in engine.sessions.items() if v.txn))
                ].txn
                assert txn is not None
                own = dict(engine.own_writes(txn, "t.watched"))
            assert len(own) == 2 and any(d is None for d in own.values())
            s.commit_transaction()
        with client.start_session() as s:
            s.start_transaction()
            w.insert_one({"_id": 3}, session=s)
            s.abort_transaction()  # never reported
        with pytest.raises(OperationFailure):
            w.insert_one({"_id": 2})  # duplicate: nothing committed, nothing reported
        ts = [c[0] for c in rec.commits]
        assert ts == sorted(ts) and len(ts) == 3
        assert all(rec.visible_at_call)
        first, second, third = (c[1] for c in rec.commits)
        assert first == [("t.watched", first[0][1], None, {"_id": 1, "v": 1})]
        assert second[0][2:] == ({"_id": 1, "v": 1}, {"_id": 1, "v": 2})
        assert sorted(((old, new) for _, _, old, new in third), key=repr) == sorted(
            [(None, {"_id": 2, "v": 0}), ({"_id": 1, "v": 2}, None)], key=repr
        )
        client.admin.command("renameCollection", "t.watched", to="t.moved")
        client.t.moved.drop()
        assert rec.renamed == [("t.watched", "t.moved")] and rec.dropped == ["t.moved"]
    finally:
        client.close()
        server.stop()


def test_failed_commit_is_never_reported(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "db", port=0, sync=False).start()
    client: MongoClient = MongoClient(server.uri)
    engine = server.engine
    assert engine is not None
    rec = Recorder(engine, "t.c")
    with engine.locked():
        engine.commit_observers.append(rec)
    try:
        client.t.c.insert_one({"_id": 1})
        engine.storage.fail_next = OSError(28, "No space left on device")
        with pytest.raises(OperationFailure) as info:
            client.t.c.insert_one({"_id": 2})
        assert info.value.code == 14031
        client.t.c.insert_one({"_id": 3})
        assert [c[1][0][3]["_id"] for c in rec.commits] == [1, 3]
    finally:
        client.close()
        server.stop()
