"""Child process of the checkpointer kill suite and of the two-writers test.

Run as a script (``python tests/checkpointers/kill_worker.py MODE ...``); the parents are
``test_kill_suite.py`` and ``test_two_writers.py``, which also import the graph from here
to run the uninterrupted reference in-process.

The graphs (``--graph``): a turn starts with a human message; ``model`` (a deterministic
fake model) runs :data:`MODEL_STEPS` times in a loop, then ``finish`` runs once. EVERY
model/finish step appends one AIMessage with a deterministic id (``ai-<n>``) and stages
two business writes: an insert into ``ledger`` (``_id`` ``<thread>-<n>``) and an
``$inc``/``$push`` on the thread's ``counters`` document. In the ``fanout`` graph each
model step also fans out to ``audit_a`` and ``audit_b`` (each ``$inc`` on the thread's
``audits`` document) which fan in to ``join`` (``add_edge([a, b], "join")``: a barrier
channel; ``join`` inserts ``joins`` ``<thread>-<n>``) before the next model step.

``--saver sync`` drives the graph with ``invoke`` on ``AccordSaver``; ``--saver async``
with ``ainvoke`` on ``AsyncAccordSaver``. Workers hold the thread with a short lease
(``--lease``): a worker that starts while a killed one's lease is still live waits for it
to expire (ConcurrentRunError, retried), as a restarted worker would.

``run`` mode resumes the thread where it is (or starts it) and drives it to the end.
``ACCORD_KILL_AT=<point>:<n>`` makes the process SIGKILL itself at the n-th occurrence of
``point`` (the hooks live here, in test code, never in accord):

* ``node_start`` / ``node_end``: a node began / staged its writes and is about to return;
* ``put_writes_before`` / ``put_writes_after``: entry of ``put_writes`` / after it
  committed, before the next ``put`` ("between put_writes and put");
* ``put_before`` / ``put_after``: entry of ``put`` / after the checkpoint committed;
* ``txn_write``: a write command inside a transaction was about to be sent;
* ``commit_start``: ``commitTransaction`` was about to be sent (never reaches the server);
* ``commit_done``: the server acknowledged ``commitTransaction``, the saver has not seen it.

Every session that starts a transaction is appended to the ``--lsid-file`` before the
command leaves the process, so the parent can end a dead worker's open transaction
(``killSessions``) instead of waiting out ``transactionLifetimeLimitSeconds``.

``race`` mode (two-writers test) waits at a file barrier right before LangGraph loads
the thread (so two writers claim it at the same moment; see :class:`BarrierSaver`),
optionally holds its first node until a file exists (``--hold``), then drives the thread
and records the outcome (and how many nodes it ran) as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, TypedDict

from bson import json_util
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import StateSnapshot
from pymongo import AsyncMongoClient, MongoClient, monitoring

from accord.checkpointers import AccordSaver, AsyncAccordSaver, business
from accord.errors import ConcurrentRunError

#: model steps per turn; ``finish`` adds one more step
MODEL_STEPS = 12
STEPS_PER_TURN = MODEL_STEPS + 1
KILL_POINTS = (
    "node_start",
    "node_end",
    "put_writes_before",
    "put_writes_after",
    "put_before",
    "put_after",
    "txn_write",
    "commit_start",
    "commit_done",
)
_TXN_WRITES = frozenset({"bulkWrite", "insert", "update", "delete"})


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class FakeChatModel:
    """A fake, deterministic chat model: no network, no randomness.

    Its reply depends on the whole conversation so far (a digest of every message), so a
    step replayed on a wrong or duplicated history produces a different final state.
    """

    def __init__(self, latency: float = 0.0) -> None:
        self.latency = latency

    def invoke(self, messages: list[AnyMessage], *, final: bool = False) -> AIMessage:
        if self.latency:
            time.sleep(self.latency)  # stands in for the model call
        n = sum(isinstance(m, AIMessage) for m in messages) + 1
        transcript = "\n".join(f"{m.type}|{m.id}|{m.content}" for m in messages)
        digest = hashlib.sha256(transcript.encode()).hexdigest()[:16]
        text = "final answer" if final else f"thought {n}"
        return AIMessage(f"{text} after {len(messages)} messages [{digest}]", id=f"ai-{n}")


def steps_this_turn(messages: list[AnyMessage]) -> int:
    """AI messages since the last human message."""
    count = 0
    for m in reversed(messages):
        if isinstance(m, HumanMessage):
            break
        count += isinstance(m, AIMessage)
    return count


def build_graph(model: FakeChatModel, on_point: Any = None, *, fanout: bool = False) -> StateGraph:
    hook = on_point or (lambda point: None)

    def step(state: State, config: RunnableConfig, *, final: bool) -> dict[str, Any]:
        hook("node_start")
        reply = model.invoke(state["messages"], final=final)
        n = int(str(reply.id).split("-")[1])
        thread = config["configurable"]["thread_id"]
        business.insert_one(
            "ledger",
            {"_id": f"{thread}-{n}", "thread": thread, "step": n, "content": reply.content},
        )
        business.update_one(
            "counters",
            {"_id": thread},
            {"$inc": {"n": 1}, "$push": {"steps": n}},
            upsert=True,
        )
        hook("node_end")
        return {"messages": [reply]}

    def model_node(state: State, config: RunnableConfig) -> dict[str, Any]:
        return step(state, config, final=False)

    def finish_node(state: State, config: RunnableConfig) -> dict[str, Any]:
        return step(state, config, final=True)

    def route(state: State) -> str:
        return "model" if steps_this_turn(state["messages"]) < MODEL_STEPS else "finish"

    g = StateGraph(State)
    g.add_node("model", model_node)
    g.add_node("finish", finish_node)
    g.add_edge(START, "model")
    g.add_edge("finish", END)
    if not fanout:
        g.add_conditional_edges("model", route, ["model", "finish"])
        return g

    def audit(side: str) -> Any:
        def node(state: State, config: RunnableConfig) -> dict[str, Any]:
            hook("node_start")
            business.update_one(
                "audits",
                {"_id": config["configurable"]["thread_id"]},
                {"$inc": {side: 1}},
                upsert=True,
            )
            hook("node_end")
            return {}

        return node

    def join(state: State, config: RunnableConfig) -> dict[str, Any]:
        hook("node_start")
        thread = config["configurable"]["thread_id"]
        n = sum(isinstance(m, AIMessage) for m in state["messages"])
        business.insert_one("joins", {"_id": f"{thread}-{n}", "thread": thread, "step": n})
        hook("node_end")
        return {}

    g.add_node("audit_a", audit("a"))
    g.add_node("audit_b", audit("b"))
    g.add_node("join", join)
    g.add_edge("model", "audit_a")
    g.add_edge("model", "audit_b")
    g.add_edge(["audit_a", "audit_b"], "join")
    g.add_conditional_edges("join", route, ["model", "finish"])
    return g


# --- kill hooks (test code only) ---------------------------------------------------------


class KillSwitch:
    """SIGKILLs this process at the n-th occurrence of one point (``point:n``)."""

    def __init__(self, spec: str | None) -> None:
        self.point, self.n = None, 0
        if spec:
            point, _, n = spec.partition(":")
            if point not in KILL_POINTS:
                raise SystemExit(f"unknown kill point {point!r}")
            self.point, self.n = point, int(n or 1)
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def hit(self, point: str) -> None:
        if point != self.point:
            return
        with self.lock:
            self.counts[point] += 1
            if self.counts[point] == self.n:
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(60)  # never reached


class TxnWatcher(monitoring.CommandListener):
    """Records transaction sessions and fires the in-transaction kill points."""

    def __init__(self, switch: KillSwitch, lsid_file: str | None) -> None:
        self.switch = switch
        self.lsid_file = lsid_file
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        cmd = event.command
        if cmd.get("startTransaction") and self.lsid_file and "lsid" in cmd:
            line = json_util.dumps(cmd["lsid"])
            with self.lock:
                if line not in self.seen:
                    self.seen.add(line)
                    with open(self.lsid_file, "a") as f:
                        f.write(line + "\n")
        if cmd.get("autocommit") is False:
            if event.command_name in _TXN_WRITES:
                self.switch.hit("txn_write")
            elif event.command_name == "commitTransaction":
                self.switch.hit("commit_start")

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "commitTransaction":
            self.switch.hit("commit_done")

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


class KillingSaver(AccordSaver):
    """AccordSaver with kill points around ``put_writes`` and ``put``."""

    switch: KillSwitch

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        self.switch.hit("put_writes_before")
        super().put_writes(config, writes, task_id, task_path)
        self.switch.hit("put_writes_after")

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        self.switch.hit("put_before")
        out = super().put(config, checkpoint, metadata, new_versions)
        self.switch.hit("put_after")
        return out


class AsyncKillingSaver(AsyncAccordSaver):
    """AsyncAccordSaver with kill points around ``aput_writes`` and ``aput``."""

    switch: KillSwitch

    async def aput_writes(
        self, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:
        self.switch.hit("put_writes_before")
        await super().aput_writes(config, writes, task_id, task_path)
        self.switch.hit("put_writes_after")

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        self.switch.hit("put_before")
        out = await super().aput(config, checkpoint, metadata, new_versions)
        self.switch.hit("put_after")
        return out


#: how long a worker waits for a killed worker's lease to expire
LEASE_WAIT = 60.0


def invoke_waiting(graph: Any, inputs: Any, cfg: RunnableConfig, durability: str) -> Any:
    """``graph.invoke``, retried while a dead worker's lease is still live."""
    deadline = time.monotonic() + LEASE_WAIT
    while True:
        try:
            return graph.invoke(inputs, cfg, durability=durability)
        except ConcurrentRunError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


