"""The agent half of ``make demo``: a LangGraph run SIGKILLed mid-way and resumed.

The graph is a five-step order-processing agent. Each step asks a model (here
``FakeOrderModel``, a deterministic stand-in named as the fake it is; no network) what to
do, appends its answer to the thread's messages, and stages one business write (an order
line) with :mod:`accord.checkpointers.business`. accord commits the step's state, its
message and its business write in one transaction. A worker process runs the thread and
is killed with SIGKILL after step 3; a new process resumes the thread from the last
committed step, and every order line exists exactly once. The dead worker still held the
thread (a run's lease, renewed while it works): the new worker is refused until that
lease expires (2 s here), as a second live worker would be, then takes the thread over.
"""

from __future__ import annotations

import operator
import subprocess
import sys
import time
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pymongo import MongoClient

from accord.checkpointers import AccordSaver, business
from accord.errors import ConcurrentRunError, TransactionTimeout
from accord.runtime import Accord

STEPS = 5
#: the demo's lease: how long a killed worker keeps the thread
LEASE_SECONDS = 2.0
#: the server's transactionLifetimeLimitSeconds (mongod's default; the embedded engine's too)
TRANSACTION_LIFETIME_S = 60.0
DB = "accord_demo_agent"
ITEMS = ["coffee beans", "filters", "grinder", "kettle", "mugs"]
#: The user's opening message: a request, and a preference long-term memory should keep.
REQUEST = "I prefer deliveries on Saturday mornings. Order my kitchen kit."


class OrderState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    step: int
    total_cents: Annotated[int, operator.add]


class FakeOrderModel:
    """A deterministic fake chat model: answers from the step number, never the network."""

    def reply(self, step: int) -> tuple[str, int]:
        item = ITEMS[step - 1]
        price = 450 + 125 * step
        return f"Step {step}: ordering {item} for ${price / 100:.2f}.", price


def build_graph(saver: AccordSaver, thread: str) -> Any:
    model = FakeOrderModel()

    def work(state: OrderState) -> dict[str, Any]:
        step = state.get("step", 0) + 1
        print(f"worker: running step {step}", flush=True)
        text, price = model.reply(step)
        business.insert_one(
            "order_lines", {"_id": f"{thread}-{step}", "item": ITEMS[step - 1], "cents": price}
        )
        return {"messages": [AIMessage(text, id=f"ai-{step}")], "step": step, "total_cents": price}

    def route(state: OrderState) -> str:
        return "work" if state["step"] < STEPS else END

    builder = StateGraph(OrderState)
    builder.add_node("work", work)
    builder.add_edge(START, "work")
    builder.add_conditional_edges("work", route)
    return builder.compile(checkpointer=saver)


def run_worker(uri: str, thread: str) -> None:
    """Child process: run (or resume) the thread until the graph ends."""
    app = Accord(uri, db_name=DB)
    saver = app.checkpointer(lease_seconds=LEASE_SECONDS)
    graph = build_graph(saver, thread)
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    started = saver.get_tuple(config) is not None
    inputs = None if started else {"messages": [HumanMessage(REQUEST, id="human-1")], "step": 0}
    # A worker killed between its step's write and commit leaves that transaction open
    # until the server aborts it (transactionLifetimeLimitSeconds, 60 s by default), and it
    # holds the thread's run document until then: wait that long too.
    deadline = time.monotonic() + 10 * LEASE_SECONDS + TRANSACTION_LIFETIME_S
    while True:
        try:
            graph.invoke(inputs, config, durability="sync")
            break
        except ConcurrentRunError:
            if time.monotonic() > deadline:
                raise
            print(
                f"worker: refused: the killed worker's run still holds thread {thread!r}; "
                f"waiting for its lease ({LEASE_SECONDS:g} s in this demo) to run out",
                flush=True,
            )
            time.sleep(LEASE_SECONDS / 2)
        except TransactionTimeout:
            if time.monotonic() > deadline:
                raise
            print(
                "worker: the killed worker's open transaction still holds the thread; waiting "
                "for the server to abort it",
                flush=True,
            )
    print("worker: finished", flush=True)
    app.close()


def main(uri: str, console: Any) -> None:
    client: MongoClient = MongoClient(uri)
    client.drop_database(DB)
    with Accord(uri, db_name=DB) as accord:
        accord.aggregator()  # set up first: the steps write outbox events for a consumer
    thread = "order-42"
    console.print(
        "\n[bold]An agent killed mid-run[/bold]: 5 steps, each = 1 message + 1 business write. "
        f"A run holds its thread with a lease ({LEASE_SECONDS:g} s in this demo), renewed "
        "while it works; a holder that died on this machine is taken over at once."
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "accord.demo_agent", uri, thread], stdout=subprocess.PIPE, text=True
    )
    assert worker.stdout is not None
    for line in worker.stdout:
        console.print(f"  {line.rstrip()}")
        if "running step 4" in line:
            worker.kill()  # SIGKILL: no cleanup, no flush, like an OOM kill or a lost node
            worker.wait()
            console.print("  [red]SIGKILL[/red] the worker while step 4 runs")
            break
    committed = sorted(d["_id"] for d in client[DB].order_lines.find())
    console.print(f"  after the kill, committed order lines: {committed}")
    console.print("  resuming the thread in a new process ...")
    resumed = subprocess.run(
        [sys.executable, "-m", "accord.demo_agent", uri, thread],
        capture_output=True,
        text=True,
        timeout=120,
    )
    for line in resumed.stdout.splitlines():
        console.print(f"  {line}")
    if resumed.returncode != 0:
        raise SystemExit(f"resume failed:\n{resumed.stderr}")
    saver = AccordSaver(client, db_name=DB)
    state = build_graph(saver, thread).get_state({"configurable": {"thread_id": thread}})
    ids = sorted(d["_id"] for d in client[DB].order_lines.find())
    console.print(
        f"  order lines: {len(ids)} (each exactly once: {ids == [f'{thread}-{i}' for i in range(1, STEPS + 1)]})"
    )
    console.print(f"  messages in order: {[m.id for m in state.values['messages']]}")
    console.print(
        f"  total: ${state.values['total_cents'] / 100:.2f}; the resumed run continued after "
        f"the last committed step ({len(committed)}) instead of starting over"
    )
    show_memory(uri, console)
    client.close()


def show_memory(uri: str, console: Any) -> None:
    """Aggregate the thread's committed steps into long-term memory and search it."""
    console.print(
        "\n[bold]Long-term memory[/bold], derived from the committed messages through the outbox"
    )
    with Accord(uri, db_name=DB) as app:
        aggregator = app.aggregator()
        backlog = aggregator.stats().backlog
        done = aggregator.drain()
        console.print(
            f"  outbox events the steps committed: {backlog}; aggregated: {done}; "
            f"dead-lettered: {aggregator.stats().dead}"
        )
        question = "when should deliveries come"
        for memory in app.memory().search(("memories",), query=question, limit=2):
            source = memory.provenance
            console.print(
                f"  {memory.kind} {memory.namespace}: {memory.text!r} (score "
                f"{memory.score:.2f}; from thread {source.get('thread_id')}, messages "
                f"{source.get('message_ids')})"
            )
        # what a node sees through `get_store()` when the graph is compiled with it
        hits = app.store().search(("memories",), query=question, limit=1)
        console.print(f"  through the LangGraph store: {[hit.value for hit in hits]}")
        again = aggregator.drain()
        console.print(f"  a second pass finds nothing left to do ({again} events): exactly once")


if __name__ == "__main__":
    run_worker(sys.argv[1], sys.argv[2])
