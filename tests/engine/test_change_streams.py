"""Change streams through pymongo's ``watch()``: events, scopes, resuming, options."""

from __future__ import annotations

import threading
import time

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure


def _events(stream, n: int, timeout: float = 10.0) -> list[dict]:
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        event = stream.try_next()
        if event is not None:
            out.append(event)
    assert len(out) == n, out
    return out


def test_collection_stream_sees_inserts_updates_and_deletes_in_order(db) -> None:
    coll = db["cs"]
    with coll.watch(max_await_time_ms=200) as stream:
        coll.insert_one({"_id": 1, "a": 1, "gone": True})
        coll.update_one({"_id": 1}, {"$set": {"a": 2}, "$unset": {"gone": ""}})
        coll.delete_one({"_id": 1})
        db["other"].insert_one({"x": 1})  # another collection: not in this stream
        insert, update, delete = _events(stream, 3)
    assert insert["operationType"] == "insert"
    assert insert["fullDocument"] == {"_id": 1, "a": 1, "gone": True}
    assert insert["ns"] == {"db": db.name, "coll": "cs"} and insert["documentKey"] == {"_id": 1}
    assert update["operationType"] == "update"
    assert update["updateDescription"]["updatedFields"] == {"a": 2}
    assert update["updateDescription"]["removedFields"] == ["gone"]
    assert delete["operationType"] == "delete" and delete["documentKey"] == {"_id": 1}
    assert insert["clusterTime"] <= update["clusterTime"] <= delete["clusterTime"]


def test_a_stream_sees_only_what_commits_after_it_opens(db) -> None:
    coll = db["cs"]
    coll.insert_one({"_id": "before"})
    with coll.watch(max_await_time_ms=100) as stream:
        assert stream.try_next() is None
        coll.insert_one({"_id": "after"})
        (event,) = _events(stream, 1)
    assert event["documentKey"] == {"_id": "after"}


def test_a_transaction_appears_only_when_it_commits(client: MongoClient, db) -> None:
    coll = db["cs"]
    coll.insert_one({"_id": 0})
    with coll.watch(max_await_time_ms=100) as stream, client.start_session() as session:
        session.start_transaction()
        coll.insert_one({"_id": 1}, session=session)
        coll.insert_one({"_id": 2}, session=session)
        assert stream.try_next() is None  # nothing visible before the commit
        session.commit_transaction()
        events = _events(stream, 2)
    assert [e["documentKey"]["_id"] for e in events] == [1, 2]
    assert events[0]["clusterTime"] == events[1]["clusterTime"]  # one commit


def test_database_and_cluster_streams_cover_their_scope(client: MongoClient, db) -> None:
    with db.watch(max_await_time_ms=100) as db_stream, client.watch(max_await_time_ms=100) as all_:
        db["a"].insert_one({"_id": 1})
        client[db.name + "_x"]["b"].insert_one({"_id": 2})
        (mine,) = _events(db_stream, 1)
        seen = _events(all_, 2)
    client.drop_database(db.name + "_x")
    assert mine["ns"]["coll"] == "a"
    assert {e["ns"]["db"] for e in seen} == {db.name, db.name + "_x"}


def test_resume_after_a_token_and_start_at_operation_time(db) -> None:
    coll = db["cs"]
    with coll.watch(max_await_time_ms=100) as stream:
        coll.insert_many([{"_id": i} for i in range(3)])
        first, _, _ = _events(stream, 3)
    with coll.watch(resume_after=first["_id"], max_await_time_ms=100) as resumed:
        assert [e["documentKey"]["_id"] for e in _events(resumed, 2)] == [1, 2]
    with coll.watch(start_at_operation_time=first["clusterTime"], max_await_time_ms=100) as again:
        assert [e["documentKey"]["_id"] for e in _events(again, 3)] == [0, 1, 2]


def test_a_pipeline_filters_and_reshapes_events(db) -> None:
    coll = db["cs"]
    pipeline = [
        {"$match": {"operationType": "insert", "fullDocument.keep": True}},
        {"$project": {"fullDocument._id": 1, "operationType": 1}},
    ]
    with coll.watch(pipeline, max_await_time_ms=100) as stream:
        coll.insert_many([{"_id": 1, "keep": False}, {"_id": 2, "keep": True}])
        (event,) = _events(stream, 1)
    assert event["fullDocument"] == {"_id": 2}


def test_update_lookup_returns_the_current_document(db) -> None:
    coll = db["cs"]
    coll.insert_one({"_id": 1, "n": 0})
    with coll.watch(full_document="updateLookup", max_await_time_ms=100) as stream:
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}})
        (event,) = _events(stream, 1)
    assert event["fullDocument"] == {"_id": 1, "n": 1}


