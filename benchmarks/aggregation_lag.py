"""Aggregation lag: from a step's commit to its memories' commit, under a steady stream.

A producer commits steps at a fixed rate, each as the checkpointer commits one
(the step's new ``short_term_memory`` documents and its ``checkpoint`` outbox event in one
transaction through the unit of work; the event contract of docs/checkpointer.md): a user
message (half of them state a fact, a preference or a name, which the rule extractor
turns into memories) and an assistant reply, over 16 threads of 4 tenants. Aggregator
workers (``accord memory worker``'s loop: default rule extractor, hashing embedder,
consolidation) run in their own processes. The engine runs in its own process
(``--no-sync``).

Lag of an event = ``done_at - created_at``: both stamped when the plan that writes them is
built (the producer's step, the aggregator's commit), so each end is early by one
transaction of a few ms. Memories are searchable when their commit is (the engine indexes
vectors in the commit; Atlas Search indexes asynchronously, typically within a second).
Run alone: ``python -m benchmarks.aggregation_lag [SECONDS]``.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pymongo import MongoClient

from accord.memory.aggregator import Aggregator, AggregatorConfig, percentile
from accord.platform.ids import doc_id
from accord.platform.plan import Group, OutboxEvent, Plan, PlanContext, insert_once
from accord.platform.synchronous.unit_of_work import UnitOfWork

ROOT = Path(__file__).resolve().parents[1]
DB = "lagbench"
#: (steps per second, workers)
RUNS = [(10, 1), (20, 1), (40, 1), (20, 2), (40, 2)]
SECONDS = 20.0
TENANTS = ("t0", "t1", "t2", "t3")
THREADS = 16
STATEMENTS = (
    "I prefer {w} over everything else.", "Remember that the {w} key is in the drawer.",
    "My name is {W}.", "I like {w} music.", "Can you help me plan a trip to {W}?",
    "What's the weather like in {W} today?",
)  # fmt: skip
WORDS = ("amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo",
         "juniper", "kelp", "lagoon", "maple", "nectar", "onyx", "prairie", "quartz", "rowan")  # fmt: skip

WORKER = """
import sys
from pymongo import MongoClient
from accord.memory.aggregator import Aggregator, AggregatorConfig
agg = Aggregator(MongoClient(sys.argv[1]), config=AggregatorConfig(db_name=sys.argv[2], poll_interval=0.02))
print("ready", flush=True)
agg.run()
"""


def step_plan(tenant: str, thread: str, n: int, rng: random.Random) -> Plan:
    now = datetime.now(UTC)
    word = rng.choice(WORDS)
    said = rng.choice(STATEMENTS).format(w=word, W=word.capitalize())
    docs, keys = [], []
    for i, (role, text) in enumerate((("human", said), ("ai", f"Sure, noted (step {n})."))):
        key = doc_id("msg", tenant, thread, n, i)
        keys.append(key)
        docs.append(insert_once({
            "_id": doc_id("stm", tenant, thread, key, 0), "tenant_id": tenant,
            "thread_id": thread, "checkpoint_ns": "", "key": key, "chunk": 0,
            "message_id": f"{thread}/{n}/{i}", "role": role, "text": text,
            "checkpoint_id": f"c{n}", "created_at": now,
        }))  # fmt: skip
    fields = {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": f"c{n}",
              "messages": keys}  # fmt: skip
    return Plan(
        PlanContext(tenant, thread, operation="bench.step"),
        [Group("messages", DB, "short_term_memory", "short_term_memory", docs)],
        [OutboxEvent(DB, "outbox", "checkpoint", tenant, (thread, "", f"c{n}"), fields)],
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(rate: int, workers: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        port = _free_port()
        engine = subprocess.Popen(
            [sys.executable, "-m", "accord.platform.embedded", "--dbpath", d, "--port", str(port),
             "--no-sync"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        assert engine.stdout is not None and "listening" in engine.stdout.readline().decode()
        uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
        procs: list[subprocess.Popen[bytes]] = []
        try:
            client: MongoClient[Any] = MongoClient(uri)
            Aggregator(client, config=AggregatorConfig(db_name=DB)).setup()
            # the index the checkpointer's setup() creates on its messages
            client[DB].short_term_memory.create_index(
                [("tenant_id", 1), ("thread_id", 1), ("key", 1), ("chunk", 1)],
                name="thread_key_chunk", unique=True,
            )  # fmt: skip
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            for _ in range(workers):
                p = subprocess.Popen([sys.executable, "-c", WORKER, uri, DB], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
                assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
                procs.append(p)
            uow, rng = UnitOfWork(client), random.Random(rate * 10 + workers)
            total = int(rate * seconds)
            t0 = time.perf_counter()
            behind = 0
            for n in range(total):
                due = t0 + n / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                else:
                    behind += 1
                tenant = TENANTS[n % len(TENANTS)]
                uow.execute(step_plan(tenant, f"{tenant}-th{n % THREADS}", n, rng))
            produced_s = time.perf_counter() - t0
            drain_start = time.perf_counter()
            outbox = client[DB].outbox
            while outbox.count_documents({"status": {"$nin": ["done", "dead"]}}) and (
                time.perf_counter() - drain_start < 120
            ):
                time.sleep(0.05)
            drain_s = time.perf_counter() - drain_start
            lags = [
                (d["done_at"] - d["created_at"]).total_seconds()
                for d in outbox.find({"status": "done"}, {"created_at": 1, "done_at": 1})
            ]
            dead = outbox.count_documents({"status": "dead"})
            load = os.getloadavg()[0]
            memories = client[DB].long_term_memory.count_documents({})
            client.close()
        finally:
            for p in procs:
                p.kill()
                p.wait()
            engine.terminate()
            engine.wait(30)
    return {
        "rate": rate, "workers": workers, "steps": total, "achieved": total / produced_s,
        "p50": percentile(lags, 0.5), "p95": percentile(lags, 0.95), "max": max(lags),
        "done": len(lags), "dead": dead, "drain": drain_s, "memories": memories,
        "late_steps": behind, "load": load,
    }  # fmt: skip


def report(seconds: float = SECONDS) -> str:
    rows = [run(rate, workers, seconds) for rate, workers in RUNS]
    base = next(r for r in rows if (r["rate"], r["workers"]) == (20, 1))
    lines = [
        "### Memory aggregation lag (step commit -> memories committed)",
        "",
        "Run alone: `.venv/bin/python -m benchmarks.aggregation_lag`. A producer commits "
        f"steps at a fixed rate for {seconds:.0f} s (messages + outbox event in one "
        "transaction, as the checkpointer does; half the user messages state something "
        "the rule extractor keeps); aggregator workers in their own processes "
        "(rule extractor, hashing embedder, consolidation), engine in its own process "
        "(`--no-sync`). Lag = `done_at - created_at` of each event. Target: p95 <= 1 s at "
        "20 steps/s. `load avg`: the machine's 1-minute load average at the end of the row "
        "(2 cores; other sessions share them).",
        "",
        "| steps/s | workers | steps | achieved steps/s | lag p50 ms | lag p95 ms | lag max ms "
        "| p95 vs 20/s, 1 worker | backlog drained in s | memories | dead | load avg |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['rate']} | {r['workers']} | {r['steps']} | {r['achieved']:.1f} | "
            f"{r['p50'] * 1000:.0f} | {r['p95'] * 1000:.0f} | {r['max'] * 1000:.0f} | "
            f"{r['p95'] / base['p95']:.2f}x | {r['drain']:.2f} | {r['memories']} | {r['dead']} | "
            f"{r['load']:.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(report(float(sys.argv[1]) if len(sys.argv) > 1 else SECONDS))
