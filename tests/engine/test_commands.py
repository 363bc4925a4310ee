"""Administrative and catalog commands, driven through pymongo.

Every assertion is MongoDB 8.0 replica-set behaviour, so the file runs unchanged against a
real server when ``MONGODB_URI`` is set.
"""

from __future__ import annotations

import uuid

import pytest
from bson import Binary
from pymongo import MongoClient
from pymongo.errors import OperationFailure, WriteError

SCHEMA = {
    "$jsonSchema": {
        "bsonType": "object",
        "required": ["name", "age"],
        "properties": {
            "name": {"bsonType": "string"},
            "age": {"bsonType": "int", "minimum": 0},
        },
    }
}


def _options(db, name: str) -> dict:
    (info,) = list(db.list_collections(filter={"name": name}))
    return info.get("options", {})


# -- handshake and server info ------------------------------------------------------------


def test_ping(client: MongoClient) -> None:
    assert client.admin.command("ping")["ok"] == 1.0


def test_ping_on_any_database(db) -> None:
    assert db.command("ping")["ok"] == 1.0


def test_build_info_reports_mongodb_8_0(client: MongoClient) -> None:
    info = client.admin.command("buildInfo")
    assert info["ok"] == 1.0
    assert info["version"].startswith("8.0")
    assert list(info["versionArray"][:2]) == [8, 0]
    assert client.server_info()["version"] == info["version"]


def test_hello_reports_writable_replica_set_primary(client: MongoClient) -> None:
    reply = client.admin.command("hello")
    assert reply["ok"] == 1.0
    assert reply["isWritablePrimary"] is True
    assert isinstance(reply["setName"], str) and reply["setName"]
    assert reply["maxWireVersion"] == 25
    assert reply["minWireVersion"] <= 25
    assert isinstance(reply["logicalSessionTimeoutMinutes"], int)
    assert reply["logicalSessionTimeoutMinutes"] > 0
    assert reply["me"] in reply["hosts"]
    assert reply["primary"] == reply["me"]
    assert "topologyVersion" in reply
    assert reply["maxBsonObjectSize"] == 16 * 1024 * 1024
    assert reply["maxMessageSizeBytes"] >= 48_000_000
    assert reply["maxWriteBatchSize"] >= 100_000


def test_is_master_legacy_name(client: MongoClient) -> None:
    reply = client.admin.command("isMaster")
    assert reply["ok"] == 1.0
    assert reply["ismaster"] is True
    assert reply["maxWireVersion"] == 25
    assert reply["setName"] == client.admin.command("hello")["setName"]
    assert "logicalSessionTimeoutMinutes" in reply


def test_driver_sees_a_replica_set_primary(client: MongoClient) -> None:
    client.admin.command("ping")
    assert client.primary is not None
    assert client.is_primary


def test_end_sessions(client: MongoClient) -> None:
    session = client.start_session()
    client.admin.command("ping", session=session)
    lsid = session.session_id
    reply = client.admin.command("endSessions", [lsid])
    assert reply["ok"] == 1.0
    session.end_session()
    # Ending an unknown session is not an error either.
    assert (
        client.admin.command("endSessions", [{"id": Binary.from_uuid(uuid.uuid4())}])["ok"] == 1.0
    )


def test_unknown_command_is_command_not_found(db) -> None:
    with pytest.raises(OperationFailure) as info:
        db.command("noSuchCommand")
    assert info.value.code == 59
    assert info.value.details["codeName"] == "CommandNotFound"
    # The server is still fine afterwards.
    assert db.command("ping")["ok"] == 1.0


# -- databases ------------------------------------------------------------------------------


def test_list_databases(client: MongoClient, db) -> None:
    db.things.insert_one({"x": 1})
    assert db.name in client.list_database_names()
    reply = client.admin.command("listDatabases")
    assert reply["ok"] == 1.0
    entry = next(d for d in reply["databases"] if d["name"] == db.name)
    assert "sizeOnDisk" in entry and "empty" in entry
    assert "totalSize" in reply
    names_only = client.admin.command("listDatabases", nameOnly=True)
    assert {"name": db.name} in names_only["databases"]
    filtered = client.admin.command("listDatabases", filter={"name": db.name})
    assert [d["name"] for d in filtered["databases"]] == [db.name]


def test_drop_database(client: MongoClient, db) -> None:
    db.a.insert_one({"x": 1})
    db.b.insert_one({"x": 2})
    reply = db.command("dropDatabase")
    assert reply["ok"] == 1.0
    assert db.list_collection_names() == []
    assert db.name not in client.list_database_names()
    assert db.a.find_one() is None
    # The database can be used again afterwards.
    db.a.insert_one({"x": 3})
    assert db.a.count_documents({}) == 1


# -- collections ----------------------------------------------------------------------------


