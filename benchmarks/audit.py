"""The audit trail's cost per step: the users' checkpointer workload with the audit hook
off, in ``metadata`` mode, in ``full`` mode and in ``policy`` mode (each class in the
mode of the built-in default policy: checkpoints, messages and business records in
``metadata``, the run registry not audited), side by side in one run.

One embedded engine process with its default durability (every commit fsynced), one
database and one ``MongoClient`` per variant, each an ``Accord`` root (``audit=`` off,
metadata, full) whose ``AccordSaver`` runs one of two graphs, each with one business
write per turn:

* ``chat``: the chat graph of :mod:`benchmarks.checkpointer`, one node per turn: the run's
  lease claim and its save weigh on every step;
* ``tool``: a turn with a tool call, three nodes (a fake model asks for a tool, the fake
  tool writes the order, the fake model answers): the claim is paid once for three steps,
  as in an agent's turn.

Turns are interleaved (turn i runs on every variant before turn i+1) so machine noise
hits them alike. Measured: the median and p90 wall time of one ``invoke`` and of one step
(the invoke over the graph's nodes), its ratio to audit off, commands per invoke (pymongo
command monitoring) and audit records per invoke; then every chain is verified
(``verify_chain``) and the records it read are counted.

``python -m benchmarks.audit [TURNS]`` prints both tables (default 100 turns each).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from pymongo import MongoClient, monitoring

from accord import runtime
from accord.checkpointers import business
from accord.governance.audit_records import RECORDS
from accord.governance.verify import verify_chain
from accord.runtime import Accord
from benchmarks.checkpointer import (
    REPLY_CHARS,
    WARMUP,
    ChatState,
    build_graph,
    human,
    order,
    start_engine,
)

TURNS = 100
MODES = ("off", "metadata", "full", "policy")
THREAD = {"configurable": {"thread_id": "audit-bench"}}
#: Issue 24's target: median step latency with full audit <= 1.15x audit off.
TARGET = 1.15


def build_tool_turn() -> StateGraph:
    """``START -> model -> tool -> answer -> END``: a turn with one tool call, the tool
    writing the turn's order (``business.insert_one``, committed with its step); the model
    and the tool are fakes (deterministic, no I/O of their own)."""

    def model(state: ChatState) -> dict[str, Any]:
        n = state.get("turns", 0) + 1
        call = {"name": "place_order", "args": {"turn": n}, "id": f"call-{n}"}
        return {"messages": [AIMessage("", tool_calls=[call], id=f"ai-call-{n}")], "turns": n}

    def tool(state: ChatState) -> dict[str, Any]:
        n = state["turns"]
        business.insert_one("orders", order(n))
        return {"messages": [ToolMessage(f"order-{n} placed", tool_call_id=f"call-{n}",
                                         id=f"tool-{n}")]}  # fmt: skip

    def answer(state: ChatState) -> dict[str, Any]:
        n = state["turns"]
        text = (f"Your order {n} is placed. " + "lorem ipsum " * 20)[:REPLY_CHARS]
        return {"messages": [AIMessage(text, id=f"ai-{n}")]}

    g = StateGraph(ChatState)
    for name, node in (("model", model), ("tool", tool), ("answer", answer)):
        g.add_node(name, node)
    g.add_edge(START, "model")
    g.add_edge("model", "tool")
    g.add_edge("tool", "answer")
    g.add_edge("answer", END)
    return g


#: workload -> (what it is, its graph, nodes per turn)
WORKLOADS: dict[str, tuple[str, Callable[[], StateGraph], int]] = {
    "chat": (
        "the chat graph of the checkpointer benchmark, one node per turn",
        lambda: build_graph(lambda n: business.insert_one("orders", order(n))),
        1,
    ),
    "tool": (
        "a turn with a tool call: three nodes (model, tool, answer), the tool writing the order",
        build_tool_turn,
        3,
    ),
}


class Commands(monitoring.CommandListener):
    """Commands started on one client while enabled."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.enabled = False

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.enabled:
            self.counts[event.command_name] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def run(turns: int = TURNS, workload: str = "chat") -> dict[str, Any]:
    """Every mode, turn by turn, on ``workload`` (:data:`WORKLOADS`); latencies, commands
    and records per mode."""
    build = WORKLOADS[workload][1]
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_engine(tmp, fsync=True)
        uri = f"mongodb://127.0.0.1:{port}/?replicaSet=accord"
        clients: list[MongoClient] = []
        try:
            variants: dict[str, dict[str, Any]] = {}
            for mode in MODES:
                counter = Commands()
                client: MongoClient = MongoClient(uri, event_listeners=[counter])
                clients.append(client)
                root = Accord(client=client, db_name=f"bench_audit_{mode}", audit=mode)
                graph = build()
                variants[mode] = {
                    "graph": graph.compile(checkpointer=root.checkpointer()),
                    "counter": counter, "client": client, "root": root, "latencies": [],
                }  # fmt: skip
                counter.enabled = True
            started = time.perf_counter()
            for n in range(1, turns + 1):
                for v in variants.values():
                    t0 = time.perf_counter()
                    out = v["graph"].invoke(human(n), THREAD)
                    v["latencies"].append(time.perf_counter() - t0)
                    assert out["turns"] == n
            elapsed = time.perf_counter() - started
            for mode, v in variants.items():
                v["counter"].enabled = False
                db = v["client"][f"bench_audit_{mode}"]
                v["records"] = db[RECORDS].count_documents(
                    {"action": {"$not": {"$regex": "setup$"}}}
                )
                v["orders"] = db["orders"].count_documents({})
                if mode != "off":
                    t0 = time.perf_counter()
                    report = verify_chain(v["root"].uow, f"bench_audit_{mode}")
                    v["verify_s"] = time.perf_counter() - t0
                    v["verified"] = report.ok
                    v["verified_records"] = report.records
            return {"variants": variants, "elapsed": elapsed, "turns": turns,
                    "workload": workload}  # fmt: skip
        finally:
            for c in clients:
                c.close()
            proc.terminate()
            proc.wait()