async def ainvoke_waiting(graph: Any, inputs: Any, cfg: RunnableConfig, durability: str) -> Any:
    deadline = time.monotonic() + LEASE_WAIT
    while True:
        try:
            return await graph.ainvoke(inputs, cfg, durability=durability)
        except ConcurrentRunError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def human(turn: int) -> HumanMessage:
    return HumanMessage(f"turn {turn}: keep the ledger", id=f"human-{turn}")


def finished(state: StateSnapshot) -> bool:
    """The thread ran to the end: its latest checkpoint has no tasks at all.

    Not ``not state.next``: ``get_state`` leaves out of ``next`` the tasks whose writes
    are recorded, so a checkpoint whose task finished (killed before the next ``put``)
    has an empty ``next`` although the graph has more steps to go.
    """
    return state.created_at is not None and not state.tasks


def run(args: argparse.Namespace) -> int:
    if args.saver == "async":
        return asyncio.run(arun(args))
    switch = KillSwitch(os.environ.get("ACCORD_KILL_AT"))
    client: MongoClient = MongoClient(
        args.uri, event_listeners=[TxnWatcher(switch, args.lsid_file)]
    )
    saver = KillingSaver(client, db_name=args.db, lease_seconds=args.lease)
    saver.switch = switch
    model = FakeChatModel(args.latency)
    graph = build_graph(model, switch.hit, fanout=args.graph == "fanout").compile(
        checkpointer=saver
    )
    cfg: RunnableConfig = {"configurable": {"thread_id": args.thread}}
    print("READY", flush=True)
    if saver.get_tuple(cfg) is None:
        invoke_waiting(graph, {"messages": [human(1)]}, cfg, args.durability)
    elif not finished(graph.get_state(cfg)):
        invoke_waiting(graph, None, cfg, args.durability)
    state = graph.get_state(cfg)
    print(json.dumps({"finished": finished(state), "messages": len(state.values["messages"])}))
    client.close()
    return 0


