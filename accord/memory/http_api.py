"""The memory HTTP API: the memory service behind FastAPI (``accord serve``).

Every request carries an API key (``Authorization: Bearer <key>`` or ``X-API-Key``); the
key's principal (:mod:`accord.memory.principals`) fixes the tenant, and the request is
served by the memory service scoped to that tenant, so no parameter, body or filter can
reach another tenant's memories. Bodies are pydantic models that forbid unknown fields
(a ``tenant_id`` in a body is a 422, not ignored); namespaces are dot-joined labels in the
path (``users.u1.memories``) and are validated like the store's; value filters allow
field names that do not start with ``$`` and only BaseStore's operators ($eq $ne $gt $gte
$lt $lte $in), so ``{"$where": ...}``, ``{"$or": [...]}`` or ``{"a": {"$regex": ...}}`` are
refused with a message saying what is allowed.

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
there may be more. Errors are JSON ``{"error": code, "detail": message}``: 400 bad input,
401 no or unknown key, 403 missing scope, 404 not found, 409 a concurrent change, 422 a
body or parameter of the wrong shape, 503 the database is unreachable. The OpenAPI schema
is at ``/openapi.json``, the docs at ``/docs``.
"""

# No ``from __future__ import annotations``: FastAPI reads the route functions'
# annotations at runtime, and some of them are local to create_app.
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any

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
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    WrapValidator,
)
from pydantic_core import PydanticCustomError
from pymongo import AsyncMongoClient
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException
from typing_extensions import TypeAliasType

from accord.errors import (
    AccordError,
    ConfigurationError,
    DatabaseError,
    InvalidInputError,
    MemoryConflictError,
)
from accord.memory import model
from accord.memory.asynchronous.service import AsyncMemoryService
from accord.memory.principals import ApiKeys, Principal

log = logging.getLogger("accord.memory.http")

MAX_PAGE = 100
KIND_PATTERN = r"^[A-Za-z][A-Za-z0-9_:-]{0,63}$"


# -- request and response bodies ------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _json_integer(value: Any) -> Any:
    """Refuse what pydantic's lax mode would turn into an integer but JSON Schema's
    ``integer`` does not allow (``true``, ``"5"``); ``5.0`` stays allowed, as there."""
    if isinstance(value, bool | str | bytes):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


# Body fields as their schema types say, without lax coercions: a boolean is not a number,
# a string is not a number or a boolean (``"yes"`` for ``true``), so those are 422s.
JsonInt = Annotated[int, BeforeValidator(_json_integer)]
JsonNumber = Annotated[float, Strict()]
JsonBool = Annotated[bool, Strict()]


INT64 = (-(2**63), 2**63 - 1)


def _storable(value: Any, where: str = "value") -> Any:
    """Refuse what BSON cannot store as sent: strings that are not valid Unicode (lone
    surrogates), field names with NUL, integers beyond 64 bits (refused rather than
    silently rounded to a double)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                f"{where}: strings must be valid Unicode (no lone surrogates)"
            ) from None
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        if not INT64[0] <= value <= INT64[1]:
            raise ValueError(
                f"{where}: integers must fit in 64 bits (MongoDB's limit); send larger "
                f"numbers as strings"
            )
    elif isinstance(value, dict):
        for k, v in value.items():
            if "\x00" in k:
                raise ValueError(f"{where}: field names may not contain NUL")
            _storable(k, where)
            _storable(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _storable(v, f"{where}[{i}]")
    return value


#: A field name of a stored value: anything but NUL.
ValueKey = Annotated[str, StringConstraints(pattern=r"^[^\x00]*$")]
#: Any JSON a memory's value may hold (field names without NUL).
JsonValue = TypeAliasType(  # type: ignore[misc]
    "JsonValue", "str | int | float | bool | None | list[JsonValue] | dict[ValueKey, JsonValue]"
)


def _value(value: Any, handler: Callable[[Any], Any]) -> Any:
    """Clear messages for what cannot be stored, then the schema's shape; keep the JSON."""
    _storable(value)
    handler(value)
    return value