def report(turns: int = TURNS) -> str:
    """Both workloads' tables, as markdown (docs/benchmarks.md and docs/governance.md)."""
    lines = [
        "### The audit trail's cost per step (users' checkpointer workload)",
        "",
        "`python -m benchmarks.audit`: the embedded engine with every commit fsynced, one "
        "business write per turn, "
        f"{turns} turns on one thread through an `Accord` root per audit mode, interleaved; "
        "a step is one node's run and save (the invoke over the graph's nodes).",
    ]
    ratios: dict[str, float] = {}
    for workload, (what, _, nodes) in WORKLOADS.items():
        result = run(turns, workload)
        lines += ["", *_table(result, what, nodes)]
        variants = result["variants"]
        base = statistics.median(variants["off"]["latencies"][WARMUP:])
        ratios[workload] = statistics.median(variants["full"]["latencies"][WARMUP:]) / base
    lines.append("")
    for workload, full in ratios.items():
        met = "yes" if full <= TARGET else "**no**"
        lines.append(
            f"Target (issue 24): full audit <= {TARGET}x audit off, `{workload}`: "
            f"{full:.2f}x, {met}."
        )
    return "\n".join(lines) + "\n"


def _table(result: dict[str, Any], what: str, nodes: int) -> list[str]:
    variants = result["variants"]
    turns = result["turns"]
    base = statistics.median(variants["off"]["latencies"][WARMUP:])
    lines = [
        f"`{result['workload']}`: {what}. Wall time: {result['elapsed']:.0f} s.",
        "",
        "| audit | median ms / invoke | median ms / step | p90 ms / step | vs off "
        "| commands / invoke | records / invoke | orders | chains |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for mode, v in variants.items():
        lat = sorted(v["latencies"][WARMUP:])
        med = statistics.median(lat)
        p90 = lat[int(len(lat) * 0.9) - 1]
        cmds = sum(v["counter"].counts.values()) / turns
        chains = "-"
        if mode != "off":
            ok = "verified" if v["verified"] else "**BROKEN**"
            chains = f"{ok} ({v['verified_records']:,} records in {v['verify_s']:.2f} s)"
        lines.append(
            f"| {mode} | {med * 1000:.2f} | {med * 1000 / nodes:.2f} | "
            f"{p90 * 1000 / nodes:.2f} | {med / base:.2f}x | {cmds:.2f} | "
            f"{v['records'] / turns:.1f} | {v['orders']} | {chains} |"
        )
    return lines


if __name__ == "__main__":
    runtime.configured_hooks()  # fail early on a bad ACCORD_HOOKS
    print(report(int(sys.argv[1]) if len(sys.argv) > 1 else TURNS))
