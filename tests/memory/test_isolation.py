"""Tenant isolation through all three doors (the BaseStore, the HTTP API, the MCP server)
with the same crafted inputs: operator injection ($where, $expr, $or, $regex, operators
nested in fields), dotted and tenant-named field paths, namespace prefixes and wildcards.
Tenant B asks; tenant A's memories must never come back, be listed or be touched, and
every filter that is not a plain BaseStore condition is refused with a message."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_asyncio
from fastapi.testclient import TestClient
from mcp import Client
from pymongo import AsyncMongoClient, MongoClient

from accord.errors import InvalidInputError
from accord.memory.asynchronous.service import AsyncMemoryService
from accord.memory.http_api import create_app
from accord.memory.mcp_server import create_server
from accord.memory.principals import ApiKeys, Principal, new_key
from accord.memory.synchronous.service import MemoryService
from accord.memory.synchronous.store import AccordStore

DIMS = 64
KEY_B = new_key()

#: Filters that try to say something other than "this value field compares so": refused.
REFUSED: list[Any] = [
    {"$where": "true"},
    {"$expr": {"$eq": ["$tenant_id", "A"]}},
    {"$or": [{"owner": "A"}, {"owner": "B"}]},
    {"$and": [{"owner": "A"}]},
    {"$nor": [{"owner": "B"}]},
    {"tenant_id": {"$regex": "."}},
    {"owner": {"$where": "1"}},
    {"owner": {"$exists": True}},
    {"owner": {"$nin": ["B"]}},
    {"owner": {"$expr": 1}},
    {"owner": {"$eq": "A", "tenant_id": "A"}},
    {"meta": {"$or": [{"x": 1}]}},
    {"": "A"},
    {"$tenant_id": "A"},
]

#: Filters that are allowed: they compare value fields, so they can only narrow B's own
#: results (a value field named tenant_id is the value's, not the memory's tenant).
NARROWING: list[Any] = [
    {"tenant_id": "A"},
    {"tenant_id": {"$ne": "B"}},
    {"tenant_id.$ne": "B"},
    {"value.tenant_id": "A"},
    {"owner": {"$ne": "B"}},
    {"owner": {"$in": ["A", "B"]}},
    {"n": {"$gte": 0}},
    {"meta": {"tenant_id": "A"}},
]

#: Of those, the ones B's own memories pass (so the search is shown to find something).
MATCH_B: list[Any] = [{"owner": {"$in": ["A", "B"]}}, {"n": {"$gte": 0}}]

#: Namespace prefixes to search under (all of them B's view only).
PREFIXES: list[tuple[str, ...]] = [(), ("users",), ("users", "alice"), ("shared",)]


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "iso_" + uuid.uuid4().hex[:10]
    a = MemoryService(client, tenant_id="A", db_name=name, dims=DIMS)
    a.setup()
    b = a.for_tenant("B")
    for svc, owner, ns in ((a, "A", ("users", "alice")), (a, "A", ("shared",)),
                           (b, "B", ("users", "bob")), (b, "B", ("shared",))):  # fmt: skip
        svc.put(ns, "secret", {"owner": owner, "n": 1, "tenant_id": owner,
                               "meta": {"tenant_id": owner}},
                text=f"the launch code of {owner} is secret")  # fmt: skip
    try:
        yield name
    finally:
        client.drop_database(name)


def owners(values: list[dict[str, Any]]) -> set[str]:
    return {v["owner"] for v in values}


# -- the BaseStore ---------------------------------------------------------------------------


@pytest.fixture()
def store(client: MongoClient, db_name: str) -> AccordStore:
    return AccordStore(
        client, service=MemoryService(client, tenant_id="B", db_name=db_name, dims=DIMS)
    )


@pytest.mark.parametrize("filt", REFUSED)
def test_store_refuses_crafted_filters(store: AccordStore, filt: Any) -> None:
    with pytest.raises(InvalidInputError):
        store.search(("users",), query="launch code", filter=filt)


@pytest.mark.parametrize("filt", NARROWING)
@pytest.mark.parametrize("prefix", PREFIXES)
def test_store_never_returns_another_tenant(store: AccordStore, filt: Any,
                                            prefix: tuple[str, ...]) -> None:  # fmt: skip
    for query in ("launch code", None):
        hits = store.search(prefix, query=query, filter=filt, limit=50)
        assert owners([h.value for h in hits]) <= {"B"}, (filt, prefix, query)
        if filt in MATCH_B and prefix in ((), ("shared",)):
            assert owners([h.value for h in hits]) == {"B"}


def test_store_get_list_delete_stay_in_the_tenant(store: AccordStore, client: MongoClient,
                                                   db_name: str) -> None:  # fmt: skip
    assert store.get(("users", "alice"), "secret") is None
    assert owners([store.get(("shared",), "secret").value]) == {"B"}  # type: ignore[union-attr]
    assert store.list_namespaces() == [("shared",), ("users", "bob")]
    assert store.list_namespaces(prefix=("users", "*")) == [("users", "bob")]
    assert store.list_namespaces(suffix=("alice",)) == []
    store.delete(("users", "alice"), "secret")
    store.delete(("shared",), "secret")
    a = MemoryService(client, tenant_id="A", db_name=db_name, dims=DIMS)
    assert a.get(("users", "alice"), "secret") is not None
    assert a.get(("shared",), "secret") is not None  # B deleted its own, not A's
    assert store.get(("shared",), "secret") is None


# -- the HTTP API ----------------------------------------------------------------------------


@pytest.fixture()
def api(mongo_uri: str, db_name: str) -> Iterator[TestClient]:
    keys = ApiKeys([Principal(name="b", tenant="B", key=KEY_B)])
    with TestClient(create_app(mongo_uri, keys=keys, db_name=db_name, dims=DIMS)) as c:
        yield c


def b(api: TestClient, method: str, path: str, **kw: Any) -> Any:
    return api.request(method, path, headers={"X-API-Key": KEY_B}, **kw)


@pytest.mark.parametrize("filt", REFUSED)
def test_http_refuses_crafted_filters(api: TestClient, filt: Any) -> None:
    r = b(api, "POST", "/v1/search", json={"query": "launch code", "filter": filt})
    assert r.status_code == 422, (filt, r.text)


@pytest.mark.parametrize("filt", NARROWING)
@pytest.mark.parametrize("prefix", PREFIXES)
def test_http_never_returns_another_tenant(api: TestClient, filt: Any,
                                           prefix: tuple[str, ...]) -> None:  # fmt: skip
    for query in ("launch code", None):
        r = b(api, "POST", "/v1/search", json={"namespace_prefix": list(prefix), "query": query,
                                               "filter": filt, "limit": 50})  # fmt: skip
        assert r.status_code == 200, r.text
        assert owners([m["value"] for m in r.json()["items"]]) <= {"B"}, (filt, prefix, query)
        if filt in MATCH_B and prefix in ((), ("shared",)):
            assert owners([m["value"] for m in r.json()["items"]]) == {"B"}


def test_http_get_list_history_delete_stay_in_the_tenant(api: TestClient, client: MongoClient,
                                                         db_name: str) -> None:  # fmt: skip
    assert b(api, "GET", "/v1/memories/users.alice/secret").status_code == 404
    assert b(api, "GET", "/v1/history/users.alice/secret").json()["items"] == []
    assert b(api, "GET", "/v1/namespaces").json()["items"] == [["shared"], ["users", "bob"]]
    assert b(api, "GET", "/v1/namespaces?prefix=users.*").json()["items"] == [["users", "bob"]]
    assert b(api, "GET", "/v1/namespaces?suffix=alice").json()["items"] == []
    # a tenant in a body or in the query string is refused or means nothing
    assert b(api, "POST", "/v1/search", json={"tenant_id": "A"}).status_code == 422
    r = b(api, "GET", "/v1/namespaces?tenant_id=A")
    assert r.json()["items"] == [["shared"], ["users", "bob"]]
    r = b(api, "PUT", "/v1/memories/shared/secret", json={"value": {"owner": "B"},
                                                           "tenant_id": "A"})  # fmt: skip
    assert r.status_code == 422
    assert b(api, "DELETE", "/v1/memories/users.alice/secret").json() == {"deleted": False}
    assert b(api, "DELETE", "/v1/memories/shared/secret").json() == {"deleted": True}
    a = MemoryService(client, tenant_id="A", db_name=db_name, dims=DIMS)
    assert a.get(("users", "alice"), "secret") is not None
    assert a.get(("shared",), "secret") is not None


# -- the MCP server --------------------------------------------------------------------------


@pytest_asyncio.fixture()
async def service(mongo_uri: str, db_name: str) -> Any:
    aclient: AsyncMongoClient[Any] = AsyncMongoClient(mongo_uri)
    try:
        yield AsyncMemoryService(aclient, db_name=db_name, dims=DIMS)
    finally:
        await aclient.close()


def tool_data(result: Any) -> Any:
    assert not result.is_error, result.content
    structured = result.structured_content
    return structured.get("result", structured) if structured is not None else None


@pytest.mark.asyncio
async def test_mcp_refuses_crafted_filters(service: AsyncMemoryService) -> None:
    async with Client(create_server(service=service, tenant_id="B")) as mcp_b:
        await refuses(mcp_b)


async def refuses(mcp_b: Any) -> None:
    for filt in REFUSED:
        result = await mcp_b.call_tool("search_memory", {"query": "launch code", "filter": filt})
        assert result.is_error, filt


@pytest.mark.asyncio
async def test_mcp_never_returns_another_tenant(service: AsyncMemoryService, client: MongoClient,
                                                db_name: str) -> None:  # fmt: skip
    async with Client(create_server(service=service, tenant_id="B")) as mcp_b:
        await stays_in_tenant(mcp_b, client, db_name)


async def stays_in_tenant(mcp_b: Any, client: MongoClient, db_name: str) -> None:
    for filt in [None, *NARROWING]:
        for prefix in PREFIXES:
            args: dict[str, Any] = {"query": "launch code", "namespace": list(prefix),
                                    "limit": 50}  # fmt: skip
            if filt is not None:
                args["filter"] = filt
            hits = tool_data(await mcp_b.call_tool("search_memory", args))
            assert owners([h["value"] for h in hits]) <= {"B"}, (filt, prefix)
            if (filt is None or filt in MATCH_B) and prefix in ((), ("shared",)):
                assert owners([h["value"] for h in hits]) == {"B"}
    # a tenant argument is not a parameter of any tool: refused, nothing of A returned
    sneaky = await mcp_b.call_tool("search_memory", {"query": "launch code", "tenant_id": "A"})
    assert sneaky.is_error and "does not take 'tenant_id'" in sneaky.content[0].text
    assert sneaky.structured_content is None and len(sneaky.content) == 1  # no memories
    got = await mcp_b.call_tool("get_memory", {"namespace": ["users", "alice"], "key": "secret"})
    assert tool_data(got) is None
    spaces = tool_data(await mcp_b.call_tool("list_namespaces", {}))
    assert spaces == [["shared"], ["users", "bob"]]
    spaces = tool_data(await mcp_b.call_tool("list_namespaces", {"prefix": ["users"]}))
    assert spaces == [["users", "bob"]]
    gone = await mcp_b.call_tool("delete_memory", {"namespace": ["users", "alice"],
                                                   "key": "secret"})  # fmt: skip
    assert tool_data(gone) == {"deleted": False}
    gone = await mcp_b.call_tool("delete_memory", {"namespace": ["shared"], "key": "secret"})
    assert tool_data(gone) == {"deleted": True}
    a = MemoryService(client, tenant_id="A", db_name=db_name, dims=DIMS)
    assert a.get(("users", "alice"), "secret") is not None
    assert a.get(("shared",), "secret") is not None
