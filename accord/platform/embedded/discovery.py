"""What another process needs to find a running engine: its lock file and replica-set name.

Kept apart from the server so that ``accord.platform.connection`` can locate or start an
engine without importing it (an Atlas user never loads the engine or mongomock).
"""

from __future__ import annotations

REPLICA_SET = "accord"
# In the data directory: flock-held by the serving engine, contains "<pid> <port>\n".
LOCK_FILE = "mongod.lock"

__all__ = ["LOCK_FILE", "REPLICA_SET"]
