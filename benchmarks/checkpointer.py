"""LangGraph checkpointers side by side: accord vs MongoDBSaver vs InMemorySaver.

One embedded engine process (``--no-sync``), one database and one ``MongoClient`` per
Mongo-backed saver, the same chat-like graph compiled once per saver. The turns are
interleaved (turn i runs on every saver before turn i+1), so machine noise hits all the
savers alike. Measured:

* round trips: MongoDB commands started per ``invoke`` (pymongo command monitoring on each
  saver's own client), split by command name and by what they were sent for;
* bytes read: BSON bytes of the replies per ``invoke``;
* latency: median wall time of one ``invoke``, as ratios to InMemorySaver and MongoDBSaver;
* storage: BSON bytes of every document in the saver's collections after 50, 100 and 200
  turns of one thread (InMemorySaver: bytes of the serialized payloads it keeps in memory);
* ``get_tuple`` of the latest checkpoint on threads of 10 and 5,000 checkpoints: reads
  and bytes, cold (a saver that never saw the thread) and warm (it read it before).

``AsyncAccordSaver`` runs ``ainvoke`` on an event loop in a thread of its own (the
caller waits for each invoke), so its row includes that hand-off.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict

import bson
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.mongodb import MongoDBSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pymongo import AsyncMongoClient, MongoClient, monitoring

from accord.checkpointers import AccordSaver, AsyncAccordSaver, CollectionNames
from accord.checkpointers import business as accord_business
from accord.platform.connection import read_lock

#: accord's collection names (MongoDBSaver's are ``checkpoints`` / ``checkpoint_writes``).
ACCORD = CollectionNames()

TURNS = 200
SNAPSHOTS = (50, 100, 200)
WARMUP = 5  # first turns left out of the latency median (imports, caches, index warm-up)
THREAD = {"configurable": {"thread_id": "bench-thread"}}
REPLY_CHARS = 200


# --- the graph ----------------------------------------------------------------------------


class ChatState(TypedDict):
    messages: Annotated[list, add_messages]
    turns: int  # small extra channel, overwritten every turn


def fake_model(state: ChatState) -> dict[str, Any]:
    """Deterministic stand-in for a chat model: one ~200-char AIMessage per turn."""
    n = state.get("turns", 0) + 1
    text = (f"Fake reply {n} to '{state['messages'][-1].content}'. " + "lorem ipsum " * 20)[
        :REPLY_CHARS
    ]
    return {"messages": [AIMessage(text, id=f"ai-{n}")], "turns": n}


def order(n: int) -> dict[str, Any]:
    """The business record a turn writes (users' workload): one small order."""
    return {"_id": f"order-{n}", "tenant_id": "default", "total": n, "items": ["a", "b"]}


def build_graph(write: Callable[[int], None] | None = None) -> StateGraph:
    """``START -> fake_model -> END``; with ``write``, the node also writes one business
    record per turn (``write(turn)``: ``insert_one`` on the application's client for
    MongoDBSaver, ``business.insert_one`` for accord, committed with the step)."""

    def node(state: ChatState) -> dict[str, Any]:
        out = fake_model(state)
        if write is not None:
            write(out["turns"])
        return out

    g = StateGraph(ChatState)
    g.add_node("fake_model", node if write is not None else fake_model)
    g.add_edge(START, "fake_model")
    g.add_edge("fake_model", END)
    return g


def human(n: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(f"question number {n}: what next?", id=f"human-{n}")]}


# --- measurement helpers -------------------------------------------------------------------


#: what a command was sent for, by the collections it touches (see ``CommandCounter``)
PURPOSES = ("get_tuple", "put", "put_writes", "lease")


