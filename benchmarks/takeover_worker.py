"""Child process of ``benchmarks/takeover.py``: a run that holds its thread in a node.

``python -m benchmarks.takeover_worker URI DB THREAD DIR`` invokes a one-node graph on
THREAD with AccordSaver (default lease); the node writes ``DIR/started`` and waits until
``DIR/finish`` exists.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TypedDict

from langgraph.graph import START, StateGraph
from pymongo import MongoClient

from accord.checkpointers import AccordSaver


class S(TypedDict):
    n: int


def graph(directory: Path | None, saver: Any) -> Any:
    def hold(state: S) -> dict[str, Any]:
        if directory is not None:
            (directory / "started").write_text("1")
            while not (directory / "finish").exists():
                time.sleep(0.01)
        return {"n": state["n"] + 1}

    g = StateGraph(S)
    g.add_node("hold", hold)
    g.add_edge(START, "hold")
    return g.compile(checkpointer=saver)


def main() -> None:
    uri, db, thread, directory = sys.argv[1:5]
    saver = AccordSaver(MongoClient(uri), db_name=db)
    graph(Path(directory), saver).invoke({"n": 0}, {"configurable": {"thread_id": thread}})


if __name__ == "__main__":
    main()
