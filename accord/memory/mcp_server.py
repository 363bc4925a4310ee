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

Inputs are validated by the same module as the other doors' (:mod:`accord.memory.validation`:
namespace labels, keys, kinds, sizes of queries and texts, BaseStore's filter operators
only), strictly: ``"10"`` or ``true`` is not a limit, and a JSON text is not a filter or a
namespace (the MCP SDK would parse one; :class:`StrictArguments` refuses it first). A
refusal comes back as a tool error whose text says what is allowed. Writes go through the
memory service (one transaction each, history kept).

The server speaks MCP over stdio (:func:`serve_stdio`); start it from an MCP client's
configuration, e.g.::

    {"command": "accord", "args": ["mcp", "--tenant", "acme"],
     "env": {"MONGODB_URI": "mongodb+srv://..."}}

A line on stdin that is not a JSON-RPC message (invalid JSON, JSON nested too deep, a
lone surrogate, a batch) is answered with a JSON-RPC error (``-32700`` parse error,
``-32600`` invalid request; with the request's id when it can be read), where the MCP
SDK's stdio transport drops it silently and leaves the client waiting
(modelcontextprotocol/python-sdk issue 2751).
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

try:  # the server extra (accord/extras.py): say so when it is missing
    import anyio
    from mcp import types
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.stdio import stdio_server
    from mcp.shared.message import SessionMessage
except ImportError as exc:
    from accord.extras import missing

    raise missing(exc, "The MCP server (accord mcp)") from exc
from pydantic import BaseModel, Field, ValidationError

from accord.errors import AccordError, ConfigurationError
from accord.memory import json_body, model, validation
from accord.memory.asynchronous.service import AsyncMemoryService
from accord.memory.extraction import content_key
from accord.platform.context import MEMORY_API
from accord.platform.context import Principal as KernelPrincipal

log = logging.getLogger("accord.memory.mcp")
_F = TypeVar("_F", bound=Callable[..., Any])

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


#: Tool arguments that are not strings: the SDK parses a string given for one as JSON (a
#: lax coercion for some clients); accord refuses it, as the HTTP API would.
STRUCTURED_ARGUMENTS: Mapping[str, frozenset[str]] = {
    "search_memory": frozenset({"namespace", "limit", "filter"}),
    "save_memory": frozenset({"namespace"}),
    "get_memory": frozenset({"namespace"}),
    "delete_memory": frozenset({"namespace"}),
    "list_namespaces": frozenset({"prefix", "limit"}),
}


class StrictArguments:
    """Server middleware: a ``tools/call`` whose list, object or number argument arrives
    as a string is a tool error, before the SDK would parse the string as JSON; so is a
    call with an argument the tool does not take (the SDK ignores it: ``search_memory``
    with ``prefix`` for ``namespace`` would search every namespace, and a ``tenant_id``
    would look obeyed). ``arguments``: each tool's argument names (filled as tools are
    registered)."""

    def __init__(self) -> None:
        self.arguments: dict[str, frozenset[str]] = {}

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method == "tools/call" and isinstance(ctx.params, Mapping):
            tool = str(ctx.params.get("name"))
            structured = STRUCTURED_ARGUMENTS.get(tool, frozenset())
            arguments = ctx.params.get("arguments")
            known = self.arguments.get(tool)
            if isinstance(arguments, Mapping) and known is not None:
                unknown = sorted(str(name) for name in arguments if name not in known)
                if unknown:
                    names = ", ".join(validation.preview(n) for n in unknown[:5])
                    return _tool_error(
                        f"{tool} does not take {names}; its arguments are "
                        f"{', '.join(sorted(known))}. Nothing was done."
                    )
            if isinstance(arguments, Mapping):
                for name in sorted(structured & set(arguments)):
                    if isinstance(arguments[name], str):
                        try:  # the shared check, for the shared message (it refuses a string)
                            _STRUCTURED_CHECKS[name](arguments[name])
                        except validation.InvalidField as exc:
                            return _tool_error(str(exc))
        return await call_next(ctx)


def _tool_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


_STRUCTURED_CHECKS: Mapping[str, Any] = {
    "namespace": lambda v: validation.check_namespace(v, field="namespace"),
    "prefix": lambda v: validation.check_namespace(v, field="prefix"),
    "filter": validation.check_filter,
    "limit": lambda v: validation.check_int(v, "limit"),
}


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
    # the MCP client's process is one tenant's: its principal is that tenant's memory API
    acting = KernelPrincipal(name=f"mcp:{tenant}", role=MEMORY_API, tenant_id=tenant)
    if service is not None:
        state["service"] = service.for_tenant(tenant).acting_as(acting)

    @asynccontextmanager
    async def lifespan(server: MCPServer[Any]) -> AsyncIterator[None]:
        from accord.runtime import AsyncAccord  # the composition root builds every part

        root: AsyncAccord | None = None
        if "service" not in state:  # the runtime's root, on the server's event loop
            root = AsyncAccord(uri, db_name=db_name, embedder=embedder, dims=dims)
            base = await root.memory(tenant) if setup else root.memory_unprepared(tenant)
            state["service"] = base.acting_as(acting)
        elif setup:
            await state["service"].setup()
        try:
            yield
        finally:
            if root is not None:
                state.pop("service", None)
                await root.close()

    strict = StrictArguments()
    server: MCPServer[Any] = MCPServer(
        "accord-memory", instructions=INSTRUCTIONS, version="1", lifespan=lifespan,
        middleware=[strict],
    )  # fmt: skip

    def tool(fn: _F) -> _F:
        """Register ``fn`` as a tool; calls naming an argument it does not take are refused."""
        strict.arguments[fn.__name__] = frozenset(inspect.signature(fn).parameters)
        server.tool()(fn)
        return fn

    def svc() -> AsyncMemoryService:
        try:
            return state["service"]
        except KeyError:
            raise ToolError("the memory service is not started") from None

    # Every argument is one of accord.memory.validation's types: the store's and the HTTP
    # API's rules, with their messages.

    @tool
    async def search_memory(
        query: validation.Query,
        namespace: validation.NamespacePrefixOrNone = None,
        limit: validation.McpLimit = 5,
        filter: validation.Filter = None,
    ) -> list[MemoryResult]:
        """Search long-term memory by meaning. `namespace`: a prefix of labels (default:
        all). `filter`: conditions on value fields, {field: value} or {field: {"$gt": 1}}
        ($eq $ne $gt $gte $lt $lte $in). `limit`: 1 to 50. Best matches first."""
        try:
            hits = await svc().search(tuple(namespace or ()), query=query, filter=filter,
                                      limit=limit)  # fmt: skip
        except AccordError as exc:
            raise ToolError(str(exc)) from None
        return [MemoryResult.of(m) for m in hits]

    @tool
    async def save_memory(
        text: validation.Text,
        namespace: validation.NamespaceOrNone = None,
        key: validation.KeyOrNoneAsText = None,  # type: ignore[assignment]  # str or None
        kind: validation.Kind = "fact",
    ) -> Saved:
        """Remember `text` (one self-contained statement, e.g. "User prefers aisle
        seats"). Same namespace and key replace the memory (its old version is kept in
        history); without a key, saving the same text again keeps one memory. `kind`: a
        short name such as fact, preference or note."""
        text = text.strip()
        if not text:
            raise ToolError("text must be a non-empty statement")
        space = home if namespace is None else tuple(namespace)
        memory_key = key if key is not None else content_key(kind, text)
        try:
            service = svc()
            saved = await service.put(
                space, memory_key, {"content": text}, text=text, kind=kind,
                provenance=model.Provenance(source="mcp", tenant_id=service.tenant_id),
            )  # fmt: skip
        except AccordError as exc:
            raise ToolError(str(exc)) from None
        return Saved(namespace=list(space), key=memory_key, version=saved.version)

    @tool
    async def get_memory(
        namespace: validation.Namespace, key: validation.Key
    ) -> MemoryResult | None:
        """One memory by namespace and key (null when there is none)."""
        try:
            found = await svc().get(tuple(namespace), key)
        except AccordError as exc:
            raise ToolError(str(exc)) from None
        return None if found is None else MemoryResult.of(found)

    @tool
    async def delete_memory(namespace: validation.Namespace, key: validation.Key) -> Deleted:
        """Forget one memory (its last version stays in history). `deleted` says whether
        this call deleted it (of concurrent deletes, one says true)."""
        try:
            deleted = await svc().delete(tuple(namespace), key)
        except AccordError as exc:
            raise ToolError(str(exc)) from None
        return Deleted(deleted=deleted)

    @tool
    async def list_namespaces(
        prefix: validation.NamespacePrefixOrNone = None, limit: validation.PageLimit = 50
    ) -> list[list[str]]:
        """Namespaces that hold memories, optionally under `prefix` ("*" matches any
        label). `limit`: 1 to 100."""
        try:
            names = await svc().list_namespaces(prefix=prefix, limit=limit)
        except AccordError as exc:
            raise ToolError(str(exc)) from None
        return [list(n) for n in names]

    return server


# -- stdio ---------------------------------------------------------------------------------------


async def serve_stdio(server: MCPServer[Any], stdin: AsyncIterable[bytes] | None = None) -> None:
    """Serve ``server`` over this process's stdin/stdout, as ``MCPServer.run("stdio")``
    does, except that every line is first read as strict JSON (:func:`read_message`) and a
    line that is not a JSON-RPC message is answered with a JSON-RPC error instead of being
    dropped (see the module docstring). ``stdin``: lines of bytes (default: this process's
    standard input)."""
    lines = stdin if stdin is not None else anyio.wrap_file(sys.stdin.buffer)
    # The SDK's transport writes the answers; its reader gets no line (it would decode
    # bytes that are not UTF-8 as U+FFFD and keep the last of a field given twice).
    async with stdio_server(stdin=_NoLines()) as (_, write_stream):  # type: ignore[arg-type]
        relayed_in, relayed_out = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def relay() -> None:
            async with relayed_in:
                async for line in lines:
                    answer, message = read_message(line)
                    if answer is not None:
                        log.warning("answered an unreadable message: %s", answer.error.message)
                        await write_stream.send(SessionMessage(answer))
                    else:
                        await relayed_in.send(SessionMessage(message))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(relay)
            # The SDK has no public way to run an MCPServer on given streams.
            lowlevel = server._lowlevel_server
            await lowlevel.run(relayed_out, write_stream, lowlevel.create_initialization_options())
            tasks.cancel_scope.cancel()


class _NoLines:
    """An input without lines, for the SDK's stdio reader (accord reads stdin itself)."""

    def __aiter__(self) -> _NoLines:
        return self

    async def __anext__(self) -> str:
        raise StopAsyncIteration


def read_message(line: bytes | str) -> tuple[types.JSONRPCError | None, Any]:
    """One line of the stdio transport: ``(None, message)``, or ``(error, None)`` to answer.
    The line is read strictly first
    (:func:`accord.memory.json_body.loads`, as HTTP bodies are): UTF-8, nested at most 36
    levels, finite numbers, each field of an object once; the SDK's reader took the last
    of a field given twice (a gateway that allows a call by its first ``name`` would let
    another tool run), ``1e400`` as infinity and bytes that are not UTF-8 as U+FFFD. Those
    are ``-32700`` parse errors with id null; then the SDK validates the message as its
    reader does (:func:`unreadable_message` answers what it refuses)."""
    try:
        json_body.loads(line, field="message")
    except validation.InvalidField as refused:
        return _error(types.PARSE_ERROR, f"Parse error: {refused.reason}", None), None
    try:
        return None, types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception as exc:  # as the SDK's reader: any refusal is answered
        return unreadable_message(exc), None


def unreadable_message(exc: Exception) -> types.JSONRPCError:
    """The JSON-RPC error answering a line the transport could not read as a message:
    ``-32700`` when it is not JSON (or nests deeper than accord reads), ``-32600`` when it
    is JSON but no JSON-RPC message (a batch, a lone surrogate, a missing field), with the
    request's id when one can be read from it."""
    raw: Any = None
    if isinstance(exc, ValidationError) and exc.errors():
        raw = exc.errors()[0].get("input")
    code, reason, data = types.INVALID_REQUEST, "not a JSON-RPC 2.0 message", raw
    if isinstance(raw, str | bytes):  # the transport's parser refused the text itself
        try:
            data = json_body.loads(raw, field="message")
            reason = "strings must be valid Unicode (no lone surrogates)"
        except validation.InvalidField as refused:
            return _error(types.PARSE_ERROR, f"Parse error: {refused.reason}", None)
    if isinstance(data, list):
        reason = (
            "batches are not supported (MCP removed JSON-RPC batching); send one message a line"
        )
    request_id = data.get("id") if isinstance(data, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        request_id = None
    return _error(code, f"Invalid Request: {reason}", request_id)


def _error(code: int, message: str, request_id: Any) -> types.JSONRPCError:
    return types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message[:500])
    )
