"""A crashed or stopped worker does not lock its thread (docs/checkpointer.md, "Ownership").

Real processes (tests/checkpointers/takeover_worker.py) hold a thread in the middle of a
node; then they are SIGKILLed, SIGTERMed, or taken over with ``accord threads release``,
and another process's run continues the thread:

* a SIGKILLed holder on this machine is taken over at once, while its lease is still
  live (its pid is gone, or a zombie, or reused);
* a holder on another machine (``ACCORD_MACHINE_ID``) is waited out: refused with
  ``ConcurrentRunError`` naming it until its lease expires, then taken over;
* SIGTERM gives the lease back as the process exits;
* ``accord threads release`` ends a live holder's run: the thread is free at once, and
  the old run's commit is refused when it comes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient
from typer.testing import CliRunner

from accord.checkpointers import AccordSaver, CollectionNames
from accord.errors import ConcurrentRunError
from accord.platform import runs
from accord.platform.cli import app
from tests.checkpointers.takeover_worker import _graph

# the workers must share this machine's pid table; processes killed: slow
pytestmark = [pytest.mark.embedded_only, pytest.mark.slow]
WORKER = Path(__file__).with_name("takeover_worker.py")
NAMES = CollectionNames()


class Worker:
    def __init__(self, proc: subprocess.Popen[str], directory: Path) -> None:
        self.proc = proc
        self.dir = directory

    def wait_started(self) -> None:
        deadline = time.monotonic() + 60
        while not (self.dir / "started").exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"the worker exited early: {self.proc.stdout.read()}")  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the worker never started its node"
            time.sleep(0.02)

    def finish(self) -> str:
        (self.dir / "finish").write_text("1")
        out, _ = self.proc.communicate(timeout=60)
        return out.strip().splitlines()[-1] if out.strip() else ""


@pytest.fixture()
def start_worker(mongo_uri: str, db_name: str, tmp_path: Path) -> Iterator[Any]:
    started: list[Worker] = []

    def start(
        thread: str, *, lease: float, machine: str | None = None, kind: str = "sync"
    ) -> Worker:
        directory = tmp_path / f"{thread}-{len(started)}"
        directory.mkdir()
        env = dict(os.environ)
        if machine is not None:
            env["ACCORD_MACHINE_ID"] = machine
        args = [sys.executable, str(WORKER), "--uri", mongo_uri, "--db", db_name,
                "--thread", thread, "--lease", str(lease), "--dir", str(directory)]  # fmt: skip
        if kind == "async":
            args.append("--async")
        proc = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
        worker = Worker(proc, directory)
        started.append(worker)
        worker.wait_started()
        # its saves before the node are committed: no transaction of it is open now (a
        # process killed inside a commit holds that transaction's locks until the server
        # ends it, docs/checkpointer.md "Limits")
        client = MongoClient(mongo_uri)
        try:
            deadline = time.monotonic() + 60
            while client[db_name][NAMES.checkpoints].count_documents({"thread_id": thread}) < 2:
                assert time.monotonic() < deadline, "the worker's first checkpoints never came"
                time.sleep(0.01)
        finally:
            client.close()
        return worker

    yield start
    for w in started:
        if w.proc.poll() is None:
            w.proc.kill()
        w.proc.wait()


def _registry(client: MongoClient, db_name: str, thread: str) -> dict[str, Any]:
    doc = client[db_name].runs.find_one({"_id": runs.run_doc_id("default", thread)})
    assert doc is not None
    return doc


def _continue(client: MongoClient, db_name: str, thread: str) -> dict[str, Any]:
    """Run the thread's graph in this process; returns its final state."""
    saver = AccordSaver(client, db_name=db_name)
    graph = _graph(Path("/nonexistent")).compile(checkpointer=saver)
    return graph.invoke({"n": 10}, {"configurable": {"thread_id": thread}})


def _finishing_graph(client: MongoClient, db_name: str) -> Any:
    from langgraph.graph import START, StateGraph

    from tests.checkpointers.takeover_worker import S

    g = StateGraph(S)
    g.add_node("step", lambda s: {"n": s["n"] + 1})
    g.add_edge(START, "step")
    return g.compile(checkpointer=AccordSaver(client, db_name=db_name))


