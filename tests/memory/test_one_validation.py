"""The three doors validate through one module, strictly (issue 22, item 6): the same bad
input refused by the store (or the memory service behind it, where the BaseStore API has
no such parameter), the HTTP API and the MCP server, with the same reason; what HTTP
refuses, MCP refuses too (before, MCP took ``"10"``, ``true`` or ``"5.0"`` as a limit, a
JSON text as a filter, ``'事实'`` as a kind, and queries of any size). And over stdio, a
line that is no JSON-RPC message is answered, never dropped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from fastapi.testclient import TestClient
from mcp import Client
from pymongo import AsyncMongoClient, MongoClient

from accord.errors import InvalidInputError
from accord.memory import validation
from accord.memory.asynchronous.service import AsyncMemoryService
from accord.memory.http_api import create_app
from accord.memory.mcp_server import create_server
from accord.memory.principals import ApiKeys, Principal, new_key
from accord.memory.synchronous.service import MemoryService
from accord.memory.synchronous.store import AccordStore

KEY = new_key()
LONG_QUERY = "q" * (validation.MAX_QUERY + 1)
LONG_TEXT = "t" * (validation.MAX_TEXT + 1)


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "onev_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


@pytest.fixture()
def doors(mongo_uri: str, client: MongoClient, db_name: str) -> Iterator[dict[str, Any]]:
    keys = ApiKeys([Principal(name="a", tenant="acme", key=KEY)])
    store = AccordStore(client, tenant_id="acme", db_name=db_name, index={"dims": 32})
    store.setup()
    with TestClient(create_app(mongo_uri, keys=keys, db_name=db_name, dims=32)) as http:
        yield {"store": store, "service": MemoryService(client, tenant_id="acme",
                                                         db_name=db_name, dims=32),
               "http": http}  # fmt: skip


@pytest_asyncio.fixture()
async def service(mongo_uri: str, db_name: str) -> AsyncIterator[AsyncMemoryService]:
    aclient: AsyncMongoClient[Any] = AsyncMongoClient(mongo_uri)
    try:
        yield AsyncMemoryService(aclient, tenant_id="acme", db_name=db_name, dims=32)
    finally:
        await aclient.close()


#: One bad input per row, as each door takes it: (store call, HTTP request, MCP tool call,
#: the reason all three must give).
CASES: list[tuple[str, Any, tuple[str, str, Any], tuple[str, dict[str, Any]], str]] = [
    ("limit as a string",
     lambda d: d["store"].search(("n",), limit="10"),
     ("post", "/v1/search", {"limit": "10"}),
     ("search_memory", {"query": "x", "limit": "10"}),
     "must be an integer, got a string"),
    ("limit as a boolean",
     lambda d: d["store"].search(("n",), limit=True),
     ("post", "/v1/search", {"limit": True}),
     ("search_memory", {"query": "x", "limit": True}),
     "must be an integer, got a boolean"),
    ("a filter as a JSON text",
     lambda d: d["store"].search(("n",), filter='{"a": 1}'),
     ("post", "/v1/search", {"filter": '{"a": 1}'}),
     ("search_memory", {"query": "x", "filter": '{"a": 1}'}),
     "a filter is an object of field -> condition, got a string"),
    ("an operator that widens",
     lambda d: d["store"].search(("n",), filter={"$where": "1"}),
     ("post", "/v1/search", {"filter": {"$where": "1"}}),
     ("search_memory", {"query": "x", "filter": {"$where": "1"}}),
     "filter field '$where' is not allowed"),
    ("a query over its cap",
     lambda d: d["store"].search(("n",), query=LONG_QUERY),
     ("post", "/v1/search", {"query": LONG_QUERY}),
     ("search_memory", {"query": LONG_QUERY}),
     "has 10,001 characters; at most 10,000"),
    ("a kind that is not a short name",
     lambda d: d["service"].put(("n",), "k", {"v": 1}, kind="事实"),
     ("put", "/v1/memories/n/k", {"value": {}, "kind": "事实"}),
     ("save_memory", {"text": "x", "kind": "事实"}),
     "a kind is a short name"),
    ("a kind starting with a digit",
     lambda d: d["service"].put(("n",), "k", {"v": 1}, kind="1abc"),
     ("put", "/v1/memories/n/k", {"value": {}, "kind": "1abc"}),
     ("save_memory", {"text": "x", "kind": "1abc"}),
     "a kind is a short name"),
    ("a text over its cap",
     lambda d: d["service"].put(("n",), "k", {"v": 1}, text=LONG_TEXT),
     ("put", "/v1/memories/n/k", {"value": {}, "text": LONG_TEXT}),
     ("save_memory", {"text": LONG_TEXT}),
     "has 100,001 characters; at most 100,000"),
    ("a key with NUL",
     lambda d: d["store"].get(("n",), "a\x00b"),
     ("get", "/v1/memories/n/a%00b", None),
     ("get_memory", {"namespace": ["n"], "key": "a\x00b"}),
     "a memory key is a string without NUL"),
    ("a namespace as a JSON text",
     lambda d: d["service"].get('["n"]', "k"),
     ("get", "/v1/namespaces?prefix=a..b", None),  # (HTTP namespaces are dot-joined text)
     ("get_memory", {"namespace": '["n"]', "key": "k"}),
     "namespace"),
    ("a namespace label with a dot",
     lambda d: d["service"].get(("a.b",), "k"),
     ("get", "/v1/memories/a..b/k", None),
     ("delete_memory", {"namespace": ["a.b"], "key": "k"}),
     "namespace"),
    ("a TTL of zero",
     lambda d: d["store"].put(("n",), "k", {"v": 1}, ttl=0),
     ("put", "/v1/memories/n/k", {"value": {}, "ttl_minutes": 0}),
     None,
     "must be a finite number > 0"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "store_call", "request_", "tool", "reason"), CASES,
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_three_doors_one_reason(
    doors: dict[str, Any], service: AsyncMemoryService, name: str, store_call: Any,
    request_: tuple[str, str, Any], tool: Any, reason: str,
) -> None:  # fmt: skip
    with pytest.raises(InvalidInputError) as caught:
        store_call(doors)
    assert reason in str(caught.value), caught.value
    method, path, body = request_
    r = doors["http"].request(method, path, headers={"Authorization": f"Bearer {KEY}"}, json=body)
    assert r.status_code in (400, 422), r.text[:300]
    assert reason in r.json()["detail"], r.json()["detail"][:500]
    if tool is not None:
        text = _mcp_error(service, *tool)
        assert reason in text, text[:500]


def _mcp_error(service: AsyncMemoryService, tool: str, arguments: dict[str, Any]) -> str:
    """The tool error an in-process MCP client gets (run on a loop of its own)."""
    import asyncio

    out: list[Any] = []

    async def call() -> None:
        async with Client(create_server(service=service, tenant_id="acme", setup=False)) as mcp:
            out.append(await mcp.call_tool(tool, arguments))

    thread = threading.Thread(target=lambda: asyncio.run(call()))
    thread.start()
    thread.join(60)
    (result,) = out
    assert result.is_error, result
    return str(result.content[0].text)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("search_memory", {"query": "x", "limit": "10"}),
        ("search_memory", {"query": "x", "limit": " 7 "}),
        ("search_memory", {"query": "x", "limit": True}),
        ("search_memory", {"query": "x", "limit": "5.0"}),
        ("search_memory", {"query": "x", "limit": 5.5}),
        ("search_memory", {"query": "x", "filter": '{"content": "x"}'}),
        ("search_memory", {"query": "x", "namespace": '["memories"]'}),
        ("search_memory", {"query": LONG_QUERY}),
        ("save_memory", {"text": "x", "kind": "事实"}),
        ("save_memory", {"text": "x", "kind": "²"}),
        ("save_memory", {"text": "x", "kind": "1abc"}),
        ("save_memory", {"text": "x", "namespace": '["memories"]'}),
        ("save_memory", {"text": LONG_TEXT}),
        ("save_memory", {"text": "x", "key": "k" * 1025}),
        ("list_namespaces", {"limit": "3"}),
        ("list_namespaces", {"prefix": '["memories"]'}),
    ],
)
async def test_mcp_refuses_what_http_refuses(
    service: AsyncMemoryService, tool: str, arguments: dict[str, Any]
) -> None:
    async with Client(create_server(service=service, tenant_id="acme")) as mcp:
        result = await mcp.call_tool(tool, arguments)
        assert result.is_error, (tool, arguments, result)
        assert len(result.content[0].text) < 2000  # the input is not echoed whole
        assert await service.list_namespaces() == []  # nothing saved


@pytest.mark.asyncio
async def test_mcp_takes_json_integers(service: AsyncMemoryService) -> None:
    async with Client(create_server(service=service, tenant_id="acme")) as mcp:
        for limit in (3, 3.0):
            result = await mcp.call_tool("search_memory", {"query": "x", "limit": limit})
            assert not result.is_error, result


# -- stdio: answered, never dropped ------------------------------------------------------------


def test_unreadable_lines_over_stdio_get_json_rpc_errors(mongo_uri: str, db_name: str) -> None:
    """The real ``accord mcp``: invalid JSON, JSON nested 300 deep, a lone surrogate and a
    batch each get an error answer (the MCP SDK's transport answered none of them); the
    server keeps serving afterwards."""
    env = {**os.environ, "MONGODB_URI": mongo_uri, "ACCORD_DATABASE": db_name,
           "ACCORD_EMBEDDING_DIMS": "32"}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "accord.platform.cli", "mcp", "--tenant", "acme"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, text=True, encoding="utf-8", errors="surrogateescape")  # fmt: skip
    lines = [
        "{not json",
        '{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": ' + "[" * 300 + "]" * 300 + "}",
        '{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"x": "\\ud800"}}',
        '[{"jsonrpc": "2.0", "id": 8, "method": "ping"}]',
        json.dumps({"jsonrpc": "2.0", "id": 9, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}),
    ]  # fmt: skip
    try:
        answers = []
        assert proc.stdin is not None and proc.stdout is not None
        for line in lines:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            answers.append(_read_line(proc))
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    parse, deep, surrogate, batch, init = (json.loads(a) for a in answers)
    assert parse["id"] is None and parse["error"]["code"] == -32700
    assert deep["id"] is None and deep["error"]["code"] == -32700
    assert "nested" in deep["error"]["message"]
    assert surrogate["id"] == 7 and surrogate["error"]["code"] == -32600
    assert "surrogate" in surrogate["error"]["message"]
    assert batch["id"] is None and batch["error"]["code"] == -32600
    assert "batch" in batch["error"]["message"]
    assert init["id"] == 9 and init["result"]["serverInfo"]["name"] == "accord-memory"


def test_stdio_reads_messages_strictly(mongo_uri: str, client: MongoClient, db_name: str) -> None:
    """Every line, not only the ones the SDK cannot read, is read as strict JSON first
    (docs/memory.md): a field name given twice (the SDK kept the last: a gateway that
    allows ``get_memory`` by the first ``name`` let a ``delete_memory`` through, and a
    second ``namespace`` chose where a memory was saved), a number beyond a double, and
    bytes that are not UTF-8 (the SDK read them as U+FFFD and saved that) are parse
    errors; nothing is done, and the server keeps serving."""
    env = {**os.environ, "MONGODB_URI": mongo_uri, "ACCORD_DATABASE": db_name,
           "ACCORD_EMBEDDING_DIMS": "32"}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "accord.platform.cli", "mcp", "--tenant", "acme"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)  # fmt: skip

    def call(n: int, params: str) -> bytes:
        return b'{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": %s}' % (
            n,
            params.encode(),
        )

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
    save = '{"name": "save_memory", "arguments": {"text": "kept", "key": "k", "namespace": ["a"]}}'
    lines = [
        json.dumps(init).encode(),
        call(2, save),
        call(
            3,
            '{"name": "get_memory", "arguments": {"namespace": ["a"], "key": "k"}, '
            '"name": "delete_memory"}',
        ),
        call(
            4,
            '{"name": "save_memory", "arguments": {"text": "x", "key": "k2", '
            '"namespace": ["a"], "namespace": ["b"]}}',
        ),
        call(5, '{"name": "search_memory", "arguments": {"query": "x", "limit": 1e400}}'),
        call(6, '{"name": "save_memory", "arguments": {"text": "cafe", "key": "k3"}}').replace(
            b"cafe", b"caf\xff"
        ),
        call(7, '{"name": "get_memory", "arguments": {"namespace": ["a"], "key": "k"}}'),
    ]
    notified = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
    try:
        answers = []
        assert proc.stdin is not None and proc.stdout is not None
        for i, line in enumerate(lines):
            proc.stdin.write(line + b"\n")
            proc.stdin.flush()
            answers.append(json.loads(_read_line(proc)))  # type: ignore[arg-type]  # bytes
            if i == 0:
                proc.stdin.write(notified + b"\n")
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    _, saved, twice_name, twice_ns, huge, not_utf8, still = answers
    assert saved["result"]["isError"] is False
    for answer, why in ((twice_name, "given twice"), (twice_ns, "given twice"),
                        (huge, "beyond"), (not_utf8, "UTF-8")):  # fmt: skip
        assert answer["error"]["code"] == -32700, answer
        assert why in answer["error"]["message"], answer
    got = still["result"]["structuredContent"]
    assert got.get("result", got)["key"] == "k", still  # not deleted
    docs = client[db_name].long_term_memory
    assert sorted(d["key"] for d in docs.find({}, {"key": 1})) == ["k"]


def _read_line(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    """One line of the server's stdout, or a failure after ``timeout`` seconds (a line
    that gets no answer would otherwise hang the test)."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()))  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    assert got and got[0], "no answer from the server"
    return got[0]
