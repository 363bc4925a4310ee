"""The memory HTTP API: the memory service behind FastAPI (``accord serve``).

Every request carries an API key (``Authorization: Bearer <key>`` or ``X-API-Key``); the
key's principal (:mod:`accord.memory.principals`) fixes the tenant, and the request is
served by the memory service scoped to that tenant, so no parameter, body or filter can
reach another tenant's memories. Bodies are pydantic models that forbid unknown fields
(a ``tenant_id`` in a body is a 422, not ignored), built from the types of
:mod:`accord.memory.validation` (the store's and the MCP server's rules and messages);
namespaces are dot-joined labels in the path (``users.u1.memories``; a ``/`` in a label
is ``%2F``, and the path is split before it is decoded); value filters allow field names
that do not start with ``$`` and only BaseStore's operators ($eq $ne $gt $gte $lt $lte
$in), so ``{"$where": ...}``, ``{"$or": [...]}`` or ``{"a": {"$regex": ...}}`` are refused
with a message saying what is allowed.

What one request costs is bounded: a body over its limit is a 413 while it arrives
(:class:`BodyLimit`), JSON is read strictly with its depth checked before parsing, large
bodies are parsed and validated in a worker thread (never on the event loop), and an
error answer is at most :data:`MAX_ERROR_BYTES` bytes without the input echoed.

=======================================  ============================================  =======
route                                    what                                          scope
=======================================  ============================================  =======
``POST /v1/search``                      memories under a namespace prefix, best first  read
``GET /v1/memories/{namespace}/{key}``   one memory                                    read
``PUT /v1/memories/{namespace}/{key}``   create or replace a memory (keeps history)    write
``DELETE /v1/memories/{namespace}/{key}``  delete it (keeps history)                   write
``GET /v1/history/{namespace}/{key}``    its previous versions, oldest first           read
``GET /v1/namespaces``                   namespaces holding memories                   read
``GET /healthz``                         the database answers (no key needed)          -
=======================================  ============================================  =======

Lists are paginated with ``limit``/``offset``; a response's ``next_offset`` is set when
there may be more. History is paginated with ``limit`` and a cursor (``after=`` the
previous page's ``next``; ``next`` is null on the last page). Errors are JSON ``{"error": code, "detail": message}``: 400 bad input,
401 no, unknown or expired key, 403 missing scope, 404 not found, 409 a concurrent change,
413 a body too large, 422 a body or parameter of the wrong shape, 503 the database is
unreachable. The OpenAPI schema
is at ``/openapi.json``, the docs at ``/docs``.
"""

# No ``from __future__ import annotations``: FastAPI reads the route functions'
# annotations at runtime, and some of them are local to create_app.
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any
from urllib.parse import unquote

try:  # the server extra (accord/extras.py): say so when it is missing
    from fastapi import Depends, FastAPI, Path, Query, Request
    from fastapi_offline import FastAPIOffline
except ImportError as exc:
    from accord.extras import missing

    raise missing(exc, "The memory HTTP API (accord serve)") from exc
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException

from accord.errors import (
    AccordError,
    ConfigurationError,
    DatabaseError,
    InvalidInputError,
    MemoryConflictError,
    PermissionDenied,
)
from accord.memory import history_pages, model, validation
from accord.memory.asynchronous.service import AsyncMemoryService
from accord.memory.http_bodies import (
    MAX_PAGE,
    BodyLimit,
    Deleted,
    ErrorOut,
    HistoryEntry,
    HistoryPage,
    InvalidRequestOut,
    MemoryOut,
    MemoryPage,
    NamespacePage,
    PutRequestBody,
    SearchRequest,
    body_schema,
    bounded_errors,
    json_body,
)
from accord.memory.principals import MIN_KEY_LENGTH, AccessLogRedaction, ApiKeys, Principal
from accord.platform.context import Principal as KernelPrincipal

log = logging.getLogger("accord.memory.http")

# -- the app --------------------------------------------------------------------------------------


class _Problem(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        self.status, self.code, self.detail = status, code, detail


class _AnyPath(Convertor[str]):
    """Like Starlette's ``path``, but also across newlines (a key may hold any character
    but NUL)."""

    regex = r"[\s\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


class _Segment(Convertor[str]):
    """A path segment that may be empty: a namespace whose first label starts with ``/``
    (``%2Fteam``) reaches the router as ``/v1/memories//team/...``; :func:`address_of`
    reads the namespace from the raw path (an empty one is the store's refusal, a 400)."""

    regex = "[^/]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("anypath", _AnyPath())
register_url_convertor("segment", _Segment())

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")
_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="or X-API-Key: <key>")


