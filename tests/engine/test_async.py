"""The same core operations through ``pymongo.AsyncMongoClient`` (run with ``asyncio.run``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pymongo import AsyncMongoClient, InsertOne, ReturnDocument, UpdateOne
from pymongo.errors import DuplicateKeyError, OperationFailure
from pymongo.read_concern import ReadConcern


def run(mongo_uri: str, body: Callable[[Any], Awaitable[None]]) -> None:
    """Run ``body(db)`` on a fresh database with a fresh AsyncMongoClient."""

    async def main() -> None:
        client: AsyncMongoClient = AsyncMongoClient(mongo_uri)
        name = "t_async_" + uuid.uuid4().hex[:10]
        try:
            await body(client[name])
        finally:
            await client.drop_database(name)
            await client.close()

    asyncio.run(main())


def test_async_handshake(mongo_uri: str) -> None:
    async def body(db) -> None:
        assert (await db.command("ping"))["ok"] == 1.0
        hello = await db.client.admin.command("hello")
        assert hello["isWritablePrimary"] is True
        assert hello["maxWireVersion"] == 25

    run(mongo_uri, body)


def test_async_crud(mongo_uri: str) -> None:
    async def body(db) -> None:
        result = await db.c.insert_one({"_id": 1, "v": 1})
        assert result.inserted_id == 1
        await db.c.insert_many([{"_id": i, "v": i} for i in range(2, 301)])
        assert await db.c.count_documents({}) == 300
        assert await db.c.find_one({"_id": 5}) == {"_id": 5, "v": 5}
        docs = await db.c.find({"v": {"$gt": 100}}, {"_id": 1}).sort("_id", -1).to_list()
        assert [d["_id"] for d in docs] == list(range(300, 100, -1))
        seen = [d["_id"] async for d in db.c.find().batch_size(7)]
        assert sorted(seen) == list(range(1, 301))
        upd = await db.c.update_many({"v": {"$lte": 10}}, {"$inc": {"v": 1000}})
        assert upd.matched_count == upd.modified_count == 10
        up = await db.c.update_one({"_id": 999}, {"$set": {"v": 0}}, upsert=True)
        assert up.upserted_id == 999
        after = await db.c.find_one_and_update(
            {"_id": 1}, {"$set": {"tag": "x"}}, return_document=ReturnDocument.AFTER
        )
        assert after == {"_id": 1, "v": 1001, "tag": "x"}
        assert (await db.c.delete_many({"v": {"$gte": 1000}})).deleted_count == 10
        assert sorted(await db.c.distinct("tag")) == []
        agg = await (await db.c.aggregate([{"$group": {"_id": None, "n": {"$sum": 1}}}])).to_list()
        assert agg == [{"_id": None, "n": 291}]
        with pytest.raises(DuplicateKeyError):
            await db.c.insert_one({"_id": 50})
        with pytest.raises(OperationFailure) as info:
            await db.c.find_one({"v": {"$foo": 1}})
        assert info.value.code == 2
        bulk = await db.c.bulk_write(
            [InsertOne({"_id": 5000}), UpdateOne({"_id": 5000}, {"$set": {"b": 1}})]
        )
        assert bulk.inserted_count == 1 and bulk.modified_count == 1
        await db.c.create_index("v", unique=True)
        names = [i["name"] async for i in await db.c.list_indexes()]
        assert names == ["_id_", "v_1"]

    run(mongo_uri, body)


def test_async_transaction_commit_and_abort(mongo_uri: str) -> None:
    async def body(db) -> None:
        await db.acct.insert_many([{"_id": "a", "bal": 100}, {"_id": "b", "bal": 0}])
        client = db.client
        async with client.start_session() as s:
            await s.start_transaction()
            await db.acct.update_one({"_id": "a"}, {"$inc": {"bal": -40}}, session=s)
            await db.acct.update_one({"_id": "b"}, {"$inc": {"bal": 40}}, session=s)
            assert (await db.acct.find_one({"_id": "b"}))["bal"] == 0  # not yet visible
            assert (await db.acct.find_one({"_id": "b"}, session=s))["bal"] == 40
            await s.commit_transaction()
        assert {d["_id"]: d["bal"] async for d in db.acct.find()} == {"a": 60, "b": 40}

        async with client.start_session() as s:
            await s.start_transaction()
            await db.acct.update_one({"_id": "a"}, {"$inc": {"bal": -60}}, session=s)
            await s.abort_transaction()
        assert (await db.acct.find_one({"_id": "a"}))["bal"] == 60

    run(mongo_uri, body)


def test_async_with_transaction_and_concurrent_conflicts(mongo_uri: str) -> None:
    async def body(db) -> None:
        await db.counter.insert_one({"_id": 1, "n": 0})
        client = db.client

        async def bump(session) -> None:
            doc = await db.counter.find_one({"_id": 1}, session=session)
            await asyncio.sleep(0)  # let the other tasks interleave
            await db.counter.update_one({"_id": 1}, {"$set": {"n": doc["n"] + 1}}, session=session)

        async def worker() -> None:
            async with client.start_session() as s:
                for _ in range(10):
                    await s.with_transaction(bump, read_concern=ReadConcern("snapshot"))

        await asyncio.gather(*(worker() for _ in range(8)))
        # Lost updates would leave n below 80: conflicting read-modify-writes must retry.
        assert (await db.counter.find_one({"_id": 1}))["n"] == 80

    run(mongo_uri, body)


def test_async_client_bulk_write(mongo_uri: str) -> None:
    async def body(db) -> None:
        result = await db.client.bulk_write(
            [
                InsertOne(namespace=f"{db.name}.x", document={"_id": 1}),
                InsertOne(namespace=f"{db.name}.y", document={"_id": 1}),
                UpdateOne(namespace=f"{db.name}.x", filter={"_id": 1}, update={"$set": {"k": 1}}),
            ],
            verbose_results=True,
        )
        assert result.inserted_count == 2 and result.modified_count == 1
        assert await db.x.find_one() == {"_id": 1, "k": 1}
        assert await db.y.count_documents({}) == 1

    run(mongo_uri, body)
