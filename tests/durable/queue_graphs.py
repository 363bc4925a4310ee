"""Graphs the queue tests submit by name (``tests.durable.queue_graphs:NAME``) and that
``accord worker --graph`` imports in the fleet test's worker processes.

* ``steps``: three steps, each with two business writes: ``fleet_writes`` (``_id`` = run
  and step, so a duplicate would be refused) and ``fleet_commits`` (``_id`` = run, step,
  process and start time: a duplicate would be kept, so it counts committed executions)
  and, when ``ACCORD_TEST_LOG`` names a file, one
  line ``{run, step, pid, start, end}`` per execution of a step (the outside world's view:
  which process executed what, when), sleeping ``ACCORD_TEST_STEP_S`` seconds inside,
  and, in the tests' own process, waiting for ``GATES[step]`` when it is set; in a
  worker process, each step waits (at most two minutes) until the file
  ``ACCORD_TEST_HOLD`` names exists.
* ``approval``: ``ask`` calls ``interrupt()`` for a decision, ``act`` records it.
* ``boom``: a step that raises.
* ``compiled_steps``: ``steps``, compiled (without a checkpointer).
* ``async_steps`` / ``async_approval``: ``steps`` and ``approval`` with async nodes only
  (LangGraph's sync ``stream`` cannot run them: ``AsyncWorker`` does).
* ``approvals``: ``ask`` calls ``interrupt()`` seven times in a row (a run that waits
  for more decisions than a worker's ``max_attempts``).
* ``wire``: ``pay`` makes a recorded call that is not idempotent (a fake bank that logs
  each request to ``ACCORD_TEST_BANK``).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from accord.checkpointers import business
from accord.checkpointers.recorded import recorded

#: step name -> an event the step waits for (at most a minute) before it writes
GATES: dict[str, threading.Event] = {}


class State(TypedDict, total=False):
    run: str
    n: int
    done: list[str]
    decision: Any
    acted: str


def _log(entry: dict[str, Any]) -> None:
    path = os.environ.get("ACCORD_TEST_LOG")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()


def _step(name: str) -> Any:
    def node(state: State) -> dict[str, Any]:
        start = time.time()
        _log({"run": state["run"], "step": name, "pid": os.getpid(), "start": start})
        time.sleep(float(os.environ.get("ACCORD_TEST_STEP_S", "0")))
        gate = GATES.get(name)
        if gate is not None:
            gate.wait(60)
        hold = os.environ.get("ACCORD_TEST_HOLD")
        deadline = time.monotonic() + 120
        while hold and not os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.01)
        business.insert_one("fleet_writes", {"_id": f"{state['run']}:{name}", "step": name})
        # and one that a duplicate would not collide with: who committed this execution
        business.insert_one("fleet_commits", {"_id": f"{state['run']}:{name}:{os.getpid()}:{start}",
                                              "run": state["run"], "step": name, "pid": os.getpid()})  # fmt: skip
        _log({"run": state["run"], "step": name, "pid": os.getpid(), "start": start,
              "end": time.time()})  # fmt: skip
        return {"n": state.get("n", 0) + 1, "done": [*state.get("done", []), name]}

    return node


def _steps() -> StateGraph:
    g = StateGraph(State)
    for name in ("a", "b", "c"):
        g.add_node(name, _step(name))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g


def _ask(state: State) -> dict[str, Any]:
    return {"decision": interrupt({"question": "wire the money?", "run": state.get("run")})}


def _act(state: State) -> dict[str, Any]:
    business.insert_one(
        "approvals", {"_id": f"{state['run']}:{state['decision']}", "decision": state["decision"]}
    )
    return {"acted": "wired" if state["decision"] is True else "stopped"}


def _approval() -> StateGraph:
    g = StateGraph(State)
    g.add_node("ask", _ask)
    g.add_node("act", _act)
    g.add_edge(START, "ask")
    g.add_edge("ask", "act")
    g.add_edge("act", END)
    return g


def _ask_again(state: State) -> dict[str, Any]:
    n = state.get("n", 0)
    interrupt({"question": f"approve step {n}?"})
    return {"n": n + 1}


def _approvals() -> StateGraph:
    g = StateGraph(State)
    g.add_node("ask", _ask_again)
    g.add_edge(START, "ask")
    g.add_conditional_edges("ask", lambda s: END if s["n"] >= 7 else "ask")
    return g


def _boom_node(state: State) -> dict[str, Any]:
    raise RuntimeError("the tool is down")


def _boom() -> StateGraph:
    g = StateGraph(State)
    g.add_node("boom", _boom_node)
    g.add_edge(START, "boom")
    g.add_edge("boom", END)
    return g


@recorded(name="fake.wire")  # not idempotent: never made twice blindly
def _wire(cents: int) -> str:
    """A fake bank: each request is a line of ``ACCORD_TEST_BANK``; it takes
    ``ACCORD_TEST_STEP_S`` seconds (a window to be killed in, mid-call)."""
    with open(os.environ["ACCORD_TEST_BANK"], "a") as f:
        f.write(json.dumps({"cents": cents, "pid": os.getpid()}) + "\n")
    time.sleep(float(os.environ.get("ACCORD_TEST_STEP_S", "0")))
    return f"wired {cents}"


def _pay(state: State) -> dict[str, Any]:
    return {"acted": _wire(500)}


def _wire_graph() -> StateGraph:
    g = StateGraph(State)
    g.add_node("pay", _pay)
    g.add_edge(START, "pay")
    g.add_edge("pay", END)
    return g


def _async_steps() -> StateGraph:
    def step(name: str) -> Any:
        sync = _step(name)

        async def node(state: State) -> dict[str, Any]:
            await asyncio.sleep(0)
            gate = GATES.get(name)
            while gate is not None and not gate.is_set():  # waited for without the loop
                await asyncio.sleep(0.01)
            return sync(state)  # the same writes, from an async node

        return node

    g = StateGraph(State)
    for name in ("a", "b", "c"):
        g.add_node(name, step(name))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g


async def _async_ask(state: State) -> dict[str, Any]:
    return _ask(state)


async def _async_act(state: State) -> dict[str, Any]:
    return _act(state)


def _async_approval() -> StateGraph:
    g = StateGraph(State)
    g.add_node("ask", _async_ask)
    g.add_node("act", _async_act)
    g.add_edge(START, "ask")
    g.add_edge("ask", "act")
    g.add_edge("act", END)
    return g


steps = _steps()
async_steps = _async_steps()
async_approval = _async_approval()
wire = _wire_graph()
compiled_steps = _steps().compile()  # the worker copies it onto its saver
approval = _approval()
approvals = _approvals()
boom = _boom()
