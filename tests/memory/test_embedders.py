"""Embedders: the hashing default, LangChain wrapping, Voyage AI through a FAKE client."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import pytest
from voyageai.error import InvalidRequestError, RateLimitError

from accord.errors import ConfigurationError, EmbeddingDimensionError
from accord.memory.embedders import (
    HashingEmbedder,
    LangChainEmbedder,
    VoyageEmbedder,
    resolve_embedder,
)


def test_hashing_is_deterministic_unit_and_lexical():
    e = HashingEmbedder(128)
    a, b = e.embed_documents(["I like green tea", "I like green tea"])
    assert a == b and abs(np.linalg.norm(a) - 1) < 1e-9
    q = np.array(e.embed_query("green tea"))
    assert q @ np.array(a) > q @ np.array(e.embed_query("the train leaves at nine"))
    assert len(e.embed_query("")) == 128


def test_resolve_defaults_to_hashing_and_says_so(caplog):
    with caplog.at_level("DEBUG"):  # (WARNING the first time in a process)
        e = resolve_embedder(None)
    assert isinstance(e, HashingEmbedder) and e.dims == 256
    assert "hashing embedder" in caplog.text


def test_the_default_embedder_is_announced_once_per_process():
    """Every root and store resolves its embedder: the demo printed the line twice."""
    code = (
        "import logging; logging.basicConfig(level=logging.WARNING)\n"
        "from accord.memory.embedders import resolve_embedder\n"
        "resolve_embedder(None); resolve_embedder(None, 64)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("no embedder configured") == 1, run.stderr


def test_an_unknown_provider_string_is_a_configuration_error():
    """ACCORD_EMBEDDER=bogus was LangChain's ValueError (a traceback from every command,
    the MCP server's an ExceptionGroup); a provider whose package is missing, ImportError."""
    for spec in ("bogus", "nosuchprovider:model-x"):
        with pytest.raises(ConfigurationError, match=f"embedder '{spec}'"):
            resolve_embedder(spec)


def test_langchain_wrapper_checks_dimensions():
    class Fixed:
        def embed_documents(self, texts):
            return [[1.0, 0.0, 0.0] for _ in texts]

        def embed_query(self, text):
            return [1.0, 0.0]

    e = LangChainEmbedder(Fixed())
    assert e.embed_documents(["a"]) == [[1.0, 0.0, 0.0]] and e.dims == 3
    with pytest.raises(EmbeddingDimensionError):
        e.embed_query("q")


class FakeVoyageResult:
    def __init__(self, embeddings):
        self.embeddings = embeddings


class FakeVoyageClient:
    """A FAKE voyageai.Client: records calls, answers 429 ``fail`` times first."""

    def __init__(self, fail: int = 0, dims: int = 4):
        self.calls: list[tuple[list[str], str, str]] = []
        self.fail = fail
        self.dims = dims

    def embed(self, texts, model, input_type):
        self.calls.append((list(texts), model, input_type))
        if self.fail:
            self.fail -= 1
            raise RateLimitError("rate limited", http_status=429)
        return FakeVoyageResult([[float(len(t))] + [0.0] * (self.dims - 1) for t in texts])


class FakeAsyncVoyageClient(FakeVoyageClient):
    async def embed(self, texts, model, input_type):  # type: ignore[override]
        return FakeVoyageClient.embed(self, texts, model, input_type)


def test_voyage_input_types_batches_and_retries():
    client = FakeVoyageClient(fail=2)
    slept: list[float] = []
    e = VoyageEmbedder("voyage-3.5", dims=4, batch_size=3, client=client, sleep=slept.append,
                       backoff=0.5)  # fmt: skip
    out = e.embed_documents([f"text {i}" for i in range(7)])
    assert len(out) == 7 and out[0][0] == len("text 0")
    assert slept == [0.5, 1.0]  # two 429s, exponential backoff
    sizes = [len(texts) for texts, _, _ in client.calls[2:]]
    assert sizes == [3, 3, 1]
    assert {(m, t) for _, m, t in client.calls} == {("voyage-3.5", "document")}
    e.embed_query("q")
    assert client.calls[-1][2] == "query"


def test_voyage_token_budget_splits_long_texts():
    e = VoyageEmbedder("voyage-3-large", dims=4, client=FakeVoyageClient())
    big = "x" * (e.token_budget * 4 // 2)  # about half the budget each
    assert [len(b) for b in e.batches([big, big, big])] == [1, 1, 1]


def test_voyage_gives_up_after_max_retries_and_does_not_retry_other_errors():
    e = VoyageEmbedder(dims=4, client=FakeVoyageClient(fail=10), max_retries=2,
                       sleep=lambda s: None)  # fmt: skip
    with pytest.raises(RateLimitError):
        e.embed_documents(["a"])

    class Broken(FakeVoyageClient):
        def embed(self, texts, model, input_type):
            self.calls.append((texts, model, input_type))
            raise InvalidRequestError("bad model")

    broken = Broken()
    with pytest.raises(InvalidRequestError):
        VoyageEmbedder(dims=4, client=broken, sleep=lambda s: None).embed_query("a")
    assert len(broken.calls) == 1


def test_voyage_async_and_dimension_check():
    e = VoyageEmbedder("voyage-3.5", aclient=FakeAsyncVoyageClient(dims=4))
    with pytest.raises(EmbeddingDimensionError, match="returned 4 dimensions, expected 1024"):
        asyncio.run(e.aembed_query("q"))
    ok = VoyageEmbedder("voyage-3.5", dims=4, aclient=FakeAsyncVoyageClient(dims=4))
    assert asyncio.run(ok.aembed_documents(["ab", "c"])) == [[2.0, 0, 0, 0], [1.0, 0, 0, 0]]


def test_bad_configuration():
    with pytest.raises(ConfigurationError):
        VoyageEmbedder(batch_size=5000)
    with pytest.raises(ConfigurationError):
        resolve_embedder(42)