def _key_in_url(request: Request, keys: ApiKeys) -> bool:
    """Whether a query item (name or value) or a path segment is a configured API key."""
    parts = [p for item in request.query_params.multi_items() for p in item]
    parts += request.url.path.split("/")
    return any(
        len(part) >= MIN_KEY_LENGTH and keys.authenticate(part) is not None for part in parts
    )


def single_valued_query(request: Request) -> None:
    """Refuse a query parameter given more than once. Every parameter of this API holds one
    value (the OpenAPI schema says so); without this check ``?prefix=a&prefix=b`` would be
    answered for the last value alone, silently. And refuse a query string that is not
    UTF-8 once percent-decoded, as a path is (``%FF`` and ``%FE`` both read as U+FFFD)."""
    raw = request.scope.get("query_string")
    if isinstance(raw, bytes) and b"%" in raw:
        for item in raw.decode("latin-1").replace("+", " ").split("&"):
            _decoded(item, "query", "query string")
    counts: dict[str, int] = {}
    for name, _ in request.query_params.multi_items():
        counts[name] = counts.get(name, 0) + 1
    repeated = sorted(name for name, n in counts.items() if n > 1)
    if repeated:
        raise RequestValidationError([
            {"loc": ("query", name), "type": "repeated_parameter",
             "msg": f"given {counts[name]} times; each query parameter takes one value, "
                    f"give it once"}
            for name in repeated
        ])  # fmt: skip


def namespace_of(path: str, field: str = "namespace") -> tuple[str, ...]:
    """``users.u1.memories`` -> ``("users", "u1", "memories")`` (validated)."""
    return model.check_namespace(path.split("."), field=field)


#: The routes whose path holds a namespace and a key.
_ADDRESSED = ("/v1/memories/", "/v1/history/")


def address_of(request: Request, namespace: str, key: str) -> tuple[tuple[str, ...], str]:
    """The namespace and key a request's path names, read from the path as it was sent.

    A label may hold ``/`` (the store's rule: no ``.``, no NUL), sent as ``%2F``. The
    router matches the decoded path, where ``team%2Falice/profile`` would read as
    namespace ``team`` and key ``alice/profile``; here the namespace is the first segment
    of the raw path, decoded after splitting, so a label never crosses into the key."""
    raw = request.scope.get("raw_path")
    if isinstance(raw, bytes):
        path = raw.split(b"?", 1)[0].decode("latin-1")
        # the route's own marker is the first in the path: a key may spell another route
        # (``/v1/history/ns/v1/memories/other/k`` is key ``v1/memories/other/k`` of ``ns``)
        found = [(at, m) for m in _ADDRESSED if (at := path.find(m)) >= 0]
        if not found:  # the route's own part percent-encoded: the router decoded it
            raise validation.InvalidField(
                "path", f"send the route's path as it is written ({' or '.join(_ADDRESSED)}), "
                f"not percent-encoded",
            )  # fmt: skip
        at, marker = min(found)
        ns, sep, rest = path[at + len(marker) :].partition("/")
        if not sep:  # (``team%2Falice``: one label, no key; the router split it)
            raise validation.InvalidField(
                "key", f"the path names no key after the namespace: {marker}NAMESPACE/KEY "
                f"(a '/' inside a label is sent as %2F)",
            )  # fmt: skip
        namespace, key = _decoded(ns, "namespace"), _decoded(rest, "key")
    return namespace_of(namespace), model.check_key(key)


def _decoded(part: str, field: str, where: str = "path") -> str:
    """A percent-encoded part of a path, decoded as UTF-8, strictly: bytes that are not
    UTF-8 (``%FF``, an encoded lone surrogate) are refused, where a lenient decoding would
    fold every such key into the same U+FFFD."""
    try:
        return unquote(part, errors="strict")
    except UnicodeDecodeError:
        raise validation.InvalidField(
            field,
            f"the {where} is not UTF-8 once percent-decoded (at {validation.preview(part)}); "
            f"send the UTF-8 bytes of each character percent-encoded",
        ) from None


