"""accord's embedded MongoDB-wire-compatible engine (development, tests, single machine).

``EmbeddedServer`` is imported on first use, so that importing a light submodule (such as
``discovery``) does not load the engine, its evaluators and mongomock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accord.platform.embedded.discovery import REPLICA_SET

if TYPE_CHECKING:
    from accord.platform.embedded.server import EmbeddedServer

__all__ = ["REPLICA_SET", "EmbeddedServer"]


def __getattr__(name: str) -> Any:
    if name == "EmbeddedServer":
        from accord.platform.embedded.server import EmbeddedServer

        return EmbeddedServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
