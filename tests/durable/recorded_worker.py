"""Child process of the recorded-calls crash tests (``test_recorded_crash.py``).

Run as ``python tests/durable/recorded_worker.py --uri ... --db ... --thread ... --dir ...``.
It drives a real LangGraph graph, ``pay -> confirm``, compiled with an accord saver
(``--saver sync``: ``AccordSaver`` and ``invoke``; ``async``: ``AsyncAccordSaver`` and
``ainvoke``). ``pay`` asks a fake model for a decision, a transfer with a NEW random id on
every call (the nondeterminism that makes a restored agent re-synthesize its tool calls,
ACRFence), then charges a fake bank with it; both are recorded calls. ``confirm`` stages a
business write.

The fakes keep their books in files of ``--dir`` (they are the outside world: they
survive the worker's death): ``model.jsonl`` gets a line per model call, ``bank.jsonl``
a line per charge request (``charged``: whether money moved; an idempotent bank does not
move it twice for one key).

``--kill`` makes the worker SIGKILL itself (first run only; the resuming run is started
without it):

* ``after_charge``: the bank call returned (and its result was recorded), before ``pay``
  returned: the task's writes and the next checkpoint were never saved;
* ``mid_charge``: inside the bank call, after the bank moved the money, before it
  returned: the call has an intent and no result.

``--kill-at POINT:N`` makes the worker SIGKILL itself at the N-th occurrence of a named
fault point (the fault-point suite, ``test_fault_points.py``): ``node_start`` (F1: ``pay``
began), ``after_charge`` (F2: the bank call returned, before ``pay`` returned),
``put_writes_after`` (F3: the task's writes were handed to the saver, before the next
``put``), ``commit_start`` (F4: inside a transaction, ``commitTransaction`` about to be
sent), ``carry_start`` (a bundle migration's state update committed, the carry-over of
the paused task's recorded calls about to be written). ``--lease S``: the saver's lease (the zombie test pauses a worker past it).

``--hold-charge N``: this process's N-th bank request, once the money moved, waits until
a file ``go`` exists in ``--dir`` (the zombie test pauses the worker there, whatever the
machine's speed). ``--steps N``: ``pay`` runs N times (one decision, one charge and one business write
each) before ``confirm``; ``--pause S`` sleeps S seconds inside each fake call (wider
windows for the random kills of ``test_random_kills``); ``--lsid-file``: every session
that starts a transaction is appended to it, so the parent can end a killed worker's
open transaction (``killSessions``) as a supervisor would.

The model call is declared idempotent: asking a model again when no answer was recorded
is harmless (the answer never reached anything); an answer once recorded is replayed.
``--idempotent``: the bank call is declared idempotent and the bank dedupes on the
key it is given. ``--bundle VERSION``: the graph runs through ``PinnedGraph`` on that
bundle (``--migrate``: with a migration from v1 to it, which marks the state). The outcome is printed as one JSON line: the final state, or the error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TypedDict

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bson import json_util  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from pymongo import AsyncMongoClient, MongoClient, monitoring  # noqa: E402

from accord.checkpointers import AccordSaver, AsyncAccordSaver, business  # noqa: E402
from accord.checkpointers.bundles import PinnedGraph  # noqa: E402
from accord.checkpointers.recorded import recorded  # noqa: E402
from accord.errors import AccordError  # noqa: E402
from accord.platform.bundles import Bundle, Migrations  # noqa: E402


class State(TypedDict, total=False):
    count: int
    account: str
    transfer_id: str
    receipt: str
    confirmed: bool
    migrated: bool


#: seconds each fake call sleeps (``--pause``)
PAUSE = [0.0]
FAULT_POINTS = ("node_start", "after_charge", "put_writes_after", "commit_start", "carry_start")


class KillSwitch:
    """SIGKILLs this process at the n-th occurrence of one fault point (``point:n``)."""

    def __init__(self, spec: str | None) -> None:
        self.point, self.n, self.count = None, 0, 0
        if spec:
            point, _, n = spec.partition(":")
            if point not in FAULT_POINTS:
                raise SystemExit(f"unknown fault point {point!r}")
            self.point, self.n = point, int(n or 1)

    def hit(self, point: str) -> None:
        if point == self.point:
            self.count += 1
            if self.count == self.n:
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(60)  # never reached


SWITCH = KillSwitch(None)


def _append(path: Path, entry: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class FakeModel:
    """A nondeterministic fake model: a new random transfer id on every call."""

    def __init__(self, books: Path) -> None:
        self.books = books

    def decide(self, account: str) -> dict[str, Any]:
        time.sleep(PAUSE[0])
        decision = {"transfer_id": uuid.uuid4().hex, "cents": 50_000, "account": account}
        _append(self.books, decision)
        return decision


class FakeBank:
    """A counter-backed fake bank: every request is booked; money moves once per
    request, or once per idempotency key when ``dedupe`` (the provider side of an
    idempotent call)."""

    def __init__(self, books: Path, *, dedupe: bool, kill_mid: bool, hold: int = 0) -> None:
        self.books = books
        self.dedupe = dedupe
        self.kill_mid = kill_mid
        self.hold = hold  # the request (1, 2, ...) that waits for the file ``go``
        self.requests = 0

    def charge(self, account: str, cents: int, transfer_id: str, key: str | None) -> str:
        time.sleep(PAUSE[0])
        seen = {e["key"] for e in _lines(self.books) if e["charged"] and e["key"]}
        charged = not (self.dedupe and key in seen)
        _append(self.books, {"account": account, "cents": cents, "transfer_id": transfer_id,
                             "key": key, "charged": charged})  # fmt: skip
        if self.kill_mid:
            os.kill(os.getpid(), signal.SIGKILL)
        self.requests += 1
        if self.requests == self.hold:
            go = self.books.with_name("go")
            while not go.exists():
                time.sleep(0.01)
        time.sleep(PAUSE[0])
        return f"receipt-{key or transfer_id}"


def build(saver: Any, args: argparse.Namespace) -> Any:
    books = Path(args.dir)
    model = FakeModel(books / "model.jsonl")
    bank = FakeBank(books / "bank.jsonl", dedupe=args.idempotent,
                    kill_mid=args.kill == "mid_charge", hold=args.hold_charge)  # fmt: skip

    if args.saver == "sync":

        @recorded(name="model.decide", idempotent=True)
        def decide(account: str) -> dict[str, Any]:
            return model.decide(account)

        @recorded(name="bank.charge", idempotent=args.idempotent)
        def charge(account: str, cents: int, transfer_id: str, **kw: Any) -> str:
            return bank.charge(account, cents, transfer_id, kw.get("idempotency_key"))

        def pay(state: State) -> State:
            SWITCH.hit("node_start")
            decision = decide(state["account"])
            receipt = charge(state["account"], decision["cents"], decision["transfer_id"])
            SWITCH.hit("after_charge")
            if args.kill == "after_charge":
                os.kill(os.getpid(), signal.SIGKILL)
            business.insert_one("charges", {"_id": decision["transfer_id"], "receipt": receipt})
            return {"transfer_id": decision["transfer_id"], "receipt": receipt,
                    "count": state.get("count", 0) + 1}  # fmt: skip

        pay_node: Any = pay
    else:

        @recorded(name="model.decide", idempotent=True)
        async def adecide(account: str) -> dict[str, Any]:
            return model.decide(account)

        @recorded(name="bank.charge", idempotent=args.idempotent)
        async def acharge(account: str, cents: int, transfer_id: str, **kw: Any) -> str:
            return bank.charge(account, cents, transfer_id, kw.get("idempotency_key"))

        async def apay(state: State) -> State:
            SWITCH.hit("node_start")
            decision = await adecide(state["account"])
            receipt = await acharge(state["account"], decision["cents"], decision["transfer_id"])
            SWITCH.hit("after_charge")
            if args.kill == "after_charge":
                os.kill(os.getpid(), signal.SIGKILL)
            business.insert_one("charges", {"_id": decision["transfer_id"], "receipt": receipt})
            return {"transfer_id": decision["transfer_id"], "receipt": receipt,
                    "count": state.get("count", 0) + 1}  # fmt: skip

        pay_node = apay

    def confirm(state: State) -> State:
        business.insert_one("transfers", {"_id": state["transfer_id"], "receipt": state["receipt"]})
        return {"confirmed": True}

    g = StateGraph(State)
    g.add_node("pay", pay_node)
    g.add_node("confirm", confirm)
    g.add_edge(START, "pay")
    g.add_conditional_edges(
        "pay", lambda s: "pay" if s.get("count", 0) < args.steps else "confirm", ["pay", "confirm"]
    )
    g.add_edge("confirm", END)
    graph = g.compile(checkpointer=saver)
    if args.bundle is None:
        return graph
    migrations = Migrations()
    if args.migrate:
        migrations.register("v1", args.bundle)(lambda values: {"migrated": True})
    bundle = Bundle(args.bundle, models={"chat": f"model-{args.bundle}"})
    return PinnedGraph(graph, bundle, migrations=migrations)


class SessionLog(monitoring.CommandListener):
    """Appends the session of every transaction this worker starts to a file (before the
    command leaves the process), and fires the ``commit_start`` fault point."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.seen: set[str] = set()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "commitTransaction":
            SWITCH.hit("commit_start")
        if self.path and event.command.get("startTransaction") and "lsid" in event.command:
            line = json_util.dumps(event.command["lsid"])
            if line not in self.seen:
                self.seen.add(line)
                with open(self.path, "a") as f:
                    f.write(line + "\n")

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def _listeners(args: argparse.Namespace) -> list[Any]:
    return [SessionLog(args.lsid_file)]