def test_pre_and_post_images_need_the_collection_option(db) -> None:
    plain = db["plain"]
    with pytest.raises(OperationFailure):  # noqa: SIM117 (the error comes on the first read)
        with plain.watch(full_document_before_change="required", max_await_time_ms=100) as s:
            plain.insert_one({"_id": 1})
            plain.delete_one({"_id": 1})
            _events(s, 2)
    images = db.create_collection("images", changeStreamPreAndPostImages={"enabled": True})
    images.insert_one({"_id": 1, "v": "old"})
    with images.watch(full_document_before_change="required", max_await_time_ms=100) as s:
        images.replace_one({"_id": 1}, {"v": "new"})
        (event,) = _events(s, 1)
    assert event["fullDocumentBeforeChange"] == {"_id": 1, "v": "old"}


def test_dropping_the_collection_invalidates_its_stream(db) -> None:
    coll = db["cs"]
    coll.insert_one({"_id": 0})
    with coll.watch(max_await_time_ms=100) as stream:
        coll.drop()
        drop, invalidate = _events(stream, 2)
        assert drop["operationType"] == "drop" and invalidate["operationType"] == "invalidate"
        assert not stream.alive


def test_a_waiting_stream_does_not_block_other_clients(client: MongoClient, db) -> None:
    coll = db["cs"]
    with coll.watch(max_await_time_ms=3000) as stream:
        got: list = []
        thread = threading.Thread(target=lambda: got.append(stream.try_next()))
        thread.start()
        time.sleep(0.3)  # the getMore is now waiting on the server
        db["other"].insert_one({"_id": 1})  # served meanwhile
        coll.insert_one({"_id": "wake"})
        thread.join(10)
    assert got and got[0] is not None and got[0]["documentKey"] == {"_id": "wake"}


@pytest.mark.parametrize(
    "pipeline",
    [[{"$changeStream": {}}, {"$group": {"_id": 1}}], [{"$changeStream": {"bogus": 1}}]],
)
def test_bad_change_stream_pipelines_are_refused(db, pipeline) -> None:
    with pytest.raises(OperationFailure):
        db.command({"aggregate": "cs", "pipeline": pipeline, "cursor": {}})


def test_not_in_a_transaction(client: MongoClient, db) -> None:
    db["cs"].insert_one({})
    with client.start_session() as session:
        session.start_transaction()
        with pytest.raises(OperationFailure):
            db["cs"].watch(session=session)
        session.abort_transaction()


def test_images_are_null_when_not_recorded_and_whenavailable(db) -> None:
    coll = db["plain_images"]
    coll.insert_one({"_id": 1, "v": 0})
    with coll.watch(
        full_document="whenAvailable",
        full_document_before_change="whenAvailable",
        max_await_time_ms=100,
    ) as stream:
        coll.update_one({"_id": 1}, {"$set": {"v": 1}})
        (event,) = _events(stream, 1)
    assert event["fullDocument"] is None and event["fullDocumentBeforeChange"] is None


@pytest.mark.embedded_only
def test_the_log_is_bounded_by_bytes_and_a_stream_behind_it_is_told(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Like mongod's oplog, the change log is bounded by size: a stream that fell behind
    it, and a resume token older than it, answer ChangeStreamHistoryLost (286)."""
    from accord.platform.embedded import EmbeddedServer
    from accord.platform.embedded.commands import changestreams

    monkeypatch.setattr(changestreams, "LOG_BYTES", 50_000)
    server = EmbeddedServer(tmp_path / "db", port=0, sync=False).start()
    client: MongoClient = MongoClient(server.uri)
    try:
        coll = client.t.big
        with coll.watch(max_await_time_ms=100) as reader, coll.watch(max_await_time_ms=100) as idle:
            coll.insert_one({"_id": 0})
            (first,) = _events(reader, 1)
            for i in range(1, 11):  # 100 KB in all, 10 KB at a time
                coll.insert_one({"_id": i, "pad": "x" * 10_000})
                (event,) = _events(reader, 1)  # a stream that keeps up sees everything
                assert event["documentKey"] == {"_id": i}
            with pytest.raises(OperationFailure) as lost:
                idle.try_next()  # still before the first insert, which was dropped
            assert lost.value.code == 286
        with pytest.raises(OperationFailure) as old:
            coll.watch(resume_after=first["_id"], max_await_time_ms=100).try_next()
        assert old.value.code == 286
        with coll.watch(max_await_time_ms=100) as fresh:  # a new stream starts from now
            coll.insert_one({"_id": "new"})
            (event,) = _events(fresh, 1)
        assert event["documentKey"] == {"_id": "new"}
    finally:
        client.close()
        server.stop()
