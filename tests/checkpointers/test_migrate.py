"""Migration from MongoDBSaver: same states, accord's storage model."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.mongodb import MongoDBSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from pymongo import MongoClient

from accord.checkpointers.migrate import migrate_threads
from tests.checkpointers.conftest import config, unique_db


class S(TypedDict):
    messages: Annotated[list, add_messages]
    log: Annotated[list[str], operator.add]


def test_migrate_from_mongodbsaver(client: MongoClient, saver: Any) -> None:
    def bot(state: S) -> dict[str, Any]:
        return {
            "messages": [
                AIMessage(f"re {len(state['messages'])}", id=f"ai-{len(state['messages'])}")
            ],
            "log": ["bot"],
        }

    g = StateGraph(S)
    g.add_node("bot", bot)
    g.add_edge(START, "bot")
    src_db = unique_db()
    try:
        legacy = MongoDBSaver(client, db_name=src_db)
        graph = g.compile(checkpointer=legacy)
        for i in range(3):
            graph.invoke({"messages": [HumanMessage(f"q{i}", id=f"h{i}")]}, config("m"))
        old = list(legacy.list(config("m")))
        graph.update_state(old[-2].config, {"log": ["fork"]})  # a fork in the history

        assert migrate_threads(legacy, saver, ["m"]) == {"m": len(old) + 1}
        new_graph = g.compile(checkpointer=saver)
        src = [
            (s.config["configurable"]["checkpoint_id"], s.values, s.next)
            for s in graph.get_state_history(config("m"))
        ]
        dst = [
            (s.config["configurable"]["checkpoint_id"], s.values, s.next)
            for s in new_graph.get_state_history(config("m"))
        ]
        assert dst == src
        # and the migrated thread keeps running on accord, from its latest checkpoint (the fork)
        new_graph.invoke({"messages": [HumanMessage("after", id="h9")]}, config("m"))
        state = new_graph.get_state(config("m")).values
        assert [m.id for m in state["messages"]] == ["h0", "h9", "ai-2"]
    finally:
        client.drop_database(src_db)
