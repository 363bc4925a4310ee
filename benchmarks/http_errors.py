"""Error answers of the memory HTTP API under a deep-nesting request (issue 22, item 3).

The request is the issue's: a search body of about 1.8 KB whose filter nests 300 levels
deep, sent with a valid key. Measured through the real ``accord serve`` (uvicorn, its own
process; the engine in another): the size of the 422 answer and the time to get it; then
20 such requests at once while ``/healthz`` is asked every 20 ms, and the health checks'
latency during that burst against the same checks on an idle server. Target: a 422 of at
most 4 KB (the issue measured 9.9-26 MB), and health checks that do not wait on the burst.

With ``--baseline REV`` (or ``ACCORD_BENCH_BASELINE``) the server of git revision REV is
measured in the same run, row after row, on the same engine. Run alone:
``python -m benchmarks.http_errors [--baseline REV]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from accord.memory.principals import hash_key, new_key
from benchmarks.engine_proc import ROOT, EngineProcess, baseline, free_port

DEPTH = 300
BURST = 20
HEALTH_EVERY = 0.02
TARGET_BYTES = 4096


def deep_body(depth: int = DEPTH) -> str:
    return '{"filter": ' + '{"a": ' * depth + '{"$eq": 1}' + "}" * depth + "}"


class Server:
    """``accord serve`` in its own process (from ``source``, or this checkout)."""

    def __init__(self, uri: str, db: str, keys: Path, source: Path | None) -> None:
        self.port = free_port()
        env = {**os.environ, "MONGODB_URI": uri, "ACCORD_DATABASE": db}
        if source is not None:
            env["PYTHONPATH"] = str(source)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "accord.platform.cli", "serve", "--port", str(self.port),
             "--keys-file", str(keys)],
            env=env, cwd=str(source or ROOT), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{self.base}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("accord serve did not start")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def _health(base: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(timeout=60) as c:
        while not stop.is_set():
            started = time.perf_counter()
            c.get(f"{base}/healthz")
            out.append(time.perf_counter() - started)
            stop.wait(HEALTH_EVERY)


def measure(server: Server, key: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    body = deep_body()
    with httpx.Client(timeout=300) as c:
        sizes, times = [], []
        for _ in range(5):
            started = time.perf_counter()
            r = c.post(f"{server.base}/v1/search", headers=headers, content=body)
            times.append(time.perf_counter() - started)
            sizes.append(len(r.content))
            status = r.status_code
        small = c.post(f"{server.base}/v1/search", headers=headers, content='{"limit": 0}')
    idle: list[float] = []
    stop = threading.Event()
    checker = threading.Thread(target=_health, args=(server.base, stop, idle))
    checker.start()
    time.sleep(1.0)
    stop.set()
    checker.join()
    during: list[float] = []
    stop = threading.Event()
    checker = threading.Thread(target=_health, args=(server.base, stop, during))
    checker.start()
    started = time.perf_counter()

    def one(_: int) -> int:
        with httpx.Client(timeout=300) as c:
            return len(c.post(f"{server.base}/v1/search", headers=headers, content=body).content)

    with ThreadPoolExecutor(BURST) as pool:
        burst_bytes = sum(pool.map(one, range(BURST)))
    burst_s = time.perf_counter() - started
    stop.set()
    checker.join()
    return {
        "request": len(body), "status": status, "bytes": statistics.median(sizes),
        "ms": statistics.median(times) * 1000, "small_bytes": len(small.content),
        "burst_mb": burst_bytes / 1e6, "burst_s": burst_s,
        "idle_p50": statistics.median(idle) * 1000, "during_p50": statistics.median(during) * 1000,
        "during_max": max(during) * 1000, "load": os.getloadavg()[0],
    }  # fmt: skip


def report(rev: str | None = None) -> str:
    rev = rev or os.environ.get("ACCORD_BENCH_BASELINE")
    key = new_key()
    rows: list[tuple[str, dict[str, Any]]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        EngineProcess(Path(tmp) / "data", sync=False) as engine,
    ):
        keys = Path(tmp) / "keys.toml"
        keys.write_text(
            f'[[principals]]\nname = "b"\ntenant = "t"\nkey_sha256 = "{hash_key(key)}"\n'
        )
        versions: list[tuple[str, Path | None]] = [("this checkout", None)]
        if rev:
            versions.append((f"baseline {rev}", baseline(rev)))
        for name, source in versions:
            server = Server(engine.uri, "httpbench", keys, source)
            try:
                rows.append((name, measure(server, key)))
            finally:
                server.stop()
    ours = rows[0][1]
    lines = [
        "### Memory HTTP API: the answer to a deep-nesting request",
        "",
        "Run alone: `.venv/bin/python -m benchmarks.http_errors` (`--baseline REV` adds the "
        "server of git revision REV, same engine, same run). The issue's request: a search "
        f"body of {ours['request']:,} bytes whose filter nests {DEPTH} levels deep, valid key, "
        "through `accord serve` (uvicorn) in its own process, the engine in another. "
        f"`422 bytes`: the answer's size (median of 5; target <= {TARGET_BYTES:,}); "
        '`x request`: answer / request; `small 422`: the answer to `{"limit": 0}` for '
        f"comparison. Then {BURST} of the deep requests at once while `/healthz` is asked "
        f"every {HEALTH_EVERY * 1000:.0f} ms: the bytes answered, the burst's wall time, and "
        "the health checks' latency during it vs on the idle server just before.",
        "",
        "| server | status | 422 bytes | x request | ms | small 422 bytes | burst MB | burst s "
        "| /healthz idle p50 ms | during p50 ms | during max ms | max vs idle | load avg | "
        "target met |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
        "---: | --- |",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['status']} | {r['bytes']:,.0f} | {r['bytes'] / r['request']:.1f}x | "
            f"{r['ms']:.1f} | {r['small_bytes']:,} | {r['burst_mb']:.2f} | {r['burst_s']:.2f} | "
            f"{r['idle_p50']:.1f} | {r['during_p50']:.1f} | {r['during_max']:.1f} | "
            f"{r['during_max'] / r['idle_p50']:.1f}x | {r['load']:.1f} | "
            f"{'yes' if r['bytes'] <= TARGET_BYTES else 'no'} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http_errors")
    parser.add_argument("--baseline", default=None, help="git revision of a server to compare")
    print(report(parser.parse_args().baseline))