class CommandCounter(monitoring.CommandListener):
    """Counts commands started on one client while enabled, by command name and by what
    they were sent for, told from the command itself (savers commit in background
    threads and tasks, so the calling thread says nothing): a write touching the
    checkpoints collection is a ``put``, one touching pending writes a ``put_writes``,
    one on the run registry alone a lease claim/release (``lease``), a read a
    ``get_tuple``; ``commitTransaction`` counts for what its transaction wrote. Also
    sums the BSON bytes of the replies."""

    def __init__(self, checkpoints: str, writes: str) -> None:
        self.checkpoints = checkpoints
        self.writes = writes
        self.counts: Counter[str] = Counter()
        self.by_purpose: Counter[str] = Counter()
        self.reply_bytes = 0
        self.enabled = False
        self._txn: dict[Any, str] = {}
        self._lock = threading.Lock()

    def _purpose(self, name: str, cmd: dict[str, Any]) -> str:
        if name == "bulkWrite":
            namespaces = {ns["ns"].split(".", 1)[1] for ns in cmd.get("nsInfo", ())}
        elif name in ("update", "insert", "delete", "findAndModify"):
            namespaces = {cmd.get(name)}
        elif name in ("find", "aggregate", "getMore", "count"):
            return "get_tuple"
        else:
            return "other"
        if self.checkpoints in namespaces:
            return "put"
        if self.writes in namespaces:
            return "put_writes"
        if namespaces == {"runs"}:
            return "lease"
        return "other"

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if not self.enabled:
            return
        cmd = event.command
        lsid = str(cmd.get("lsid"))
        with self._lock:
            self.counts[event.command_name] += 1
            if event.command_name in ("commitTransaction", "abortTransaction"):
                purpose = self._txn.pop(lsid, "other")
            else:
                purpose = self._purpose(event.command_name, cmd)
                if cmd.get("autocommit") is False:
                    self._txn[lsid] = purpose
            self.by_purpose[purpose] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if self.enabled:
            size = len(bson.encode(event.reply))
            with self._lock:
                self.reply_bytes += size

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


