"""Platform: connection, embedded engine, unit of work, outbox, workers, CLI."""

from accord.platform.connection import connect, connect_async, ensure_engine, stop_engine
from accord.platform.settings import Settings

__all__ = ["Settings", "connect", "connect_async", "ensure_engine", "stop_engine"]