#: A value field a filter may name: not empty, not an operator, no NUL.
FieldName = Annotated[str, StringConstraints(pattern=r"^[^$\x00][^\x00]*$", max_length=256)]
Scalar = str | int | float | bool | None


class Operators(BaseModel):
    """Comparison operators on one field (BaseStore's set; nothing else is accepted)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False)

    eq: Any = Field(default=None, alias="$eq")
    ne: Any = Field(default=None, alias="$ne")
    gt: Any = Field(default=None, alias="$gt")
    gte: Any = Field(default=None, alias="$gte")
    lt: Any = Field(default=None, alias="$lt")
    lte: Any = Field(default=None, alias="$lte")
    in_: list[Any] = Field(default=None, alias="$in")  # type: ignore[arg-type]


#: What a filter compares a field with: a value, a list, operators, or (for a field that
#: holds an object) conditions on its fields.
Condition = TypeAliasType(  # type: ignore[misc]
    "Condition", "Scalar | list[Any] | Operators | dict[FieldName, Condition]"
)


def _filter(value: Any, handler: Callable[[Any], Any]) -> dict[str, Any] | None:
    """Check the filter's shape (the schema's types), then BaseStore's rules; keep the
    plain JSON (the service wants dicts, not the models that described them)."""
    if value is None:
        return None
    try:
        checked = model.check_value_filter(value)
    except InvalidInputError as exc:
        raise ValueError(str(exc)) from None
    handler(value)
    return checked


#: A namespace label: non-empty, no '.', no NUL.
Label = Annotated[
    str, StringConstraints(min_length=1, max_length=model.MAX_LABEL, pattern=r"^[^.\x00]+$")
]
#: A namespace in a path or a query: its labels joined by dots.
DOTTED_NAMESPACE = rf"[^.\x00]{{1,{model.MAX_LABEL}}}(\.[^.\x00]{{1,{model.MAX_LABEL}}})*"


def _labels(value: Any) -> Any:
    """The store's own check first, for its clearer message; then the schema's types."""
    try:
        model.check_namespace(value, allow_empty=True)
    except InvalidInputError as exc:
        raise ValueError(str(exc)) from None
    return value


class SearchRequest(_Body):
    """What ``POST /v1/search`` takes."""

    namespace_prefix: Annotated[list[Label], BeforeValidator(_labels)] = Field(
        default_factory=list, max_length=32, description="Labels the namespaces start with."
    )
    query: Annotated[str | None, AfterValidator(_storable)] = Field(
        default=None, max_length=10_000, description="Natural-language query (vector search)."
    )
    filter: Annotated[dict[FieldName, Condition] | None, WrapValidator(_filter)] = Field(
        default=None,
        description="Conditions on value fields: {field: value} or {field: {$op: value}} "
        "with $eq $ne $gt $gte $lt $lte $in.",
    )
    kinds: list[Annotated[str, Field(pattern=KIND_PATTERN)]] | None = Field(
        default=None, max_length=20, description="Only memories of these kinds."
    )
    limit: JsonInt = Field(default=10, ge=1, le=MAX_PAGE)
    offset: JsonInt = Field(default=0, ge=0, le=10_000)
    recency_weight: JsonNumber = Field(
        default=0.0, ge=0.0, le=1.0, description="Blend similarity with recency."
    )


class PutRequestBody(_Body):
    """What ``PUT /v1/memories/{namespace}/{key}`` takes."""

    value: Annotated[dict[ValueKey, JsonValue], WrapValidator(_value)] = Field(
        description="The memory (any JSON object)."
    )
    text: Annotated[str | None, AfterValidator(_storable)] = Field(
        default=None,
        max_length=100_000,
        description="What is embedded for search (default: the value as JSON).",
    )
    kind: str = Field(default="item", pattern=KIND_PATTERN)
    index: JsonBool = Field(default=True, description="Embed it (false: not found by queries).")
    ttl_minutes: JsonNumber | None = Field(default=None, gt=0, le=60 * 24 * 3650)


class MemoryOut(BaseModel):
    namespace: list[str]
    key: str
    value: dict[str, Any]
    text: str | None
    kind: str
    score: float | None
    version: int
    provenance: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None

    @classmethod
    def of(cls, m: model.Memory) -> "MemoryOut":
        return cls(
            namespace=list(m.namespace), key=m.key, value=m.value, text=m.text, kind=m.kind,
            score=m.score, version=m.version, provenance=m.provenance,
            created_at=m.created_at, updated_at=m.updated_at, expires_at=m.expires_at,
        )  # fmt: skip


class MemoryPage(BaseModel):
    items: list[MemoryOut]
    next_offset: int | None = Field(description="Offset of the next page; null: no more.")


class NamespacePage(BaseModel):
    items: list[list[str]]
    next_offset: int | None


class HistoryEntry(BaseModel):
    version: int
    change: str = Field(description="What replaced this version: update, merge or delete.")
    value: dict[str, Any] | None
    text: str | None
    kind: str | None
    provenance: dict[str, Any] | None
    valid_from: datetime | None
    replaced_at: datetime


class HistoryPage(BaseModel):
    namespace: list[str]
    key: str
    items: list[HistoryEntry]


class InvalidRequestOut(BaseModel):
    error: str
    detail: str
    errors: list[dict[str, Any]]


class Deleted(BaseModel):
    deleted: bool


class ErrorOut(BaseModel):
    error: str
    detail: str


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


register_url_convertor("anypath", _AnyPath())

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")
_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="or X-API-Key: <key>")


def single_valued_query(request: Request) -> None:
    """Refuse a query parameter given more than once. Every parameter of this API holds one
    value (the OpenAPI schema says so); without this check ``?prefix=a&prefix=b`` would be
    answered for the last value alone, silently."""
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


def namespace_of(path: str) -> tuple[str, ...]:
    """``users.u1.memories`` -> ``("users", "u1", "memories")`` (validated)."""
    return model.check_namespace(path.split("."))


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
    (:meth:`ApiKeys.from_env`)."""
    if (uri is None) == (service is None):
        raise ConfigurationError("create_app needs exactly one of uri or service")
    if not isinstance(keys, ApiKeys) or len(keys) == 0:
        raise ConfigurationError("create_app needs at least one API key principal (keys=)")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client: AsyncMongoClient[Any] | None = None
        if service is None:
            client = AsyncMongoClient(uri)
            app.state.service = AsyncMemoryService(
                client, db_name=db_name, embedder=embedder, dims=dims
            )
        else:
            app.state.service = service
        try:
            if setup:
                await app.state.service.setup()
            yield
        finally:
            if client is not None:
                await client.close()

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
            app.openapi_schema = exact_key_schemas(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(_Problem)
    async def problem(request: Request, exc: _Problem) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(
            {"error": exc.code, "detail": exc.detail}, status_code=exc.status, headers=headers
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own errors (an unparsable body, an unknown route...) in our shape.
        code = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "error"
        )
        return JSONResponse(
            {"error": code, "detail": str(exc.detail)},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        ]
        return JSONResponse(
            {"error": "invalid_request", "detail": "; ".join(problems),
             "errors": [{"loc": list(e.get("loc", ())), "msg": e.get("msg")}
                        for e in exc.errors()]},
            status_code=422,
        )  # fmt: skip

    @app.exception_handler(AccordError)
    async def accord_error(request: Request, exc: AccordError) -> JSONResponse:
        status, code = _status(exc)
        if status >= 500:
            log.error("%s %s failed: %s", request.method, request.url.path, exc)
        return JSONResponse({"error": code, "detail": str(exc)}, status_code=status)

    def principal(
        bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        header: Annotated[str | None, Depends(_header)],
    ) -> Principal:
        presented = bearer.credentials if bearer is not None else header
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
            return base.for_tenant(who.tenant)

        return dependency

    Reader = Annotated[AsyncMemoryService, Depends(scoped("read"))]
    Writer = Annotated[AsyncMemoryService, Depends(scoped("write"))]
    NamespacePath = Annotated[
        str,
        Path(
            description="Dot-joined labels, e.g. users.u1.memories",
            min_length=1,
            max_length=4096,
            # documented, and checked by the store's own rules (for their clearer message)
            json_schema_extra={"pattern": f"^{DOTTED_NAMESPACE}$"},
        ),
    ]
    NamespaceQuery = Query(
        max_length=4096,
        description="Dot-joined labels, * for any label (empty: no condition)",
        # documented, and checked by the store's own rules (for their clearer message)
        json_schema_extra={"pattern": f"^({DOTTED_NAMESPACE})?$"},
    )
    KeyPath = Annotated[
        str,
        Path(description="The memory's key (any characters but NUL)", min_length=0,
             max_length=1024, json_schema_extra={"pattern": r"^[^\x00]*$"}),
    ]  # fmt: skip

    @app.get("/healthz", tags=["health"])
    async def healthz(request: Request) -> dict[str, str]:
        svc: AsyncMemoryService = request.app.state.service
        try:
            await svc.client.admin.command("ping")
        except Exception as exc:  # the only answer is "not healthy"
            raise _Problem(503, "unavailable", f"the database does not answer: {exc}") from exc
        return {"status": "ok"}

    @app.post("/v1/search", response_model=MemoryPage, tags=["memories"])
    async def search(body: SearchRequest, svc: Reader) -> MemoryPage:
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

    @app.get("/v1/memories/{namespace}/{key:anypath}", response_model=MemoryOut, tags=["memories"],
             responses={404: {"model": ErrorOut}})  # fmt: skip
    async def get_memory(namespace: NamespacePath, key: KeyPath, svc: Reader) -> MemoryOut:
        found = await svc.get(namespace_of(namespace), key)
        if found is None:
            raise _Problem(404, "not_found", f"no memory {key!r} in namespace {namespace!r}")
        return MemoryOut.of(found)

    @app.put("/v1/memories/{namespace}/{key:anypath}", response_model=MemoryOut, tags=["memories"])
    async def put_memory(
        namespace: NamespacePath, key: KeyPath, body: PutRequestBody, svc: Writer
    ) -> MemoryOut:
        """Create or replace a memory; the replaced version is kept in its history."""
        ns = namespace_of(namespace)
        await svc.put(
            ns, key, body.value, text=body.text, embed=body.index, kind=body.kind,
            provenance=model.Provenance(source="http", tenant_id=svc.tenant_id),
            ttl_minutes=body.ttl_minutes,
        )  # fmt: skip
        found = await svc.get(ns, key)
        if found is None:  # deleted by someone else in between
            raise _Problem(409, "conflict", "the memory was deleted right after it was written")
        return MemoryOut.of(found)

    @app.delete("/v1/memories/{namespace}/{key:anypath}", response_model=Deleted,
                tags=["memories"])  # fmt: skip
    async def delete_memory(namespace: NamespacePath, key: KeyPath, svc: Writer) -> Deleted:
        """Delete a memory (its last version is kept in its history). ``deleted`` says
        whether it existed."""
        ns = namespace_of(namespace)
        existed = await svc.get(ns, key) is not None
        await svc.delete(ns, key)
        return Deleted(deleted=existed)

    @app.get("/v1/history/{namespace}/{key:anypath}", response_model=HistoryPage,
             tags=["memories"])  # fmt: skip
    async def history(namespace: NamespacePath, key: KeyPath, svc: Reader) -> HistoryPage:
        """Previous versions, oldest first, with what replaced each and its provenance."""
        ns = namespace_of(namespace)
        rows = await svc.history(ns, key)
        return HistoryPage(
            namespace=list(ns), key=key,
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
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> NamespacePage:
        """Namespaces that hold memories (``prefix``/``suffix`` match, ``*`` any label)."""
        names = await svc.list_namespaces(
            prefix=prefix.split(".") if prefix else None,
            suffix=suffix.split(".") if suffix else None,
            max_depth=max_depth, limit=limit + 1, offset=offset,
        )  # fmt: skip
        more = len(names) > limit
        return NamespacePage(
            items=[list(n) for n in names[:limit]], next_offset=offset + limit if more else None
        )

    return app


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
    if isinstance(exc, InvalidInputError):
        return 400, "invalid_input"
    if isinstance(exc, MemoryConflictError):
        return 409, "conflict"
    if isinstance(exc, DatabaseError):
        return 503, "unavailable"
    return 500, "server_error"
