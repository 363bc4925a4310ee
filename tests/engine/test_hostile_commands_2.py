"""More hostile commands through pymongo (and, for the lsid, a raw OP_MSG): each must get a
clear error like mongod's, never an internal error, never lose or half-write data.

Before their fixes: ``dropDatabase`` on admin/local dropped them, renaming a collection onto
itself with ``dropTarget`` deleted it (then answered ``internal error: KeyError``), a
non-numeric TTL from ``collMod`` (or a NaN one, which mongod accepts) stopped every TTL pass,
``create`` with ``expireAfterSeconds: NaN`` was an internal error, ``createIndexes`` kept
index specs mongod refuses, writes reached ``local.oplog.rs``, ``find`` ignored ``min``/
``max``, ``$mod`` by zero said "math domain error", numbers passed as ``ordered``/``multi``/
``upsert``/find's flags, and an lsid whose id was no 16-byte UUID was accepted.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import bson
import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from tests.engine.test_hostile_commands import INTERNAL_ERROR
from tests.engine.test_hostile_commands import refused as _refused
from tests.engine.test_wire_fuzz import exchange, op_msg

# -- catalog commands that destroyed data -----------------------------------------------------


@pytest.mark.parametrize("name", ["admin", "local"])
def test_drop_database_admin_or_local_is_refused(client: MongoClient, name: str) -> None:
    client[name].hostile_keep.insert_one({"_id": 1})
    try:
        error = _refused(client[name], {"dropDatabase": 1})
        assert error.code == 20  # IllegalOperation
        assert client[name].hostile_keep.find_one() == {"_id": 1}
    finally:
        client[name].hostile_keep.drop()


def test_rename_onto_itself_with_drop_target_keeps_the_collection(client: MongoClient, db) -> None:
    db.c.insert_one({"_id": 1})
    ns = f"{db.name}.c"
    error = _refused(client.admin, {"renameCollection": ns, "to": ns, "dropTarget": True})
    assert error.code == 20
    assert db.c.find_one() == {"_id": 1}


# -- TTL ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["x", -1, 2**31, float("inf")])
def test_coll_mod_ttl_must_be_a_number_in_range(db, bad: Any) -> None:
    db.c.create_index("t", expireAfterSeconds=100, name="ttl")
    _refused(db, {"collMod": "c", "index": {"name": "ttl", "expireAfterSeconds": bad}})
    ttl = next(i for i in db.c.list_indexes() if i["name"] == "ttl")
    assert ttl["expireAfterSeconds"] == 100


@pytest.mark.embedded_only  # waits on the engine's 1-second TTL pass (conftest)
def test_a_nan_ttl_index_does_not_stop_other_indexes_expiring(db) -> None:
    """mongod accepts expireAfterSeconds NaN; here the TTL pass raised on it ("cannot
    convert float NaN to integer") and so expired nothing anywhere."""
    db.a.create_index("t", expireAfterSeconds=float("nan"), name="nan_ttl")
    db.a.insert_one({"_id": 1, "t": dt.datetime(2000, 1, 1)})
    db.b.create_index("t", expireAfterSeconds=0)
    db.b.insert_one({"_id": 1, "t": dt.datetime(2000, 1, 1)})
    deadline = time.monotonic() + 15
    while db.b.count_documents({}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert db.b.count_documents({}) == 0
    assert db.a.count_documents({}) == 1  # a NaN TTL expires nothing


@pytest.mark.parametrize("eas", [float("nan"), float("inf"), -1, 1.5])
def test_create_with_a_non_integer_expiry_is_refused(db, eas: float) -> None:
    clustered = {"key": {"_id": 1}, "unique": True}
    error = _refused(db, {"create": "cl", "clusteredIndex": clustered, "expireAfterSeconds": eas})
    assert error.code == 72  # InvalidOptions
    assert "cl" not in db.list_collection_names()


# -- createIndexes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        {"key": {f"k{i}": 1 for i in range(33)}, "name": "k33"},
        {"key": {"a": float("nan")}, "name": "nan"},
        {"key": {"$a": 1}, "name": "dollar"},
        {"key": {"a..b": 1}, "name": "empty_part"},
        {"key": {"": 1}, "name": "empty"},
        {"key": {"a": 1}, "name": 5},
        {"key": {"a": 1}, "name": ""},
        {"key": {"a": "hashed"}, "name": "h", "unique": True},
        {"key": {"t": 1}, "name": "ttl_huge", "expireAfterSeconds": 1e30},
    ],
    ids=["33-fields", "nan", "dollar", "empty-part", "empty", "name-int", "name-empty",
         "hashed-unique", "ttl-huge"],
)  # fmt: skip
def test_index_specs_mongod_refuses_are_refused(db, spec: dict) -> None:
    db.c.insert_one({"_id": 1, "a": 1})
    _refused(db, {"createIndexes": "c", "indexes": [spec]})
    assert [i["name"] for i in db.c.list_indexes()] == ["_id_"]


def test_two_specs_with_one_name_are_refused(db) -> None:
    db.c.insert_one({"_id": 1})
    specs = [{"key": {"a": 1}, "name": "dup"}, {"key": {"b": 1}, "name": "dup"}]
    _refused(db, {"createIndexes": "c", "indexes": specs})
    assert [i["name"] for i in db.c.list_indexes()] == ["_id_"]


def test_at_most_64_indexes(db) -> None:
    db.c.insert_one({"_id": 1})
    specs = [{"key": {f"m{i}": 1}, "name": f"m{i}"} for i in range(63)]
    db.command({"createIndexes": "c", "indexes": specs})
    error = _refused(db, {"createIndexes": "c", "indexes": [{"key": {"z": 1}, "name": "z"}]})
    assert error.code == 67  # CannotCreateIndex
    assert len(list(db.c.list_indexes())) == 64