def test_create_and_list_collections(db) -> None:
    assert db.command("create", "alpha")["ok"] == 1.0
    db.create_collection("beta")
    db.gamma.insert_one({"implicit": True})
    assert sorted(db.list_collection_names()) == ["alpha", "beta", "gamma"]
    infos = {c["name"]: c for c in db.list_collections()}
    assert infos["alpha"]["type"] == "collection"
    assert infos["alpha"]["options"] == {}
    assert infos["alpha"]["idIndex"]["key"] == {"_id": 1}
    only = list(db.list_collections(filter={"name": "beta"}))
    assert [c["name"] for c in only] == ["beta"]
    name_only = db.command("listCollections", nameOnly=True)
    assert sorted(c["name"] for c in name_only["cursor"]["firstBatch"]) == [
        "alpha",
        "beta",
        "gamma",
    ]


def test_create_existing_collection_is_namespace_exists(db) -> None:
    db.command("create", "dup")
    with pytest.raises(OperationFailure) as info:
        db.command("create", "dup")
    assert info.value.code == 48


@pytest.mark.embedded_only
@pytest.mark.parametrize("capped", [True, 1])
def test_a_capped_collection_is_refused_by_the_engine(db, capped: object) -> None:
    # The engine does not evict: before 2026-12-07 it created the collection, listed it as
    # capped and let it grow without bound (docs/engine.md, "Not implemented").
    with pytest.raises(OperationFailure) as info:
        db.command("create", "ring", capped=capped, size=4096, max=10)
    assert info.value.code == 115
    assert "capped collections are not supported by the embedded engine" in str(info.value)
    assert "ring" not in db.list_collection_names()
    db.command("create", "plain", capped=False)  # an explicit false is a plain collection
    assert "plain" in db.list_collection_names()


def test_create_with_validator_options_are_listed(db) -> None:
    db.create_collection(
        "people", validator=SCHEMA, validationLevel="strict", validationAction="error"
    )
    options = _options(db, "people")
    assert options["validator"] == SCHEMA
    assert options["validationLevel"] == "strict"
    assert options["validationAction"] == "error"


def test_validator_rejects_invalid_insert(db) -> None:
    db.create_collection("people", validator=SCHEMA)
    db.people.insert_one({"name": "ann", "age": 30})
    with pytest.raises(WriteError) as info:
        db.people.insert_one({"name": "bob"})
    assert info.value.code == 121
    with pytest.raises(WriteError) as info:
        db.people.insert_one({"name": "bob", "age": "old"})
    assert info.value.code == 121
    with pytest.raises(WriteError) as info:
        db.people.insert_one({"name": "bob", "age": -1})
    assert info.value.code == 121
    assert db.people.count_documents({}) == 1


def test_validator_error_carries_err_info(db) -> None:
    db.create_collection("people", validator=SCHEMA)
    with pytest.raises(WriteError) as info:
        db.people.insert_one({"_id": 7, "name": "bob"})
    assert info.value.code == 121
    err_info = info.value.details["errInfo"]
    assert err_info["failingDocumentId"] == 7
    assert err_info["details"]["operatorName"] == "$jsonSchema"


def test_validator_rejects_invalid_update(db) -> None:
    db.create_collection("people", validator=SCHEMA)
    db.people.insert_one({"_id": 1, "name": "ann", "age": 30})
    with pytest.raises(WriteError) as info:
        db.people.update_one({"_id": 1}, {"$set": {"age": "thirty"}})
    assert info.value.code == 121
    with pytest.raises(WriteError) as info:
        db.people.replace_one({"_id": 1}, {"name": "ann"})
    assert info.value.code == 121
    assert db.people.find_one({"_id": 1}) == {"_id": 1, "name": "ann", "age": 30}
    db.people.update_one({"_id": 1}, {"$set": {"age": 31}})
    assert db.people.find_one({"_id": 1})["age"] == 31


def test_bypass_document_validation(db) -> None:
    db.create_collection("people", validator=SCHEMA)
    db.people.insert_one({"_id": 1, "name": 5}, bypass_document_validation=True)
    assert db.people.find_one({"_id": 1}) == {"_id": 1, "name": 5}


def test_validation_action_warn_accepts_invalid_documents(db) -> None:
    db.create_collection("people", validator=SCHEMA, validationAction="warn")
    db.people.insert_one({"_id": 1, "name": 5})
    assert db.people.find_one({"_id": 1}) == {"_id": 1, "name": 5}


def test_validation_level_off(db) -> None:
    db.create_collection("people", validator=SCHEMA, validationLevel="off")
    db.people.insert_one({"_id": 1})
    assert db.people.count_documents({}) == 1


def test_validation_level_moderate_skips_already_invalid_documents(db) -> None:
    db.people.insert_many([{"_id": 1, "name": 5}, {"_id": 2, "name": "ok", "age": 1}])
    db.command("collMod", "people", validator=SCHEMA, validationLevel="moderate")
    # Document 1 was invalid before the validator: moderate lets updates to it through.
    db.people.update_one({"_id": 1}, {"$set": {"other": True}})
    assert db.people.find_one({"_id": 1})["other"] is True
    # Document 2 is valid: it must stay valid.
    with pytest.raises(WriteError) as info:
        db.people.update_one({"_id": 2}, {"$unset": {"age": ""}})
    assert info.value.code == 121
    # New documents are always checked.
    with pytest.raises(WriteError):
        db.people.insert_one({"_id": 3})


