"""Durable commits per second at 1, 4 and 16 clients vs the disk's own fsync rate.

Each client is a thread of this process with its own ``MongoClient``, inserting one small
document per command (an autocommitted write: one commit, acknowledged once durable)
against an engine in its own process with fsync on. In the same run, on the same
filesystem: the raw fsync loop (``write`` 200 bytes + ``fdatasync``, one thread) and a raw
SQLite loop (WAL, ``synchronous=FULL``, one single-row transaction per commit) give the
disk's ceiling for one-commit-one-fsync (measured around each engine turn, because this
disk's rate drifts). Group commit lets many clients share one fsync, so the engine can
pass the raw loop once enough clients wait together.

``python -m benchmarks.engine_group_commit [--seconds 10] [--baseline REV]`` (seconds of
engine time per row, in ``TURNS`` turns).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pymongo.errors import PyMongoError

from benchmarks.engine_proc import EngineProcess, baseline

CLIENTS = (1, 4, 16)
# A row's engine turns, each between two raw fsync loops as long as it.
TURNS = 5


def fsync_loop(directory: Path, seconds: float) -> float:
    fd = os.open(directory / "fsync-loop", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        n = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            os.write(fd, b"x" * 200)
            os.fdatasync(fd)
            n += 1
        return n / seconds
    finally:
        os.close(fd)


def sqlite_loop(directory: Path, seconds: float) -> float:
    conn = sqlite3.connect(directory / "loop.sqlite3", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (a BLOB)")
        n = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t VALUES (?)", (b"x" * 200,))
            conn.execute("COMMIT")
            n += 1
        return n / seconds
    finally:
        conn.close()


def engine_rate(engine: EngineProcess, clients: int, seconds: float) -> dict[str, Any]:
    stop = threading.Event()
    counts = [0] * clients
    errors = [0] * clients
    latencies: list[list[float]] = [[] for _ in range(clients)]
    ready = threading.Barrier(clients + 1)

    def worker(k: int) -> None:
        client = engine.client()
        coll = client.bench[f"commits_{clients}"]
        coll.insert_one({"warm": k})
        ready.wait()
        i = 0
        while not stop.is_set():
            t = time.perf_counter()
            try:
                coll.insert_one({"k": k, "i": i, "pad": "x" * 100})
                counts[k] += 1
                latencies[k].append(time.perf_counter() - t)
            except PyMongoError:
                errors[k] += 1
            i += 1
        client.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    lat = sorted(x for xs in latencies for x in xs)
    return {
        "rate": sum(counts) / elapsed,
        "commits": sum(counts),
        "elapsed": elapsed,
        "errors": sum(errors),
        "latencies": lat,
        "p50_ms": _percentile_ms(lat, 0.50),
        "p99_ms": _percentile_ms(lat, 0.99),
    }


def _percentile_ms(sorted_seconds: list[float], q: float) -> float:
    return sorted_seconds[int(len(sorted_seconds) * q)] * 1000 if sorted_seconds else 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_row(engine: EngineProcess, clients: int, seconds: float, tmp: Path) -> dict[str, Any]:
    """One row: ``TURNS`` engine turns of ``seconds / TURNS``, each between two raw fsync
    loops of the same length. Each turn's ratio is against the mean of the loops on either
    side of it, and the row's ratio is the median turn's: a few seconds in which this
    shared machine slows down move one turn, not the row."""
    turn_s = seconds / TURNS
    loops = [fsync_loop(tmp, turn_s)]
    turns = []
    cpu = cpu_seconds(engine.pid)
    for _ in range(TURNS):
        turns.append(engine_rate(engine, clients, turn_s))
        loops.append(fsync_loop(tmp, turn_s))
    cpu = cpu_seconds(engine.pid) - cpu
    ratios = sorted(
        t["rate"] / ((a + b) / 2) for t, a, b in zip(turns, loops[:-1], loops[1:], strict=True)
    )
    commits = sum(t["commits"] for t in turns)
    lat = sorted(x for t in turns for x in t["latencies"])
    return {
        "rate": commits / sum(t["elapsed"] for t in turns),
        "loop": statistics.mean(loops),
        "ratio": statistics.median(ratios),
        "ratio_min": ratios[0],
        "ratio_max": ratios[-1],
        "errors": sum(t["errors"] for t in turns),
        "p50_ms": _percentile_ms(lat, 0.50),
        "p99_ms": _percentile_ms(lat, 0.99),
        # The warm-up insert of each client's connection counts: a few per turn.
        "cpu_us": cpu / max(commits, 1) * 1e6,
    }


def measure(seconds: float, engines: dict[str, EngineProcess], tmp: Path) -> dict[str, Any]:
    """Every row of every engine, the engines alternating row by row (both running all
    along), so a baseline and the current engine see the same moments of this shared
    machine."""
    out: dict[str, Any] = {label: {"label": label} for label in engines}
    for clients in CLIENTS:
        for label, engine in engines.items():
            row = measure_row(engine, clients, seconds, tmp)
            out[label][clients] = row
            shown = {k: round(v, 2) for k, v in row.items() if isinstance(v, float)}
            print(f"  [{label}] {clients:>2} clients: {shown}", flush=True)
    for label, engine in engines.items():
        client = engine.client()
        status = client.admin.command("serverStatus").get("accordEngine")
        client.close()
        out[label]["group"] = status["groupCommit"] if status else None
    return out


def report(seconds: float = 10.0, baseline_rev: str | None = None) -> str:
    baseline_rev = baseline_rev or os.environ.get("ACCORD_BENCH_BASELINE") or None
    with tempfile.TemporaryDirectory(dir=os.environ.get("ACCORD_BENCH_DIR")) as tmp_name:
        tmp = Path(tmp_name)
        lite = sqlite_loop(tmp, seconds)
        print(f"  raw SQLite WAL FULL loop {lite:.0f}/s", flush=True)
        engines = {"current": EngineProcess(tmp / "db-current")}
        if baseline_rev:
            engines[f"baseline {baseline_rev[:8]}"] = EngineProcess(
                tmp / "db-baseline", source=baseline(baseline_rev)
            )
        for engine in engines.values():
            engine.start()
        try:
            results = list(measure(seconds, engines, tmp).values())
        finally:
            for engine in engines.values():
                engine.stop()
    lines = [
        "### Embedded engine: durable commits per second vs the fsync loop (group commit)",
        "",
        f"Run alone: `python -m benchmarks.engine_group_commit` (`--baseline REV` adds the engine "
        f"of git revision REV). Each client inserts one small document per command (one commit, "
        f"acknowledged once durable), fsync on. A row is {TURNS} turns of "
        f"{seconds / TURNS:.0f} s, each between two raw fsync loops as long (`write` 200 bytes + "
        f"`fdatasync`, one thread, same disk); a turn's ratio is against the mean of the loops "
        f"on either side of it, and `vs fsync loop` is the median turn's, with the lowest and "
        f"highest turn beside it (this disk's rate drifts by 3x within minutes, and other "
        f"sessions share the 2 cores). `commits/s` and `fsync loop /s` are the row's means. A "
        f"raw SQLite WAL FULL loop (one single-row transaction per commit) ran at {lite:.0f}/s "
        f"at the start. With a baseline both engines run throughout and take turns row by "
        f"row; `engine CPU` is the engine process's user + system time per commit.",
        "",
        "| engine | clients | commits/s | fsync loop /s | vs fsync loop | turns | p50 ms | p99 ms "
        "| engine CPU us / commit | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        for clients in CLIENTS:
            row = r[clients]
            lines.append(
                f"| {r['label']} | {clients} | {row['rate']:.0f} | {row['loop']:.0f} "
                f"| {row['ratio']:.2f}x | {row['ratio_min']:.2f}-{row['ratio_max']:.2f}x "
                f"| {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['cpu_us']:.0f} "
                f"| {row['errors']} |"
            )
    group = results[0].get("group")
    if group:
        lines += [
            "",
            f"Group commit over the current engine's run: {group['commits']} commits in "
            f"{group['batches']} SQLite transactions ({group['commitsPerBatch']} commits per fsync "
            f"on average, largest group {group['largestBatch']}).",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_group_commit")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--baseline", default=None)
    args = parser.parse_args()
    print(report(args.seconds, args.baseline))


if __name__ == "__main__":
    main()