# -- the oplog ---------------------------------------------------------------------------------


def test_writes_to_the_oplog_are_refused(client: MongoClient) -> None:
    local = client.local
    _refused(local, {"insert": "oplog.rs", "documents": [{"x": 1}]})
    _refused(local, {"update": "oplog.rs", "updates": [{"q": {}, "u": {"x": 1}, "upsert": True}]})
    _refused(local, {"findAndModify": "oplog.rs", "query": {}, "update": {"x": 1}, "upsert": True})
    with pytest.raises(OperationFailure) as info:
        client.admin.command(
            {"bulkWrite": 1, "ops": [{"insert": 0, "document": {"x": 1}}],
             "nsInfo": [{"ns": "local.oplog.rs"}]}
        )  # fmt: skip
    assert info.value.code == 73
    assert "oplog.rs" not in local.list_collection_names()


# -- find min/max, $mod, flags -----------------------------------------------------------------


def test_find_min_max_bound_the_hinted_index_not_ignored(db) -> None:
    db.c.insert_many([{"_id": i, "a": i % 5, "b": i} for i in range(10)])
    db.c.create_index("a")
    db.c.create_index([("a", 1), ("b", -1)])
    error = _refused(db, {"find": "c", "min": {"a": 3}})
    assert error.code == 51173  # a hint is needed, as in mongod

    def ids(**options: object) -> list[int]:
        reply = db.command({"find": "c", "projection": {"_id": 1}, **options})
        return [d["_id"] for d in reply["cursor"]["firstBatch"]]

    # min inclusive, max exclusive, before skip and limit
    assert sorted(ids(min={"a": 1}, max={"a": 3}, hint={"a": 1})) == [1, 2, 6, 7]
    assert ids(min={"a": 1}, max={"a": 3}, hint={"a": 1}, sort={"b": 1}, skip=1, limit=2) == [
        2, 6,
    ]  # fmt: skip
    assert sorted(ids(max={"_id": 2}, hint={"_id": 1})) == [0, 1]
    # a descending field orders its bounds the other way: (a=1, b<=6) .. (a=2, b>2)
    bounded = ids(min={"a": 1, "b": 6}, max={"a": 2, "b": 2}, hint={"a": 1, "b": -1})
    assert sorted(bounded) == [1, 6, 7]
    error = _refused(db, {"find": "c", "min": {"b": 1}, "hint": {"a": 1}})
    assert error.code == 51174  # not the hinted index's fields


def test_mod_by_zero_in_an_expression_is_16610(db) -> None:
    db.c.insert_one({"_id": 1, "a": 5})
    for divisor in (0, 0.0, bson.Int64(0)):
        pipeline = [{"$project": {"x": {"$mod": ["$a", divisor]}}}]
        error = _refused(db, {"aggregate": "c", "pipeline": pipeline, "cursor": {}})
        assert error.code == 16610
    pipeline = [{"$project": {"_id": 0, "x": {"$mod": [float("inf"), 2]}}}]
    (row,) = db.command({"aggregate": "c", "pipeline": pipeline, "cursor": {}})["cursor"][
        "firstBatch"
    ]
    assert row["x"] != row["x"]  # NaN, as mongod's fmod


@pytest.mark.parametrize(
    "command",
    [
        {"insert": "c", "documents": [{"_id": 2}], "ordered": 5},
        {"delete": "c", "deletes": [{"q": {}, "limit": 0}], "ordered": 0},
        {"find": "c", "singleBatch": 5},
        {"find": "c", "allowDiskUse": 1},
        {"find": "c", "returnKey": 1},
        {"find": "c", "showRecordId": "yes"},
    ],
    ids=lambda c: next(k for k in c if k in ("ordered", "singleBatch", "allowDiskUse",
                                             "returnKey", "showRecordId")),
)  # fmt: skip
def test_boolean_flags_must_be_booleans(db, command: dict) -> None:
    db.c.insert_one({"_id": 1})
    error = _refused(db, command)
    assert error.code == 14  # TypeMismatch
    assert list(db.c.find()) == [{"_id": 1}]


@pytest.mark.parametrize("flag", ["multi", "upsert"])
def test_update_multi_and_upsert_must_be_booleans(db, flag: str) -> None:
    db.c.insert_many([{"_id": 1}, {"_id": 2}])
    statement = {"q": {"_id": {"$gte": 1}}, "u": {"$set": {"x": 1}}, flag: 1}
    reply = db.command({"update": "c", "updates": [statement]})
    assert reply["writeErrors"][0]["code"] == 14  # TypeMismatch
    assert db.c.count_documents({"x": 1}) == 0


# -- lsid --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lsid_id",
    [bson.Binary(b"abc", 4), bson.Binary(b"\x01" * 17, 4), bson.Binary(b"\x01" * 16, 0)],
    ids=["3-bytes", "17-bytes", "subtype-0"],
)
def test_an_lsid_that_is_not_a_uuid_is_refused(client: MongoClient, db, lsid_id: Any) -> None:
    db.c.insert_one({"_id": 1})
    host, port = client.address
    outcome = exchange((host, port), op_msg({"find": "c", "lsid": {"id": lsid_id}, "$db": db.name}))
    (reply,) = outcome.replies
    assert reply["ok"] == 0 and reply["code"] != INTERNAL_ERROR, reply
    if lsid_id.subtype == 4:  # 16 bytes or no UUID: mongod's InvalidUUID
        assert reply["code"] == 207, reply
    client.admin.command("ping")
