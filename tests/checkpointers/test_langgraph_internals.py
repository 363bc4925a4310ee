"""accord reads a few of LangGraph's private things (accord/checkpointers/langgraph_internals.py,
listed in docs/checkpointer.md). This test fails, naming what changed, on a LangGraph release
that no longer has one of them: before a user meets it as a wrong run identity or a thread
that is never released."""

from __future__ import annotations

from typing import Any

import pytest

from accord.checkpointers import langgraph_internals


def test_the_installed_langgraph_has_what_accord_reads() -> None:
    assert langgraph_internals.problems() == []


def test_a_changed_constant_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from langgraph._internal import _constants

    monkeypatch.setattr(_constants, "CONFIG_KEY_RUNTIME", "__pregel_renamed")
    assert langgraph_internals.problems() == [
        "langgraph._internal._constants.CONFIG_KEY_RUNTIME is '__pregel_renamed', not "
        "'__pregel_runtime'"
    ]


def test_a_missing_loop_method_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from langgraph.pregel import _loop

    monkeypatch.delattr(_loop.PregelLoop, "_first")
    assert "SyncPregelLoop has no _first method" in langgraph_internals.problems()


def test_the_loop_is_recognised_in_a_real_run(saver: Any) -> None:
    """The frame inspection finds LangGraph's loop when a graph invokes the saver, and
    nothing when the saver is called directly."""
    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict

    class S(TypedDict):
        n: int

    seen: list[Any] = []
    original = type(saver).get_tuple

    def spy(self: Any, config: Any) -> Any:
        seen.append(langgraph_internals.calling_loop())
        return original(self, config)

    g = StateGraph(S)
    g.add_node("step", lambda s: {"n": s["n"] + 1})
    g.add_edge(START, "step")
    graph = g.compile(checkpointer=saver)
    pytest.MonkeyPatch().setattr(type(saver), "get_tuple", spy)
    try:
        graph.invoke({"n": 1}, {"configurable": {"thread_id": "internals"}})
        saver.get_tuple({"configurable": {"thread_id": "internals"}})
    finally:
        pytest.MonkeyPatch().setattr(type(saver), "get_tuple", original)
    assert seen and type(seen[0]).__name__ == "SyncPregelLoop"
    assert seen[-1] is None