def _expires(doc: dict[str, Any]) -> datetime:
    at = doc["lease_expires"]
    return at if at.tzinfo else at.replace(tzinfo=UTC)


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
def test_a_sigkilled_holder_on_this_machine_is_taken_over_at_once(
    client: MongoClient, db_name: str, start_worker: Any, kind: str, reap: bool
) -> None:
    worker = start_worker("killed", lease=30.0, kind=kind)
    held = _registry(client, db_name, "killed")
    assert held["holder_pid"] == worker.proc.pid
    os.kill(worker.proc.pid, signal.SIGKILL)
    if reap:
        worker.proc.wait()
    else:  # not reaped yet: a zombie still has its pid
        stat = Path(f"/proc/{worker.proc.pid}/stat")
        while stat.read_text().split(") ")[1][0] != "Z":
            time.sleep(0.01)
    graph = _finishing_graph(client, db_name)
    state = graph.invoke({"n": 5}, {"configurable": {"thread_id": "killed"}})
    taken_at = datetime.now(UTC)
    assert state == {"n": 6}
    assert taken_at < _expires(held), "the dead holder's lease was waited out, not taken over"
    after = _registry(client, db_name, "killed")
    assert after["fence"] > held["fence"]


def test_a_holder_on_another_machine_is_waited_out(
    client: MongoClient, db_name: str, start_worker: Any
) -> None:
    # a lease far above the time this process takes to reach its first invoke on a
    # loaded machine (at least two thirds of it are left at the kill)
    worker = start_worker("elsewhere", lease=10.0, machine="another-host")
    held = _registry(client, db_name, "elsewhere")
    os.kill(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait()
    graph = _finishing_graph(client, db_name)
    cfg = {"configurable": {"thread_id": "elsewhere"}}
    refused = 0
    while True:
        try:
            state = graph.invoke({"n": 5}, cfg)
            break
        except ConcurrentRunError as err:
            assert str(worker.proc.pid) in str(err), "the error names the holding process"
            refused += 1
            time.sleep(0.1)
    assert refused >= 1, "a live lease of another machine was taken over"
    assert datetime.now(UTC) >= _expires(held)
    assert state == {"n": 6}


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_sigterm_gives_the_thread_back(
    client: MongoClient, db_name: str, start_worker: Any, kind: str
) -> None:
    worker = start_worker("stopped", lease=30.0, machine="another-host", kind=kind)
    worker.proc.send_signal(signal.SIGTERM)
    (worker.dir / "finish").write_text("1")  # the node returns; its step is not committed
    worker.proc.wait(timeout=60)
    after = _registry(client, db_name, "stopped")
    assert after["lease_expires"] is None, "the lease was not given back on SIGTERM"
    state = _finishing_graph(client, db_name).invoke(
        {"n": 5}, {"configurable": {"thread_id": "stopped"}}
    )
    assert state == {"n": 6}


def test_threads_release_takes_a_live_holders_thread(
    client: MongoClient, mongo_uri: str, db_name: str, start_worker: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    worker = start_worker("stuck", lease=60.0, machine="another-host")
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    shown = CliRunner().invoke(app, ["threads", "show", "stuck", "--db", db_name])
    assert shown.exit_code == 0, shown.output
    assert f":{worker.proc.pid}" in shown.output
    released = CliRunner().invoke(app, ["threads", "release", "stuck", "--db", db_name])
    assert released.exit_code == 0, released.output
    assert "released thread 'stuck'" in released.output
    # an id no saver accepts is refused, not written (release '' stored a registry entry)
    for command in ("show", "release"):
        refused = CliRunner().invoke(app, ["threads", command, "", "--db", db_name])
        assert refused.exit_code == 2 and "thread" in refused.output, refused.output
    assert client[db_name][CollectionNames().runs].count_documents({"thread_id": ""}) == 0
    state = _finishing_graph(client, db_name).invoke(
        {"n": 5}, {"configurable": {"thread_id": "stuck"}}
    )
    assert state == {"n": 6}
    last = worker.finish()  # the old run wakes up and tries to commit its step
    assert last.startswith("ConcurrentRunError"), last
    saver = AccordSaver(client, db_name=db_name)
    assert (
        saver.get_tuple({"configurable": {"thread_id": "stuck"}}).checkpoint["channel_values"]["n"]
        == 6
    )
