"""The governance policy's cost on a step: the same graph on two savers in one run, one
whose kernel enforces the policy (as every kernel ``accord.runtime`` builds does, with the
retention hook) and one on a kernel with the default hooks only (tenancy guard and
outbox), built directly here because no part of accord can build a kernel without them.

Turns are interleaved (turn i on both savers before turn i+1) so machine noise hits both
alike; each turn writes one business record (the users' workload). Reported: the median
``invoke`` latency of each and their ratio (target <= 1.05x, issue 23), and the policy
hook's own CPU per step's plans in process (no I/O).

``python -m benchmarks.governance_policy [turns]``
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from typing import Any

from pymongo import MongoClient

from accord import runtime
from accord.checkpointers import AccordSaver
from accord.checkpointers import business as accord_business
from accord.platform.synchronous.unit_of_work import UnitOfWork
from accord.platform.transaction import default_hooks
from benchmarks.checkpointer import build_graph, human, order, start_engine, step_plans

TURNS = 300
WARMUP = 10


def _graph(saver: Any) -> Any:
    def write(n: int) -> None:
        accord_business.insert_one("orders", order(n))

    return build_graph(write).compile(checkpointer=saver)


def step_latency(turns: int = TURNS) -> dict[str, float]:
    """Median seconds per invoke, with the policy and without, interleaved."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_engine(tmp)
        client: MongoClient = MongoClient(f"mongodb://127.0.0.1:{port}/?replicaSet=accord")
        try:
            enforced = AccordSaver(client, db_name="bench_policy")  # runtime.kernel's
            bare_uow = UnitOfWork(client, hooks=default_hooks())  # no policy hook
            bare = AccordSaver(client, db_name="bench_no_policy", uow=bare_uow)
            assert "governance-policy" in enforced.uow.hooks.names()
            assert "governance-policy" not in bare.uow.hooks.names()
            graphs = {"policy": _graph(enforced), "none": _graph(bare)}
            times: dict[str, list[float]] = {name: [] for name in graphs}
            for n in range(turns):
                order_of = list(graphs) if n % 2 else list(reversed(graphs))
                for name in order_of:
                    started = time.perf_counter()
                    graphs[name].invoke(human(n), {"configurable": {"thread_id": "t"}})
                    times[name].append(time.perf_counter() - started)
            return {name: statistics.median(t[WARMUP:]) for name, t in times.items()}
        finally:
            client.close()
            proc.terminate()
            proc.wait()


def check_cost(rounds: int = 20000) -> float:
    """Seconds of the policy hook's ``check`` per step (a checkpoint put with its blobs
    and messages, and a task's writes with one business insert), in process."""
    uow = runtime.kernel(MongoClient("mongodb://127.0.0.1:9/?directConnection=true",
                                     connect=False))  # fmt: skip
    hook = next(h for h in uow.hooks.check if h.name == "governance-policy")
    step = step_plans(uow.principal)
    started = time.perf_counter()
    for _ in range(rounds):
        for plan in step:
            hook.check(plan)
    per_step = (time.perf_counter() - started) / rounds
    uow.client.close()
    return per_step


def report(turns: int = TURNS) -> str:
    medians = step_latency(turns)
    cost = check_cost()
    ratio = medians["policy"] / medians["none"]
    return "\n".join(
        [
            f"**The governance policy's cost per step** ({turns} turns interleaved, one "
            f"business write per turn, embedded engine --no-sync):",
            "",
            "| kernel | median invoke |",
            "| --- | --- |",
            f"| default hooks only (no policy) | {medians['none'] * 1e3:.2f} ms |",
            f"| default hooks + policy (every kernel of accord) | "
            f"{medians['policy'] * 1e3:.2f} ms |",
            f"| ratio | {ratio:.3f}x (target <= 1.05x: {'met' if ratio <= 1.05 else 'NOT met'}) |",
            "",
            f"The policy hook's own check of a step's two plans, in process: {cost * 1e6:.1f} us.",
        ]
    )


if __name__ == "__main__":
    print(report(int(sys.argv[1]) if len(sys.argv) > 1 else TURNS))
