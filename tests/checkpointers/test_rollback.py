"""Rollback with compensation: ``saver.rollback(config, to=CHECKPOINT)`` rewinds a thread
and restores the business records its later steps wrote, from the before-images the undo
log recorded, in one transaction; refused, naming the record, when another thread wrote
one of those records since."""

from __future__ import annotations

import operator
from collections import defaultdict
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from pymongo import MongoClient, monitoring

from accord.checkpointers import business
from accord.errors import DatabaseError, InvalidInputError, RollbackRefused
from accord.platform import gridfs_layout as gl
from accord.platform import undo_log
from tests.checkpointers.conftest import config, make_saver
from tests.failpoints import fail_command

COLLECTIONS = ("accounts", "ledger", "notes", "profiles")


class State(TypedDict):
    n: Annotated[int, operator.add]


def _graph(saver: Any) -> Any:
    """Each turn runs ``work`` once: an upsert-created and then updated balance, a ledger
    row, a replaced profile, a deleted note (second turn), an artifact."""

    def work(state: State, config: RunnableConfig) -> dict[str, Any]:
        thread = config["configurable"]["thread_id"]
        n = state["n"] + 1
        business.update_one("accounts", {"_id": "acct"}, {"$inc": {"balance": -10}}, upsert=True)
        business.insert_one("ledger", {"_id": f"{thread}-{n}", "n": n})
        business.replace_one("profiles", {"_id": "p"}, {"name": f"v{n}"}, upsert=True)
        business.update_one("counters", {"kind": thread}, {"$inc": {"n": 1}}, upsert=True)
        if n == 2:
            business.delete_one("notes", {"_id": "note"})
        saver.put_artifact(config, f"output {n}".encode())
        return {"n": 1}

    g = StateGraph(State)
    g.add_node("work", work)
    g.add_edge(START, "work")
    return g.compile(checkpointer=saver)


def _snapshot(client: MongoClient, db_name: str) -> dict[str, list[Any]]:
    db = client[db_name]
    return {c: sorted(db[c].find(), key=str) for c in (*COLLECTIONS, "counters")}


def _latest(graph: Any, thread: str) -> str:
    return str(graph.get_state(config(thread)).config["configurable"]["checkpoint_id"])


def test_restores_the_records_and_rewinds_the_thread(
    client: MongoClient, saver: Any, db_name: str
) -> None:
    client[db_name].notes.insert_one({"_id": "note", "tenant_id": "default", "text": "keep"})
    graph = _graph(saver)
    graph.invoke({"n": 0}, config("a"))
    cp = _latest(graph, "a")
    before = _snapshot(client, db_name)
    graph.invoke({"n": 0}, config("a"))
    graph.invoke({"n": 0}, config("a"))
    assert client[db_name].accounts.find_one()["balance"] == -30
    assert client[db_name].notes.count_documents({}) == 0
    assert client[db_name].ledger.count_documents({}) == 3

    done = saver.rollback(config("a"), to=cp)

    assert _snapshot(client, db_name) == before  # the records exactly, _version included
    assert done.checkpoint_id == cp and done.checkpoints_removed == 6  # 3 per turn
    assert done.records_restored == 6 and done.writes_undone == 9
    assert _latest(graph, "a") == cp and graph.get_state(config("a")).values == {"n": 1}
    assert [h.config["configurable"]["checkpoint_id"] for h in graph.get_state_history(
        config("a"))][0] == cp  # fmt: skip
    # the undone steps' artifacts are orphans again: collected
    assert client[db_name][gl.FILES].count_documents({"status": gl.PENDING}) == 2
    assert saver.gc_artifacts(grace=0) == 2
    # the first step's undo entries stay (a rollback further back is still possible)
    assert client[db_name][undo_log.COLLECTION].count_documents({"thread_id": "a"}) == 4
    # the thread goes on from there: its second step runs again, once
    graph.invoke({"n": 0}, config("a"))
    assert client[db_name].accounts.find_one()["balance"] == -20
    assert sorted(d["_id"] for d in client[db_name].ledger.find()) == ["a-1", "a-2"]
    # and can be rolled back to its very first checkpoint: nothing of it stays
    first = [h.config["configurable"]["checkpoint_id"] for h in graph.get_state_history(
        config("a"))][-1]  # fmt: skip
    saver.rollback(config("a"), to=first)
    assert {c: docs for c, docs in _snapshot(client, db_name).items() if docs} == {
        "notes": [{"_id": "note", "tenant_id": "default", "text": "keep"}]
    }


