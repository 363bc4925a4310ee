"""Retention sweep throughput at scale, and what it does to the steps of runs going on.

A database holds DOCS documents of expired threads: one template thread is written through
the drop-in ``AccordSaver`` (TURNS turns, under a stored policy whose thread period is
2 s), then cloned with raw pymongo ``insert_many`` (each document re-keyed to its thread,
its run-registry document expired), so the expired data has exactly accord's shape
without taking hours to write. Then ``accord governance sweep`` runs as its own process
(as a worker would), in two phases on a fresh set of expired threads each:

* **quiet**: nothing else runs; documents deleted per second;
* **with runs**: RUNNERS threads of this process step live graphs continuously (each on
  its own thread id) before and during the sweep; their step latency (p50 / p99) before
  the sweep and during it, and the sweep's documents per second meanwhile.

``python -m benchmarks.governance_sweep [DOCS] [--batch N] [--pause S] [--runners R]``
(default 100,000 documents; the issue's figure is at 1,000,000).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import MongoClient

from accord import runtime
from accord.checkpointers import AccordSaver, maintenance
from accord.checkpointers import business as accord_business
from accord.governance.apply import apply, plan
from accord.governance.loading import default_policy, parse_policy
from accord.platform import runs
from accord.platform.context import Principal
from benchmarks.checkpointer import build_graph, human, order, start_engine

DOCS = 100_000
TURNS = 2
DB = "bench_sweep"
POLICY = '[classes.checkpoint]\nretention = { expire_after = "2s", after = "last_activity" }\n'
#: collection -> the re-keying kind of :func:`accord.checkpointers.maintenance.rekey`
THREAD_DATA = {
    "accord_checkpoints": "checkpoints", "accord_checkpoint_blobs": "blobs",
    "accord_checkpoint_writes": "writes", "short_term_memory": "messages",
}  # fmt: skip
INSERT_BATCH = 5000


def _graph(saver: Any) -> Any:
    numbers = itertools.count()

    def write(n: int) -> None:  # one order per turn, unique across threads
        record = order(n)
        accord_business.insert_one("orders", {**record, "_id": f"{record['_id']}-{next(numbers)}"})

    return build_graph(write).compile(checkpointer=saver)


def _template(client: MongoClient, thread: str) -> dict[str, list[dict[str, Any]]]:
    db = client[DB]
    docs = {name: list(db[name].find({"thread_id": thread})) for name in THREAD_DATA}
    docs["runs"] = list(db.runs.find({"thread_id": thread}))
    return docs


def _clone(client: MongoClient, template: dict[str, list[dict[str, Any]]], prefix: str,
           docs: int) -> int:  # fmt: skip
    """Expired threads ``prefix-N`` with ``docs`` documents (about) in all; returns how
    many threads."""
    per_thread = sum(len(template[name]) for name in THREAD_DATA)
    threads = max(1, docs // per_thread)
    past = datetime.now(UTC) - timedelta(hours=1)
    db = client[DB]
    pending: dict[str, list[dict[str, Any]]] = {name: [] for name in [*THREAD_DATA, "runs"]}

    def flush(force: bool = False) -> None:
        for name, batch in pending.items():
            if batch and (force or len(batch) >= INSERT_BATCH):
                db[name].insert_many(batch, ordered=False)
                batch.clear()

    for i in range(threads):
        thread = f"{prefix}-{i}"
        for name, kind in THREAD_DATA.items():
            pending[name].extend(maintenance.rekey(kind, d, thread) for d in template[name])
        for d in template["runs"]:
            pending["runs"].append({
                **d, "_id": runs.run_doc_id(d["tenant_id"], thread), "thread_id": thread,
                "expire_at": past, "lease_expires": None,
            })  # fmt: skip
        flush()
    flush(force=True)
    return threads


def _expired_docs(client: MongoClient, prefix: str) -> int:
    pattern = {"thread_id": {"$regex": f"^{re.escape(prefix)}-"}}
    return sum(client[DB][name].count_documents(pattern) for name in THREAD_DATA)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _sweep_process(uri: str, batch: int, pause: float) -> tuple[float, str]:
    """``accord governance sweep`` in its own process; (wall seconds, its output)."""
    env = {**os.environ, "MONGODB_URI": uri, "ACCORD_POLICY_REFRESH": "5"}
    env.pop("ACCORD_POLICY", None)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "accord.platform.cli", "governance", "sweep", "--db", DB,
         "--limit", "100000000", "--batch", str(batch), "--pause", str(pause)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"sweep failed ({done.returncode}): {done.stdout}{done.stderr}")
    return seconds, " ".join(done.stdout.split())  # rich wraps long lines


def _reported_seconds(output: str) -> float:
    found = re.search(r"in ([0-9.]+) s", output)
    return float(found.group(1)) if found else 0.0


def run(docs: int = DOCS, *, batch: int = 1000, pause: float = 0.0, runners: int = 2) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_engine(tmp, fsync=True)  # the default durability
        uri = f"mongodb://127.0.0.1:{port}/?replicaSet=accord"
        client: MongoClient = MongoClient(uri)
        try:
            admin = runtime.kernel(client, principal=Principal.os_user(), policy=default_policy())
            apply(admin, plan(admin, DB, parse_policy(POLICY, "bench.toml")))
            saver = AccordSaver(client, db_name=DB)  # the stored policy: a 2 s thread period
            graph = _graph(saver)
            for t in range(TURNS):
                graph.invoke(human(t), {"configurable": {"thread_id": "template"}})
            template = _template(client, "template")
            per_thread = sum(len(template[name]) for name in THREAD_DATA)
            result: dict[str, Any] = {"docs_per_thread": per_thread, "batch": batch,
                                      "pause": pause, "runners": runners}  # fmt: skip

            # quiet
            started = time.perf_counter()
            threads = _clone(client, template, "quiet", docs)
            result["clone_seconds"] = time.perf_counter() - started
            before = _expired_docs(client, "quiet")
            wall, output = _sweep_process(uri, batch, pause)
            assert _expired_docs(client, "quiet") == 0, output
            result["quiet"] = {"threads": threads, "docs": before, "wall": wall,
                               "sweep": _reported_seconds(output), "output": output}  # fmt: skip

            # with runs
            threads = _clone(client, template, "busy", docs)
            before = _expired_docs(client, "busy")
            steps: dict[str, list[tuple[float, float]]] = {}
            stop = threading.Event()

            def stepper(name: str) -> None:
                mine = steps.setdefault(name, [])
                config = {"configurable": {"thread_id": name}}
                for n in itertools.count():
                    if stop.is_set():
                        return
                    at = time.perf_counter()
                    graph.invoke(human(n), config)
                    mine.append((at, time.perf_counter() - at))

            workers = [threading.Thread(target=stepper, args=(f"live-{i}",), daemon=True)
                       for i in range(runners)]  # fmt: skip
            for w in workers:
                w.start()
            time.sleep(20)  # before: the runs alone
            sweep_from = time.perf_counter()
            wall, output = _sweep_process(uri, batch, pause)
            sweep_to = time.perf_counter()
            stop.set()
            for w in workers:
                w.join()
            assert _expired_docs(client, "busy") == 0, output
            every = [s for name in steps for s in steps[name]]
            idle = [d for at, d in every if at < sweep_from - 0.5 and at > sweep_from - 19]
            during = [d for at, d in every if sweep_from + 2 < at < sweep_to]  # once started
            result["busy"] = {
                "threads": threads, "docs": before, "wall": wall,
                "sweep": _reported_seconds(output), "output": output,
                "idle": (len(idle), statistics.median(idle), _percentile(idle, 0.99)),
                "during": (len(during), statistics.median(during), _percentile(during, 0.99)),
            }  # fmt: skip
            return result
        finally:
            client.close()
            proc.terminate()
            proc.wait()


def report(docs: int = DOCS, *, batch: int = 1000, pause: float = 0.0, runners: int = 2) -> str:
    r = run(docs, batch=batch, pause=pause, runners=runners)
    q, b = r["quiet"], r["busy"]
    lines = [
        f"**Retention sweep** ({q['docs']:,} expired documents in {q['threads']:,} threads of "
        f"{r['docs_per_thread']} documents; `accord governance sweep --batch {batch} --pause "
        f"{pause}` in its own process; embedded engine, default durability (fsync on); {runners} live runs "
        f"stepping in the benchmark's process in the second phase):",
        "",
        "| phase | documents | sweep s (its own report) | documents / s | threads / s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, p in (("quiet", q), (f"with {runners} runs", b)):
        seconds = p["sweep"] or p["wall"]
        lines.append(f"| {name} | {p['docs']:,} | {seconds:.1f} | {p['docs'] / seconds:,.0f} | "
                     f"{p['threads'] / seconds:,.0f} |")  # fmt: skip
    (n0, m0, p0), (n1, m1, p1) = b["idle"], b["during"]
    lines += [
        "",
        "| live step latency | steps | p50 ms | p99 ms |",
        "| --- | ---: | ---: | ---: |",
        f"| before the sweep | {n0} | {m0 * 1e3:.1f} | {p0 * 1e3:.1f} |",
        f"| during the sweep | {n1} | {m1 * 1e3:.1f} | {p1 * 1e3:.1f} |",
        "",
        f"(cloning the quiet phase's documents took {r['clone_seconds']:.0f} s; the sweep "
        f"said: `{q['output']}` / `{b['output']}`)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("docs", nargs="?", type=int, default=DOCS)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--runners", type=int, default=2)
    args = parser.parse_args(argv)
    print(report(args.docs, batch=args.batch, pause=args.pause, runners=args.runners))


if __name__ == "__main__":
    main()
