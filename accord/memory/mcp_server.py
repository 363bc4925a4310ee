"""The memory MCP server: accord memory as tools for any MCP-capable agent (``accord mcp``).

Tools (all for ONE tenant, fixed when the server starts: ``--tenant`` or
``ACCORD_MCP_TENANT``; no tool takes a tenant, so a model cannot ask for another one):

- ``search_memory(query, namespace?, limit?, filter?)``: memories by similarity to the
  query, under a namespace prefix (default: every namespace of the tenant);
- ``save_memory(text, namespace?, key?, kind?)``: remember something (default namespace
  ``["memories"]``, where the aggregator puts what it learns; the default key is derived
  from the text, so saving the same sentence twice keeps one memory);
- ``get_memory(namespace, key)``, ``delete_memory(namespace, key)``;
- ``list_namespaces(prefix?, limit?)``.

Inputs are validated as in the other doors (namespace labels, keys, BaseStore's filter
operators only); a refusal comes back as a tool error whose text says what is allowed.
Writes go through the memory service (one transaction each, history kept). The server
speaks MCP over stdio; start it from an MCP client's configuration, e.g.::

    {"command": "accord", "args": ["mcp", "--tenant", "acme"],
     "env": {"MONGODB_URI": "mongodb+srv://..."}}
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

try:  # the server extra (accord/extras.py): say so when it is missing
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError as exc:
    from accord.extras import missing

    raise missing(exc, "The MCP server (accord mcp)") from exc
from pydantic import BaseModel, Field
from pymongo import AsyncMongoClient

from accord.errors import AccordError, ConfigurationError
from accord.memory import model
from accord.memory.asynchronous.service import AsyncMemoryService
from accord.memory.extraction import content_key

DEFAULT_NAMESPACE = ("memories",)
INSTRUCTIONS = (
    "Long-term memory of the user, kept by accord. Before answering, search_memory for what "
    "you may already know (preferences, facts, earlier conversations); save_memory for a "
    "durable fact or preference the user states. Namespaces are lists of labels; "
    '["memories"] holds facts and preferences, ["episodes", <thread>] conversation summaries.'
)


class MemoryResult(BaseModel):
    namespace: list[str]
    key: str
    text: str | None
    value: dict[str, Any]
    kind: str
    score: float | None = Field(description="Similarity to the query (null without a query).")
    version: int
    updated_at: str

    @classmethod
    def of(cls, m: model.Memory) -> MemoryResult:
        return cls(
            namespace=list(m.namespace), key=m.key, text=m.text, value=_plain(m.value),
            kind=m.kind, score=m.score, version=m.version, updated_at=m.updated_at.isoformat(),
        )  # fmt: skip


class Saved(BaseModel):
    namespace: list[str]
    key: str
    version: int


class Deleted(BaseModel):
    deleted: bool


def _plain(value: Any) -> Any:
    """JSON-safe copy (memories the aggregator wrote hold datetimes)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def create_server(
    uri: str | None = None,
    *,
    tenant_id: str,
    db_name: str = "accord",
    embedder: Any = None,
    dims: int | None = None,
    service: AsyncMemoryService | None = None,
    default_namespace: Sequence[str] = DEFAULT_NAMESPACE,
    setup: bool = True,
) -> MCPServer[Any]:
    """The MCP server for ``tenant_id``. Give ``uri`` (the server opens its own client
    when it starts) or an existing ``service`` (it is re-scoped to ``tenant_id``)."""
    if (uri is None) == (service is None):
        raise ConfigurationError("create_server needs exactly one of uri or service")
    tenant = model.check_tenant(tenant_id)
    home = model.check_namespace(tuple(default_namespace))
    state: dict[str, AsyncMemoryService] = {}
    if service is not None:
        state["service"] = service.for_tenant(tenant)

    @asynccontextmanager
    async def lifespan(server: MCPServer[Any]) -> AsyncIterator[None]:
        client: AsyncMongoClient[Any] | None = None
        if "service" not in state:
            client = AsyncMongoClient(uri)
            state["service"] = AsyncMemoryService(
                client, tenant_id=tenant, db_name=db_name, embedder=embedder, dims=dims
            )
        try:
            if setup:
                await state["service"].setup()
            yield
        finally:
            if client is not None:
                state.pop("service", None)
                await client.close()

    server: MCPServer[Any] = MCPServer(
        "accord-memory", instructions=INSTRUCTIONS, version="1", lifespan=lifespan
    )

    def svc() -> AsyncMemoryService:
        try:
            return state["service"]
        except KeyError:
            raise ToolError("the memory service is not started") from None

    def ns(labels: list[str] | None, default: tuple[str, ...]) -> tuple[str, ...]:
        return default if labels is None else model.check_namespace(labels, allow_empty=True)

    @server.tool()
    async def search_memory(
        query: str,
        namespace: list[str] | None = None,
        limit: int = 5,
        filter: dict[str, Any] | None = None,
    ) -> list[MemoryResult]:
        """Search long-term memory by meaning. `namespace`: a prefix of labels (default:
        all). `filter`: conditions on value fields, {field: value} or {field: {"$gt": 1}}
        ($eq $ne $gt $gte $lt $lte $in). Best matches first."""
        if not 1 <= limit <= 50:
            raise ToolError(f"limit must be between 1 and 50, got {limit}")
        try:
            hits = await svc().search(ns(namespace, ()), query=query, filter=filter, limit=limit)
        except AccordError as exc:
            raise ToolError(str(exc)) from None
        return [MemoryResult.of(m) for m in hits]

    @server.tool()
    async def save_memory(
        text: str,
        namespace: list[str] | None = None,
        key: str | None = None,
        kind: str = "fact",
    ) -> Saved:
        """Remember `text` (one self-contained statement, e.g. "User prefers aisle
        seats"). Same namespace and key replace the memory (its old version is kept in
        history); without a key, saving the same text again keeps one memory."""
        text = text.strip() if isinstance(text, str) else text
        if not text:
            raise ToolError("text must be a non-empty statement")
        if not kind or not kind.replace("_", "").replace("-", "").isalnum() or len(kind) > 64:
            raise ToolError("kind is a short word such as fact, preference or note")
        try:
            space = ns(namespace, home)
            if not space:
                raise ToolError("namespace needs at least one label")
            memory_key = model.check_key(key if key is not None else content_key(kind, text))
            service = svc()
            await service.put(
                space, memory_key, {"content": text}, text=text, kind=kind,
                provenance=model.Provenance(source="mcp", tenant_id=service.tenant_id),
            )  # fmt: skip
            saved = await service.get(space, memory_key)
        except AccordError as exc:
            raise ToolError(str(exc)) from None
        if saved is None:
            raise ToolError("the memory was deleted right after it was saved")
        return Saved(namespace=list(space), key=memory_key, version=saved.version)

    @server.tool()
    async def get_memory(namespace: list[str], key: str) -> MemoryResult | None:
        """One memory by namespace and key (null when there is none)."""
        try:
            found = await svc().get(model.check_namespace(namespace), key)
        except AccordError as exc:
            raise ToolError(str(exc)) from None
        return None if found is None else MemoryResult.of(found)

    @server.tool()
    async def delete_memory(namespace: list[str], key: str) -> Deleted:
        """Forget one memory (its last version stays in history). `deleted` says whether
        it existed."""
        try:
            space = model.check_namespace(namespace)
            service = svc()
            existed = await service.get(space, key) is not None
            await service.delete(space, key)
        except AccordError as exc:
            raise ToolError(str(exc)) from None
        return Deleted(deleted=existed)

    @server.tool()
    async def list_namespaces(prefix: list[str] | None = None, limit: int = 50) -> list[list[str]]:
        """Namespaces that hold memories, optionally under `prefix` ("*" matches any label)."""
        if not 1 <= limit <= 100:
            raise ToolError(f"limit must be between 1 and 100, got {limit}")
        try:
            names = await svc().list_namespaces(prefix=prefix, limit=limit)
        except AccordError as exc:
            raise ToolError(str(exc)) from None
        return [list(n) for n in names]

    return server
