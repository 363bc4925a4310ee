"""The MCP door, through an MCP client session: in process (the mcp package's client on
the server object) and over stdio (``accord mcp`` in a child process). Tools, validation,
and tenant isolation."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from mcp import Client, StdioServerParameters
from pymongo import AsyncMongoClient, MongoClient

from accord.errors import ConfigurationError
from accord.memory.asynchronous.service import AsyncMemoryService
from accord.memory.mcp_server import create_server


@pytest_asyncio.fixture()
async def service(mongo_uri: str, client: MongoClient) -> AsyncIterator[AsyncMemoryService]:
    db = "mcp_" + uuid.uuid4().hex[:10]
    aclient: AsyncMongoClient[Any] = AsyncMongoClient(mongo_uri)
    try:
        yield AsyncMemoryService(aclient, db_name=db, dims=64)
    finally:
        await aclient.close()
        client.drop_database(db)


def data(result: Any) -> Any:
    """A tool result's structured content (the tool's return value)."""
    assert not result.is_error, result.content
    structured = result.structured_content
    if structured is not None:
        return structured.get("result", structured)
    return json.loads(result.content[0].text)


def error(result: Any) -> str:
    assert result.is_error
    return str(result.content[0].text)


@pytest.mark.asyncio
async def test_tools_save_search_get_delete(service: AsyncMemoryService) -> None:
    async with Client(create_server(service=service, tenant_id="acme")) as mcp:
        names = {t.name for t in (await mcp.list_tools()).tools}
        assert names == {"search_memory", "save_memory", "get_memory", "delete_memory",
                         "list_namespaces"}  # fmt: skip
        saved = data(await mcp.call_tool("save_memory", {"text": "User prefers aisle seats",
                                                         "kind": "preference"}))  # fmt: skip
        assert saved["namespace"] == ["memories"] and saved["version"] == 1
        again = data(await mcp.call_tool("save_memory", {"text": "User prefers aisle seats",
                                                         "kind": "preference"}))  # fmt: skip
        assert again["key"] == saved["key"]  # the same statement is one memory
        data(await mcp.call_tool("save_memory", {"text": "Project Falcon ships in May",
                                                 "namespace": ["projects"], "key": "falcon"}))  # fmt: skip
        hits = data(await mcp.call_tool("search_memory", {"query": "which seat?", "limit": 2}))
        assert hits[0]["text"] == "User prefers aisle seats" and hits[0]["score"] > 0
        scoped = data(
            await mcp.call_tool("search_memory", {"query": "seat", "namespace": ["projects"]})
        )
        assert [h["key"] for h in scoped] == ["falcon"]
        got = data(await mcp.call_tool("get_memory", {"namespace": ["projects"], "key": "falcon"}))
        assert got["value"] == {"content": "Project Falcon ships in May"}
        spaces = data(await mcp.call_tool("list_namespaces", {}))
        assert spaces == [["memories"], ["projects"]]
        gone = data(
            await mcp.call_tool("delete_memory", {"namespace": ["projects"], "key": "falcon"})
        )
        assert gone == {"deleted": True}
        missing = await mcp.call_tool("get_memory", {"namespace": ["projects"], "key": "falcon"})
        assert data(missing) is None
    history = await service.for_tenant("acme").history(("projects",), "falcon")
    assert [h["change"] for h in history] == ["delete"]


@pytest.mark.asyncio
async def test_a_key_that_reads_as_json_is_kept_as_given(service: AsyncMemoryService) -> None:
    """The SDK parses a string argument whose declared type is not ``str`` as JSON: a key
    "null" saved a memory under a key derived from the text, "[1]" was refused."""
    async with Client(create_server(service=service, tenant_id="acme")) as mcp:
        for key in ("null", "[1]", '{"a": 1}', "true", "5"):
            saved = data(await mcp.call_tool("save_memory", {"text": f"t {key}", "key": key}))
            assert saved["key"] == key
            got = data(await mcp.call_tool("get_memory", {"namespace": ["memories"], "key": key}))
            assert got["value"] == {"content": f"t {key}"}


@pytest.mark.asyncio
async def test_bad_input_is_a_tool_error_that_says_why(service: AsyncMemoryService) -> None:
    async with Client(create_server(service=service, tenant_id="acme")) as mcp:
        assert "may not contain '.'" in error(
            await mcp.call_tool("save_memory", {"text": "x", "namespace": ["a.b"]})
        )
        assert "non-empty statement" in error(await mcp.call_tool("save_memory", {"text": "  "}))
        assert "'$where' is not allowed" in error(
            await mcp.call_tool("search_memory", {"query": "x", "filter": {"$where": "sleep(100)"}})
        )
        assert "'$regex'" in error(
            await mcp.call_tool(
                "search_memory", {"query": "x", "filter": {"content": {"$regex": ".*"}}}
            )
        )
        assert "must be between 1 and 50" in error(
            await mcp.call_tool("search_memory", {"query": "x", "limit": 5000})
        )
        assert "a kind is a short name" in error(
            await mcp.call_tool("save_memory", {"text": "x", "kind": "$set"})
        )


@pytest.mark.asyncio
async def test_tenants_never_see_each_other(service: AsyncMemoryService) -> None:
    async with Client(create_server(service=service, tenant_id="A")) as a, \
            Client(create_server(service=service, tenant_id="B")) as b:  # fmt: skip
        data(await a.call_tool("save_memory", {"text": "A's launch code is 1234", "key": "code"}))
        data(await b.call_tool("save_memory", {"text": "B likes tea", "key": "tea"}))
        for args in ({"query": "launch code"}, {"query": "code", "filter": {"content": {"$ne": ""}}},
                     {"query": "code", "namespace": ["memories"]}):  # fmt: skip
            hits = data(await b.call_tool("search_memory", args))
            assert [h["key"] for h in hits] == ["tea"], args
        assert (
            data(await b.call_tool("get_memory", {"namespace": ["memories"], "key": "code"}))
            is None
        )
        assert data(await b.call_tool("delete_memory", {"namespace": ["memories"], "key": "code"})) == {
            "deleted": False}  # fmt: skip
        assert data(await a.call_tool("get_memory", {"namespace": ["memories"], "key": "code"}))
        # no tool takes a tenant: an extra argument is refused, never obeyed
        sneaky = await b.call_tool("search_memory", {"query": "code", "tenant_id": "A"})
        assert "search_memory does not take 'tenant_id'" in error(sneaky)


@pytest.mark.asyncio
@pytest.mark.parametrize(("tool", "args", "named"), [
    # a misnamed prefix was ignored: the search ran over every namespace
    ("search_memory", {"query": "tea", "prefix": ["projects"]}, "'prefix'"),
    ("search_memory", {"query": "tea", "namespace_prefix": ["projects"]}, "'namespace_prefix'"),
    ("save_memory", {"text": "B likes coffee", "value": {"x": 1}}, "'value'"),
    ("save_memory", {"text": "B likes coffee", "tenant_id": "A", "ttl_minutes": 5},
     "'tenant_id', 'ttl_minutes'"),
    ("delete_memory", {"namespace": ["memories"], "key": "tea", "tenant": "A"}, "'tenant'"),
    ("list_namespaces", {"namespace": ["projects"]}, "'namespace'"),
])  # fmt: skip
async def test_an_argument_a_tool_does_not_take_is_refused(
    service: AsyncMemoryService, tool: str, args: dict[str, Any], named: str
) -> None:
    """The SDK ignores unknown arguments; a model that misnames one got an answer to
    another question (every namespace searched, a value dropped) with no sign of it."""
    async with Client(create_server(service=service, tenant_id="B")) as b:
        data(await b.call_tool("save_memory", {"text": "B likes tea", "key": "tea"}))
        refused = error(await b.call_tool(tool, args))
        assert f"{tool} does not take {named}" in refused and "Nothing was done" in refused
        kept = data(await b.call_tool("get_memory", {"namespace": ["memories"], "key": "tea"}))
        assert kept is not None and kept["version"] == 1  # nothing written or deleted
        spaces = data(await b.call_tool("list_namespaces", {}))
        assert spaces == [["memories"]]


def test_configuration_errors(mongo_uri: str) -> None:
    with pytest.raises(ConfigurationError, match="exactly one of uri or service"):
        create_server(tenant_id="a")
    with pytest.raises(Exception, match="tenant_id"):
        create_server(mongo_uri, tenant_id="$all")


@pytest.mark.asyncio
async def test_accord_mcp_over_stdio(mongo_uri: str, client: MongoClient) -> None:
    """The real command, as an MCP client configuration would start it."""
    db = "mcp_" + uuid.uuid4().hex[:10]
    env = {**os.environ, "MONGODB_URI": mongo_uri, "ACCORD_DATABASE": db,
           "ACCORD_EMBEDDING_DIMS": "64"}  # fmt: skip
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "accord.platform.cli", "mcp", "--tenant", "acme"],
        env=env,
    )  # fmt: skip
    try:
        async with Client(params) as mcp:
            data(await mcp.call_tool("save_memory", {"text": "User's name is Dana", "key": "name"}))
            hits = data(await mcp.call_tool("search_memory", {"query": "what is the user's name"}))
            assert hits[0]["key"] == "name"
        doc = client[db].long_term_memory.find_one({"key": "name"})
        assert doc["tenant_id"] == "acme" and doc["provenance"]["source"] == "mcp"
    finally:
        client.drop_database(db)