def test_refused_when_another_thread_wrote_a_record_since(
    client: MongoClient, saver: Any, db_name: str
) -> None:
    graph = _graph(saver)
    graph.invoke({"n": 0}, config("a"))
    cp = _latest(graph, "a")
    graph.invoke({"n": 0}, config("a"))
    graph.invoke({"n": 0}, config("b"))  # another agent moves the shared balance on
    after = _snapshot(client, db_name)
    checkpoints = client[db_name].accord_checkpoints.count_documents({"thread_id": "a"})
    with pytest.raises(RollbackRefused, match="'acct'.*'accounts'.*\\['b'\\]") as refused:
        saver.rollback(config("a"), to=cp)
    assert refused.value.collection == "accounts" and refused.value.record_id == "acct"
    assert _snapshot(client, db_name) == after  # nothing changed
    assert client[db_name].accord_checkpoints.count_documents({"thread_id": "a"}) == checkpoints
    # thread b's own rollback is fine: nobody wrote its records since
    b_first = [h.config["configurable"]["checkpoint_id"] for h in graph.get_state_history(
        config("b"))][-1]  # fmt: skip
    saver.rollback(config("b"), to=b_first)
    assert client[db_name].accounts.find_one()["balance"] == -20
    assert client[db_name].ledger.count_documents({"_id": {"$regex": "^b-"}}) == 0


def test_refused_when_a_record_changed_outside_the_log(
    client: MongoClient, saver: Any, db_name: str
) -> None:
    """A versioned write that left no undo entry (another application's) moves
    ``_version`` on: the rollback sees the record is not as the thread left it."""
    graph = _graph(saver)
    graph.invoke({"n": 0}, config("a"))
    cp = _latest(graph, "a")
    graph.invoke({"n": 0}, config("a"))
    client[db_name].profiles.update_one({"_id": "p"}, {"$set": {"_version": 99}})
    with pytest.raises(RollbackRefused, match="'p'.*'profiles'.*99"):
        saver.rollback(config("a"), to=cp)
    assert client[db_name].ledger.count_documents({}) == 2


class _Commands(monitoring.CommandListener):
    def __init__(self) -> None:
        self.on = False
        self.txns: dict[Any, set[str]] = defaultdict(set)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if not self.on or event.command_name not in ("bulkWrite", "insert", "update", "delete"):
            return
        cmd = event.command
        key = (str(cmd.get("lsid")), cmd.get("txnNumber"))
        if event.command_name == "bulkWrite":
            names = {ns["ns"].split(".", 1)[1] for ns in cmd.get("nsInfo", [])}
        else:
            names = {str(cmd[event.command_name])}
        self.txns[key] |= names

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        pass


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_one_transaction(kind: str, mongo_uri: str, client: MongoClient, db_name: str) -> None:
    """Every write of the rollback (records, undo log, checkpoints, writes, artifacts) is
    in one transaction (only the collection of unreferenced values comes after it)."""
    listener = _Commands()
    client[db_name].notes.insert_one({"_id": "note", "tenant_id": "default"})
    with make_saver(kind, mongo_uri, db_name, listeners=[listener]) as saver:
        graph = _graph(saver)
        graph.invoke({"n": 0}, config("a"))
        cp = _latest(graph, "a")
        graph.invoke({"n": 0}, config("a"))
        listener.on = True
        saver.rollback(config("a"), to=cp)
    together = [names for (_, txn), names in listener.txns.items() if "accounts" in names]
    assert len(together) == 1
    assert {"accounts", "ledger", "profiles", "counters", "notes", undo_log.COLLECTION,
            "accord_checkpoints", "accord_checkpoint_writes", gl.FILES} <= together[0]  # fmt: skip


