"""Acceptance kill suite: SIGKILL the worker anywhere, resume in a new process, lose nothing.

Real LangGraph StateGraphs (``kill_worker.build_graph``: 12 ``model`` steps and a
``finish`` step, each appending one message and staging business writes; the ``fanout``
variant fans every model step out to two nodes joined by a barrier,
``add_edge([a, b], "join")``, each with business writes) run in a child process on
:class:`~accord.checkpointers.AccordSaver` (``invoke``) or
:class:`~accord.checkpointers.AsyncAccordSaver` (``ainvoke``), under both durability
modes. A worker that restarts while the killed one's lease is still live waits for it to
expire (leases are 1 s here). The parent SIGKILLs the child at
named points (``ACCORD_KILL_AT``: before/after a node, inside ``put_writes``, between
``put_writes`` and ``put``, around ``put``, inside the transaction before and after the
commit) and at random moments, then resumes the thread in a new process until it
finishes. One thread per scenario, all on one server (``MONGODB_URI`` if set, otherwise an
embedded engine in its own process; only workers are killed, never the server).

After every kill: business writes are all-or-nothing per step and never ahead of the
saved state by more than the one task whose writes committed; the history is one chain.
At the end: the graph finished (a fan-in ``join`` was never skipped), every business
write exists exactly once, every message exists exactly once and in order (state and
short-term memory), and the final state equals an uninterrupted run's.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from bson import json_util
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from pymongo import MongoClient
from pymongo.database import Database

from accord.checkpointers import AccordSaver, CollectionNames
from tests.checkpointers.kill_worker import (
    KILL_POINTS,
    STEPS_PER_TURN,
    FakeChatModel,
    build_graph,
    finished,
    human,
    start_engine,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

WORKER = Path(__file__).with_name("kill_worker.py")
ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("ACCORD_KILL_SEED", "20240611"))
MIN_KILLS = 36
#: random-time kills: threads x kills per thread
RANDOM_THREADS, RANDOM_KILLS_PER_THREAD = 4, 2
#: seconds after the worker is ready within which random kills land
RANDOM_WINDOW = 0.4
#: the fake model's "thinking" time in random scenarios, so a run outlasts the window
RANDOM_LATENCY = 0.03
#: lease of the workers: a restarted worker waits at most this long for a dead one's
LEASE = 1.0
#: (saver, durability) combinations every kill point runs under
COMBOS = [("sync", "sync"), ("sync", "async"), ("async", "sync"), ("async", "async")]
NAMES = CollectionNames()


@pytest.fixture(scope="module")
def server_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``MONGODB_URI`` if set, else an embedded engine in its own process."""
    uri = os.environ.get("MONGODB_URI")
    if uri:
        yield uri
        return
    proc, uri = start_engine(tmp_path_factory.mktemp("kill-engine"))
    try:
        yield uri
    finally:
        proc.kill()
        proc.wait()


@dataclass
class Scenario:
    thread: str
    durability: str
    #: one entry per killed worker: an ``ACCORD_KILL_AT`` value, or ``"random"``
    kills: list[str]
    latency: float = 0.0
    saver: str = "sync"
    graph: str = "chain"


@dataclass
class Outcome:
    thread: str
    kills: list[str]
    workers: int
    #: kills after which a task's business writes had committed but not its checkpoint
    ahead: int