async def arun(args: argparse.Namespace) -> int:
    switch = KillSwitch(os.environ.get("ACCORD_KILL_AT"))
    client: AsyncMongoClient = AsyncMongoClient(
        args.uri, event_listeners=[TxnWatcher(switch, args.lsid_file)]
    )
    saver = AsyncKillingSaver(client, db_name=args.db, lease_seconds=args.lease)
    saver.switch = switch
    model = FakeChatModel(args.latency)
    graph = build_graph(model, switch.hit, fanout=args.graph == "fanout").compile(
        checkpointer=saver
    )
    cfg: RunnableConfig = {"configurable": {"thread_id": args.thread}}
    print("READY", flush=True)
    if await saver.aget_tuple(cfg) is None:
        await ainvoke_waiting(graph, {"messages": [human(1)]}, cfg, args.durability)
    elif not finished(await graph.aget_state(cfg)):
        await ainvoke_waiting(graph, None, cfg, args.durability)
    state = await graph.aget_state(cfg)
    print(json.dumps({"finished": finished(state), "messages": len(state.values["messages"])}))
    await client.close()
    return 0


# --- race mode (two-writers test) --------------------------------------------------------


def file_barrier(directory: Path, name: str, role: str, parties: int = 2) -> None:
    (directory / f"{name}-{role}").touch()
    wait_for(directory, f"{name}-*", parties)