class LoopThread:
    """An event loop in a daemon thread: AsyncAccordSaver's home in this benchmark."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=600)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


class AsyncGraph:
    """``invoke`` of a graph compiled with AsyncAccordSaver: ``ainvoke`` on its loop."""

    def __init__(self, graph: Any, home: LoopThread) -> None:
        self.graph = graph
        self.home = home

    def invoke(self, inputs: Any, config: Any) -> Any:
        return self.home.run(self.graph.ainvoke(inputs, config))


def mongo_bytes(client: MongoClient, db_name: str) -> dict[str, int]:
    """BSON bytes of every document, per collection of ``db_name``."""
    db = client.get_database(db_name, codec_options=CodecOptions(document_class=RawBSONDocument))
    sizes = {}
    for name in sorted(db.list_collection_names()):
        sizes[name] = sum(len(doc.raw) for doc in db[name].find({}, batch_size=10_000))
    return sizes


def memory_bytes(saver: InMemorySaver) -> dict[str, int]:
    """Bytes of the serialized payloads InMemorySaver keeps (checkpoints, blobs, writes)."""
    checkpoints = sum(
        len(ckpt) + len(meta)
        for namespaces in saver.storage.values()
        for stored in namespaces.values()
        for (_, ckpt), (_, meta), _parent in stored.values()
    )
    blobs = sum(len(blob) for _type, blob in saver.blobs.values())
    writes = sum(
        len(value)
        for task_writes in saver.writes.values()
        for _task, _channel, (_, value), _path in task_writes.values()
    )
    return {"checkpoints": checkpoints, "blobs": blobs, "writes": writes}


@dataclass
class Run:
    name: str
    saver: BaseCheckpointSaver | None
    measure_bytes: Callable[[], dict[str, int]]
    counter: CommandCounter | None = None
    graph: Any = None
    latencies: list[float] = field(default_factory=list)
    bytes_at: dict[int, dict[str, int]] = field(default_factory=dict)
    checkpoints: int = 0
    error: str | None = None
    failed_turn: int | None = None


def start_engine(tmp: str, *, fsync: bool = False) -> tuple[subprocess.Popen[bytes], int]:
    cmd = [sys.executable, "-m", "accord.platform.embedded", "--dbpath", tmp, "--port", "0"]
    if not fsync:
        cmd.append("--no-sync")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    proc.stdout.readline()
    found = read_lock(Path(tmp))
    assert found, "engine did not start"
    return proc, found[1]


def run_all(
    turns: int = TURNS, *, fsync: bool = False, business: bool = False
) -> tuple[list[Run], dict[str, Any]]:
    """Every saver, turn by turn. ``fsync``: the engine's default durability (every commit
    fsynced) instead of ``--no-sync``; ``business``: each turn's node writes one business
    record (users' workload)."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_engine(tmp, fsync=fsync)
        uri = f"mongodb://127.0.0.1:{port}/?replicaSet=accord"
        clients: list[MongoClient] = []
        aclients: list[AsyncMongoClient[Any]] = []
        home: LoopThread | None = None

        def client_with(counter: CommandCounter | None) -> MongoClient:
            c: MongoClient = MongoClient(uri, event_listeners=[counter] if counter else [])
            clients.append(c)
            return c

        try:
            plain = client_with(None)  # for byte scans, not counted
            runs: list[Run] = []

            memory = InMemorySaver()
            runs.append(Run("InMemorySaver", memory, lambda: memory_bytes(memory)))

            mongo_counter = CommandCounter("checkpoints", "checkpoint_writes")
            mongo = MongoDBSaver(client_with(mongo_counter), db_name="bench_mongodbsaver")
            runs.append(
                Run(
                    "MongoDBSaver",
                    mongo,
                    lambda: mongo_bytes(plain, "bench_mongodbsaver"),
                    mongo_counter,
                )
            )

            accord_counter = CommandCounter(ACCORD.checkpoints, ACCORD.writes)
            accord_run = Run(
                "AccordSaver",
                None,
                lambda: mongo_bytes(plain, "bench_accord"),
                accord_counter,
            )
            try:
                accord_run.saver = AccordSaver(client_with(accord_counter), db_name="bench_accord")
                accord_run.saver.setup()
            except Exception:
                accord_run.error = traceback.format_exc(limit=-8)
                accord_run.failed_turn = 0
            runs.append(accord_run)

            home = LoopThread()
            async_counter = CommandCounter(ACCORD.checkpoints, ACCORD.writes)
            async_run = Run(
                "AsyncAccordSaver",
                None,
                lambda: mongo_bytes(plain, "bench_accord_async"),
                async_counter,
            )

            async def start_async() -> AsyncAccordSaver:
                aclient: AsyncMongoClient[Any] = AsyncMongoClient(
                    uri, event_listeners=[async_counter]
                )
                aclients.append(aclient)
                saver = AsyncAccordSaver(aclient, db_name="bench_accord_async")
                await saver.setup()
                return saver

            try:
                async_run.saver = home.run(start_async())
            except Exception:
                async_run.error = traceback.format_exc(limit=-8)
                async_run.failed_turn = 0
            runs.append(async_run)

            writers: dict[str, Callable[[int], None] | None] = {r.name: None for r in runs}
            if business:
                memory_orders = plain["bench_memory"]["orders"]
                mongo_orders = mongo.client["bench_mongodbsaver"]["orders"]
                writers = {
                    "InMemorySaver": lambda n: memory_orders.insert_one(order(n)) and None,
                    "MongoDBSaver": lambda n: mongo_orders.insert_one(order(n)) and None,
                    "AccordSaver": lambda n: accord_business.insert_one("orders", order(n)),
                    "AsyncAccordSaver": lambda n: accord_business.insert_one("orders", order(n)),
                }
            for run in runs:
                if run.error or run.saver is None:
                    continue
                run.graph = build_graph(writers[run.name]).compile(checkpointer=run.saver)
                if isinstance(run.saver, AsyncAccordSaver):
                    run.graph = AsyncGraph(run.graph, home)
                if run.counter:
                    run.counter.enabled = True  # setup/index creation is not counted

            started = time.perf_counter()
            for n in range(1, turns + 1):
                expected: list[tuple[str, str]] | None = None  # InMemorySaver's messages
                for run in runs:
                    if run.error:
                        continue
                    t0 = time.perf_counter()
                    try:
                        out = run.graph.invoke(human(n), THREAD)
                        took = time.perf_counter() - t0
                        got = [(m.id, m.content) for m in out["messages"]]
                        assert len(got) == 2 * n, f"{len(got)} messages after turn {n}"
                        assert out["turns"] == n, f"turns={out['turns']} after turn {n}"
                        if expected is None:
                            expected = got
                        assert got == expected, f"messages differ from InMemorySaver at turn {n}"
                    except Exception:
                        run.error = traceback.format_exc(limit=-8)
                        run.failed_turn = n
                        continue
                    run.latencies.append(took)
                if n in SNAPSHOTS:
                    for run in runs:
                        if not run.error:
                            run.bytes_at[n] = run.measure_bytes()
            elapsed = time.perf_counter() - started
            for run in runs:
                if run.counter:
                    run.counter.enabled = False
                if not run.error:
                    try:
                        if isinstance(run.saver, AsyncAccordSaver):
                            assert home is not None
                            run.checkpoints = home.run(_count(run.saver))
                        else:
                            run.checkpoints = sum(1 for _ in run.saver.list(THREAD))
                    except Exception:
                        run.error = traceback.format_exc(limit=-8)
                        run.failed_turn = turns
            hello = plain.admin.command("hello")
            info = {"elapsed": elapsed, "maxWireVersion": hello.get("maxWireVersion")}
            if business:  # every saver wrote each turn's record exactly once
                for run, db in (("MongoDBSaver", "bench_mongodbsaver"),
                                ("AccordSaver", "bench_accord"),
                                ("AsyncAccordSaver", "bench_accord_async")):  # fmt: skip
                    found = plain[db]["orders"].count_documents({})
                    info[f"orders:{run}"] = found
            return runs, info
        finally:
            for c in clients:
                c.close()
            if home is not None:
                for ac in aclients:
                    home.run(ac.close())
                home.close()
            proc.terminate()
            proc.wait()


async def _count(saver: AsyncAccordSaver) -> int:
    return len([t async for t in saver.alist(THREAD)])


# --- get_tuple on long threads --------------------------------------------------------------

SCALING = (10, 5000)


def _fill(saver: Any, thread: str, n: int) -> None:
    """``n`` chained checkpoints of a state of constant size, through ``put``."""
    from langgraph.checkpoint.base import empty_checkpoint

    parent: str | None = None
    version: Any = None
    for i in range(n):
        version = saver.get_next_version(version, None)
        cp = empty_checkpoint()
        cp["channel_values"] = {"counter": i, "note": "x" * 200}
        cp["channel_versions"] = {"counter": version, "note": version}
        conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
        if parent:
            conf["checkpoint_id"] = parent
        saver.put(
            {"configurable": conf},
            cp,
            {"source": "loop", "step": i},
            {"counter": version, "note": version},
        )
        parent = cp["id"]


def scaling() -> list[tuple[str, int, str, int, int]]:
    """(saver, checkpoints, cold/warm, commands, reply bytes) of one latest ``get_tuple``."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_engine(tmp)
        uri = f"mongodb://127.0.0.1:{port}/?replicaSet=accord"
        plain: MongoClient = MongoClient(uri)
        try:
            for name, make, names in (
                ("AccordSaver", lambda c: AccordSaver(c, db_name="scale_accord"), ACCORD),
                (
                    "MongoDBSaver",
                    lambda c: MongoDBSaver(c, db_name="scale_mongodbsaver"),
                    CollectionNames(checkpoints="checkpoints", writes="checkpoint_writes"),
                ),
            ):
                writer = make(plain)
                if hasattr(writer, "setup"):
                    writer.setup()
                for n in SCALING:
                    _fill(writer, f"t{n}", n)
                counter = CommandCounter(names.checkpoints, names.writes)
                reader_client: MongoClient = MongoClient(uri, event_listeners=[counter])
                reader = make(reader_client)
                for n in SCALING:
                    cfg = {"configurable": {"thread_id": f"t{n}"}}
                    for phase in ("cold", "warm"):
                        counter.counts.clear()
                        counter.reply_bytes = 0
                        counter.enabled = True
                        tup = reader.get_tuple(cfg)
                        counter.enabled = False
                        assert (
                            tup is not None and tup.checkpoint["channel_values"]["counter"] == n - 1
                        )
                        out.append(
                            (name, n, phase, sum(counter.counts.values()), counter.reply_bytes)
                        )
                reader_client.close()
        finally:
            plain.close()
            proc.terminate()
            proc.wait()
    return out


# --- report --------------------------------------------------------------------------------


def _kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:,.0f}"


def report(turns: int = TURNS) -> str:
    """Both workloads: the users' (fsync, a business write per turn), then the engine's
    write path alone (``--no-sync``, no business write)."""
    return users_workload(turns) + "\n" + write_path(turns)


#: Issue 20's target on the users' workload: median time per invoke vs MongoDBSaver's.
USERS_TARGET = 0.9


def users_workload(turns: int = TURNS) -> str:
    """The workload users run: the engine's default durability (every commit fsynced)
    and one business write per turn (MongoDBSaver's node writes it with ``insert_one``,
    accord's with ``business.insert_one``)."""
    runs, info = run_all(turns, fsync=True, business=True)
    by = {r.name: r for r in runs}
    mdb = by["MongoDBSaver"]
    lines = [
        "### LangGraph checkpointers on the users' workload: fsync on, one business write per turn",
        "",
        "Run with `make bench`; this section alone: `.venv/bin/python -m benchmarks.checkpointer`. "
        "The embedded engine with its default durability (every commit fsynced before it is "
        "acknowledged), the graph of the next section, and each turn's node writes one "
        "business record (an order of ~80 bytes): MongoDBSaver's node with `insert_one` on "
        "the application's client (as its users do today), accord's with "
        "`business.insert_one` (committed with the step, exactly once). "
        f"{turns} turns on one thread, interleaved across the savers, LangGraph's default "
        f"durability (`async`). Wall time: {info['elapsed']:.0f} s.",
        "",
        "| saver | median ms | p90 ms | vs MongoDBSaver | commands / invoke | transactions / invoke | orders written |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    mdb_med = statistics.median(mdb.latencies[WARMUP:]) if not mdb.error else None
    for r in runs:
        if r.error or len(r.latencies) <= WARMUP:
            lines.append(f"| {r.name} | error | | | | | |")
            continue
        lat = sorted(r.latencies[WARMUP:])
        med = statistics.median(lat)
        p90 = lat[int(len(lat) * 0.9) - 1]
        cmds = sum(r.counter.counts.values()) / turns if r.counter else 0.0
        txns = r.counter.counts["commitTransaction"] / turns if r.counter else 0.0
        orders = info.get(f"orders:{r.name}", "-")
        vs = f"{med / mdb_med:.2f}x" if mdb_med else "-"
        lines.append(
            f"| {r.name} | {med * 1000:.2f} | {p90 * 1000:.2f} | {vs} | {cmds:.2f} | "
            f"{txns:.2f} | {orders} |"
        )
    lines += ["", *kernel_cost(), "", "**Targets** (issue 20, this run):", "",
              "| saver | target | measured | met |", "| --- | --- | ---: | --- |"]  # fmt: skip
    for r in runs:
        if r.name not in ("AccordSaver", "AsyncAccordSaver"):
            continue
        if r.error or mdb_med is None:
            lines.append(f"| {r.name} | <= {USERS_TARGET}x MongoDBSaver | error | **no** |")
            continue
        ratio = statistics.median(r.latencies[WARMUP:]) / mdb_med
        met = "yes" if ratio <= USERS_TARGET else "**no**"
        lines.append(
            f"| {r.name} | median time per invoke <= {USERS_TARGET}x MongoDBSaver's | "
            f"{ratio:.2f}x | {met} |"
        )
    return "\n".join(lines) + "\n"


def step_plans(principal: Any) -> list[Any]:
    """A step's two plans as the saver builds them, acting as ``principal``: a checkpoint
    put with two changed channels and two messages, and a task's writes with one business
    insert (in-process cost benchmarks: this one's and governance_policy's)."""
    from accord.checkpointers import plans, schema, storage
    from accord.checkpointers.storage import Scope
    from accord.platform import hosts, runs
    from accord.platform.plan import Op, insert_once

    target = plans.Target("bench", schema.CollectionNames(), "bench")
    scope = Scope("default", "t", "")
    at = runs.now()
    lease = runs.Lease("default", "t", "r", 1, hosts.current().fields()["holder"], at, None)
    guard = runs.ThreadGuard("bench", "runs", "owner", "default", "t", "v", at, lease=lease)
    docs = storage.PutDocs(
        checkpoint=insert_once({"_id": "c", "tenant_id": "default", "thread_id": "t"}),
        blobs=[insert_once({"_id": f"b{i}", "tenant_id": "default"}) for i in range(2)],
        messages=[insert_once({"_id": f"m{i}", "tenant_id": "default"}) for i in range(2)],
        message_keys=["m0", "m1"],
        entry=None,
    )
    put = plans.put_plan(target, scope, guard, docs, "c", run=lease)
    writes = plans.writes_plan(
        target, scope, None, storage.WriteDocs(
            ops=[insert_once({"_id": "w", "tenant_id": "default"})],
            marks=[Op("insert", doc={"_id": "mark", "tenant_id": "default"})],
            kept=[], overwrite=False),
        "c", "task", run=lease,
        business=[{"op": "insert_one", "collection": "orders",
                   "document": {"_id": "o", "tenant_id": "default"}}],
    )  # fmt: skip
    for plan in (put, writes):
        plan.context = plan.context.with_principal(principal)  # as the kernel does
    return [put, writes]


def kernel_cost(rounds: int = 2000) -> list[str]:
    """The kernel's own CPU per step, in this process: the contexts and the check and
    derive phases of a step's two plans (:func:`step_plans`), and its run guard. The
    database round trips are what the tables above measure."""
    from accord import runtime

    uow = runtime.kernel(MongoClient("mongodb://127.0.0.1:9/?directConnection=true",
                                     connect=False))  # fmt: skip

    def step() -> None:
        for plan in step_plans(uow.principal):
            for hook in uow.hooks.check:
                hook.check(plan)
            for hook in uow.hooks.derive:
                hook.derive(plan)
            if plan.context.guard is not None:
                plan.context.guard.group()

    step()
    started = time.perf_counter()
    for _ in range(rounds):
        step()
    per_step = (time.perf_counter() - started) / rounds
    checks = ", ".join(h.name for h in uow.hooks.check)
    derives = ", ".join(h.name for h in uow.hooks.derive)
    seals = ", ".join(h.name for h in uow.hooks.seal)
    uow.client.close()
    return [
        f"**The kernel's own cost per step** (in process, {rounds:,} steps, no I/O): "
        f"{per_step * 1e6:.0f} us to build a step's two plans with their contexts and run "
        f"its check ({checks}) and derive ({derives}) phases and build its run guard. The "
        f"seal phase ({seals}) adds nothing to a step that appends no workflow event and "
        "stages no business write; the undo log adds one document per business write (and "
        "a read per update, replace or delete: `python -m benchmarks.undo_cost`); "
        "governance's audit, when on, adds its records there."
    ]


def write_path(turns: int = TURNS) -> str:
    runs, info = run_all(turns)
    by = {r.name: r for r in runs}
    ok = [r for r in runs if not r.error]
    ref_steps = by["InMemorySaver"].checkpoints / turns if not by["InMemorySaver"].error else 0

    lines = [
        "### LangGraph checkpointers: accord vs MongoDBSaver vs InMemorySaver",
        "",
        "Run with `make bench` (= `.venv/bin/python -m benchmarks`); this section alone: "
        "`.venv/bin/python -m benchmarks.checkpointer`.",
        "",
        f"One embedded engine process (`--no-sync`), one database and one `MongoClient` per "
        f"saver. Graph: `START -> fake_model -> END` over a `messages` channel (`add_messages`) "
        f"and an int `turns` channel; each turn is one `graph.invoke` with one `HumanMessage`, "
        f"and the deterministic `fake_model` node appends one {REPLY_CHARS}-char `AIMessage`. "
        f"{turns} turns on one thread, interleaved across the savers, LangGraph's default "
        f"durability (`async`). Each invoke writes {ref_steps:.0f} checkpoints "
        f"(super-steps: input, `__start__`, `fake_model`). Wall time of the measured turns: "
        f"{info['elapsed']:.0f} s. Engine maxWireVersion {info['maxWireVersion']}.",
        "",
        "**Round trips** (MongoDB commands started per `invoke`, mean over all turns; "
        "InMemorySaver makes none):",
        "",
    ]
    names = sorted(
        {c for r in ok if r.counter for c in r.counter.counts},
        key=lambda c: -max(r.counter.counts[c] for r in ok if r.counter),
    )
    lines.append("| saver | total / invoke | per super-step | " + " | ".join(names) + " |")
    lines.append("| --- | ---: | ---: |" + " ---: |" * len(names))
    for r in runs:
        if r.error:
            lines.append(f"| {r.name} | error | | " + " | ".join("" for _ in names) + " |")
            continue
        if r.counter is None:
            lines.append(f"| {r.name} | 0 | 0 | " + " | ".join("0" for _ in names) + " |")
            continue
        total = sum(r.counter.counts.values()) / turns
        per_step = total / ref_steps if ref_steps else float("nan")
        cells = " | ".join(f"{r.counter.counts[c] / turns:.2f}" for c in names)
        lines.append(f"| {r.name} | {total:.2f} | {per_step:.2f} | {cells} |")

    mem = by["InMemorySaver"].saver
    tasks = (
        len({(k, task) for k, ws in mem.writes.items() for task, _ in ws})  # type: ignore[union-attr]
        if not by["InMemorySaver"].error
        else 0
    )
    calls = {"get_tuple": 1.0, "put": ref_steps, "put_writes": tasks / turns, "lease": 1.0}
    lines += [
        "",
        f"The same commands by what they were sent for (a write touching the checkpoints "
        f"collection: a `put`, with the task writes that share its transaction, as accord's "
        f'queued saves do under "async" durability; pending writes alone: a `put_writes`; '
        f"the run registry alone: the run's lease claim and release; a read: a `get_tuple`; "
        f"a `commitTransaction` counts for its transaction), per `invoke` and per call "
        f"(LangGraph makes "
        f"{calls['put']:.0f} `put`s, {calls['put_writes']:.0f} `put_writes` and 1 `get_tuple` "
        f"per invoke), and the bytes of the replies read per `invoke`:",
        "",
        "| saver | `get_tuple` cmds | `put` cmds | per `put` | `put_writes` cmds | per `put_writes` | lease cmds | other | KiB read / invoke |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in ok:
        if r.counter is None:
            continue
        p = {k: r.counter.by_purpose[k] / turns for k in (*PURPOSES, "other")}
        per_put = p["put"] / calls["put"] if calls["put"] else float("nan")
        per_writes = p["put_writes"] / calls["put_writes"] if calls["put_writes"] else float("nan")
        lines.append(
            f"| {r.name} | {p['get_tuple']:.2f} | {p['put']:.2f} | {per_put:.2f} | "
            f"{p['put_writes']:.2f} | {per_writes:.2f} | {p['lease']:.2f} | {p['other']:.2f} | "
            f"{r.counter.reply_bytes / turns / 1024:.1f} |"
        )

    lines += [
        "",
        f"**Step latency** (wall time of one `invoke`; first {WARMUP} turns left out; "
        f"the last column is the median of the last 50 turns, where history is longest):",
        "",
        "| saver | median ms | p90 ms | vs InMemorySaver | vs MongoDBSaver | median ms, last 50 turns |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]

    def median(r: Run) -> float:
        return statistics.median(r.latencies[WARMUP:])

    mem_med = median(by["InMemorySaver"]) if not by["InMemorySaver"].error else None
    mdb_med = median(by["MongoDBSaver"]) if not by["MongoDBSaver"].error else None
    for r in runs:
        if r.error or len(r.latencies) <= WARMUP:
            lines.append(f"| {r.name} | error | | | | |")
            continue
        med = median(r)
        lat = sorted(r.latencies[WARMUP:])
        p90 = lat[int(len(lat) * 0.9) - 1]
        vs_mem = f"{med / mem_med:.1f}x" if mem_med else "-"
        vs_mdb = f"{med / mdb_med:.2f}x" if mdb_med else "-"
        tail = statistics.median(r.latencies[-50:])
        lines.append(
            f"| {r.name} | {med * 1000:.2f} | {p90 * 1000:.2f} | {vs_mem} | {vs_mdb} | "
            f"{tail * 1000:.2f} |"
        )

    s0, s1, s2 = SNAPSHOTS
    lines += [
        "",
        "**Bytes stored** on one thread (Mongo savers: sum of the BSON sizes of every "
        "document in the saver's collections, indexes excluded; InMemorySaver: bytes of the "
        "serialized checkpoints, blobs and writes it keeps). O(n) storage doubles when the "
        f"turns double; O(n^2) quadruples. Checkpoints after {turns} turns in the last column.",
        "",
        f"| saver | KiB @ {s0} | KiB @ {s1} | KiB @ {s2} | x {s0}->{s1} | x {s1}->{s2} | "
        f"bytes / turn ({s1}->{s2}) | checkpoints |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        b = {n: sum(sizes.values()) for n, sizes in r.bytes_at.items()}
        g1 = f"{b[s1] / b[s0]:.2f}" if s0 in b and s1 in b else "-"
        g2 = f"{b[s2] / b[s1]:.2f}" if s1 in b and s2 in b else "-"
        marginal = f"{(b[s2] - b[s1]) / (s2 - s1):,.0f}" if s1 in b and s2 in b else "-"
        lines.append(
            f"| {r.name} | {_kib(b.get(s0))} | {_kib(b.get(s1))} | {_kib(b.get(s2))} | "
            f"{g1} | {g2} | {marginal} | {r.checkpoints if not r.error else '-'} |"
        )

    lines += [
        "",
        "By collection (InMemorySaver: by structure):",
        "",
        f"| saver | collection | KiB @ {s0} | KiB @ {s1} | KiB @ {s2} | x {s1}->{s2} |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        colls = sorted({c for sizes in r.bytes_at.values() for c in sizes})
        for c in colls:
            at = {n: sizes.get(c, 0) for n, sizes in r.bytes_at.items()}
            g2 = f"{at[s2] / at[s1]:.2f}" if at.get(s1) and s2 in at else "-"
            lines.append(
                f"| {r.name} | `{c}` | {_kib(at.get(s0))} | {_kib(at.get(s1))} | "
                f"{_kib(at.get(s2))} | {g2} |"
            )

    rows = scaling()
    lines += [
        "",
        f"**`get_tuple` of the latest checkpoint** on threads of {SCALING[0]:,} and "
        f"{SCALING[1]:,} checkpoints (a state of constant size: an int and a 200-char "
        "string, written through `put`), read by a saver that never saw the thread "
        "(cold), then again (warm): commands and reply bytes.",
        "",
        "| saver | checkpoints | read | commands | bytes read |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    for name, n, phase, cmds, size in rows:
        lines.append(f"| {name} | {n:,} | {phase} | {cmds} | {size:,} |")

    lines += ["", *targets(runs, calls, rows)]

    for r in runs:
        if r.error:
            lines += [
                "",
                f"**{r.name} failed "
                f"{'in setup' if r.failed_turn == 0 else f'at turn {r.failed_turn}'}** "
                "(repro: `.venv/bin/python -m benchmarks.checkpointer`):",
                "",
                "```",
                r.error.rstrip(),
                "```",
            ]
    return "\n".join(lines) + "\n"


def targets(
    runs: list[Run], calls: dict[str, float], rows: list[tuple[str, int, str, int, int]]
) -> list[str]:
    """Issue 6's targets for the accord savers, each with its measured value."""
    by = {r.name: r for r in runs}
    mdb = by["MongoDBSaver"]
    if mdb.error or mdb.counter is None:
        return ["(targets not computed: MongoDBSaver failed)"]
    turns = len(mdb.latencies)
    mdb_med = statistics.median(mdb.latencies[WARMUP:])
    mdb_read = mdb.counter.reply_bytes / turns
    out = [
        "**Targets** (issue 6; measured in this run; `get_tuple` from the table above, "
        f"cold reads at {SCALING[0]:,} vs {SCALING[1]:,} checkpoints):",
        "",
        "| saver | target | measured | met |",
        "| --- | --- | ---: | --- |",
    ]

    def row(name: str, target: str, measured: str, met: bool) -> None:
        out.append(f"| {name} | {target} | {measured} | {'yes' if met else '**no**'} |")

    for r in runs:
        if r.error or r.counter is None or r.name == "MongoDBSaver":
            continue
        ratio = statistics.median(r.latencies[WARMUP:]) / mdb_med
        row(r.name, "median time per invoke <= 1.0x MongoDBSaver", f"{ratio:.2f}x", ratio <= 1.0)
        # a transaction may hold several calls (accord's queued saves): their commands
        # over their calls
        saves = calls["put"] + calls["put_writes"]
        per = (r.counter.by_purpose["put"] + r.counter.by_purpose["put_writes"]) / turns / saves
        row(
            r.name,
            "round trips per `put` and per `put_writes` <= 2 (their commands / their calls)",
            f"{per:.2f}",
            per <= 2.0,
        )
        read = r.counter.reply_bytes / turns
        row(
            r.name,
            "bytes read per invoke <= MongoDBSaver's",
            f"{read / 1024:.1f} KiB vs {mdb_read / 1024:.1f} KiB",
            read <= mdb_read,
        )
    cold = {n: (cmds, size) for name, n, phase, cmds, size in rows
            if name == "AccordSaver" and phase == "cold"}  # fmt: skip
    if len(cold) == 2:
        (c0, b0), (c1, b1) = cold[SCALING[0]], cold[SCALING[1]]
        row(
            "AccordSaver",
            "`get_tuple` (latest): same reads and bytes (within 1%) at "
            f"{SCALING[0]:,} and {SCALING[1]:,} checkpoints",
            f"{c0} / {c1} commands, {b0:,} / {b1:,} bytes",
            c0 == c1 and abs(b1 - b0) <= 0.01 * b0,
        )
    return out


if __name__ == "__main__":
    print(report(int(sys.argv[1]) if len(sys.argv) > 1 else TURNS))