def scenarios(rng: random.Random) -> list[Scenario]:
    """Every kill point under two (saver, durability) pairs that cover both savers and
    both durabilities (alternating which), on the chain and the fan-out/fan-in graph;
    then random-time kills under every pair."""
    out = []
    for p, point in enumerate(KILL_POINTS):
        pair = (COMBOS[0], COMBOS[3]) if p % 2 == 0 else (COMBOS[1], COMBOS[2])
        for c, (saver, durability) in enumerate(pair):
            graph = ("chain", "fanout")[(p // 2 + c) % 2]
            # n <= 6 leaves the 13-step graph enough events for a second kill
            kills = [f"{point}:{rng.randint(1, 6)}" for _ in range(2)]
            name = f"{point}-{saver}-{durability}-{graph}"
            out.append(Scenario(name, durability, kills, saver=saver, graph=graph))
    for i in range(RANDOM_THREADS):
        saver, durability = COMBOS[i % len(COMBOS)]
        graph = ("chain", "fanout")[i % 2]
        kills = ["random"] * RANDOM_KILLS_PER_THREAD
        name = f"random-{i}-{saver}-{durability}-{graph}"
        out.append(Scenario(name, durability, kills, RANDOM_LATENCY, saver, graph))
    return out


class Harness:
    def __init__(self, uri: str, db_name: str, tmp: Path) -> None:
        self.uri = uri
        self.db_name = db_name
        self.tmp = tmp
        self.client: MongoClient = MongoClient(uri)
        self.db: Database = self.client[db_name]
        self.saver = AccordSaver(self.client, db_name=db_name)

    def spawn(self, sc: Scenario, kill: str | None) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if k != "ACCORD_KILL_AT"}
        if kill and kill != "random":
            env["ACCORD_KILL_AT"] = kill
        return subprocess.Popen(
            [sys.executable, str(WORKER), "run", "--uri", self.uri, "--db", self.db_name,
             "--thread", sc.thread, "--durability", sc.durability, "--latency", str(sc.latency),
             "--lsid-file", str(self.lsid_file(sc)), "--saver", sc.saver, "--graph", sc.graph,
             "--lease", str(LEASE)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        )  # fmt: skip

    def lsid_file(self, sc: Scenario) -> Path:
        return self.tmp / f"{sc.thread}.lsids"

    def end_dead_sessions(self, sc: Scenario) -> None:
        """End the dead worker's open transaction, as a supervisor would, instead of
        letting it hold its locks until transactionLifetimeLimitSeconds."""
        path = self.lsid_file(sc)
        if not path.exists():
            return
        lsids = [json_util.loads(line) for line in path.read_text().splitlines() if line]
        if lsids:
            self.client.admin.command("killSessions", lsids)
        path.unlink()

    def drive(self, sc: Scenario) -> Outcome:
        rng = random.Random(f"{SEED}-{sc.thread}")
        killed: list[str] = []
        workers = ahead = 0
        for kill in sc.kills:
            returncode, out, err = self.run_worker(sc, kill, rng)
            workers += 1
            if returncode == -signal.SIGKILL:
                killed.append(kill)
                self.end_dead_sessions(sc)
                ahead += self.check_after_kill(sc, kill)
            else:
                assert returncode == 0, f"{sc.thread} worker ({kill}) failed:\n{err}"
                if '"finished": true' in out:
                    break  # the kill point was never reached: nothing left to kill
        # One clean worker in a new process must finish the thread.
        returncode, out, err = self.run_worker(sc, None, rng)
        workers += 1
        assert returncode == 0, f"{sc.thread} resume failed:\n{err}"
        assert '"finished": true' in out, (sc.thread, out, err)
        return Outcome(sc.thread, killed, workers, ahead)

    def run_worker(
        self, sc: Scenario, kill: str | None, rng: random.Random
    ) -> tuple[int, str, str]:
        """One worker process; ``kill="random"``: SIGKILL it at a random moment."""
        proc = self.spawn(sc, kill)
        try:
            if kill == "random":
                assert proc.stdout is not None
                ready = proc.stdout.readline()
                assert ready.strip() == "READY", ready
                time.sleep(rng.uniform(0.0, RANDOM_WINDOW))
                proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode, out, err

    # --- invariants ------------------------------------------------------------------

    def ledger_steps(self, thread: str) -> list[int]:
        return sorted(d["step"] for d in self.db.ledger.find({"thread": thread}))

    def check_chain(self, thread: str) -> list[Any]:
        history = list(self.saver.list({"configurable": {"thread_id": thread}}))
        for newer, older in zip(history, history[1:], strict=False):
            assert newer.parent_config is not None, f"{thread}: two roots"
            assert (
                newer.parent_config["configurable"]["checkpoint_id"]
                == older.config["configurable"]["checkpoint_id"]
            ), f"{thread}: history forked"
        if history:
            assert history[-1].parent_config is None
        ids = {t.config["configurable"]["checkpoint_id"] for t in history}
        orphans = self.db[NAMES.writes].distinct(
            "checkpoint_id", {"thread_id": thread, "checkpoint_id": {"$nin": sorted(ids)}}
        )
        assert not orphans, f"{thread}: task writes of checkpoints never saved: {orphans}"
        return history

    def check_after_kill(self, sc: Scenario, kill: str) -> bool:
        """Invariants of a thread whose worker was just killed; True when the last task's
        writes (and business writes) committed without the next checkpoint."""
        where = f"{sc.thread} after kill {kill!r}"
        steps = self.ledger_steps(sc.thread)
        k = len(steps)
        assert steps == list(range(1, k + 1)), f"{where}: ledger {steps}"
        counter = self.db.counters.find_one({"_id": sc.thread}) or {"n": 0, "steps": []}
        # the insert and the $inc of a step commit together or not at all
        assert counter["n"] == k and counter["steps"] == steps, f"{where}: {counter}"
        latest = self.saver.get_tuple({"configurable": {"thread_id": sc.thread}})
        messages = latest.checkpoint["channel_values"].get("messages", []) if latest else []
        saved = sum(isinstance(m, AIMessage) for m in messages)
        # business writes are never behind the saved state, and ahead of it only by the
        # one task whose writes (message included) committed with them
        assert k in (saved, saved + 1), f"{where}: {k} business steps, {saved} saved"
        if k == saved + 1:
            assert latest is not None
            pending = [v for _, ch, v in latest.pending_writes or [] if ch == "messages"]
            assert any(m.id == f"ai-{k}" for v in pending for m in v), f"{where}: {pending}"
        if sc.graph == "fanout":
            # every side of a fan-out and every join at most once per model step
            audits = self.db.audits.find_one({"_id": sc.thread}) or {}
            joins = sorted(d["step"] for d in self.db.joins.find({"thread": sc.thread}))
            assert joins == sorted(set(joins)) and set(joins) <= set(steps), f"{where}: {joins}"
            for side in ("a", "b"):
                assert audits.get(side, 0) <= k, f"{where}: audits {audits}"
        self.check_chain(sc.thread)
        self.check_memory(sc.thread, exact=None)
        return k == saved + 1

    def check_memory(self, thread: str, exact: list[str] | None) -> None:
        docs = list(self.db[NAMES.messages].find({"thread_id": thread, "chunk": 0}))
        ids = Counter(d["message_id"] for d in docs)
        dupes = {i: n for i, n in ids.items() if n > 1}
        assert not dupes, f"{thread}: messages stored more than once: {dupes}"
        if exact is not None:
            assert set(ids) == set(exact), f"{thread}: short-term memory {sorted(ids)}"
            created = {d["message_id"]: d["created_at"] for d in docs}
            times = [created[i] for i in exact]
            assert times == sorted(times), f"{thread}: messages stored out of order"

    def describe(self, thread: str) -> str:
        """The thread's history, oldest first, for assertion messages."""
        rows = []
        for t in reversed(list(self.saver.list({"configurable": {"thread_id": thread}}))):
            conf = t.config["configurable"]
            parent = (t.parent_config or {}).get("configurable", {}).get("checkpoint_id")
            ids = [m.id for m in t.checkpoint["channel_values"].get("messages", [])]
            rows.append(
                f"  {conf['checkpoint_id']} <- {parent} {t.metadata.get('source')} "
                f"step={t.metadata.get('step')} messages={ids[:2]}..{ids[-2:]}({len(ids)}) "
                f"writes={[(w[0][:8], w[1]) for w in t.pending_writes]}"
            )
        return f"history of {thread}:\n" + "\n".join(rows)

    def check_final(self, sc: Scenario, references: dict[str, dict[str, Any]]) -> None:
        reference = references[sc.graph]
        graph = build_graph(FakeChatModel(), fanout=sc.graph == "fanout").compile(
            checkpointer=self.saver
        )
        state = graph.get_state({"configurable": {"thread_id": sc.thread}})
        assert finished(state), f"{sc.thread}: graph did not finish\n{self.describe(sc.thread)}"
        messages = state.values["messages"]
        expected_ids = ["human-1"] + [f"ai-{n}" for n in range(1, STEPS_PER_TURN + 1)]
        assert [m.id for m in messages] == expected_ids, self.describe(sc.thread)
        assert messages == reference["messages"], f"{sc.thread}: final state differs"
        ledger = {d["step"]: d for d in self.db.ledger.find({"thread": sc.thread})}
        assert sorted(ledger) == list(range(1, STEPS_PER_TURN + 1)), sc.thread
        assert self.db.ledger.count_documents({"thread": sc.thread}) == STEPS_PER_TURN
        assert [ledger[n]["content"] for n in sorted(ledger)] == reference["ledger"]
        counter = self.db.counters.find_one({"_id": sc.thread})
        assert counter is not None and counter["n"] == STEPS_PER_TURN, counter
        assert counter["steps"] == list(range(1, STEPS_PER_TURN + 1)), counter
        history = self.check_chain(sc.thread)
        assert len(history) == len(reference["history"]), (
            f"{sc.thread}: {len(history)} checkpoints, uninterrupted run has "
            f"{len(reference['history'])}"
        )
        self.check_memory(sc.thread, exact=expected_ids)
        if sc.graph == "fanout":
            # the barrier never lost or repeated a join: one per model step, and both
            # sides of every fan-out exactly once
            joins = sorted(d["step"] for d in self.db.joins.find({"thread": sc.thread}))
            assert joins == list(range(1, STEPS_PER_TURN)), f"{sc.thread}: joins {joins}"
            audits = self.db.audits.find_one({"_id": sc.thread})
            assert audits is not None, sc.thread
            assert audits["a"] == audits["b"] == STEPS_PER_TURN - 1, f"{sc.thread}: {audits}"


def reference_run(h: Harness, graph_kind: str) -> dict[str, Any]:
    """The same graph, uninterrupted, in this process."""
    thread = f"reference-{graph_kind}"
    graph = build_graph(FakeChatModel(), fanout=graph_kind == "fanout").compile(
        checkpointer=h.saver
    )
    cfg: RunnableConfig = {"configurable": {"thread_id": thread}}
    out = graph.invoke({"messages": [human(1)]}, cfg)
    messages = out["messages"]
    assert isinstance(messages[0], HumanMessage)
    assert len(messages) == 1 + STEPS_PER_TURN
    ledger = [d["content"] for d in h.db.ledger.find({"thread": thread}).sort("step", 1)]
    assert len(ledger) == STEPS_PER_TURN
    return {"messages": messages, "ledger": ledger, "history": h.check_chain(thread)}


def test_sigkilled_workers_resume_exactly_once(server_uri: str, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    db_name = "kill_" + uuid.uuid4().hex[:10]
    h = Harness(server_uri, db_name, tmp_path)
    started = time.monotonic()
    try:
        h.saver.setup()
        references = {kind: reference_run(h, kind) for kind in ("chain", "fanout")}
        plan = scenarios(rng)
        with ThreadPoolExecutor(max_workers=3) as pool:
            outcomes = list(pool.map(h.drive, plan))
        for sc in plan:
            h.check_final(sc, references)
        kills = [k for o in outcomes for k in o.kills]
        by_point = Counter(k.split(":")[0] for k in kills)
        ahead = sum(o.ahead for o in outcomes)
        by_combo = Counter(
            f"{sc.saver}/{sc.durability}/{sc.graph}"
            for sc, o in zip(plan, outcomes, strict=True)
            for _ in o.kills
        )
        summary = (
            f"{len(kills)} kills in {sum(o.workers for o in outcomes)} worker processes, "
            f"{time.monotonic() - started:.1f}s: {dict(sorted(by_point.items()))}; "
            f"by saver/durability/graph {dict(sorted(by_combo.items()))}; "
            f"{ahead} left a recorded task without its next checkpoint"
        )
        print(summary)
        assert len(kills) >= MIN_KILLS, summary
        assert set(by_point) >= set(KILL_POINTS) | {"random"}, summary
        assert len(by_combo) == 8, summary  # both savers, durabilities and graphs killed
        assert ahead, f"no kill landed between put_writes and put: {summary}"
    finally:
        h.client.drop_database(db_name)
        h.client.close()
