"""Embedders: text to vectors, for long-term memory and its vector index.

Three kinds, one protocol (:class:`Embedder`):

- :class:`HashingEmbedder`: deterministic, dependency-free (numpy), the default when nothing
  is configured. It hashes words, word pairs and character trigrams into a fixed number of
  dimensions: lexical similarity, not semantic. Good enough for tests, demos and keyword-
  style recall; configure a real model for meaning ("car" does not find "automobile").
- :class:`LangChainEmbedder`: any LangChain ``Embeddings`` object (OpenAI, Cohere, a local
  sentence-transformers model...), or a plain function ``texts -> vectors``.
- :class:`VoyageEmbedder`: Voyage AI through the ``voyageai`` package (the ``accord[voyage]``
  extra; without it, constructing one says so), with ``input_type``
  ``document`` for memories and ``query`` for searches, batches within the API's limits, and
  retries with backoff on rate limits (HTTP 429).
- :class:`~accord.memory.local_embedder.LocalEmbedder` (``"local"``): all-MiniLM-L6-v2 on
  this machine from weights a package ships, the optional extra ``accord[local]``.

:func:`resolve_embedder` turns what a user passes (an embedder, an ``Embeddings``, a function,
``"voyage:<model>"``, ``"local"``, None) into an :class:`Embedder`; None gives the hashing
embedder and says so in the log.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from accord.errors import ConfigurationError, EmbeddingDimensionError
from accord.extras import require
from accord.memory.local_embedder import LocalEmbedder

log = logging.getLogger("accord.memory.embedders")

Vector = list[float]
DEFAULT_DIMS = 256


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors of ``dims`` floats."""

    name: str

    @property
    def dims(self) -> int | None:
        """The vector length, or None until the first call tells it."""

    def embed_documents(self, texts: Sequence[str]) -> list[Vector]: ...

    def embed_query(self, text: str) -> Vector: ...

    async def aembed_documents(self, texts: Sequence[str]) -> list[Vector]: ...

    async def aembed_query(self, text: str) -> Vector: ...


# -- the default: hashing ---------------------------------------------------------------------

_WORD = re.compile(r"\w+", re.UNICODE)


def _stem(word: str) -> str:
    """A tiny suffix stripper so 'likes'/'liked'/'liking' share a feature."""
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


class HashingEmbedder:
    """Deterministic lexical embeddings: signed feature hashing of words, pairs, trigrams.

    The same text always gives the same unit vector, on every machine and Python version
    (blake2b, not ``hash()``), so stored vectors stay comparable across restarts.
    """

    def __init__(self, dims: int = DEFAULT_DIMS) -> None:
        if not isinstance(dims, int) or isinstance(dims, bool) or not 8 <= dims <= 8192:
            raise ConfigurationError(
                f"HashingEmbedder dims must be an integer in [8, 8192], got {dims!r}"
            )
        self._dims = dims
        self.name = f"hashing-{dims}"

    @property
    def dims(self) -> int:
        return self._dims

    def _features(self, text: str) -> dict[str, float]:
        words = [_stem(w) for w in _WORD.findall(text.lower())]
        feats: dict[str, float] = {}
        for w in words:
            feats["w:" + w] = feats.get("w:" + w, 0.0) + 1.0
        for a, b in zip(words, words[1:], strict=False):
            key = f"b:{a} {b}"
            feats[key] = feats.get(key, 0.0) + 0.5
        squashed = " ".join(words)
        for i in range(len(squashed) - 2):
            key = "c:" + squashed[i : i + 3]
            feats[key] = feats.get(key, 0.0) + 0.25
        return feats

    def _one(self, text: str) -> Vector:
        vec = np.zeros(self._dims, dtype=np.float64)
        for feat, weight in self._features(text).items():
            digest = hashlib.blake2b(feat.encode(), digest_size=8).digest()
            h = int.from_bytes(digest, "little")
            sign = 1.0 if h & 1 else -1.0
            vec[(h >> 1) % self._dims] += sign * (1.0 + math.log(weight))
        norm = float(np.linalg.norm(vec))
        if norm == 0.0:
            vec[0] = 1.0  # empty text: a fixed unit vector, never a zero one (cosine)
            return vec.tolist()
        return (vec / norm).tolist()

    def embed_documents(self, texts: Sequence[str]) -> list[Vector]:
        return [self._one(t) for t in texts]

    def embed_query(self, text: str) -> Vector:
        return self._one(text)

    # CPU-bound (a hash per feature): the async methods hash in a worker thread, so an
    # event loop is never blocked by a large batch.
    async def aembed_documents(self, texts: Sequence[str]) -> list[Vector]:
        return await asyncio.to_thread(self.embed_documents, list(texts))

    async def aembed_query(self, text: str) -> Vector:
        return await asyncio.to_thread(self.embed_query, text)