class KillingSaver(AccordSaver):
    """AccordSaver with the ``put_writes_after`` fault point."""

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        super().put_writes(config, writes, task_id, task_path)
        SWITCH.hit("put_writes_after")


class AsyncKillingSaver(AsyncAccordSaver):
    """AsyncAccordSaver with the ``put_writes_after`` fault point."""

    async def aput_writes(
        self, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:
        await super().aput_writes(config, writes, task_id, task_path)
        SWITCH.hit("put_writes_after")


def _hook_carry() -> None:
    """The ``carry_start`` fault point, at the start of both call logs' ``carry``."""
    from accord.platform.asynchronous.call_log import AsyncCallLog
    from accord.platform.synchronous.call_log import CallLog

    sync_carry, async_carry = CallLog.carry, AsyncCallLog.carry

    def carry(self: Any, *a: Any) -> None:
        SWITCH.hit("carry_start")
        sync_carry(self, *a)

    async def acarry(self: Any, *a: Any) -> None:
        SWITCH.hit("carry_start")
        await async_carry(self, *a)

    setattr(CallLog, "carry", carry)  # noqa: B010 (a fault point patched in)
    setattr(AsyncCallLog, "carry", acarry)  # noqa: B010


def run_sync(args: argparse.Namespace) -> dict[str, Any]:
    client: MongoClient[Any] = MongoClient(args.uri, event_listeners=_listeners(args))
    try:
        saver = KillingSaver(client, db_name=args.db, lease_seconds=args.lease)
        saver.setup()
        graph = build(saver, args)
        config = {"configurable": {"thread_id": args.thread}}
        resume = graph.get_state(config).created_at is not None
        return dict(graph.invoke(None if resume else {"account": "acme"}, config,
                                 durability=args.durability))  # fmt: skip
    finally:
        client.close()


async def run_async(args: argparse.Namespace) -> dict[str, Any]:
    client: AsyncMongoClient[Any] = AsyncMongoClient(args.uri, event_listeners=_listeners(args))
    try:
        saver = AsyncKillingSaver(client, db_name=args.db, lease_seconds=args.lease)
        await saver.setup()
        graph = build(saver, args)
        config = {"configurable": {"thread_id": args.thread}}
        resume = (await graph.aget_state(config)).created_at is not None
        return dict(await graph.ainvoke(None if resume else {"account": "acme"}, config,
                                        durability=args.durability))  # fmt: skip
    finally:
        await client.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--uri", required=True)
    p.add_argument("--db", required=True)
    p.add_argument("--thread", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--saver", choices=("sync", "async"), default="sync")
    p.add_argument("--durability", choices=("sync", "async"), default="async")
    p.add_argument("--kill", choices=("after_charge", "mid_charge"))
    p.add_argument("--kill-at")
    p.add_argument("--lease", type=float, default=10.0)
    p.add_argument("--idempotent", action="store_true")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--hold-charge", type=int, default=0)
    p.add_argument("--lsid-file")
    p.add_argument("--bundle")
    p.add_argument("--migrate", action="store_true")
    args = p.parse_args(argv)
    PAUSE[0] = args.pause
    global SWITCH
    SWITCH = KillSwitch(args.kill_at)
    if SWITCH.point == "carry_start":
        _hook_carry()
    try:
        state = run_sync(args) if args.saver == "sync" else asyncio.run(run_async(args))
    except AccordError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc),
                          "key": getattr(exc, "key", None)}))  # fmt: skip
        return 3
    print(json.dumps({"state": state}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
