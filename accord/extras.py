"""Optional dependencies: import one, or say which extra installs it.

``pip install accord`` is the core (checkpointer, store, aggregator, embedded engine,
CLI). The HTTP API and MCP server need ``accord[server]``, Voyage AI embeddings
``accord[voyage]``, the local embedding model ``accord[local]``. Code that needs one
imports it where it is used (so the core imports without it) through :func:`require`,
or turns the ``ImportError`` of its own imports into :func:`missing`'s error: a
:class:`~accord.errors.MissingExtraError` naming the extra, not a bare
``ModuleNotFoundError`` from deep inside.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from accord.errors import MissingExtraError

#: The extra that installs each optional top-level module.
EXTRA_OF = {
    "fastapi": "server",
    "fastapi_offline": "server",
    "starlette": "server",
    "uvicorn": "server",
    "mcp": "server",
    "voyageai": "voyage",
    "sentence_transformers": "local",
}


def missing(exc: ImportError, feature: str) -> ImportError:
    """The error to raise for ``exc``, an import of ``feature`` that failed: a
    :class:`~accord.errors.MissingExtraError` naming the extra when the missing module is
    an optional dependency, else ``exc`` itself (a broken install shows as it is)."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRA_OF.get(top)
    if extra is None:
        return exc
    err = MissingExtraError(
        f"{feature} needs the {top} package, which is not installed: "
        f"pip install 'accord[{extra}]' (the {extra!r} extra)."
    )
    err.name = top
    return err


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` for ``feature`` (what the user asked for, e.g. ``accord serve``)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(exc, feature) from exc