def wait_for(directory: Path, pattern: str, count: int = 1, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(list(directory.glob(pattern))) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other writer never got to {pattern!r}")
        time.sleep(0.001)


class BarrierSaver(AccordSaver):
    """Waits at a file barrier right before LangGraph loads the thread (its first
    ``get_tuple``), so that two writers claim the thread at the same moment, and at a
    second one after the claim, so that the race is decided by the claims."""

    barrier_dir: Path | None = None
    role = ""
    waited = False

    def get_tuple(self, config: Any) -> Any:
        if not self.waited and self.barrier_dir is not None:
            self.waited = True
            file_barrier(self.barrier_dir, "claim", self.role)
            try:
                return super().get_tuple(config)
            finally:
                # Neither runs a node before both have tried to claim: on a busy machine
                # the winner could otherwise finish and release the thread before the
                # other is scheduled, and the "race" would be two runs one after another.
                file_barrier(self.barrier_dir, "claimed", self.role)
        return super().get_tuple(config)


class AsyncBarrierSaver(AsyncAccordSaver):
    """:class:`BarrierSaver` for the async saver (the barrier waits in a thread)."""

    barrier_dir: Path | None = None
    role = ""
    waited = False

    async def aget_tuple(self, config: Any) -> Any:
        if not self.waited and self.barrier_dir is not None:
            self.waited = True
            await asyncio.to_thread(file_barrier, self.barrier_dir, "claim", self.role)
            try:
                return await super().aget_tuple(config)
            finally:
                await asyncio.to_thread(file_barrier, self.barrier_dir, "claimed", self.role)
        return await super().aget_tuple(config)


def race(args: argparse.Namespace) -> int:
    if args.saver == "async":
        return asyncio.run(arace(args))
    client: MongoClient = MongoClient(args.uri)
    saver = BarrierSaver(client, db_name=args.db, lease_seconds=args.lease)
    saver.barrier_dir = Path(args.barrier) if args.barrier else None
    saver.role = args.role
    graph, nodes = _race_graph(args, saver)
    result = _race_result(
        args,
        lambda: graph.invoke(_race_input(args), _race_config(args), durability=args.durability),
        nodes,
    )
    Path(args.result).write_text(json.dumps(result))
    client.close()
    return 0


async def arace(args: argparse.Namespace) -> int:
    client: AsyncMongoClient = AsyncMongoClient(args.uri)
    saver = AsyncBarrierSaver(client, db_name=args.db, lease_seconds=args.lease)
    saver.barrier_dir = Path(args.barrier) if args.barrier else None
    saver.role = args.role
    graph, nodes = _race_graph(args, saver)
    started = time.monotonic()
    try:
        await graph.ainvoke(_race_input(args), _race_config(args), durability=args.durability)
        result: dict[str, Any] = {"outcome": "finished"}
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        result = _race_error(exc)
    result.update(
        role=args.role,
        durability=args.durability,
        saver=args.saver,
        seconds=time.monotonic() - started,
        nodes=nodes["node_start"],
    )
    Path(args.result).write_text(json.dumps(result))
    await client.close()
    return 0


def _race_input(args: argparse.Namespace) -> Any:
    return None if args.turn == 0 else {"messages": [human(args.turn)]}


def _race_config(args: argparse.Namespace) -> RunnableConfig:
    return {"configurable": {"thread_id": args.thread}}


def _race_error(exc: BaseException) -> dict[str, Any]:
    return {
        "outcome": "error",
        "type": type(exc).__name__,
        "concurrent": isinstance(exc, ConcurrentRunError),
        "message": str(exc),
        "traceback": traceback.format_exc(),
    }


def _race_result(args: argparse.Namespace, invoke: Any, nodes: Counter[str]) -> dict[str, Any]:
    started = time.monotonic()
    try:
        invoke()
        result: dict[str, Any] = {"outcome": "finished"}
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        result = _race_error(exc)
    result.update(
        role=args.role,
        durability=args.durability,
        saver=args.saver,
        seconds=time.monotonic() - started,
        nodes=nodes["node_start"],
    )
    return result


def _race_graph(args: argparse.Namespace, saver: Any) -> tuple[Any, Counter[str]]:
    nodes = Counter[str]()
    hold = Path(args.hold) if args.hold else None

    def on_point(point: str) -> None:
        if point != "node_start":
            return
        nodes[point] += 1
        if hold is not None and nodes[point] == 1:
            Path(f"{hold}.{args.role}.in-node").touch()
            wait_for(hold.parent, hold.name, timeout=120.0)

    graph = build_graph(FakeChatModel(args.latency), on_point).compile(checkpointer=saver)
    return graph, nodes


# --- helpers for the parents ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_engine(dbpath: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start the embedded engine in its own process (not fsyncing: it is never killed)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "accord.platform.embedded", "--dbpath", str(dbpath),
         "--port", str(port), "--no-sync"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if "listening" not in line:
        proc.kill()
        raise RuntimeError(f"engine did not start: {line!r}")
    return proc, f"mongodb://127.0.0.1:{port}/?directConnection=true"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    for name in ("run", "race"):
        s = sub.add_parser(name)
        s.add_argument("--uri", required=True)
        s.add_argument("--db", required=True)
        s.add_argument("--thread", required=True)
        s.add_argument("--durability", choices=("sync", "async"), default="async")
        s.add_argument("--latency", type=float, default=0.0)
        s.add_argument("--lease", type=float, default=30.0, help="lease seconds")
    w = sub.choices["run"]
    w.add_argument("--lsid-file")
    w.add_argument("--saver", choices=("sync", "async"), default="sync")
    w.add_argument("--graph", choices=("chain", "fanout"), default="chain")
    r = sub.choices["race"]
    r.add_argument("--barrier", help="claim at the same moment as the other writer")
    r.add_argument("--role", required=True)
    r.add_argument("--result", required=True)
    r.add_argument("--turn", type=int, required=True, help="0 = resume with invoke(None)")
    r.add_argument("--hold", help="the first node waits until this file exists")
    r.add_argument("--saver", choices=("sync", "async"), default="sync")
    args = p.parse_args(argv)
    return run(args) if args.mode == "run" else race(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
