"""The fleet workload, accord's workers side by side with DBOS (issue 25).

``.venv/bin/python -m benchmarks.fleet [RUNS] [--workers N] [--concurrency C]`` (needs the
``bench`` extra for DBOS: ``pip install -e '.[bench]'``; ``make bench-fleet`` does both).

The workload: RUNS runs of a three-step graph (``benchmarks/fleet_graph.py``), each step
one recorded tool call (a fake tool that answers at once) and one business write keeping
the step's start and end times. accord: the embedded engine in its own process with its
default durability (every commit fsynced), the runs submitted to the queue of runs, then
N ``accord worker`` processes started with ``--concurrency C``. DBOS: the same three steps
as DBOS steps with the business write in a DBOS transaction of a SQLite datasource, its
system database SQLite too (``benchmarks/fleet_dbos.py``), on the same disk, one process
with ``worker_concurrency`` N x C. Rows: accord with one worker process (like DBOS's one
process) and with N, and with N where the tool call is not recorded (what recording the
calls costs: an intent and a result, two more transactions per step); then DBOS.

Measures: runs/s and steps/s from the first step's start until every run was seen ended;
a step's latency is the time between the starts of two consecutive steps of a run (the
step's tool call, business write and the commit of its state; DBOS: its step and its
transaction), p50 and p99 over every run's two intervals.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from pymongo import MongoClient

from accord.platform.embedded import EmbeddedServer
from accord.runtime import Accord
from benchmarks.checkpointer import start_engine

ROOT = Path(__file__).resolve().parent.parent
ACCORD = Path(sys.executable).parent / "accord"
GRAPH = "benchmarks.fleet_graph:graph"
#: the takeover measurement's lease, seconds
LEASE = 2.0


def _latencies(steps: list[dict[str, Any]]) -> list[float]:
    by_run: dict[str, list[float]] = defaultdict(list)
    for s in steps:
        by_run[s["run"]].append(s["start"])
    gaps: list[float] = []
    for starts in by_run.values():
        starts.sort()
        gaps.extend(b - a for a, b in zip(starts, starts[1:], strict=False))
    return sorted(gaps)


def _row(name: str, runs: int, wall: float, steps: list[dict[str, Any]]) -> dict[str, Any]:
    gaps = _latencies(steps)
    return {"name": name, "runs": runs, "steps": len(steps), "wall": wall,
            "runs_s": runs / wall, "steps_s": len(steps) / wall,
            "p50_ms": statistics.median(gaps) * 1000,
            "p99_ms": gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] * 1000}  # fmt: skip


def run_accord(
    uri: str, db: str, runs: int, workers: int, concurrency: int, *, recorded: bool = True
) -> dict[str, Any]:
    """Submit RUNS runs, start the workers, wait until every run ended; the row.
    ``recorded=False``: the tool is called without recording it (what recording costs)."""
    client: MongoClient[Any] = MongoClient(uri)
    try:
        with Accord(client=client, db_name=db) as root:
            queue = root.runs()
            ids = [queue.submit(GRAPH, {"run": f"run-{i}"}).run_id for i in range(runs)]
            env = {**os.environ, "MONGODB_URI": uri,
                   "ACCORD_FLEET_UNRECORDED": "0" if recorded else "1"}  # fmt: skip
            procs = [
                subprocess.Popen(
                    [
                        str(ACCORD),
                        "worker",
                        "--graph",
                        GRAPH,
                        "--db",
                        db,
                        "--concurrency",
                        str(concurrency),
                        "--poll",
                        "0.05",
                        "--until-idle",
                    ],
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )  # fmt: skip
                for _ in range(workers)
            ]
            try:
                for run_id in ids:
                    queue.wait(run_id, timeout=600)
                done = time.time()
            finally:
                for proc in procs:
                    proc.terminate()
                    proc.wait(timeout=60)
        steps = list(client[db]["fleet_steps"].find({}, {"_id": 0}))
    finally:
        client.close()
    if len(steps) != 3 * runs:
        raise SystemExit(
            f"accord: {len(steps)} business writes for {runs} runs (expected {3 * runs})"
        )
    first = min(s["start"] for s in steps)
    name = f"accord, {workers} worker process(es) x {concurrency}"
    if not recorded:
        name += ", tool call not recorded"
    return _row(name, runs, done - first, steps)


def run_dbos(runs: int, concurrency: int, directory: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.fleet_dbos", str(runs),
                           str(concurrency), str(directory)], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"DBOS side failed: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.splitlines()[-1])
    if len(out["steps"]) != 3 * runs:
        raise SystemExit(f"DBOS: {len(out['steps'])} business writes for {runs} runs")
    return _row(f"DBOS (SQLite), 1 process x {concurrency}", runs, out["wall"], out["steps"])


def _worker(uri: str, db: str, concurrency: int, lease: float, machine: str) -> Any:
    env = {**os.environ, "MONGODB_URI": uri, "ACCORD_MACHINE_ID": machine,
           "ACCORD_FLEET_UNRECORDED": "0"}  # fmt: skip
    return subprocess.Popen([str(ACCORD), "worker", "--graph", GRAPH, "--db", db,
                             "--concurrency", str(concurrency), "--poll", "0.05", "--lease",
                             str(lease)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def takeover(runs: int, concurrency: int, lease: float) -> dict[str, Any]:
    """Two workers playing two machines (``ACCORD_MACHINE_ID``), so the dead one's runs
    wait for their lease; one is SIGKILLed while it holds runs: seconds from the kill to
    the first step of one of its runs on the other worker. The engine aborts a dead
    worker's open transaction after ``lease`` seconds (mongod's
    ``transactionLifetimeLimitSeconds``, 60 s by default, set to the lease here)."""
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(dbpath=tmp, port=0, transaction_lifetime=lease)
        server.start()
        client: MongoClient[Any] = MongoClient(server.uri)
        procs: list[Any] = []
        try:
            with Accord(client=client, db_name="takeover") as root:
                queue = root.runs()
                named = {queue.submit(GRAPH, {"run": f"run-{i}"}).run_id: f"run-{i}"
                         for i in range(runs)}  # fmt: skip
                procs = [_worker(server.uri, "takeover", concurrency, lease, f"m{i}")
                         for i in range(2)]  # fmt: skip
                victim = procs[0]
                table = client["takeover"]["accord_run_queue"]
                deadline = time.monotonic() + 300
                while (
                    not table.count_documents({"status": "running", "owner.holder_pid": victim.pid})
                    or table.count_documents({"status": "done"}) < runs // 4
                ):
                    if time.monotonic() > deadline:
                        raise SystemExit("takeover: the victim never held runs midway")
                    time.sleep(0.01)
                victim.kill()
                killed_at = time.time()
                victim.wait()
                orphans = [d["_id"] for d in table.find(
                    {"status": "running", "owner.holder_pid": victim.pid}, {"_id": 1})]  # fmt: skip
                names = {named[r] for r in orphans}
                while table.count_documents({"status": "done"}) < runs:
                    if time.monotonic() > deadline:
                        raise SystemExit("takeover: the runs did not all finish")
                    time.sleep(0.05)
            starts = [s["start"] for s in client["takeover"]["fleet_steps"].find(
                {"run": {"$in": sorted(names)}, "start": {"$gt": killed_at}})]  # fmt: skip
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=60)
            client.close()
            server.stop()
    return {"lease": lease, "orphans": len(names), "seconds": min(starts) - killed_at}


def measure(runs: int, workers: int, concurrency: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:  # the engine's files and DBOS's: one disk
        proc, port = start_engine(tmp, fsync=True)
        uri = f"mongodb://127.0.0.1:{port}/?replicaSet=accord"
        try:
            rows = [run_accord(uri, "fleet_one", runs, 1, concurrency),
                    run_accord(uri, "fleet_many", runs, workers, concurrency),
                    run_accord(uri, "fleet_plain", runs, workers, concurrency,
                               recorded=False)]  # fmt: skip
        finally:
            proc.terminate()
            proc.wait()
        dbos_dir = Path(tmp) / "dbos"
        dbos_dir.mkdir()
        rows.append(run_dbos(runs, workers * concurrency, dbos_dir))
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    dbos = rows[-1]
    lines = ["| system | runs | steps | wall s | runs/s | steps/s | vs DBOS steps/s | "
             "step p50 ms | step p99 ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['name']} | {r['runs']} | {r['steps']} | {r['wall']:.2f} | "
                     f"{r['runs_s']:.1f} | {r['steps_s']:.1f} | "
                     f"{r['steps_s'] / dbos['steps_s']:.2f}x | {r['p50_ms']:.1f} | "
                     f"{r['p99_ms']:.1f} |")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet")
    parser.add_argument("runs", nargs="?", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    rows = measure(args.runs, args.workers, args.concurrency)
    moved = takeover(args.runs, args.concurrency, LEASE)
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("\n".join(table(rows)))
    print(
        f"\nTakeover: a worker SIGKILLed holding {moved['orphans']} runs (the workers on two "
        f"machines, lease {moved['lease']:g} s): its runs resumed on the other worker "
        f"{moved['seconds']:.2f} s after the kill ({moved['seconds'] / moved['lease']:.2f}x "
        f"the lease; target <= 2x)."
    )


if __name__ == "__main__":
    main()
