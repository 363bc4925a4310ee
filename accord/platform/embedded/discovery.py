"""What another process needs to find a running engine: its lock file, its replica-set
name, and the per-user list of running engines (``accord engine ls``).

Kept apart from the server so that ``accord.platform.connection`` can locate or start an
engine without importing it (an Atlas user never loads the engine or mongomock).

Each engine, once it listens, writes one small JSON file (dbpath, host, port, pid) in
:func:`engines_dir` and removes it when it stops. A SIGKILLed engine leaves its file
behind; readers check each entry against the data directory's lock (held only by a live
engine) and drop stale ones, so the list never names a dead engine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

REPLICA_SET = "accord"
# In the data directory: flock-held by the serving engine, contains "<pid> <port>\n".
LOCK_FILE = "mongod.lock"
# The port ``accord engine start`` listens on by default: not mongod's 27017 (nor 27018
# or 27019, which mongod uses for shard and config servers), so a local mongod and the
# engine never collide. ``connect()`` starts its engines on any free port instead.
DEFAULT_PORT = 27027
# Exit codes of an engine process whose start failed (``connection.spawn_engine`` tells
# them apart): could not start at all (the reason on stderr), or the data directory is
# another engine's (mongod's code for that), which a starter that lost a race expects.
EXIT_START_FAILED = 2
EXIT_DIR_TAKEN = 100
#: Where running engines are listed (one file each); ``~/.accord/engines`` by default.
ENGINES_DIR_ENV = "ACCORD_ENGINES_DIR"

__all__ = [
    "DEFAULT_PORT",
    "ENGINES_DIR_ENV",
    "EXIT_DIR_TAKEN",
    "EXIT_START_FAILED",
    "LOCK_FILE",
    "REPLICA_SET",
    "engines_dir",
    "listed_engines",
    "register",
    "unregister",
]


def engines_dir() -> Path:
    """The directory of running engines' entries (``ACCORD_ENGINES_DIR``)."""
    configured = os.environ.get(ENGINES_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".accord" / "engines"


def _entry(dbpath: Path) -> Path:
    digest = hashlib.sha256(str(dbpath.resolve()).encode()).hexdigest()[:16]
    return engines_dir() / f"{digest}.json"


def register(dbpath: Path, *, host: str, port: int, pid: int) -> None:
    """Note that the engine ``pid`` serves ``dbpath`` on ``host:port``. Best effort: an
    unwritable home directory only leaves the engine out of ``accord engine ls``."""
    entry = _entry(dbpath)
    record = {"dbpath": str(dbpath.resolve()), "host": host, "port": port, "pid": pid}
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_suffix(f".{pid}.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, entry)  # readers see the whole entry or none
    except OSError:
        pass


def unregister(dbpath: Path, pid: int) -> None:
    """Remove ``dbpath``'s entry if it is still ``pid``'s (a newer engine's stays)."""
    entry = _entry(dbpath)
    record = _read(entry)
    if record is not None and record.get("pid") == pid:
        with contextlib.suppress(OSError):
            entry.unlink()


def listed_engines() -> list[dict[str, Any]]:
    """Every entry of :func:`engines_dir` (running or not: check each one's lock)."""
    directory = engines_dir()
    try:
        files = sorted(directory.glob("*.json"))
    except OSError:
        return []
    found = []
    for entry in files:
        record = _read(entry)
        if record is not None:
            record["entry"] = str(entry)
            found.append(record)
    return found


def _read(entry: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(entry.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("dbpath"), str):
        return None
    return record
