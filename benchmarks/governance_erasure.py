"""A data subject's export and erasure: how long they take, and what compaction does.

An engine in its own process (every commit fsynced), the audit trail in ``full`` mode, a policy
naming ``business:orders``'s ``user_id``. The subject has THREADS threads of TURNS turns
(each turn: a message, a business record naming the user, a workflow event) and
MEMORIES memories put through the store; another user has as many. Reported: the
subject's documents (export), the export's seconds, the erasure's seconds (without the
compaction), the compaction's seconds and the data files' bytes before and after it.

``python -m benchmarks.governance_erasure [threads] [turns] [memories]``
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, MessagesState, StateGraph
from pymongo import MongoClient

from accord import runtime
from accord.checkpointers import business
from accord.governance.loading import parse_policy
from benchmarks.checkpointer import start_engine

THREADS = 20
TURNS = 10
MEMORIES = 200
DB = "bench_erasure"
ALL = '["find", "insert", "update", "remove"]'
POLICY = (
    '[classes."business:orders"]\nsubject_fields = ["user_id"]\n'
    f"roles = {{ runtime = {ALL}, admin = {ALL} }}\n"
)


def _graph(saver: Any) -> Any:
    def answer(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        conf = config["configurable"]
        n = len(state["messages"])
        business.insert_one("orders", {"_id": f"o-{conf['thread_id']}-{n}",
                                       "tenant_id": "default", "user_id": conf["user_id"]})  # fmt: skip
        business.append_event("checkout", {"user_id": conf["user_id"], "step": n})
        return {"messages": [AIMessage(f"noted {n}", id=f"ai-{conf['thread_id']}-{n}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    return builder.compile(checkpointer=saver)


def _files(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("accord-engine.sqlite3*") if p.is_file())


def run(threads: int = THREADS, turns: int = TURNS, memories: int = MEMORIES) -> dict[str, float]:
    os.environ["ACCORD_AUDIT"] = "full"
    policy = parse_policy(POLICY, "bench.toml")
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_engine(tmp, fsync=True)
        client: MongoClient = MongoClient(f"mongodb://127.0.0.1:{port}/?replicaSet=accord")
        try:
            app = runtime.Accord(client=client, db_name=DB, policy=policy)
            graph = _graph(app.checkpointer())
            for user in ("u-1", "u-2"):
                for i in range(threads):
                    config = {"configurable": {"thread_id": f"{user}-{i}", "user_id": user}}
                    for t in range(turns):
                        graph.invoke({"messages": [HumanMessage(f"{user} says {t}")]}, config)
                store = app.store()
                for m in range(memories):
                    store.put(("memories", user), f"m{m}", {"text": f"{user} fact {m}"})
            started = time.perf_counter()
            manifest = runtime.export_subject_data(client, "u-1", Path(tmp) / "export", DB,
                                                   policy=policy)  # fmt: skip
            exported = time.perf_counter() - started
            started = time.perf_counter()
            report = runtime.erase_subject_data(client, "u-1", DB, policy=policy, compact=False)
            erased = time.perf_counter() - started
            before = _files(Path(tmp))
            started = time.perf_counter()
            runtime.compact_storage(client, DB)
            compacted = time.perf_counter() - started
            return {
                "documents": manifest["documents"],
                "deleted": sum(report.deleted.values()),
                "audit_images": report.audit_images_erased,
                "export_s": exported,
                "erase_s": erased,
                "compact_s": compacted,
                "bytes_before": before,
                "bytes_after": _files(Path(tmp)),
            }
        finally:
            client.close()
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:4]]
    print(run(*args))
