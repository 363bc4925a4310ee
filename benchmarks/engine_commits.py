"""Commit throughput and latency of small 3-document transactions on the embedded engine.

Runs the same workload against an engine with fsync on and one with fsync off, each in
its own process (as in real use), and reports commits/s and p50/p99 commit latency.
Compare the rows with each other, not with another machine: the absolute numbers depend
on the disk and on whatever else this shared machine is doing.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pymongo import MongoClient

from accord.platform.connection import read_lock

TXNS = 600
WARMUP = 50


def run_one(sync: bool, txns: int = TXNS) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "accord.platform.embedded", "--dbpath", tmp, "--port", "0"]
        if not sync:
            cmd.append("--no-sync")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            assert proc.stdout is not None
            proc.stdout.readline()
            found = read_lock(Path(tmp))
            assert found, "engine did not start"
            client: MongoClient = MongoClient(f"mongodb://127.0.0.1:{found[1]}/?replicaSet=accord")
            db = client.bench
            latencies = []
            for n in range(txns + WARMUP):
                start = time.perf_counter()
                with client.start_session() as s, s.start_transaction():
                    db.steps.insert_one({"n": n, "state": "x" * 100}, session=s)
                    db.messages.insert_one({"n": n, "text": "hello"}, session=s)
                    db.outbox.insert_one({"n": n, "status": "pending"}, session=s)
                if n >= WARMUP:
                    latencies.append(time.perf_counter() - start)
            client.close()
        finally:
            proc.terminate()
            proc.wait()
    latencies.sort()
    total = sum(latencies)
    return {
        "commits_per_s": len(latencies) / total,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
    }


def bulk_insert(n: int = 5000) -> dict[str, float]:
    """Seconds to insert_many ``n`` documents without and with a unique compound index."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "accord.platform.embedded", "--dbpath", tmp, "--port", "0"]
        proc = subprocess.Popen(
            cmd + ["--no-sync"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            assert proc.stdout is not None
            proc.stdout.readline()
            found = read_lock(Path(tmp))
            assert found, "engine did not start"
            client: MongoClient = MongoClient(f"mongodb://127.0.0.1:{found[1]}/?replicaSet=accord")
            out = {}
            for name, unique in (("no secondary index", False), ("unique compound index", True)):
                coll = client.bench[name.replace(" ", "_")]
                if unique:
                    coll.create_index([("t", 1), ("i", 1)], unique=True)
                start = time.perf_counter()
                coll.insert_many([{"t": "x", "i": i, "pad": "p" * 50} for i in range(n)])
                out[name] = time.perf_counter() - start
            client.close()
        finally:
            proc.terminate()
            proc.wait()
    return out


def report() -> str:
    on = run_one(sync=True)
    off = run_one(sync=False)
    lines = [
        "### Embedded engine: small transactions (3 inserts in 3 collections + commit)",
        "",
        f"{TXNS} transactions after {WARMUP} warm-up, one client, engine in its own process.",
        "",
        "| fsync | commits/s | p50 ms | p99 ms | commits/s relative to fsync on |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, row in (("on (default)", on), ("off (--no-sync)", off)):
        ratio = row["commits_per_s"] / on["commits_per_s"]
        lines.append(
            f"| {name} | {row['commits_per_s']:.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {ratio:.2f}x |"
        )
    bulk = bulk_insert()
    base = bulk["no secondary index"]
    lines += [
        "",
        "### Embedded engine: insert_many of 5,000 documents",
        "",
        "| collection | seconds | relative |",
        "| --- | ---: | ---: |",
    ]
    for name, secs in bulk.items():
        lines.append(f"| {name} | {secs:.2f} | {secs / base:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(report())
