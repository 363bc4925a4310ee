"""Child process of tests/checkpointers/test_takeover.py: a run that holds its thread.

``python tests/checkpointers/takeover_worker.py --uri URI --db DB --thread T --lease S
--dir D [--async]`` invokes a one-node graph on thread T; the node writes ``D/started``
and then waits until ``D/finish`` exists (or 10 minutes), then returns. The process
prints ``done`` or the error's class and message (``ConcurrentRunError: ...``) as its
last line. ``ACCORD_MACHINE_ID`` in its environment makes it look like a process of
another machine.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

from langgraph.graph import START, StateGraph


class S(TypedDict):
    n: int


def _graph(directory: Path) -> StateGraph:
    def hold(state: S) -> dict[str, Any]:
        (directory / "started").write_text("1")
        deadline = time.monotonic() + 600
        while not (directory / "finish").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return {"n": state["n"] + 1}

    g = StateGraph(S)
    g.add_node("hold", hold)
    g.add_edge(START, "hold")
    return g


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uri", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--async", dest="use_async", action="store_true")
    args = parser.parse_args()
    cfg: Any = {"configurable": {"thread_id": args.thread}}
    try:
        if args.use_async:
            asyncio.run(_arun(args, cfg))
        else:
            from pymongo import MongoClient

            from accord.checkpointers import AccordSaver

            client: Any = MongoClient(args.uri)
            saver = AccordSaver(client, db_name=args.db, lease_seconds=args.lease)
            _graph(args.dir).compile(checkpointer=saver).invoke({"n": 0}, cfg)
    except Exception as exc:  # reported to the parent
        print(f"{type(exc).__name__}: {exc}", flush=True)
        return 1
    print("done", flush=True)
    return 0


async def _arun(args: argparse.Namespace, cfg: Any) -> None:
    from pymongo import AsyncMongoClient

    from accord.checkpointers import AsyncAccordSaver

    client: Any = AsyncMongoClient(args.uri)
    saver = AsyncAccordSaver(client, db_name=args.db, lease_seconds=args.lease)
    graph = _graph(args.dir).compile(checkpointer=saver)
    await graph.ainvoke({"n": 0}, cfg)


if __name__ == "__main__":
    sys.exit(main())
