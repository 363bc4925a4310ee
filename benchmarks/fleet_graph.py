"""The fleet benchmark's graph (``benchmarks/fleet.py``), served by ``accord worker --graph
benchmarks.fleet_graph:graph``: three steps, each one recorded tool call (a fake tool: a
lookup that answers at once, declared idempotent) and one business write that keeps the
step's start and end times (so the benchmark reads the steps' timing from the database,
with no file written by the workers)."""

from __future__ import annotations

import os
import time
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

from accord.checkpointers import business
from accord.checkpointers.recorded import recorded

STEPS = ("a", "b", "c")


class State(TypedDict, total=False):
    run: str
    receipts: list[str]


def _lookup(run: str, step: str) -> str:
    """The fake tool: answers at once (what is measured is accord's cost, not a tool's)."""
    return f"receipt-{run}-{step}"


#: ``ACCORD_FLEET_UNRECORDED=1``: the tool is called plainly, not recorded (the benchmark's
#: row that measures what recording the calls costs)
UNRECORDED = os.environ.get("ACCORD_FLEET_UNRECORDED") == "1"
lookup = _lookup if UNRECORDED else recorded(name="fake_tool.lookup", idempotent=True)(_lookup)


def _step(name: str) -> Any:
    def node(state: State) -> dict[str, Any]:
        start = time.time()
        receipt = lookup(state["run"], name)
        business.insert_one("fleet_steps", {"_id": f"{state['run']}:{name}", "run": state["run"],
                                            "step": name, "start": start, "end": time.time()})  # fmt: skip
        return {"receipts": [*state.get("receipts", []), receipt]}

    return node


def _build() -> StateGraph:
    g = StateGraph(State)
    for name in STEPS:
        g.add_node(name, _step(name))
    g.add_edge(START, STEPS[0])
    for a, b in zip(STEPS, STEPS[1:], strict=False):
        g.add_edge(a, b)
    g.add_edge(STEPS[-1], END)
    return g


graph = _build()