def test_create_rejects_bad_validation_options(db) -> None:
    with pytest.raises(OperationFailure):
        db.command("create", "bad", validator=SCHEMA, validationLevel="sometimes")
    with pytest.raises(OperationFailure):
        db.command("create", "bad2", validator=SCHEMA, validationAction="shout")
    with pytest.raises(OperationFailure):
        db.command("create", "bad3", validator={"$jsonSchema": {"noSuchKeyword": 1}})
    assert "bad" not in db.list_collection_names()
    assert "bad3" not in db.list_collection_names()


def test_coll_mod_changes_validator(db) -> None:
    db.people.insert_one({"_id": 1, "free": "form"})
    reply = db.command("collMod", "people", validator=SCHEMA)
    assert reply["ok"] == 1.0
    assert _options(db, "people")["validator"] == SCHEMA
    with pytest.raises(WriteError) as info:
        db.people.insert_one({"_id": 2, "free": "form"})
    assert info.value.code == 121
    db.command("collMod", "people", validationAction="warn")
    db.people.insert_one({"_id": 2, "free": "form"})
    assert _options(db, "people")["validationAction"] == "warn"
    db.command("collMod", "people", validator={})
    db.command("collMod", "people", validationAction="error")
    db.people.insert_one({"_id": 3})
    assert db.people.count_documents({}) == 3


def test_coll_mod_missing_collection_is_namespace_not_found(db) -> None:
    with pytest.raises(OperationFailure) as info:
        db.command("collMod", "nope", validator=SCHEMA)
    assert info.value.code == 26


def test_drop_collection(db) -> None:
    db.c.insert_many([{"x": i} for i in range(3)])
    db.c.create_index("x")
    reply = db.command("drop", "c")
    assert reply["ok"] == 1.0
    assert reply["nIndexesWas"] == 2
    assert "c" not in db.list_collection_names()
    assert db.c.count_documents({}) == 0
    db.drop_collection("never_existed")  # dropping a missing collection is not an error
    # Indexes are gone with the collection.
    db.c.insert_one({"x": 1})
    assert [i["name"] for i in db.c.list_indexes()] == ["_id_"]


# -- count and distinct ------------------------------------------------------------------------


def test_count_command(db) -> None:
    db.c.insert_many([{"x": i, "even": i % 2 == 0} for i in range(10)])
    assert db.command("count", "c")["n"] == 10
    assert db.command("count", "c", query={"even": True})["n"] == 5
    assert db.command("count", "c", query={"x": {"$gte": 3}}, skip=2, limit=4)["n"] == 4
    assert db.command("count", "c", skip=8)["n"] == 2
    assert db.command("count", "c", skip=20)["n"] == 0
    assert db.command("count", "missing")["n"] == 0
    assert db.c.estimated_document_count() == 10


def test_count_documents(db) -> None:
    db.c.insert_many([{"x": i} for i in range(25)])
    assert db.c.count_documents({}) == 25
    assert db.c.count_documents({"x": {"$lt": 10}}) == 10
    assert db.c.count_documents({"x": {"$lt": 10}}, skip=3) == 7
    assert db.c.count_documents({}, limit=5) == 5
    assert db.c.count_documents({"x": 100}) == 0
    assert db.nothing.count_documents({}) == 0


def test_distinct(db) -> None:
    db.c.insert_many(
        [
            {"k": "a", "tags": ["x", "y"], "n": 1},
            {"k": "b", "tags": ["y", "z"], "n": 2},
            {"k": "a", "tags": ["x"], "n": 3},
            {"k": None, "n": 4},
            {"n": 5},
            {"k": {"nested": 1}, "n": 6},
        ]
    )
    values = db.c.distinct("k")
    assert len(values) == 4
    assert "a" in values and "b" in values and None in values and {"nested": 1} in values
    assert sorted(db.c.distinct("tags")) == ["x", "y", "z"]  # arrays are unwound
    assert sorted(db.c.distinct("k", {"n": {"$lte": 2}})) == ["a", "b"]
    assert db.c.distinct("missing_field") == []
    assert db.nothing.distinct("k") == []
    reply = db.command("distinct", "c", key="k", query={"k": "a"})
    assert reply["values"] == ["a"]


def test_distinct_ignores_empty_arrays(db) -> None:
    db.c.insert_many([{"tags": ["x"]}, {"tags": []}, {"other": 1}])
    assert db.c.distinct("tags") == ["x"]


def test_distinct_treats_equal_numbers_as_one(db) -> None:
    db.c.insert_many([{"n": 1}, {"n": 1.0}, {"n": 2}])
    assert sorted(db.c.distinct("n")) == [1, 2]


def test_distinct_dotted_path(db) -> None:
    db.c.insert_many([{"a": {"b": 1}}, {"a": [{"b": 2}, {"b": 3}]}, {"a": {"b": 1}}])
    assert sorted(db.c.distinct("a.b")) == [1, 2, 3]
