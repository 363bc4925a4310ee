"""accord's embedded MongoDB-wire-compatible engine (development, tests, single machine)."""

from accord.platform.embedded.server import REPLICA_SET, EmbeddedServer

__all__ = ["REPLICA_SET", "EmbeddedServer"]
