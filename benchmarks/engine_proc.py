"""An embedded engine in its own process, for benchmarks: start, restart, stop, and read
its RSS and CPU time from /proc.

``source`` runs the engine from another checkout of accord (``baseline(rev)`` extracts
one with ``git archive``), so two engine versions can be measured side by side in one run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from pymongo import MongoClient

ROOT = Path(__file__).resolve().parent.parent
READY = "accord-engine listening on"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def baseline(rev: str) -> Path:
    """A directory holding ``accord/`` as of git revision ``rev`` (for PYTHONPATH)."""
    out = Path(tempfile.mkdtemp(prefix=f"accord-{rev[:12]}-"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "accord"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    tar_path = out / "src.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(out, filter="data")
    tar_path.unlink()
    return out


class EngineProcess:
    def __init__(
        self, dbpath: Path, *, sync: bool = True, source: Path | None = None,
        args: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        self.dbpath = dbpath
        self.sync = sync
        self.source = source
        self.args = args
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> float:
        """Start the engine; returns the seconds until it accepted connections."""
        cmd = [sys.executable, "-m", "accord.platform.embedded", "--dbpath", str(self.dbpath),
               "--port", str(self.port), *self.args]  # fmt: skip
        if not self.sync:
            cmd.append("--no-sync")
        env = dict(os.environ)
        if self.source is not None:
            env["PYTHONPATH"] = str(self.source)
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(self.source or ROOT),
        )
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline().decode()
            if not line:
                raise RuntimeError(f"engine exited with {self.proc.wait()} before listening")
            if READY in line:
                return time.perf_counter() - started

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> float:
        self.stop()
        return self.start()

    def client(self, **kwargs: object) -> MongoClient:
        return MongoClient(self.uri, **kwargs)  # type: ignore[arg-type]

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the engine process so far (all threads)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> EngineProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