# -- LangChain Embeddings, or plain functions ----------------------------------------------------


class LangChainEmbedder:
    """Any LangChain ``Embeddings`` object, or a function ``list[str] -> list[vector]``
    (sync or async), as an :class:`Embedder`."""

    def __init__(self, embeddings: Any, dims: int | None = None, name: str | None = None) -> None:
        self.embeddings = embeddings
        self._dims = dims
        self.name = name or type(embeddings).__name__

    @property
    def dims(self) -> int | None:
        return self._dims

    def _checked(self, vectors: Any, expected: int) -> list[Vector]:
        out = [list(map(float, v)) for v in vectors]
        if len(out) != expected:
            raise ConfigurationError(
                f"embedder {self.name} returned {len(out)} vectors for {expected} texts"
            )
        for v in out:
            if self._dims is None:
                self._dims = len(v)
            elif len(v) != self._dims:
                raise EmbeddingDimensionError(
                    f"embedder {self.name} returned a vector of {len(v)} dimensions where "
                    f"{self._dims} were expected; configure dims to match the model"
                )
        return out

    def embed_documents(self, texts: Sequence[str]) -> list[Vector]:
        e = self.embeddings
        if hasattr(e, "embed_documents"):
            return self._checked(e.embed_documents(list(texts)), len(texts))
        result = e(list(texts))
        if asyncio.iscoroutine(result):
            result.close()
            raise ConfigurationError(
                f"embedder {self.name} is an async function; use the async store or pass "
                "a LangChain Embeddings object with both sync and async methods"
            )
        return self._checked(result, len(texts))

    def embed_query(self, text: str) -> Vector:
        e = self.embeddings
        if hasattr(e, "embed_query"):
            return self._checked([e.embed_query(text)], 1)[0]
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: Sequence[str]) -> list[Vector]:
        e = self.embeddings
        if hasattr(e, "aembed_documents"):
            return self._checked(await e.aembed_documents(list(texts)), len(texts))
        if hasattr(e, "embed_documents"):  # sync only: in a worker thread, off the loop
            return await asyncio.to_thread(self.embed_documents, texts)
        if inspect.iscoroutinefunction(e) or inspect.iscoroutinefunction(type(e).__call__):
            result = await e(list(texts))
        else:  # a plain function may compute (a local model): in a worker thread
            result = await asyncio.to_thread(e, list(texts))
            if isinstance(result, Awaitable):
                result = await result
        return self._checked(result, len(texts))

    async def aembed_query(self, text: str) -> Vector:
        e = self.embeddings
        if hasattr(e, "aembed_query"):
            return self._checked([await e.aembed_query(text)], 1)[0]
        return (await self.aembed_documents([text]))[0]


# -- Voyage AI ----------------------------------------------------------------------------------

#: Output dimensions of Voyage models at their default ``output_dimension``.
VOYAGE_DIMS = {
    "voyage-3.5": 1024, "voyage-3.5-lite": 1024, "voyage-3-large": 1024, "voyage-3": 1024,
    "voyage-3-lite": 512, "voyage-code-3": 1024, "voyage-finance-2": 1024,
    "voyage-law-2": 1024, "voyage-multilingual-2": 1024, "voyage-context-3": 1024,
}  # fmt: skip
#: The API's limits per request: 1,000 texts; the total token budget depends on the model
#: (120k for voyage-3-large and older large models, 320k for voyage-3.5, 1M for the lite
#: models). Tokens are estimated at 4 characters each, with a safety margin.
VOYAGE_MAX_TEXTS = 1000
VOYAGE_TOKEN_BUDGET = {"voyage-3.5-lite": 1_000_000, "voyage-3-lite": 1_000_000,
                       "voyage-3.5": 320_000, "voyage-2": 320_000}  # fmt: skip
VOYAGE_DEFAULT_BUDGET = 120_000


