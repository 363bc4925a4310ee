"""Cluster time, causal consistency, snapshot reads and transactional DDL, as a one-node
replica-set primary of MongoDB 8.0 provides them to pymongo."""

from __future__ import annotations

import time
from typing import Any

import pytest
from bson import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure
from pymongo.read_concern import ReadConcern

from tests.engine.helpers import recording_client


def test_replies_carry_operation_and_cluster_time(mongo_uri: str, db) -> None:  # type: ignore[no-untyped-def]
    client, recorder = recording_client(mongo_uri)
    try:
        coll = client[db.name].c
        coll.insert_one({"_id": 1})
        coll.find_one({"_id": 1})
        insert, find = recorder.replies("insert")[-1], recorder.replies("find")[-1]
        for reply in (insert, find):
            assert isinstance(reply["operationTime"], Timestamp)
            assert isinstance(reply["$clusterTime"]["clusterTime"], Timestamp)
            assert reply["$clusterTime"]["clusterTime"] >= reply["operationTime"]
        assert find["operationTime"] >= insert["operationTime"]
    finally:
        client.close()


def test_causally_consistent_session_reads_its_writes(mongo_uri: str, db) -> None:  # type: ignore[no-untyped-def]
    client, recorder = recording_client(mongo_uri)
    try:
        coll = client[db.name].c
        with client.start_session(causal_consistency=True) as s:
            coll.insert_one({"_id": 1, "v": 1}, session=s)
            assert s.operation_time is not None
            assert coll.find_one({"_id": 1}, session=s) == {"_id": 1, "v": 1}
        sent = recorder.started_commands("find")[-1]
        assert (
            sent["readConcern"]["afterClusterTime"]
            == recorder.replies("insert")[-1]["operationTime"]
        )
    finally:
        client.close()


def test_a_cluster_time_past_the_engines_is_refused(client: MongoClient, db) -> None:  # type: ignore[no-untyped-def]
    """As mongod refuses one past its cluster time (72). The engine moved its clock to it
    before: a read-only user who sent the largest Timestamp left every later write
    without a reply, even after a restart."""
    db.c.insert_one({"_id": 1})
    now = client.admin.command("ping")["operationTime"]
    reply = db.command({"find": "c", "filter": {}, "readConcern": {"afterClusterTime": now}})
    assert reply["cursor"]["firstBatch"] == [{"_id": 1}]
    for ahead in (Timestamp(now.time + 2, 1), Timestamp(2**32 - 1, 2**32 - 1)):
        for rc in ({"afterClusterTime": ahead}, {"level": "snapshot", "atClusterTime": ahead}):
            with pytest.raises(OperationFailure, match="must not be greater") as info:
                db.command({"find": "c", "filter": {}, "readConcern": rc})
            assert info.value.code == 72
    db.c.insert_one({"_id": 2})  # acknowledged
    assert client.admin.command("ping")["operationTime"].time < now.time + 3600


def test_snapshot_session_reads_at_its_first_read_time(mongo_uri: str, db) -> None:  # type: ignore[no-untyped-def]
    client, recorder = recording_client(mongo_uri)
    db = client[db.name]
    db.c.insert_many([{"_id": 1, "x": 11}, {"_id": 2, "x": 20}])
    with client.start_session(snapshot=True) as s:
        assert db.c.find_one({"_id": 1}, session=s)["x"] == 11
        at = recorder.replies("find")[-1]["cursor"]["atClusterTime"]
        assert isinstance(at, Timestamp)
        db.c.update_one({"_id": 1}, {"$inc": {"x": 1}})  # later writes, outside the snapshot
        db.c.insert_one({"_id": 3, "x": 30})
        db.c.delete_one({"_id": 2})
        assert db.c.find_one({"_id": 1}, session=s)["x"] == 11
        assert sorted(d["_id"] for d in db.c.find({}, session=s)) == [1, 2]
        assert db.c.distinct("x", session=s) == [11, 20]
        assert db.c.count_documents({}, session=s) == 2  # an aggregate at the snapshot
        sent = recorder.started_commands("find")[-1]["readConcern"]
        assert sent == {"level": "snapshot", "atClusterTime": at}
    assert db.c.find_one({"_id": 1})["x"] == 12
    client.close()


def test_snapshot_session_refuses_writes(client: MongoClient, db) -> None:  # type: ignore[no-untyped-def]
    db.c.insert_one({"_id": 1})
    with client.start_session(snapshot=True) as s:
        db.c.find_one({}, session=s)
        for write in (
            lambda: db.c.insert_one({"_id": 2}, session=s),
            lambda: db.c.update_one({"_id": 1}, {"$set": {"a": 1}}, session=s),
            lambda: db.c.delete_one({"_id": 1}, session=s),
            lambda: db.c.find_one_and_update({"_id": 1}, {"$set": {"a": 1}}, session=s),
        ):
            with pytest.raises(OperationFailure) as info:
                write()
            assert info.value.code == 72
    assert db.c.count_documents({}) == 1 and "a" not in db.c.find_one({"_id": 1})