def create_app(
    uri: str | None = None,
    *,
    keys: ApiKeys,
    db_name: str = "accord",
    embedder: Any = None,
    dims: int | None = None,
    service: AsyncMemoryService | None = None,
    setup: bool = True,
) -> FastAPI:
    """The ASGI app. Give ``uri`` (the app opens and closes its own client, on its own
    event loop) or an existing ``service``. ``keys``: the principals
    (:meth:`ApiKeys.from_env`; a keys file is re-read when it changes)."""
    if (uri is None) == (service is None):
        raise ConfigurationError("create_app needs exactly one of uri or service")
    if not isinstance(keys, ApiKeys) or len(keys) == 0:
        raise ConfigurationError("create_app needs at least one API key principal (keys=)")
    # uvicorn's access log prints each request's URL: no key sent in one may reach it.
    AccessLogRedaction.install(keys)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from accord.runtime import AsyncAccord  # the composition root builds every part

        root: AsyncAccord | None = None
        AccessLogRedaction.install(keys)  # again, after the server configured its logging
        if service is None:  # the runtime's root, on this app's event loop
            root = AsyncAccord(uri, db_name=db_name, embedder=embedder, dims=dims)
            app.state.service = await root.memory() if setup else root.memory_unprepared()
        else:
            app.state.service = service
            if setup:
                await service.setup()
        try:
            yield
        finally:
            if root is not None:
                await root.close()

    # FastAPIOffline: FastAPI whose /docs and /redoc load their scripts and styles from
    # the package's files, not a CDN (docs work offline and behind a firewall).
    app = FastAPIOffline(
        title="accord memory",
        version="1",
        description="Long-term memory of LangGraph agents on MongoDB, per tenant. "
        "Authenticate with an API key: `Authorization: Bearer <key>` or `X-API-Key`.",
        lifespan=lifespan,
        dependencies=[Depends(single_valued_query)],
        responses={
            400: {"model": ErrorOut},
            401: {"model": ErrorOut},
            403: {"model": ErrorOut},
            409: {"model": ErrorOut},
            413: {"model": ErrorOut},
            422: {"model": InvalidRequestOut},
            500: {"model": ErrorOut},
            503: {"model": ErrorOut},
        },  # fmt: skip
    )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description,
                routes=app.routes,
            )  # fmt: skip
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for body_model in (SearchRequest, PutRequestBody):
                body = body_model.model_json_schema(
                    ref_template="#/components/schemas/{model}", mode="validation"
                )
                components.update(body.pop("$defs", {}))
                components[body_model.__name__] = body
            app.openapi_schema = exact_key_schemas(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(BodyLimit)

    @app.exception_handler(_Problem)
    async def problem(request: Request, exc: _Problem) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(
            {"error": exc.code, "detail": exc.detail}, status_code=exc.status, headers=headers
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's and Starlette's own errors (an unknown route, a body over its limit...)
        # in our shape.
        code = {400: "bad_request", 404: "not_found", 405: "method_not_allowed",
                413: "too_large"}.get(exc.status_code, "error")  # fmt: skip
        detail = str(exc.detail)
        return JSONResponse(
            {"error": code, "detail": detail[:1000]},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(bounded_errors(list(exc.errors())), status_code=422)

    @app.exception_handler(AccordError)
    async def accord_error(request: Request, exc: AccordError) -> JSONResponse:
        status, code = _status(exc)
        if status >= 500:
            log.error("%s %s failed: %s", request.method, request.url.path, exc)
        return JSONResponse({"error": code, "detail": str(exc)[:1000]}, status_code=status)

    def principal(
        request: Request,
        bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        header: Annotated[str | None, Depends(_header)],
    ) -> Principal:
        twice = [n for n in ("Authorization", "X-API-Key") if len(request.headers.getlist(n)) > 1]
        if twice:  # the first or the last? a gateway and this server might each pick one
            raise _Problem(
                401, "unauthorized", f"{twice[0]} sent more than once; send one API key"
            )  # fmt: skip
        if _key_in_url(request, keys):
            raise _Problem(
                401, "unauthorized",
                "an API key was sent in the URL (URLs are logged); send it in a header "
                "only, and rotate it",
            )  # fmt: skip
        presented = bearer.credentials if bearer is not None else header
        if bearer is not None and header and header != bearer.credentials:
            # which one is meant? (e.g. a gateway's key added to a client's request)
            raise _Problem(
                401, "unauthorized",
                "two different API keys sent (Authorization and X-API-Key); send one",
            )  # fmt: skip
        found = keys.authenticate(presented)
        if found is None:
            raise _Problem(
                401, "unauthorized",
                "a valid API key is required: Authorization: Bearer <key>, or X-API-Key",
            )  # fmt: skip
        return found

    def scoped(scope: str) -> Callable[..., AsyncMemoryService]:
        def dependency(
            request: Request, who: Annotated[Principal, Depends(principal)]
        ) -> AsyncMemoryService:
            if scope not in who.scopes:
                raise _Problem(403, "forbidden", f"this API key may not {scope} memories")
            base: AsyncMemoryService = request.app.state.service
            # the key's principal acts: the kernel's hooks (policy, audit) see who it is
            acting = KernelPrincipal.api_key(
                who.name, tenant_id=who.tenant, scopes=frozenset(who.scopes)
            )
            return base.for_tenant(who.tenant).acting_as(acting)

        return dependency

    Reader = Annotated[AsyncMemoryService, Depends(scoped("read"))]
    Writer = Annotated[AsyncMemoryService, Depends(scoped("write"))]
    # Declared after the key: a caller without a valid key never gets its body read.
    SearchBody = Annotated[SearchRequest, Depends(json_body(SearchRequest))]
    PutBody = Annotated[PutRequestBody, Depends(json_body(PutRequestBody))]
    NamespacePath = Annotated[
        str,
        Path(
            description="Dot-joined labels, e.g. users.u1.memories; a '/' in a label is sent "
            "as %2F",
            # documented, and checked by the store's own rules on the namespace read from
            # the raw path (address_of): the router's segment is not the namespace when a
            # label holds '/', so its length says nothing
            json_schema_extra={
                "pattern": f"^{DOTTED_NAMESPACE}$",
                "minLength": 1,
                "maxLength": MAX_DOTTED,
            },
        ),
    ]
    NamespaceQuery = Query(
        max_length=MAX_DOTTED,
        description="Dot-joined labels, * for any label (empty: no condition)",
        # documented, and checked by the store's own rules (for their clearer message)
        json_schema_extra={"pattern": f"^({DOTTED_NAMESPACE})?$"},
    )
    HistoryCursor = Query(
        min_length=1, max_length=history_pages.MAX_CURSOR, pattern=history_pages.CURSOR_PATTERN,
        description="The 'next' cursor of the previous page (absent: the oldest versions)",
    )  # fmt: skip
    KeyPath = Annotated[
        str,
        Path(description="The memory's key (any characters but NUL)",
             # checked on the key read from the raw path (address_of), as the namespace
             json_schema_extra={"pattern": r"^[^\x00]*$", "maxLength": validation.MAX_KEY}),
    ]  # fmt: skip

    @app.get("/healthz", tags=["health"])
    async def healthz(request: Request) -> dict[str, str]:
        svc: AsyncMemoryService = request.app.state.service
        try:
            await svc.client.admin.command("ping")
        except Exception as exc:  # the only answer is "not healthy"
            raise _Problem(503, "unavailable", f"the database does not answer: {exc}") from exc
        return {"status": "ok"}

    @app.post("/v1/search", response_model=MemoryPage, tags=["memories"],
              openapi_extra=body_schema(SearchRequest))  # fmt: skip
    async def search(svc: Reader, body: SearchBody) -> MemoryPage:
        """Memories under ``namespace_prefix``: by similarity to ``query`` when given (with
        optional recency weighting), else newest first; ``filter`` narrows by value."""
        hits = await svc.search(
            tuple(body.namespace_prefix), query=body.query, filter=body.filter,
            limit=body.limit + 1, offset=body.offset, kinds=body.kinds,
            recency_weight=body.recency_weight,
        )  # fmt: skip
        more = len(hits) > body.limit
        return MemoryPage(
            items=[MemoryOut.of(m) for m in hits[: body.limit]],
            next_offset=body.offset + body.limit if more else None,
        )

    @app.get("/v1/memories/{namespace:segment}/{key:anypath}", response_model=MemoryOut, tags=["memories"],
             responses={404: {"model": ErrorOut}})  # fmt: skip
    async def get_memory(
        request: Request, namespace: NamespacePath, key: KeyPath, svc: Reader
    ) -> MemoryOut:
        ns, key = address_of(request, namespace, key)
        found = await svc.get(ns, key)
        if found is None:
            raise _Problem(404, "not_found", f"no memory {validation.preview(key)} in "
                                             f"namespace {validation.preview('.'.join(ns))}")  # fmt: skip
        return MemoryOut.of(found)

    @app.put("/v1/memories/{namespace:segment}/{key:anypath}", response_model=MemoryOut, tags=["memories"],
             openapi_extra=body_schema(PutRequestBody))  # fmt: skip
    async def put_memory(
        request: Request, namespace: NamespacePath, key: KeyPath, svc: Writer, body: PutBody
    ) -> MemoryOut:
        """Create or replace a memory; the replaced version is kept in its history. The
        answer is the memory as written (even when a tiny ``ttl_minutes`` expires it
        before anyone could read it)."""
        ns, key = address_of(request, namespace, key)
        written = await svc.put(
            ns, key, body.value, text=body.text, embed=body.index, kind=body.kind,
            provenance=model.Provenance(source="http", tenant_id=svc.tenant_id),
            ttl_minutes=body.ttl_minutes,
        )  # fmt: skip
        return MemoryOut.of(written)

    @app.delete("/v1/memories/{namespace:segment}/{key:anypath}", response_model=Deleted,
                tags=["memories"])  # fmt: skip
    async def delete_memory(
        request: Request, namespace: NamespacePath, key: KeyPath, svc: Writer
    ) -> Deleted:
        """Delete a memory (its last version is kept in its history). ``deleted`` says
        whether this request deleted it (of concurrent deletes, one says true)."""
        ns, key = address_of(request, namespace, key)
        return Deleted(deleted=await svc.delete(ns, key))

    @app.get("/v1/history/{namespace:segment}/{key:anypath}", response_model=HistoryPage,
             tags=["memories"])  # fmt: skip
    async def history(
        request: Request, namespace: NamespacePath, key: KeyPath, svc: Reader,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        after: Annotated[str | None, HistoryCursor] = None,
    ) -> HistoryPage:  # fmt: skip
        """Previous versions, oldest first, with what replaced each and its provenance;
        ``limit`` at a time, the next page from the ``next`` cursor (``after=``)."""
        ns, key = address_of(request, namespace, key)
        page = await svc.history_page(ns, key, limit=limit, after=after)
        rows = page.items
        return HistoryPage(
            namespace=list(ns), key=key, next=page.next,
            items=[HistoryEntry(
                version=r["version"], change=r.get("change", "update"), value=r.get("value"),
                text=r.get("text"), kind=r.get("kind"), provenance=r.get("provenance"),
                valid_from=model.aware(r.get("valid_from")),
                replaced_at=model.aware(r["replaced_at"]),  # type: ignore[arg-type]
            ) for r in rows],
        )  # fmt: skip

    @app.get("/v1/namespaces", response_model=NamespacePage, tags=["namespaces"])
    async def namespaces(
        svc: Reader,
        prefix: Annotated[str | None, NamespaceQuery] = None,
        suffix: Annotated[str | None, NamespaceQuery] = None,
        max_depth: Annotated[int | None, Query(ge=1, le=64)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        offset: Annotated[int, Query(ge=0, le=validation.MAX_OFFSET)] = 0,
    ) -> NamespacePage:
        """Namespaces that hold memories (``prefix``/``suffix`` match, ``*`` any label)."""
        names = await svc.list_namespaces(
            prefix=namespace_of(prefix, "prefix") if prefix else None,
            suffix=namespace_of(suffix, "suffix") if suffix else None,
            max_depth=max_depth, limit=limit + 1, offset=offset,
        )  # fmt: skip
        more = len(names) > limit
        return NamespacePage(
            items=[list(n) for n in names[:limit]], next_offset=offset + limit if more else None
        )

    return app


#: A namespace in a path or a query: its labels joined by dots.
MAX_DOTTED = validation.MAX_LABELS * (validation.MAX_LABEL + 1) - 1
DOTTED_NAMESPACE = rf"[^.\x00]{{1,{validation.MAX_LABEL}}}(\.[^.\x00]{{1,{validation.MAX_LABEL}}})*"


def exact_key_schemas(node: Any) -> Any:
    """Pydantic describes ``dict[ConstrainedKey, V]`` with ``patternProperties``, which
    lets keys that do not match through (as *additional* properties). Say exactly what is
    accepted instead: ``propertyNames`` with the pattern, ``additionalProperties`` V. (So
    clients, and schemathesis, know that ``{"$where": ...}`` is not a valid filter.)"""
    if isinstance(node, list):
        return [exact_key_schemas(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: exact_key_schemas(v) for k, v in node.items()}
    patterns = out.get("patternProperties")
    if isinstance(patterns, dict) and len(patterns) == 1 and "properties" not in out:
        ((pattern, value),) = patterns.items()
        del out["patternProperties"]
        out["propertyNames"] = {**out.get("propertyNames", {}), "pattern": pattern}
        out["additionalProperties"] = value
    return out


def _status(exc: AccordError) -> tuple[int, str]:
    if isinstance(exc, PermissionDenied):
        return 403, "forbidden"
    if isinstance(exc, InvalidInputError):
        return 400, "invalid_input"
    if isinstance(exc, MemoryConflictError):
        return 409, "conflict"
    if isinstance(exc, DatabaseError):
        return 503, "unavailable"
    return 500, "server_error"
