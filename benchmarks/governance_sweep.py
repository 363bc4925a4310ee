"""Retention sweep throughput, and what it does to the steps of runs going on meanwhile.

A database with THREADS expired threads (TURNS turns each, one business write per turn,
written through the drop-in ``AccordSaver`` under a stored policy whose thread period is
2 s), then ``accord.runtime.sweep`` (what ``accord governance sweep`` runs) while another
thread of the same process invokes a live graph continuously. Reported: the documents
the sweep deleted (checkpoints, blobs, pending writes, messages of the expired threads)
per second, threads per second, and the live graph's step latency (median, p90) idle
before the sweep and during it.

``python -m benchmarks.governance_sweep [threads] [turns]``
"""

from __future__ import annotations

import itertools
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

from pymongo import MongoClient

from accord import runtime
from accord.checkpointers import AccordSaver
from accord.checkpointers import business as accord_business
from accord.governance.apply import apply, plan
from accord.governance.loading import default_policy, parse_policy
from accord.platform.context import Principal
from benchmarks.checkpointer import build_graph, human, order, start_engine

THREADS = 400
TURNS = 2
DB = "bench_sweep"
POLICY = '[classes.checkpoint]\nretention = { expire_after = "2s", after = "last_activity" }\n'
THREAD_DATA = (
    "accord_checkpoints", "accord_checkpoint_blobs", "accord_checkpoint_writes",
    "short_term_memory",
)  # fmt: skip


def _graph(saver: Any) -> Any:
    numbers = itertools.count()

    def write(n: int) -> None:  # one order per turn, unique across threads
        record = order(n)
        accord_business.insert_one("orders", {**record, "_id": f"{record['_id']}-{next(numbers)}"})

    return build_graph(write).compile(checkpointer=saver)


def _expired_docs(client: MongoClient) -> int:
    return sum(
        client[DB][name].count_documents({"thread_id": {"$regex": "^old-"}}) for name in THREAD_DATA
    )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(threads: int = THREADS, turns: int = TURNS) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_engine(tmp)
        client: MongoClient = MongoClient(f"mongodb://127.0.0.1:{port}/?replicaSet=accord")
        try:
            admin = runtime.kernel(client, principal=Principal.os_user(), policy=default_policy())
            apply(admin, plan(admin, DB, parse_policy(POLICY, "bench.toml")))
            saver = AccordSaver(client, db_name=DB)  # the stored policy: a 2 s thread period
            graph = _graph(saver)
            for i in range(threads):
                for t in range(turns):
                    graph.invoke(human(t), {"configurable": {"thread_id": f"old-{i}"}})
            before = _expired_docs(client)
            idle: list[float] = []
            live = {"configurable": {"thread_id": "live"}}
            for n in range(40):
                started = time.perf_counter()
                graph.invoke(human(n), live)
                idle.append(time.perf_counter() - started)
            time.sleep(2.5)  # the old threads' period passes
            during: list[float] = []
            stop = threading.Event()

            def steps() -> None:
                n = 100
                while not stop.is_set():
                    started = time.perf_counter()
                    graph.invoke(human(n), live)
                    during.append(time.perf_counter() - started)
                    n += 1

            worker = threading.Thread(target=steps, daemon=True)
            worker.start()
            started = time.perf_counter()
            report = runtime.sweep(client, DB, limit=threads + 10)
            seconds = time.perf_counter() - started
            stop.set()
            worker.join()
            after = _expired_docs(client)
            assert report.expired_threads == threads, report
            return {
                "threads": float(threads), "docs": float(before - after), "seconds": seconds,
                "idle_median": statistics.median(idle[5:]), "idle_p90": _percentile(idle[5:], 0.9),
                "during_median": statistics.median(during) if during else 0.0,
                "during_p90": _percentile(during, 0.9) if during else 0.0,
                "during_steps": float(len(during)),
            }  # fmt: skip
        finally:
            client.close()
            proc.terminate()
            proc.wait()


def report(threads: int = THREADS, turns: int = TURNS) -> str:
    r = run(threads, turns)
    return "\n".join([
        f"**Retention sweep** ({threads} expired threads of {turns} turns, embedded engine "
        f"--no-sync, a live graph stepping in the same process meanwhile):",
        "",
        "| measure | value |",
        "| --- | ---: |",
        f"| documents deleted | {r['docs']:.0f} |",
        f"| sweep time | {r['seconds']:.2f} s |",
        f"| documents / s | {r['docs'] / r['seconds']:.0f} |",
        f"| threads / s | {r['threads'] / r['seconds']:.1f} |",
        f"| live step, idle (median / p90) | {r['idle_median'] * 1e3:.1f} / "
        f"{r['idle_p90'] * 1e3:.1f} ms |",
        f"| live step, during the sweep (median / p90, {r['during_steps']:.0f} steps) | "
        f"{r['during_median'] * 1e3:.1f} / {r['during_p90'] * 1e3:.1f} ms |",
    ])  # fmt: skip


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    print(report(*args))
