"""The HTTP API's bodies: the request and response models, and how a request body is read.

Every field is one of :mod:`accord.memory.validation`'s types (the checks of the store and
the MCP server). A body is limited while it arrives (:class:`BodyLimit`: 413 before it is
read whole), parsed strictly (:func:`parse_body`: depth checked on the bytes, no
NaN/Infinity), off the event loop when large, and a 422 answer is bounded
(:func:`bounded_errors`) and never echoes the input.
"""

# No ``from __future__ import annotations``: FastAPI reads the models' annotations.
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

try:  # the server extra (accord/extras.py): say so when it is missing
    import anyio
    from fastapi import Request
except ImportError as exc:
    from accord.extras import missing

    raise missing(exc, "The memory HTTP API (accord serve)") from exc
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from accord.memory import model, validation
from accord.memory.json_body import loads as strict_json

log = logging.getLogger("accord.memory.http")

MAX_PAGE = validation.MAX_PAGE
KIND_PATTERN = validation.KIND_PATTERN
#: Request bodies: a PUT's (a value of up to 2 MiB encoded, and its text), any other's.
#: Checked while the body arrives: a larger one is a 413 before it is read whole.
MAX_PUT_BODY = 4 * 1024 * 1024
MAX_BODY = 64 * 1024
#: Bodies parsed and validated off the event loop (in a worker thread) from this size on.
INLINE_BODY = 64 * 1024
#: An error answer is at most this many bytes, whatever the request (issue 22: a 1.8 KB
#: request once got a 26 MB answer).
MAX_ERROR_BYTES = 4096


# -- request and response bodies ------------------------------------------------------------------
# Every field is one of accord.memory.validation's types: the same checks as the store's and
# the MCP tools', with their messages, and no lax coercion ("5" is not an integer, 1 is
# not a boolean, a JSON text is not a filter).


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchRequest(_Body):
    """What ``POST /v1/search`` takes."""

    namespace_prefix: validation.NamespacePrefix = Field(
        default_factory=list, description="Labels the namespaces start with."
    )
    query: validation.QueryOrNone = Field(
        default=None, description="Natural-language query (vector search)."
    )
    filter: validation.Filter = Field(
        default=None,
        description="Conditions on value fields: {field: value} or {field: {$op: value}} "
        "with $eq $ne $gt $gte $lt $lte $in.",
    )
    kinds: validation.Kinds = Field(default=None, description="Only memories of these kinds.")
    limit: validation.PageLimit = 10
    offset: validation.Offset = 0
    recency_weight: validation.RecencyWeight = Field(
        default=0.0, description="Blend similarity with recency."
    )


class PutRequestBody(_Body):
    """What ``PUT /v1/memories/{namespace}/{key}`` takes."""

    value: validation.Value = Field(description="The memory (any JSON object).")
    text: validation.TextOrNone = Field(
        default=None,
        description="What is embedded for search (default: the value as JSON, cut to "
        "100,000 characters).",
    )
    kind: validation.Kind = "item"
    index: validation.Flag = Field(
        default=True, description="Embed it (false: not found by queries)."
    )
    ttl_minutes: validation.TtlMinutes = None


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
    next: str | None = Field(
        description="The cursor of the next page (pass it as after=); null on the last page."
    )


class InvalidRequestOut(BaseModel):
    error: str
    detail: str
    errors: list[dict[str, Any]]


class Deleted(BaseModel):
    deleted: bool


class ErrorOut(BaseModel):
    error: str
    detail: str


_M = TypeVar("_M", bound=BaseModel)


def parse_body(body_model: type[_M], raw: bytes, content_type: str | None) -> _M:
    """A request body: JSON read strictly (:func:`accord.memory.json_body.loads`: depth
    checked before parsing, no NaN/Infinity/1e400), then ``body_model``'s validation.
    Problems are a ``RequestValidationError`` (a 422), with locations under ``body``."""
    if content_type is None or not _is_json(content_type):
        raise RequestValidationError([{
            "type": "content_type", "loc": ("body",),
            "msg": "the body must be JSON (Content-Type: application/json)",
        }])  # fmt: skip
    if not raw:
        raise RequestValidationError(
            [{"type": "missing", "loc": ("body",), "msg": "Field required"}]
        )
    try:
        data = strict_json(raw)
    except validation.InvalidField as exc:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body",), "msg": exc.reason}]
        ) from None
    try:
        return body_model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(
            [
                {"type": e["type"], "loc": ("body", *e["loc"]), "msg": e["msg"]}
                for e in exc.errors(include_url=False, include_input=False, include_context=False)
            ]
        ) from None


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def json_body(body_model: type[_M]) -> Callable[..., Any]:
    """A dependency that reads the request's body as ``body_model``: in a worker thread
    when it is large, so parsing and validating it never holds the event loop. (FastAPI's
    own body handling parses and validates on the loop.) The route declares the schema
    with :func:`body_schema`."""

    async def read(request: Request) -> _M:
        raw = await request.body()
        ctype = request.headers.get("content-type")
        if len(raw) >= INLINE_BODY:
            return await anyio.to_thread.run_sync(parse_body, body_model, raw, ctype)
        return parse_body(body_model, raw, ctype)

    return read


def body_schema(body_model: type[BaseModel]) -> dict[str, Any]:
    """The ``openapi_extra`` declaring ``body_model`` as a route's JSON body (the schema
    itself is added to the components by the app's ``openapi()``)."""
    ref = {"$ref": f"#/components/schemas/{body_model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


class BodyTooLarge(StarletteHTTPException):
    """A request body over its route's limit (a 413; nothing was read or written)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than this route takes ({limit:,} "
                              f"bytes); nothing was read or written")  # fmt: skip


def body_limit(scope: Scope) -> int:
    """The most a request may send: a PUT of a memory (a value of up to 2 MiB encoded, and
    its text) :data:`MAX_PUT_BODY`, anything else :data:`MAX_BODY`."""
    path = scope.get("path", "")
    return MAX_PUT_BODY if scope.get("method") == "PUT" and "/v1/memories/" in path else MAX_BODY


class BodyLimit:
    """ASGI middleware: a body over :func:`body_limit` is a 413 before it is read (its
    ``Content-Length`` says so) or as soon as it passes the limit while it arrives (the
    route gets :class:`BodyTooLarge`, answered in the API's error shape)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit(scope)
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:
            response = JSONResponse({"error": "too_large", "detail": BodyTooLarge(limit).detail},
                                    status_code=413, headers={"Connection": "close"})  # fmt: skip
            await response(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, limited, send)


def bounded_errors(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """A 422 body for ``errors`` that is at most :data:`MAX_ERROR_BYTES` bytes: no input
    is echoed (locations and messages only, each cut short), and errors beyond the budget
    are counted instead of listed."""
    import json

    listed: list[dict[str, Any]] = []
    for e in errors:
        loc = [p if isinstance(p, int) else _cut(str(p), 60) for p in list(e.get("loc", ()))[:8]]
        msg = str(e.get("msg", ""))
        listed.append({"loc": loc, "msg": _cut(msg, 300)})
    while True:
        shown = listed[:]
        body: dict[str, Any] = {
            "error": "invalid_request",
            "detail": "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in shown),
            "errors": shown,
        }
        if len(shown) < len(errors):
            body["detail"] += f"; and {len(errors) - len(shown)} more problem(s)"
        if len(json.dumps(body).encode()) <= MAX_ERROR_BYTES or len(listed) <= 1:
            return body
        listed.pop()


def _cut(text: str, at: int) -> str:
    return text if len(text) <= at else f"{text[:at]}... ({len(text):,} characters)"