def _is_rate_limit(exc: BaseException) -> bool:
    try:
        from voyageai import error as voyage_error
    except ImportError:  # fakes in tests without the voyage extra: the status decides
        return getattr(exc, "http_status", None) == 429
    if isinstance(exc, voyage_error.RateLimitError):
        return True
    return getattr(exc, "http_status", None) == 429


class VoyageEmbedder:
    """Voyage AI embeddings (``voyageai`` package).

    ``client``/``aclient`` default to ``voyageai.Client``/``AsyncClient`` built from
    ``api_key`` (or ``VOYAGE_API_KEY``); tests pass fakes. Requests are batched by count
    (``batch_size`` <= 1000) and by an estimated token budget; a rate-limited request (429)
    is retried ``max_retries`` times with exponential backoff from ``backoff`` seconds.
    """

    def __init__(
        self,
        model: str = "voyage-3.5",
        *,
        api_key: str | None = None,
        dims: int | None = None,
        batch_size: int = 128,
        max_retries: int = 5,
        backoff: float = 1.0,
        client: Any = None,
        aclient: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        asleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ConfigurationError("VoyageEmbedder needs a model name, e.g. 'voyage-3.5'")
        if not 1 <= batch_size <= VOYAGE_MAX_TEXTS:
            raise ConfigurationError(
                f"batch_size must be in [1, {VOYAGE_MAX_TEXTS}] (the API's limit), got {batch_size}"
            )
        if client is None or aclient is None:  # the real client: fail now, not at first use
            require("voyageai", "VoyageEmbedder (ACCORD_EMBEDDER=voyage:...)")
        self.model = model
        self.name = f"voyage:{model}"
        self._dims = dims or VOYAGE_DIMS.get(model)
        self.batch_size = batch_size
        self.max_retries = max_retries
        self.backoff = backoff
        self._api_key = api_key
        self._client = client
        self._aclient = aclient
        self._sleep = sleep
        self._asleep = asleep
        self.token_budget = VOYAGE_TOKEN_BUDGET.get(model, VOYAGE_DEFAULT_BUDGET)

    @property
    def dims(self) -> int | None:
        return self._dims

    def _sync_client(self) -> Any:
        if self._client is None:
            import voyageai

            self._client = voyageai.Client(api_key=self._api_key, max_retries=0)
        return self._client

    def _async_client(self) -> Any:
        if self._aclient is None:
            import voyageai

            self._aclient = voyageai.AsyncClient(api_key=self._api_key, max_retries=0)
        return self._aclient

    def batches(self, texts: Sequence[str]) -> list[list[str]]:
        """Split ``texts`` so each request stays within the count and token limits."""
        budget = int(self.token_budget * 0.8)
        out: list[list[str]] = []
        current: list[str] = []
        tokens = 0
        for text in texts:
            cost = len(text) // 4 + 1
            if current and (len(current) >= self.batch_size or tokens + cost > budget):
                out.append(current)
                current, tokens = [], 0
            current.append(text)
            tokens += cost
        if current:
            out.append(current)
        return out

    def _check(self, vectors: list[Vector]) -> list[Vector]:
        for v in vectors:
            if self._dims is None:
                self._dims = len(v)
            elif len(v) != self._dims:
                raise EmbeddingDimensionError(
                    f"Voyage model {self.model} returned {len(v)} dimensions, expected {self._dims}"
                )
        return vectors

    def _embed(self, texts: Sequence[str], input_type: str) -> list[Vector]:
        out: list[Vector] = []
        for batch in self.batches(texts):
            for attempt in range(self.max_retries + 1):
                try:
                    result = self._sync_client().embed(
                        batch, model=self.model, input_type=input_type
                    )
                    break
                except Exception as exc:
                    if not _is_rate_limit(exc) or attempt == self.max_retries:
                        raise
                    delay = self.backoff * 2**attempt
                    log.warning("Voyage AI rate limit (429); retrying in %.1fs", delay)
                    self._sleep(delay)
            out.extend([list(map(float, v)) for v in result.embeddings])
        return self._check(out)

    async def _aembed(self, texts: Sequence[str], input_type: str) -> list[Vector]:
        out: list[Vector] = []
        for batch in self.batches(texts):
            for attempt in range(self.max_retries + 1):
                try:
                    result = await self._async_client().embed(
                        batch, model=self.model, input_type=input_type
                    )
                    break
                except Exception as exc:
                    if not _is_rate_limit(exc) or attempt == self.max_retries:
                        raise
                    delay = self.backoff * 2**attempt
                    log.warning("Voyage AI rate limit (429); retrying in %.1fs", delay)
                    await self._asleep(delay)
            out.extend([list(map(float, v)) for v in result.embeddings])
        return self._check(out)

    def embed_documents(self, texts: Sequence[str]) -> list[Vector]:
        return self._embed(texts, "document") if texts else []

    def embed_query(self, text: str) -> Vector:
        return self._embed([text], "query")[0]

    async def aembed_documents(self, texts: Sequence[str]) -> list[Vector]:
        return await self._aembed(texts, "document") if texts else []

    async def aembed_query(self, text: str) -> Vector:
        return (await self._aembed([text], "query"))[0]


# -- resolution ---------------------------------------------------------------------------------


#: Set once the default embedder was announced at WARNING in this process.
_ANNOUNCED_DEFAULT = threading.Event()


def resolve_embedder(spec: Any = None, dims: int | None = None) -> Embedder:
    """An :class:`Embedder` for ``spec``.

    None: the hashing embedder (``dims`` or 256), announced in the log. An Embedder: itself.
    A LangChain ``Embeddings`` or a function: wrapped. ``"voyage:<model>"``: Voyage AI.
    ``"local"`` (or ``"local:<model directory>"``): :class:`LocalEmbedder`.
    Other provider strings go through LangChain's ``init_embeddings`` when installed.
    """
    if spec is None:
        embedder = HashingEmbedder(dims or DEFAULT_DIMS)
        # once per process (then at DEBUG): every root and store resolves its embedder,
        # and the demo said the same line twice
        level = logging.DEBUG if _ANNOUNCED_DEFAULT.is_set() else logging.WARNING
        _ANNOUNCED_DEFAULT.set()
        log.log(
            level,
            "no embedder configured: long-term memory uses accord's deterministic hashing "
            "embedder (%d dimensions; lexical similarity, not semantic). Configure Voyage AI "
            "or any LangChain Embeddings for semantic search.",
            embedder.dims,
        )
        return embedder
    if isinstance(spec, HashingEmbedder | VoyageEmbedder | LangChainEmbedder | LocalEmbedder):
        return spec
    if isinstance(spec, str):
        if spec.startswith("voyage:"):
            return VoyageEmbedder(spec.split(":", 1)[1], dims=dims)
        if spec == "hashing":
            return HashingEmbedder(dims or DEFAULT_DIMS)
        if spec == "local" or spec.startswith("local:"):
            return LocalEmbedder(spec.split(":", 1)[1] if ":" in spec else None)
        try:
            from langchain.embeddings import init_embeddings  # type: ignore[import-not-found]
        except ImportError as exc:
            raise ConfigurationError(
                f"embedder {spec!r}: provider strings other than 'voyage:<model>', 'local' "
                "and 'hashing' need the langchain package; pass an Embeddings object instead"
            ) from exc
        try:
            embeddings = init_embeddings(spec)
        except (ValueError, ImportError) as exc:  # an unknown provider, its package missing
            raise ConfigurationError(
                f"embedder {spec!r} (ACCORD_EMBEDDER or embedder=) cannot be used: {exc}; "
                "use 'voyage:<model>', 'local', 'hashing', or '<provider>:<model>' with the "
                "provider's LangChain package installed"
            ) from None
        return LangChainEmbedder(embeddings, dims=dims, name=spec)
    if hasattr(spec, "embed_documents") or callable(spec):
        return LangChainEmbedder(spec, dims=dims)
    raise ConfigurationError(
        f"cannot use {type(spec).__name__} as an embedder: pass a LangChain Embeddings, a "
        "function texts -> vectors, 'voyage:<model>', or nothing for the hashing embedder"
    )


def check_dimensions(embedder: Any, index_dims: int, where: str) -> None:
    """Refuse an embedder whose vectors cannot go into an index of ``index_dims``."""
    if embedder.dims is not None and embedder.dims != index_dims:
        subject = getattr(embedder, "subject", None) or f"embedder {embedder.name}"
        raise EmbeddingDimensionError(
            f"{subject} makes {embedder.dims}-dimension vectors but {where} "
            f"is indexed with {index_dims} dimensions. Use an embedder with {index_dims} "
            "dimensions, or drop and re-create the index (existing memories need "
            "re-embedding)."
        )