def test_a_failed_commit_changes_nothing(client: MongoClient, saver: Any, db_name: str) -> None:
    """The database refuses the rollback's commit: no record, checkpoint or undo entry
    changed; the same rollback then succeeds."""
    graph = _graph(saver)
    graph.invoke({"n": 0}, config("a"))
    cp = _latest(graph, "a")
    graph.invoke({"n": 0}, config("a"))
    after = _snapshot(client, db_name)
    undo = client[db_name][undo_log.COLLECTION].count_documents({})
    latest = _latest(graph, "a")
    with fail_command(client, ["commitTransaction"], error_code=2), pytest.raises(DatabaseError):
        saver.rollback(config("a"), to=cp)  # BadValue: not retried
    assert _snapshot(client, db_name) == after
    assert client[db_name][undo_log.COLLECTION].count_documents({}) == undo
    assert _latest(graph, "a") == latest
    saver.rollback(config("a"), to=cp)
    assert _latest(graph, "a") == cp


def test_bad_input(saver: Any) -> None:
    graph = _graph(saver)
    graph.invoke({"n": 0}, config("a"))
    cp = _latest(graph, "a")
    for to in (None, "", 42, {"$gt": ""}, "a\x00"):
        with pytest.raises(InvalidInputError):
            saver.rollback(config("a"), to=to)
    with pytest.raises(RollbackRefused, match="not a checkpoint"):
        saver.rollback(config("a"), to="1f000000-0000-6000-8000-000000000000")
    with pytest.raises(RollbackRefused, match="not a checkpoint"):
        saver.rollback(config("other"), to=cp)  # another thread's checkpoint
    with pytest.raises(RollbackRefused, match="not a checkpoint"):
        saver.rollback(config("a", tenant_id="acme"), to=cp)  # another tenant's
    with pytest.raises(InvalidInputError):
        saver.rollback({"configurable": {}}, to=cp)
    with pytest.raises(InvalidInputError, match="checkpoint_ns"):
        saver.rollback({"configurable": {"thread_id": "a", "checkpoint_ns": "x:1"}}, to=cp)
    with pytest.raises(TypeError):
        saver.rollback(config("a"), cp)  # `to` is keyword-only


def test_the_cli(client: MongoClient, mongo_uri: str, saver: Any, db_name: str) -> None:
    """``accord threads rollback THREAD --to CP`` rewinds and restores; a refusal exits 1
    naming the record."""
    from typer.testing import CliRunner

    from accord.platform.cli import app as cli

    graph = _graph(saver)
    graph.invoke({"n": 0}, config("a"))
    cp = _latest(graph, "a")
    graph.invoke({"n": 0}, config("a"))
    graph.invoke({"n": 0}, config("b"))
    env = {"MONGODB_URI": mongo_uri}
    refused = CliRunner().invoke(cli, ["threads", "rollback", "a", "--to", cp, "--db", db_name],
                                 env=env)  # fmt: skip
    assert refused.exit_code == 1 and "'acct'" in refused.output, refused.output
    # the refusal on stderr, the result on stdout (threads' errors went to stdout)
    assert "'acct'" in refused.stderr and not refused.stdout, refused.stdout
    b_first = [h.config["configurable"]["checkpoint_id"] for h in graph.get_state_history(
        config("b"))][-1]  # fmt: skip
    done = CliRunner().invoke(cli, ["threads", "rollback", "b", "--to", b_first, "--db", db_name],
                              env=env)  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "records restored" in done.stdout
    assert client[db_name].ledger.count_documents({"_id": "b-1"}) == 0


