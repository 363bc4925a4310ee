"""``accord serve`` as a child process, for the tests that need the real server (uvicorn,
its access log): started on a free port, waited for, stopped; its output kept."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """A running ``accord serve``: its ``base`` URL; ``output`` once it stopped."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.output = ""


@contextmanager
def accord_serve(mongo_uri: str, db: str, keys_file: Path) -> Iterator[Served]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "accord.platform.cli", "serve", "--port", str(port),
         "--keys-file", str(keys_file)],
        env={**os.environ, "MONGODB_URI": mongo_uri, "ACCORD_DATABASE": db},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    served = Served(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{served.base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()  # type: ignore[union-attr]
            time.sleep(0.2)
        yield served
    finally:
        proc.terminate()
        served.output = proc.communicate(timeout=30)[0]
