"""MongoDB 8.0's client-level bulkWrite through ``MongoClient.bulk_write``."""

from __future__ import annotations

import pytest
from pymongo import DeleteMany, DeleteOne, InsertOne, MongoClient, ReplaceOne, UpdateMany, UpdateOne
from pymongo.errors import ClientBulkWriteException, InvalidOperation


def _models(a: str, b: str) -> list:
    return [
        InsertOne(namespace=a, document={"_id": 1, "v": 1}),
        InsertOne(namespace=b, document={"_id": 1, "w": 1}),
        InsertOne(namespace=b, document={"_id": 2, "w": 2}),
        UpdateOne(namespace=a, filter={"_id": 1}, update={"$inc": {"v": 10}}),
        UpdateMany(namespace=b, filter={}, update={"$set": {"seen": True}}),
        ReplaceOne(namespace=a, filter={"_id": 5}, replacement={"r": 1}, upsert=True),
        UpdateOne(namespace=a, filter={"_id": 1}, update={"$set": {"v": 11}}),  # no-op
        DeleteOne(namespace=b, filter={"_id": 2}),
        DeleteMany(namespace=a, filter={"gone": True}),
    ]


def test_mixed_namespaces_summary(client: MongoClient, db) -> None:
    a, b = f"{db.name}.a", f"{db.name}.b"
    result = client.bulk_write(_models(a, b))
    assert result.acknowledged
    assert result.inserted_count == 3
    assert result.matched_count == 4  # 1 + 2 + 0 (the upsert) + 1 (the no-op)
    assert result.modified_count == 3
    assert result.upserted_count == 1
    assert result.deleted_count == 1
    assert not result.has_verbose_results
    with pytest.raises(InvalidOperation):
        _ = result.insert_results
    assert list(db.a.find().sort("_id")) == [{"_id": 1, "v": 11}, {"_id": 5, "r": 1}]
    assert list(db.b.find()) == [{"_id": 1, "w": 1, "seen": True}]


def test_verbose_results(client: MongoClient, db) -> None:
    a, b = f"{db.name}.a", f"{db.name}.b"
    result = client.bulk_write(_models(a, b), verbose_results=True)
    assert result.has_verbose_results
    assert sorted(result.insert_results) == [0, 1, 2]
    assert result.insert_results[2].inserted_id == 2
    assert result.update_results[3].matched_count == 1
    assert result.update_results[3].modified_count == 1
    assert result.update_results[4].matched_count == 2
    assert result.update_results[5].upserted_id == 5
    assert result.update_results[6].modified_count == 0
    assert result.delete_results[7].deleted_count == 1
    assert result.delete_results[8].deleted_count == 0


def test_ordered_stops_at_first_error(client: MongoClient, db) -> None:
    ns = f"{db.name}.c"
    db.c.insert_one({"_id": 2})
    models = [
        InsertOne(namespace=ns, document={"_id": 1}),
        InsertOne(namespace=ns, document={"_id": 2}),
        InsertOne(namespace=ns, document={"_id": 3}),
    ]
    with pytest.raises(ClientBulkWriteException) as info:
        client.bulk_write(models, verbose_results=True)
    errors = info.value.write_errors
    assert len(errors) == 1
    assert errors[0]["idx"] == 1
    assert errors[0]["code"] == 11000
    partial = info.value.partial_result
    assert partial is not None and partial.inserted_count == 1
    assert sorted(d["_id"] for d in db.c.find()) == [1, 2]


def test_unordered_continues(client: MongoClient, db) -> None:
    ns, other = f"{db.name}.c", f"{db.name}.d"
    db.c.insert_one({"_id": 2})
    models = [
        InsertOne(namespace=ns, document={"_id": 1}),
        InsertOne(namespace=ns, document={"_id": 2}),
        InsertOne(namespace=other, document={"_id": 2}),
        UpdateOne(namespace=ns, filter={"_id": 1}, update={"$inc": {"x": "notanumber"}}),
        InsertOne(namespace=ns, document={"_id": 3}),
    ]
    with pytest.raises(ClientBulkWriteException) as info:
        client.bulk_write(models, ordered=False)
    assert sorted(e["idx"] for e in info.value.write_errors) == [1, 3]
    codes = {e["idx"]: e["code"] for e in info.value.write_errors}
    assert codes[1] == 11000
    assert codes[3] == 14
    assert info.value.partial_result.inserted_count == 3
    assert sorted(d["_id"] for d in db.c.find()) == [1, 2, 3]
    assert db.d.count_documents({}) == 1


def test_duplicate_key_error_details(client: MongoClient, db) -> None:
    db.c.create_index("email", unique=True)
    db.c.insert_one({"email": "x"})
    with pytest.raises(ClientBulkWriteException) as info:
        client.bulk_write([InsertOne(namespace=f"{db.name}.c", document={"email": "x"})])
    (err,) = info.value.write_errors
    assert err["code"] == 11000
    assert err["keyPattern"] == {"email": 1}
    assert err["keyValue"] == {"email": "x"}


def test_inside_a_transaction(client: MongoClient, db) -> None:
    a, b = f"{db.name}.a", f"{db.name}.b"
    db.a.insert_one({"_id": 0})
    db.b.insert_one({"_id": 0})
    with client.start_session() as session:
        session.start_transaction()
        client.bulk_write(
            [
                InsertOne(namespace=a, document={"_id": 1}),
                InsertOne(namespace=b, document={"_id": 1}),
            ],
            session=session,
        )
        session.abort_transaction()
    assert db.a.count_documents({}) == 1 and db.b.count_documents({}) == 1
    with client.start_session() as session:
        session.start_transaction()
        client.bulk_write(
            [
                InsertOne(namespace=a, document={"_id": 2}),
                DeleteOne(namespace=b, filter={"_id": 0}),
            ],
            session=session,
        )
        assert db.b.count_documents({}) == 1  # not visible outside before commit
        session.commit_transaction()
    assert sorted(d["_id"] for d in db.a.find()) == [0, 2]
    assert db.b.count_documents({}) == 0


def test_many_operations(client: MongoClient, db) -> None:
    ns = f"{db.name}.big"
    result = client.bulk_write([InsertOne(namespace=ns, document={"i": i}) for i in range(3000)])
    assert result.inserted_count == 3000
    assert db.big.count_documents({}) == 3000
