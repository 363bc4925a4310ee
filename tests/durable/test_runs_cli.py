"""`accord runs calls` and `accord runs resolve`: a human lists a parked call and settles
it; the run then replays the settled result."""

from __future__ import annotations

import uuid
from typing import Any, TypedDict

import pytest
import typer
from langgraph.graph import END, START, StateGraph
from pymongo import MongoClient
from typer.testing import CliRunner

from accord.checkpointers.durable_cli import register
from accord.checkpointers.recorded import recorded
from accord.errors import NeedsReconciliation
from tests.checkpointers.conftest import make_saver


class State(TypedDict, total=False):
    out: str


@pytest.fixture()
def db_name(client: MongoClient) -> Any:
    name = "cli_" + uuid.uuid4().hex[:12]
    try:
        yield name
    finally:
        client.drop_database(name)


def test_a_parked_call_is_listed_and_settled_from_the_cli(
    mongo_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    app = typer.Typer()
    app.command("noop")(lambda: None)  # a group with one command would be flattened
    register(app)
    cli = CliRunner()
    made: list[int] = []

    @recorded(name="fake.wire")
    def wire(cents: int) -> str:
        made.append(cents)
        raise TimeoutError("no answer")

    with make_saver("sync", mongo_uri, db_name) as saver:
        g = StateGraph(State)
        g.add_node("work", lambda s: {"out": wire(700)})
        g.add_edge(START, "work")
        g.add_edge("work", END)
        graph = g.compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "w1"}}
        with pytest.raises(TimeoutError):
            graph.invoke({"out": ""}, cfg)
        with pytest.raises(NeedsReconciliation) as parked:
            graph.invoke(None, cfg)
        key = parked.value.key

        listed = cli.invoke(app, ["runs", "calls", "--db", db_name, "--parked"])
        assert listed.exit_code == 0, listed.output
        assert "fake.wire" in listed.output and key in listed.output and "w1" in listed.output

        bad = cli.invoke(app, ["runs", "resolve", "w1", key, "--db", db_name, "--result", "{"])
        assert bad.exit_code == 2 and "not JSON" in bad.output
        done = cli.invoke(app, ["runs", "resolve", "w1", key, "--db", db_name,
                                "--result", '"wired-by-hand"'])  # fmt: skip
        assert done.exit_code == 0, done.output
        again = cli.invoke(app, ["runs", "resolve", "w1", key, "--db", db_name,
                                 "--result", '"twice"'])  # fmt: skip
        assert again.exit_code == 1 and "not unsettled" in again.output

        assert graph.invoke(None, cfg)["out"] == "wired-by-hand"
        assert made == [700]
        empty = cli.invoke(app, ["runs", "calls", "--db", db_name])
        assert "no unsettled recorded calls" in empty.output


def test_the_queue_from_the_cli(
    mongo_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accord runs submit / ls / show / approve / reject / resume / cancel / fork /
    refresh."""
    from accord.checkpointers.worker import Worker
    from accord.runtime import Accord

    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    app = typer.Typer()
    app.command("noop")(lambda: None)
    register(app)
    cli = CliRunner()
    graph = "tests.durable.queue_graphs:approval"

    def run(*args: str) -> Any:
        return cli.invoke(app, [*args, "--db", db_name])

    bad = run("runs", "submit", graph, "--input", "{nope")
    assert bad.exit_code == 2 and "not JSON" in bad.output
    refused = run("runs", "submit", "not a graph")
    assert refused.exit_code == 2 and "module.path:attribute" in refused.output  # a bad GRAPH
    submitted = run("runs", "submit", graph, "--input", '{"run": "cli"}', "--key", "cli-1")
    assert submitted.exit_code == 0, submitted.output
    run_id = submitted.output.split()[0]
    assert submitted.stdout == f"{run_id}\n"  # alone: R=$(accord runs submit ...) works
    assert run("runs", "submit", graph, "--key", "cli-1").output.split()[0] == run_id
    other = run("runs", "submit", graph, "--input", '{"run": "cli2"}', "--credential",
                "bank=2030-01-01T00:00:00+00:00").output.split()[0]  # fmt: skip
    assert "credential bank expires 2030-01-01" in run("runs", "show", other).output
    assert run("runs", "submit", graph, "--credential", "bank").exit_code == 2
    assert run("runs", "refresh", other).exit_code == 2
    refreshed = run("runs", "refresh", other, "--credential", "bank=2031-01-01T00:00:00Z")
    assert refreshed.exit_code == 0, refreshed.output
    assert "credential bank expires 2031-01-01" in run("runs", "show", other).output
    listed = run("runs", "ls", "--status", "queued")
    assert run_id in listed.output and other in listed.output
    assert "no runs" in run("runs", "ls", "--tenant", "nobody").output
    cancelled = run("runs", "cancel", other)
    assert cancelled.exit_code == 0 and "cancelled" in cancelled.output
    assert run("runs", "cancel", other).exit_code == 1  # ended already

    with Accord(db_name=db_name) as root:
        Worker(graph, client=root.client, uow=root.uow, db=db_name, poll=0.05).run(until_idle=True)
        shown = run("runs", "show", run_id)
        assert "waiting" in shown.output and "wire the money?" in shown.output
        assert run("runs", "approve", run_id, "--value", "{bad").exit_code == 2
        assert run("runs", "resume", run_id, "--value", '"later"').exit_code == 0
        assert run("runs", "reject", run_id).exit_code == 1  # not waiting any more
        Worker(graph, client=root.client, uow=root.uow, db=db_name, poll=0.05).run(until_idle=True)
        done = run("runs", "show", run_id)
        assert "done" in done.output and '"decision": "later"' in done.output, done.output
        forked = run("runs", "fork", run_id)
        assert forked.exit_code == 0, forked.output
        assert "queued" in forked.output
    assert run("runs", "show", "run-missing").exit_code == 1


def test_what_a_message_quotes_is_printed_as_it_is(
    mongo_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run id ``[/red]x`` was a MarkupError traceback (after ``threads release`` had
    moved the fence); ``run:x:1`` printed as ``run❌1``; ``--db a.b`` failed in the
    driver; a bad ``ACCORD_*`` value was pydantic's traceback."""
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    app = typer.Typer()
    app.command("noop")(lambda: None)
    register(app)
    cli = CliRunner()
    # ("run-[bold]x" printed as "run-x": a valid tag was taken as markup and dropped)
    for run_id in ("[/red]x", "run:x:1", "run-[bold]x", "run-[x]"):
        shown = cli.invoke(app, ["runs", "show", run_id, "--db", db_name])
        assert shown.exit_code == 1 and f"no run {run_id!r}" in shown.output, shown.output
        assert shown.exception is None or isinstance(shown.exception, SystemExit)
    for bad in ("a.b", "", "a b", "x$y"):
        refused = cli.invoke(app, ["runs", "ls", "--db", bad])
        assert refused.exit_code == 2 and "not a MongoDB database name" in refused.output
    monkeypatch.setenv("ACCORD_SERVER_SELECTION_TIMEOUT", "-1")
    monkeypatch.delenv("MONGODB_URI")
    env = cli.invoke(app, ["runs", "ls", "--db", db_name])
    assert env.exit_code == 2 and "ACCORD_SERVER_SELECTION_TIMEOUT" in env.output, env.output
