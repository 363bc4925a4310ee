"""The embedded engine as a collection grows: query latency, restart, memory, idle CPU, and
how long the engine lock is held under a mixed workload.

Data: one ``checkpoints`` collection shaped like the checkpointer's (``tenant_id``,
``thread_id`` over 1,000 threads, ``checkpoint_ns``, ``checkpoint_id``, a unique ``key``,
80 bytes of padding), with the checkpointer's unique index ``(tenant_id, thread_id,
checkpoint_ns, checkpoint_id desc)`` and a unique index on ``key``. Queries, through
pymongo from this process to an engine in its own process (fsync on):

- sorted-latest: ``find_one({tenant_id, thread_id, checkpoint_ns}, sort checkpoint_id -1)``
  (the checkpointer's "latest checkpoint of a thread");
- ``$in``-400: ``find({key: {$in: [400 random keys]}})``.

At the largest size: restart time, RSS per 100k documents (RSS after the restart minus an
empty engine's), idle CPU over 10 s with no client connected, then a mixed workload (2
readers, 2 committers of a 2-document transaction, 1 updater, 1 client pinging every
20 ms) reporting the ping latency every client saw and, where the engine reports it
(``serverStatus().accordEngine.lock``), the longest engine-lock hold. The current engine
runs the mixed workload with ``--snapshot-history-window 10`` so that garbage collection
of old versions happens during it (with the default 300 s it would not start in 60 s).

``python -m benchmarks.engine_scale [--sizes 10000,100000,500000] [--baseline REV]
[--mixed-seconds 60]``; ``--baseline`` runs the same against the engine of git revision
REV, side by side.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pymongo import ASCENDING, DESCENDING, IndexModel, MongoClient
from pymongo.errors import PyMongoError

from benchmarks.engine_proc import EngineProcess, baseline

THREADS = 1000
DEFAULT_SIZES = (10_000, 100_000)
FULL_SIZES = (10_000, 100_000, 500_000)
LATEST_QUERIES = 200
IN_QUERIES = 40


def _doc(i: int) -> dict[str, Any]:
    return {
        "tenant_id": "t", "thread_id": f"th{i % THREADS}", "checkpoint_ns": "",
        "checkpoint_id": f"{i:012d}", "key": i, "pad": "x" * 80,
    }  # fmt: skip


def _setup(client: MongoClient) -> None:
    client.bench.checkpoints.create_indexes(
        [
            IndexModel(
                [("tenant_id", ASCENDING), ("thread_id", ASCENDING), ("checkpoint_ns", ASCENDING),
                 ("checkpoint_id", DESCENDING)],
                name="thread_ns_checkpoint", unique=True,
            ),
            IndexModel([("key", ASCENDING)], name="key", unique=True),
        ]
    )  # fmt: skip


def _grow(client: MongoClient, start: int, stop: int) -> None:
    coll = client.bench.checkpoints
    for lo in range(start, stop, 5000):
        coll.insert_many([_doc(i) for i in range(lo, min(stop, lo + 5000))], ordered=False)


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def _latencies(client: MongoClient, n: int, rng: random.Random) -> dict[str, float]:
    coll = client.bench.checkpoints
    latest = []
    for _ in range(LATEST_QUERIES):
        th = f"th{rng.randrange(THREADS)}"
        t = time.perf_counter()
        doc = coll.find_one(
            {"tenant_id": "t", "thread_id": th, "checkpoint_ns": ""}, sort=[("checkpoint_id", -1)]
        )
        latest.append(time.perf_counter() - t)
        assert doc is not None and doc["thread_id"] == th
    ins = []
    for _ in range(IN_QUERIES):
        keys = rng.sample(range(n), 400)
        t = time.perf_counter()
        got = list(coll.find({"key": {"$in": keys}}))
        ins.append(time.perf_counter() - t)
        assert len(got) == 400
    return {
        "latest_ms": statistics.median(latest) * 1000, "latest_p90_ms": _pct(latest, 90) * 1000,
        "in400_ms": statistics.median(ins) * 1000, "in400_p90_ms": _pct(ins, 90) * 1000,
    }  # fmt: skip


def _idle_cpu(engine: EngineProcess, seconds: float = 10.0) -> float:
    time.sleep(2.0)  # let start-up work finish
    before = engine.cpu_seconds()
    time.sleep(seconds)
    return (engine.cpu_seconds() - before) / seconds * 100


def _mixed(engine: EngineProcess, n: int, seconds: float) -> dict[str, Any]:
    stop = threading.Event()
    counts: dict[str, int] = {"read": 0, "txn": 0, "update": 0, "error": 0}
    pings: list[float] = []
    lock = threading.Lock()

    def bump(kind: str) -> None:
        with lock:
            counts[kind] += 1

    def reader(seed: int) -> None:
        client = engine.client()
        coll = client.bench.checkpoints
        rng = random.Random(seed)
        while not stop.is_set():
            try:
                if rng.random() < 0.5:
                    coll.find_one(
                        {
                            "tenant_id": "t",
                            "thread_id": f"th{rng.randrange(THREADS)}",
                            "checkpoint_ns": "",
                        },
                        sort=[("checkpoint_id", -1)],
                    )
                else:
                    list(coll.find({"key": {"$in": rng.sample(range(n), 400)}}))
                bump("read")
            except PyMongoError:
                bump("error")
        client.close()

    def committer(seed: int) -> None:
        client = engine.client()
        db = client.bench
        i = n + 1_000_000 * (seed + 1)
        while not stop.is_set():
            try:
                with client.start_session() as s, s.start_transaction():
                    db.checkpoints.insert_one(_doc(i), session=s)
                    db.heads.update_one(
                        {"_id": f"c{seed}-th{i % THREADS}"},
                        {"$set": {"latest": i}},
                        upsert=True,
                        session=s,
                    )
                bump("txn")
            except PyMongoError:
                bump("error")
            i += 1
        client.close()

    def updater(seed: int) -> None:
        client = engine.client()
        coll = client.bench.checkpoints
        rng = random.Random(seed)
        while not stop.is_set():
            try:
                coll.update_one(
                    {"key": rng.randrange(n)}, {"$set": {"pad": f"{rng.random():.12f}"}}
                )
                bump("update")
            except PyMongoError:
                bump("error")
        client.close()

    def pinger() -> None:
        client = engine.client()
        while not stop.is_set():
            t = time.perf_counter()
            client.admin.command("ping")
            pings.append(time.perf_counter() - t)
            time.sleep(0.02)
        client.close()

    workers = [threading.Thread(target=reader, args=(s,)) for s in (1, 2)]
    workers += [threading.Thread(target=committer, args=(s,)) for s in (3, 4)]
    workers += [threading.Thread(target=updater, args=(5,)), threading.Thread(target=pinger)]
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    out: dict[str, Any] = {k: v / seconds for k, v in counts.items()}
    out["ping_p99_ms"] = _pct(pings, 99) * 1000
    out["ping_max_ms"] = max(pings) * 1000
    client = engine.client()
    try:
        status = client.admin.command("serverStatus")
        own = status.get("accordEngine")
        if own:
            out["lock_max_ms"] = own["lock"]["maxHoldMillis"]
            out["lock_max_by"] = own["lock"]["maxHoldBy"]
            out["lock_max_cpu_ms"] = own["lock"]["maxHoldCpuMillis"]
            out["lock_max_cpu_by"] = own["lock"]["maxHoldCpuBy"]
            out["lock_histogram"] = own["lock"]["histogram"]
            out["lock_by_kind"] = own["lock"].get("maxHoldByKind", {})
            out["gc_pruned"] = own["gc"]["versionsPruned"]
    finally:
        client.close()
    return out


def measure(
    sizes: tuple[int, ...], *, source: Path | None, mixed_seconds: float, label: str
) -> dict[str, Any]:
    rng = random.Random(7)
    result: dict[str, Any] = {"label": label, "sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        empty = EngineProcess(Path(tmp) / "empty", source=source)
        empty.start()
        time.sleep(1.0)
        result["rss_empty_mib"] = empty.rss_mib()
        empty.stop()
        args = ("--snapshot-history-window", "10") if source is None else ()
        engine = EngineProcess(Path(tmp) / "db", source=source, args=args)
        engine.start()
        try:
            client = engine.client()
            _setup(client)
            have = 0
            for n in sizes:
                t = time.perf_counter()
                _grow(client, have, n)
                load_s = time.perf_counter() - t
                have = n
                result["sizes"][n] = {"load_s": load_s, **_latencies(client, n, rng)}
                print(f"  [{label}] {n:>7,} docs: {result['sizes'][n]}", flush=True)
            client.close()
            result["restart_s"] = engine.restart()
            time.sleep(1.0)
            result["rss_mib"] = engine.rss_mib()
            result["rss_per_100k_mib"] = (result["rss_mib"] - result["rss_empty_mib"]) / (
                have / 100_000
            )
            result["idle_cpu_pct"] = _idle_cpu(engine)
            print(f"  [{label}] restart {result['restart_s']:.1f}s, RSS {result['rss_mib']:.0f} MiB, "
                  f"idle CPU {result['idle_cpu_pct']:.1f}%", flush=True)  # fmt: skip
            if mixed_seconds:
                result["mixed"] = _mixed(engine, have, mixed_seconds)
                print(f"  [{label}] mixed: {result['mixed']}", flush=True)
        finally:
            engine.stop()
    return result


def _fmt(v: Any, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def render(results: list[dict[str, Any]], mixed_seconds: float) -> str:
    sizes = list(results[0]["sizes"])
    lines = [
        "### Embedded engine: latency as the collection grows, restart, memory, idle CPU, lock holds",
        "",
        "Run alone: `python -m benchmarks.engine_scale` (`--sizes 10000,100000,500000` for the "
        "full run, `make bench-full`; `--baseline REV` adds the engine of git revision REV side "
        "by side). Engine in its own process, fsync on; median (p90) client-side milliseconds.",
        "",
        "| engine | query | "
        + " | ".join(f"{n:,} docs" for n in sizes)
        + f" | {sizes[-1]:,} / {sizes[0]:,} |",
        "| --- | --- | " + " | ".join("---:" for _ in sizes) + " | ---: |",
    ]
    for r in results:
        for name, key in (("sorted-latest", "latest"), ("`$in`-400", "in400")):
            cells = [
                f"{r['sizes'][n][key + '_ms']:.2f} ({r['sizes'][n][key + '_p90_ms']:.2f})"
                for n in sizes
            ]
            ratio = r["sizes"][sizes[-1]][key + "_ms"] / r["sizes"][sizes[0]][key + "_ms"]
            lines.append(f"| {r['label']} | {name} | " + " | ".join(cells) + f" | {ratio:.1f}x |")
    lines += [
        "",
        f"At {sizes[-1]:,} documents:",
        "",
        "| engine | restart s | RSS MiB | RSS MiB per 100k docs | idle CPU % | load s (last step) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r['label']} | {r['restart_s']:.1f} | {r['rss_mib']:.0f} | {r['rss_per_100k_mib']:.0f} "
            f"| {r['idle_cpu_pct']:.1f} | {r['sizes'][sizes[-1]]['load_s']:.1f} |"
        )
    if mixed_seconds and all("mixed" in r for r in results):
        lines += [
            "",
            f"Mixed workload for {mixed_seconds:.0f} s at {sizes[-1]:,} documents (2 readers, 2 "
            "transaction committers, 1 updater, 1 pinger every 20 ms); operations per second, "
            "ping latency seen by a client, longest engine-lock hold as the engine reports it:",
            "",
            "| engine | reads/s | txns/s | updates/s | errors/s | ping p99 ms | ping max ms | longest lock hold ms, wall (by) | longest, CPU ms (by) | versions pruned |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in results:
            m = r["mixed"]
            hold = (
                "not reported"
                if "lock_max_ms" not in m
                else f"{m['lock_max_ms']:.1f} ({m['lock_max_by']})"
            )
            cpu = (
                "not reported"
                if "lock_max_cpu_ms" not in m
                else f"{m['lock_max_cpu_ms']:.1f} ({m['lock_max_cpu_by']})"
            )
            lines.append(
                f"| {r['label']} | {m['read']:.0f} | {m['txn']:.0f} | {m['update']:.0f} | {m['error']:.1f} "
                f"| {m['ping_p99_ms']:.1f} | {m['ping_max_ms']:.1f} | {hold} | {cpu} | {m.get('gc_pruned', 'n/a')} |"
            )
        for r in results:
            kinds = r["mixed"].get("lock_by_kind") or {}
            if not kinds:
                continue
            ranked = sorted(kinds.items(), key=lambda kv: -kv[1]["wallMillis"])
            cells = ", ".join(
                f"{kind} {v['wallMillis']:.1f} / {v['cpuMillis']:.1f}" for kind, v in ranked
            )
            hist = r["mixed"].get("lock_histogram") or {}
            lines += [
                "",
                f"{r['label']}: longest lock hold of each kind during the mixed workload, wall / "
                f"CPU ms (`gc`: one garbage-collection pass; `commit`: making a durable group "
                f"visible): {cells}. Holds by wall time: "
                + ", ".join(f"{k} {v}" for k, v in hist.items())
                + ".",
            ]
    return "\n".join(lines) + "\n"


def report(
    sizes: tuple[int, ...] | None = None,
    baseline_rev: str | None = None,
    mixed_seconds: float = 60.0,
) -> str:
    if sizes is None:
        sizes = FULL_SIZES if os.environ.get("ACCORD_BENCH_FULL") else DEFAULT_SIZES
    baseline_rev = baseline_rev or os.environ.get("ACCORD_BENCH_BASELINE") or None
    results = [measure(sizes, source=None, mixed_seconds=mixed_seconds, label="current")]
    if baseline_rev:
        src = baseline(baseline_rev)
        results.append(
            measure(
                sizes, source=src, mixed_seconds=mixed_seconds, label=f"baseline {baseline_rev[:8]}"
            )
        )
    return render(results, mixed_seconds)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_scale")
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    parser.add_argument(
        "--baseline", default=None, help="git revision of the engine to compare with"
    )
    parser.add_argument("--mixed-seconds", type=float, default=60.0)
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    print(report(sizes, args.baseline, args.mixed_seconds))


if __name__ == "__main__":
    main()
