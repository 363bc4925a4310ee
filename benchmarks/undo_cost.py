"""The undo log's cost per step: the checkpointer benchmark's users' workload with and
without the undo hook (``python -m benchmarks.undo_cost``).

The embedded engine with its default durability (every commit fsynced), the graph of
``benchmarks.checkpointer`` (``START -> fake_model -> END``, one 200-char AIMessage per
turn), LangGraph's default durability (``async``). Three workloads, each with two
``AccordSaver``s on their own databases, one whose kernel has the undo hook (the default)
and one whose kernel has it removed, their turns interleaved:

* ``insert``: the users' workload: each turn's node stages one ``business.insert_one``
  (an order of ~80 bytes): the hook adds one undo document, no read;
* ``update``: each turn's node stages one ``business.update_one`` of one record: the hook
  adds a read of its before-image inside the transaction and one undo document;
* ``plain``: no business write: the hook adds nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from pymongo import MongoClient

from accord import runtime
from accord.checkpointers import AccordSaver
from accord.checkpointers import business as accord_business
from accord.platform.hooks import Hooks
from benchmarks.checkpointer import WARMUP, build_graph, human, order, start_engine

TURNS = 200
THREAD = {"configurable": {"thread_id": "bench"}}


def _saver(client: MongoClient, db: str, *, undo: bool) -> AccordSaver:
    uow = runtime.kernel(client)
    if not undo:
        uow.hooks = Hooks([h for h in uow.hooks.all if h.name != "undo_log"])
    saver = AccordSaver(client, db_name=db, uow=uow)
    saver.setup()
    return saver


def _writer(kind: str) -> Callable[[int], None] | None:
    if kind == "insert":
        return lambda n: accord_business.insert_one("orders", order(n))
    if kind == "update":
        return lambda n: accord_business.update_one(
            "accounts", {"_id": "acct"}, {"$inc": {"balance": -n}}, upsert=True
        )
    return None


def run(turns: int = TURNS) -> dict[tuple[str, bool], list[float]]:
    """Median-ready latencies (s) per (workload, undo hook on)."""
    out: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_engine(tmp, fsync=True)
        client: MongoClient = MongoClient(f"mongodb://127.0.0.1:{port}/?replicaSet=accord")
        try:
            graphs: dict[tuple[str, bool], Any] = {}
            for kind in ("insert", "update", "plain"):
                for undo in (True, False):
                    saver = _saver(client, f"bench_undo_{kind}_{int(undo)}", undo=undo)
                    graphs[(kind, undo)] = build_graph(_writer(kind)).compile(checkpointer=saver)
                    out[(kind, undo)] = []
            for n in range(1, turns + 1):
                # alternate which of the pair goes first, so neither always follows the other
                for key in graphs if n % 2 else reversed(list(graphs)):
                    t0 = time.perf_counter()
                    graphs[key].invoke(human(n), THREAD)
                    out[key].append(time.perf_counter() - t0)
            for kind in ("insert", "update"):
                db = client[f"bench_undo_{kind}_1"]
                assert db["accord_business_undo"].count_documents({}) == turns, kind
                off = client[f"bench_undo_{kind}_0"]["accord_business_undo"]
                assert off.count_documents({}) == 0, kind
        finally:
            client.close()
            proc.terminate()
            proc.wait()
    return out


def seal_cost(rounds: int = 5000) -> tuple[float, float]:
    """In process, no I/O: microseconds of the undo hook's seal phase (``seal_reads`` and
    ``seal``) on a step's batch without a business write and on one with one insert."""
    from accord.platform.hooks import SealBatch
    from accord.platform.undo_log import UndoLogHook
    from benchmarks.checkpointer import step_plans

    hook = UndoLogHook()
    out = []
    for business in (False, True):
        plans = step_plans(None)
        if not business:
            plans[1].groups = [g for g in plans[1].groups if g.origin is None]
        batch = SealBatch(plans, "t")
        started = time.perf_counter()
        for _ in range(rounds):
            hook.seal(batch, {r.key: [] for r in hook.seal_reads(batch)})
        out.append((time.perf_counter() - started) / rounds * 1e6)
    return out[0], out[1]


def report(turns: int = TURNS) -> str:
    found = run(turns)
    plain_us, business_us = seal_cost()
    lines = [
        f"The undo hook's seal phase in process (no I/O): {plain_us:.1f} us on a step "
        f"without business writes, {business_us:.1f} us with one insert.",
        "",
        "| workload | undo hook | median ms | p90 ms | with / without |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for kind in ("insert", "update", "plain"):
        medians = {}
        for undo in (True, False):
            lat = sorted(found[(kind, undo)][WARMUP:])
            medians[undo] = statistics.median(lat)
            p90 = lat[int(len(lat) * 0.9) - 1]
            ratio = f"{medians[True] / medians[False]:.3f}x" if not undo else ""
            lines.append(
                f"| {kind} | {'on' if undo else 'off'} | {medians[undo] * 1000:.2f} | "
                f"{p90 * 1000:.2f} | {ratio} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=TURNS)
    args = parser.parse_args()
    print(report(args.turns))