def test_refused_while_a_run_holds_the_thread(client: MongoClient, saver: Any) -> None:
    """A thread being run is not rolled back under its run: ``ConcurrentRunError``."""
    from accord.errors import ConcurrentRunError

    graph = _graph(saver)
    graph.invoke({"n": 0}, config("a"))
    cp = _latest(graph, "a")
    seen: list[BaseException] = []

    def meddler(state: State) -> dict[str, Any]:
        try:
            saver.rollback(config("a"), to=cp)
        except ConcurrentRunError as exc:
            seen.append(exc)
        return {"n": 1}

    g = StateGraph(State)
    g.add_node("meddler", meddler)
    g.add_edge(START, "meddler")
    g.compile(checkpointer=saver).invoke({"n": 0}, config("a"))
    assert len(seen) == 1 and "rollback" in str(seen[0])


def test_a_record_written_twice_in_one_step(client: MongoClient, saver: Any, db_name: str) -> None:
    """A task that creates a record and updates it: both writes are logged (the second
    on the record the first created), and the rollback removes it."""

    def twice(state: State) -> dict[str, Any]:
        business.insert_one("carts", {"_id": "c1", "items": 0})
        business.update_one("carts", {"_id": "c1"}, {"$inc": {"items": 2}})
        return {"n": 1}

    g = StateGraph(State)
    g.add_node("twice", twice)
    g.add_edge(START, "twice")
    graph = g.compile(checkpointer=saver)
    graph.invoke({"n": 0}, config("a"))
    assert client[db_name].carts.find_one() == {
        "_id": "c1", "tenant_id": "default", "items": 2, "_version": 2,
    }  # fmt: skip
    first = [h.config["configurable"]["checkpoint_id"] for h in graph.get_state_history(
        config("a"))][-1]  # fmt: skip
    done = saver.rollback(config("a"), to=first)
    assert done.writes_undone == 2 and done.records_restored == 1
    assert client[db_name].carts.count_documents({}) == 0


def test_records_with_compound_ids(client: MongoClient, saver: Any, db_name: str) -> None:
    """A record whose ``_id`` is a document (a compound key): before, every business
    write on one failed the task with "unhashable type: 'dict'" from the undo log."""
    line = {"order": 1, "line": 2}
    other = {"order": 1, "line": 3}  # differs in one field: another record
    db = client[db_name]
    db.lines.insert_many([
        {"_id": line, "tenant_id": "default", "qty": 1, "_version": 1},
        {"_id": other, "tenant_id": "default", "qty": 5, "_version": 1},
    ])  # fmt: skip
    before = sorted(db.lines.find(), key=str)

    def edit(state: State) -> dict[str, Any]:
        business.insert_one("lines", {"_id": {"order": 7, "line": 1}, "qty": 1})
        business.update_one("lines", {"_id": {"order": 7, "line": 1}}, {"$inc": {"qty": 1}})
        business.update_one("lines", {"_id": line}, {"$inc": {"qty": 1}})
        business.replace_one("lines", {"_id": line}, {"qty": 9})
        business.delete_one("lines", {"_id": other})
        business.update_one("lines", {"_id": {"order": 8, "line": 1}}, {"$set": {"qty": 3}},
                            upsert=True)  # fmt: skip
        return {"n": 1}

    g = StateGraph(State)
    g.add_node("edit", edit)
    g.add_edge(START, "edit")
    graph = g.compile(checkpointer=saver)
    graph.invoke({"n": 0}, config("a"))
    assert db.lines.find_one({"_id": line})["qty"] == 9
    assert db.lines.find_one({"_id": {"order": 7, "line": 1}})["qty"] == 2
    assert db.lines.count_documents({"_id": other}) == 0
    assert db[undo_log.COLLECTION].count_documents({"thread_id": "a"}) == 6
    first = [h.config["configurable"]["checkpoint_id"] for h in graph.get_state_history(
        config("a"))][-1]  # fmt: skip
    saver.rollback(config("a"), to=first)
    assert sorted(db.lines.find(), key=str) == before
