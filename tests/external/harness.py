"""What both external-suite drivers share: one engine for a run, a pytest subprocess, CPU.

A driver copies an upstream test tree into ``.accord/external/run/``, starts ONE server for
the whole run (:func:`engine`: the embedded engine on a temporary directory, or
``MONGODB_URI``), runs pytest in that tree as a subprocess (:func:`run_pytest`, output to a
log under ``.accord/external/logs/``) and reads the per-test records the tree's plugin wrote.
"""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.external.sdist import CACHE_DIR

LOGS = CACHE_DIR / "logs"


class HarnessError(RuntimeError):
    """A suite could not be run (the message says why and where the log is)."""


@dataclass
class Engine:
    """The server a run uses; ``cpu_s`` and ``alive_at_end`` are filled in when it stops."""

    uri: str
    host: str = "127.0.0.1"
    port: int = 0
    embedded: bool = True
    cpu_s: float | None = None
    alive_at_end: bool | None = None
    log_tail: str = field(default="")


@contextmanager
def engine(
    *, enable_test_commands: bool = False, prefer_port: int = 0, auth: bool = False
) -> Iterator[Engine]:
    """ONE server for a run: ``MONGODB_URI`` if set, else an embedded engine, stopped after.

    ``prefer_port``: listen there if it is free (some upstream tests ignore the configured
    port and dial the default 27017), else on any free port. ``auth``: start it with
    ``--auth`` (no user yet: the suite creates its first one through the localhost
    exception, as on a fresh mongod).
    """
    uri = os.environ.get("MONGODB_URI")
    if uri:
        yield Engine(uri=uri, embedded=False)
        return
    from accord.platform import stop_engine
    from accord.platform.connection import ENGINE_LOG, read_lock, spawn_engine

    data_dir = Path(tempfile.mkdtemp(prefix="accord-external-engine-"))
    port = prefer_port if prefer_port and port_is_free(prefer_port) else 0
    try:
        uri = spawn_engine(
            data_dir,
            port=port,
            host="127.0.0.1",
            sync=False,
            timeout=60.0,
            enable_test_commands=enable_test_commands,
            options=["--auth"] if auth else [],
        )
        found = read_lock(data_dir)
        if not found:
            raise HarnessError(f"the engine for {data_dir} exited right after starting")
        pid, port = found
        server = Engine(uri=uri, port=port)
        try:
            yield server
        finally:
            now = read_lock(data_dir)
            server.alive_at_end = now is not None and now[0] == pid
            server.cpu_s = process_cpu(pid)
            log = data_dir / ENGINE_LOG
            server.log_tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            stop_engine(data_dir)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def run_files(name: str) -> tuple[Path, Path]:
    """(pytest's log, the plugin's JSON records) for a new run called ``name``."""
    LOGS.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    return LOGS / f"{stem}.log", LOGS / f"{stem}.json"


def run_pytest(
    args: Sequence[str], *, cwd: Path, env: dict[str, str], log: Path, echo: bool = False
) -> tuple[int, float]:
    """Run ``python -m pytest ARGS`` in ``cwd``; (exit code, CPU seconds it used)."""
    before = children_cpu()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", *args],
            cwd=cwd,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if echo:
                sys.stdout.write(line)
        code = proc.wait()
    return code, children_cpu() - before


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def children_cpu() -> float:
    """User + system CPU seconds of this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a running process (Linux /proc), None if unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fresh_copy(source: Path, target: Path) -> None:
    """Replace ``target`` with a copy of the directory ``source``."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
