"""Time travel through a subgraph interrupt, under both durabilities, both savers.

LangGraph's ``test_subgraph_interrupt_replay_from_parent_then_resume`` found the earlier
accord returning the OLD interrupt answer after a fork was resumed with a new one, under
"async" durability: a silently wrong result. Here: a parent graph whose subgraph asks a
human; run to the end with one answer; replay the parent from the checkpoint where the
interrupt fired (LangGraph restarts the subgraph as a new root in a namespace that has
checkpoints); resume the fork with a new answer: the new answer is the one used, and the
original branch is untouched.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.types import Command, interrupt

from tests.checkpointers.conftest import config


class State(TypedDict):
    value: Annotated[list[str], operator.add]


def _graph(saver: Any, calls: list[str]) -> Any:
    def step(name: str, value: str) -> Any:
        def node(state: State) -> dict[str, Any]:
            calls.append(name)
            return {"value": [value]}

        return node

    def ask(state: State) -> dict[str, Any]:
        calls.append("ask")
        return {"value": [f"human:{interrupt('answer?')}"]}

    sub = (
        StateGraph(State)
        .add_node("a", step("a", "sub_a"))
        .add_node("ask", ask)
        .add_node("b", step("b", "sub_b"))
        .add_edge(START, "a")
        .add_edge("a", "ask")
        .add_edge("ask", "b")
        .compile(checkpointer=True)
    )
    return (
        StateGraph(State)
        .add_node("router", step("router", "routed"))
        .add_node("sub", sub)
        .add_node("post", step("post", "post"))
        .add_edge(START, "router")
        .add_edge("router", "sub")
        .add_edge("sub", "post")
        .compile(checkpointer=saver)
    )


def _scenario(saver: Any, thread: str, durability: str) -> dict[str, Any]:
    calls: list[str] = []
    graph = _graph(saver, calls)
    cfg = config(thread)
    out: dict[str, Any] = {}
    graph.invoke({"value": []}, cfg, durability=durability)
    out["first"] = graph.invoke(Command(resume="old"), cfg, durability=durability)["value"]
    history = list(graph.get_state_history(cfg))
    at_interrupt = next(s for s in history if s.next == ("sub",))
    calls.clear()
    replay = graph.invoke(None, at_interrupt.config, durability=durability)
    out["replay"] = (replay["__interrupt__"][0].value, list(calls))
    calls.clear()
    out["final"] = graph.invoke(Command(resume="new"), cfg, durability=durability)["value"]
    out["calls"] = list(calls)
    out["latest"] = graph.get_state(cfg).values["value"]
    original = next(s for s in history if not s.next)
    out["original"] = graph.get_state(original.config).values["value"]
    out["history"] = [(s.next, s.metadata["source"]) for s in graph.get_state_history(cfg)]
    return out


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_replaying_a_subgraph_interrupt_uses_the_new_answer(saver: Any, durability: str) -> None:
    got = _scenario(saver, f"replay-{durability}", durability)
    assert "human:new" in got["final"] and "human:old" not in got["final"]
    assert got["replay"] == ("answer?", ["a", "ask"])  # the subgraph re-ran to its interrupt
    assert got["calls"] == ["ask", "b", "post"]
    assert got["latest"] == got["final"]
    assert "human:old" in got["original"]  # the original branch still reads as before
    # and everything, history included, as with InMemorySaver
    assert got == _scenario(InMemorySaver(), "ref", durability)
