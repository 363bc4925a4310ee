"""Cursors over 10,000 documents: batches, getMore, killCursors."""

from __future__ import annotations

import math

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from tests.engine.helpers import recording_client

N = 10_000


@pytest.fixture(scope="module")
def big(mongo_uri: str):
    """One collection of 10,000 documents shared by this module's read-only tests."""
    c = MongoClient(mongo_uri)
    db = c["t_cursors_big"]
    db.drop_collection("docs")
    db.docs.insert_many([{"_id": i, "g": i % 10, "pad": "x" * 50} for i in range(N)])
    try:
        yield db.docs
    finally:
        c.drop_database(db.name)
        c.close()


@pytest.fixture()
def recorded(mongo_uri: str, big):
    c, recorder = recording_client(mongo_uri)
    try:
        yield c[big.database.name][big.name], recorder
    finally:
        c.close()


def test_iterate_all_documents(big) -> None:
    ids = [d["_id"] for d in big.find({}, {"_id": 1}).sort("_id", 1)]
    assert ids == list(range(N))
    assert big.count_documents({}) == N
    assert big.estimated_document_count() == N


def test_default_batches_use_get_more(recorded) -> None:
    coll, recorder = recorded
    ids = [d["_id"] for d in coll.find()]
    assert sorted(ids) == list(range(N))
    assert recorder.count("find") == 1
    assert recorder.count("getMore") >= 1
    (find_reply,) = recorder.replies("find")
    assert len(find_reply["cursor"]["firstBatch"]) == 101  # mongod's default first batch
    assert recorder.replies("getMore")[-1]["cursor"]["id"] == 0


@pytest.mark.parametrize("batch_size", [1_000, 3_333, 10_000])
def test_batch_sizes(recorded, batch_size: int) -> None:
    coll, recorder = recorded
    docs = list(coll.find({}, {"pad": 0}).sort("_id", -1).batch_size(batch_size))
    assert [d["_id"] for d in docs] == list(range(N - 1, -1, -1))
    batches = [len(r["cursor"]["firstBatch"]) for r in recorder.replies("find")]
    batches += [len(r["cursor"]["nextBatch"]) for r in recorder.replies("getMore")]
    assert sum(batches) == N
    assert all(b <= batch_size for b in batches)
    # A cursor that is exhausted exactly at a batch boundary may need one empty getMore.
    assert recorder.count("getMore") in (math.ceil(N / batch_size) - 1, math.ceil(N / batch_size))


def test_filtered_sorted_skip_limit_over_many(big) -> None:
    docs = list(big.find({"g": 3}, {"_id": 1}).sort("_id", -1).skip(10).limit(250).batch_size(40))
    expected = [i for i in range(N - 1, -1, -1) if i % 10 == 3][10:260]
    assert [d["_id"] for d in docs] == expected


def test_aggregate_cursor_over_many(recorded) -> None:
    coll, recorder = recorded
    docs = list(
        coll.aggregate([{"$match": {"g": {"$lt": 5}}}, {"$project": {"pad": 0}}], batchSize=500)
    )
    assert sorted(d["_id"] for d in docs) == [i for i in range(N) if i % 10 < 5]
    assert recorder.count("getMore") >= 9


def test_manual_get_more(big) -> None:
    db = big.database
    with db.client.start_session() as s:
        first = db.command("find", big.name, sort={"_id": 1}, batchSize=2_500, session=s)
        cursor = first["cursor"]
        seen = [d["_id"] for d in cursor["firstBatch"]]
        assert cursor["ns"] == big.full_name
        cursor_id = cursor["id"]
        assert cursor_id != 0
        while cursor_id:
            more = db.command("getMore", cursor_id, collection=big.name, batchSize=2_500, session=s)
            assert more["cursor"]["id"] in (0, cursor_id)
            seen += [d["_id"] for d in more["cursor"]["nextBatch"]]
            cursor_id = more["cursor"]["id"]
        assert seen == list(range(N))


def test_close_kills_the_cursor(recorded) -> None:
    coll, recorder = recorded
    cursor = coll.find().batch_size(100)
    for _ in range(150):
        next(cursor)
    cursor_id = cursor.cursor_id
    assert cursor_id
    cursor.close()
    (kill,) = recorder.started_commands("killCursors")
    assert list(kill["cursors"]) == [cursor_id]
    (reply,) = recorder.replies("killCursors")
    assert list(reply["cursorsKilled"]) == [cursor_id]
    # The cursor is gone on the server.
    with coll.database.client.start_session() as s, pytest.raises(OperationFailure) as info:
        coll.database.command("getMore", cursor_id, collection=coll.name, session=s)
    assert info.value.code == 43  # CursorNotFound


def test_kill_cursors_command(big) -> None:
    db = big.database
    with db.client.start_session() as s:
        first = db.command("find", big.name, batchSize=10, session=s)
        cursor_id = first["cursor"]["id"]
        reply = db.command("killCursors", big.name, cursors=[cursor_id, 12345], session=s)
        assert list(reply["cursorsKilled"]) == [cursor_id]
        assert list(reply["cursorsNotFound"]) == [12345]
        with pytest.raises(OperationFailure) as info:
            db.command("getMore", cursor_id, collection=big.name, session=s)
        assert info.value.code == 43


def test_get_more_unknown_cursor(client: MongoClient, big) -> None:
    with pytest.raises(OperationFailure) as info:
        big.database.command("getMore", 987654321, collection=big.name)
    assert info.value.code == 43


def test_limit_closes_the_cursor(recorded) -> None:
    coll, recorder = recorded
    docs = list(coll.find().sort("_id", 1).limit(150).batch_size(100))
    assert [d["_id"] for d in docs] == list(range(150))
    assert recorder.count("killCursors") == 0  # the server closed it at the limit
    assert recorder.replies("getMore")[-1]["cursor"]["id"] == 0


def test_many_open_cursors_interleaved(big) -> None:
    cursors = [big.find({"g": g}).sort("_id", 1).batch_size(50) for g in range(10)]
    results: dict[int, list[int]] = {g: [] for g in range(10)}
    active = set(range(10))
    while active:
        for g in list(active):
            try:
                results[g].append(next(cursors[g])["_id"])
            except StopIteration:
                active.discard(g)
    for g in range(10):
        assert results[g] == list(range(g, N, 10))


def test_cursor_sees_a_stable_result_while_collection_changes(db) -> None:
    db.c.insert_many([{"_id": i} for i in range(1_000)])
    cursor = db.c.find().sort("_id", 1).batch_size(100)
    seen = [next(cursor)["_id"] for _ in range(100)]
    db.c.insert_many([{"_id": 10_000 + i} for i in range(100)])
    seen += [d["_id"] for d in cursor]
    # Every document that existed throughout is returned exactly once.
    assert [i for i in seen if i < 1_000] == list(range(1_000))