def test_snapshot_read_concern_at_cluster_time(client: MongoClient, db) -> None:  # type: ignore[no-untyped-def]
    reply = db.command({"insert": "c", "documents": [{"_id": 1, "v": "old"}]})
    at = reply["operationTime"]
    db.c.update_one({"_id": 1}, {"$set": {"v": "new"}})
    old = db.command(
        {"find": "c", "filter": {}, "readConcern": {"level": "snapshot", "atClusterTime": at}}
    )
    assert old["cursor"]["firstBatch"] == [{"_id": 1, "v": "old"}]
    assert old["cursor"]["atClusterTime"] == at
    agg = db.command(
        {
            "aggregate": "c",
            "pipeline": [],
            "cursor": {},
            "readConcern": {"level": "snapshot", "atClusterTime": at},
        }
    )
    assert agg["cursor"]["firstBatch"] == [{"_id": 1, "v": "old"}]


@pytest.mark.embedded_only
def test_snapshot_history_window_is_bounded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from accord.platform.embedded import EmbeddedServer

    server = EmbeddedServer(tmp_path / "db", port=0, sync=False, snapshot_history=1.0).start()
    client: MongoClient = MongoClient(server.uri)
    try:
        coll = client.t.c
        at = client.t.command({"insert": "c", "documents": [{"_id": 1, "n": 0}]})["operationTime"]
        for n in range(1, 50):
            coll.update_one({"_id": 1}, {"$set": {"n": n}})
        rc: dict[str, Any] = {"level": "snapshot", "atClusterTime": at}
        reply = client.t.command({"find": "c", "filter": {}, "readConcern": rc})
        assert reply["cursor"]["firstBatch"] == [{"_id": 1, "n": 0}]  # kept: inside the window
        time.sleep(3.5)  # the window passes; the housekeeping thread collects once a second
        with pytest.raises(OperationFailure) as info:
            client.t.command({"find": "c", "filter": {}, "readConcern": rc})
        assert info.value.code == 239  # SnapshotTooOld
        status = client.admin.command("serverStatus")["accordEngine"]
        gc = status["gc"]
        assert gc["versionsPruned"] >= 49 and gc["backlog"] == 0
        # The passes' own longest lock hold is reported apart from the commands'.
        kinds = status["lock"]["maxHoldByKind"]
        assert set(kinds["gc"]) == {"wallMillis", "cpuMillis"} and "update" in kinds
        assert coll.find_one({"_id": 1}) == {"_id": 1, "n": 49}
    finally:
        client.close()
        server.stop()


@pytest.mark.embedded_only
@pytest.mark.parametrize("window", [float("inf"), float("nan"), -1.0, 86_401.0])
def test_a_snapshot_history_window_past_a_day_is_refused(tmp_path, window: float) -> None:  # type: ignore[no-untyped-def]
    # inf was taken: every snapshot read at a cluster time then failed (OverflowError)
    from accord.platform.embedded import EmbeddedServer

    with pytest.raises(ValueError, match="snapshot_history must be 0 to 86400 seconds"):
        EmbeddedServer(tmp_path / "db", port=0, sync=False, snapshot_history=window)


def test_collection_created_in_a_transaction_is_invisible_until_commit(
    client: MongoClient, mongo_uri: str, db
) -> None:  # type: ignore[no-untyped-def]
    other: MongoClient = MongoClient(mongo_uri)
    try:
        with client.start_session() as s:
            s.start_transaction()
            db.create_collection("made", session=s)
            db.made.create_index("k", session=s)
            db.made.insert_one({"_id": 1, "k": 5}, session=s)
            assert "made" not in other[db.name].list_collection_names()
            assert other[db.name].made.find_one({}) is None
            s.commit_transaction()
        assert "made" in other[db.name].list_collection_names()
        assert "k_1" in {i["name"] for i in other[db.name].made.list_indexes()}
        assert other[db.name].made.find_one({"k": 5}) == {"_id": 1, "k": 5}
        with client.start_session() as s:
            s.start_transaction()
            db.create_collection("gone", session=s)
            db.gone.insert_one({"_id": 1}, session=s)
            s.abort_transaction()
        assert "gone" not in db.list_collection_names()
    finally:
        other.close()


def test_indexes_on_an_existing_collection_are_refused_in_a_transaction(
    client: MongoClient, db
) -> None:  # type: ignore[no-untyped-def]
    db.c.insert_one({"_id": 1})
    with client.start_session() as s:
        s.start_transaction()
        with pytest.raises(OperationFailure) as info:
            db.c.create_index("k", session=s)
        assert info.value.code == 263
        s.abort_transaction()


def test_snapshot_transaction_ignores_later_commits(client: MongoClient, db) -> None:  # type: ignore[no-untyped-def]
    db.c.insert_one({"_id": 1, "v": 0})
    with client.start_session() as s, s.start_transaction(read_concern=ReadConcern("snapshot")):
        assert db.c.find_one({}, session=s)["v"] == 0
        db.c.update_one({"_id": 1}, {"$set": {"v": 1}})
        assert db.c.find_one({}, session=s)["v"] == 0
