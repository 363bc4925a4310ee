"""Swapping MongoDBSaver for accord on the same database damages nothing (issue 21, item 1).

The real MongoDBSaver (langgraph-checkpoint-mongodb) writes threads; accord is then built
naively on its database, as a user swapping checkpointers would: it refuses to start them
over (naming the migration), and MongoDBSaver still reads every thread unchanged. The
migration (Python API, both twins, and the ``accord checkpoints migrate`` command, killed
half-way and run again) copies them; accord continues them.
"""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.mongodb import MongoDBSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt
from pymongo import AsyncMongoClient, MongoClient
from typer.testing import CliRunner

from accord.checkpointers import AccordSaver, AsyncAccordSaver, CollectionNames
from accord.checkpointers.asynchronous.migration import AsyncMongoDBSaverMigration
from accord.checkpointers.synchronous.migration import MongoDBSaverMigration
from accord.errors import ForeignDataError
from accord.platform.cli import app as cli
from tests.checkpointers.conftest import config, make_saver

LEGACY = CollectionNames(
    checkpoints="checkpoints", blobs="checkpoint_blobs", writes="checkpoint_writes"
)


class S(TypedDict):
    messages: Annotated[list, add_messages]
    log: Annotated[list[str], operator.add]


def _graph() -> StateGraph:
    def bot(state: S) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(f"re {n}", id=f"ai-{n}")], "log": ["bot"]}

    def ask(state: S) -> dict[str, Any]:
        answer = interrupt("ok?")
        return {"log": [f"ask:{answer}"]}

    g = StateGraph(S)
    g.add_node("bot", bot)
    g.add_node("ask", ask)
    g.add_edge(START, "bot")
    g.add_edge("bot", "ask")
    return g


def _say(text: str, n: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(text, id=f"h-{n}")]}


def _history(graph: Any, thread: str) -> list[tuple[Any, ...]]:
    """Everything a user sees of a thread: each checkpoint's id, values, next nodes and
    interrupts, newest first."""
    return [
        (
            s.config["configurable"]["checkpoint_id"],
            s.values,
            s.next,
            [i.value for t in s.tasks for i in t.interrupts],
        )
        for s in graph.get_state_history(config(thread))
    ]


def _write_mongodbsaver_threads(client: MongoClient, db_name: str) -> dict[str, Any]:
    """Three MongoDBSaver threads: a finished one with a fork, one waiting at its interrupt
    (a pending write), one that answered it. Returns each thread's history."""
    legacy = _graph().compile(checkpointer=MongoDBSaver(client, db_name=db_name))
    legacy.invoke(_say("hi", 0), config("done"))
    legacy.invoke(Command(resume="yes"), config("done"))
    legacy.invoke(_say("again", 1), config("done"))
    old = list(legacy.get_state_history(config("done")))
    legacy.update_state(old[-3].config, {"log": ["fork"]})  # a fork in the history
    legacy.invoke(_say("hello", 0), config("waiting"))
    legacy.invoke(_say("hey", 0), config("answered"))
    legacy.invoke(Command(resume="no"), config("answered"))
    return {t: _history(legacy, t) for t in ("done", "waiting", "answered")}


def _setup(saver: Any) -> None:
    """``setup()`` of either saver, from this thread (the async one on its own loop)."""
    if isinstance(saver, AsyncAccordSaver):
        asyncio.run_coroutine_threadsafe(saver.setup(), saver.loop).result(60)
    else:
        saver.setup()


@pytest.fixture()
def legacy_db(client: MongoClient) -> Iterator[str]:
    name = "mdbs_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


def _mongodbsaver_reads(client: MongoClient, db_name: str, expected: dict[str, Any]) -> None:
    legacy = _graph().compile(checkpointer=MongoDBSaver(client, db_name=db_name))
    for thread, history in expected.items():
        assert _history(legacy, thread) == history, thread


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_naive_swap_refuses_and_damages_nothing_then_migrates_and_continues(
    client: MongoClient, mongo_uri: str, legacy_db: str, kind: str
) -> None:
    expected = _write_mongodbsaver_threads(client, legacy_db)
    before = {
        name: sorted(map(repr, client[legacy_db][name].find()))
        for name in ("checkpoints", "checkpoint_writes")
    }

    # the naive swap: accord on MongoDBSaver's database, default arguments
    with make_saver(kind, mongo_uri, legacy_db, setup=False, outbox_events=None) as naive:
        graph = _graph().compile(checkpointer=naive)
        with pytest.raises(ForeignDataError) as refused:
            graph.invoke(_say("hi", 0), config("done"))
        message = str(refused.value)
        assert "accord checkpoints migrate --db " + legacy_db in message
        assert "MongoDBSaver threads in collection 'checkpoints'" in message
        with pytest.raises(ForeignDataError):
            _setup(naive)
        with pytest.raises(ForeignDataError):  # reads too: the threads are not empty
            graph.get_state(config("done"))
    # nor with MongoDBSaver's collection names, even told to ignore unmigrated threads:
    # accord never writes into a collection holding another saver's documents
    colliding = make_saver(
        kind, mongo_uri, legacy_db, setup=False, unmigrated="ignore",
        checkpoint_collection_name="checkpoints", writes_collection_name="checkpoint_writes",
    )  # fmt: skip
    with colliding as s, pytest.raises(ForeignDataError, match="holds MongoDBSaver's checkpoints"):
        _setup(s)
    after = {
        name: sorted(map(repr, client[legacy_db][name].find()))
        for name in ("checkpoints", "checkpoint_writes")
    }
    assert after == before  # not a byte of MongoDBSaver's data changed
    _mongodbsaver_reads(client, legacy_db, expected)

    # the migration, then accord continues the threads
    if kind == "sync":
        report = MongoDBSaverMigration(client, legacy_db).run()
        again = MongoDBSaverMigration(client, legacy_db).run()
    else:

        async def both() -> tuple[Any, Any]:
            aclient: AsyncMongoClient = AsyncMongoClient(mongo_uri)
            try:
                first = await AsyncMongoDBSaverMigration(aclient, legacy_db).run()
                return first, await AsyncMongoDBSaverMigration(aclient, legacy_db).run()
            finally:
                await aclient.close()

        report, again = asyncio.run(both())
    assert (report.threads, report.migrated, report.skipped, report.recorded) == (3, 3, 0, True)
    assert report.checkpoints == sum(len(h) for h in expected.values())
    assert (again.migrated, again.skipped, again.checkpoints) == (0, 3, 0)  # idempotent

    with make_saver(kind, mongo_uri, legacy_db, outbox_events=None) as saver:
        graph = _graph().compile(checkpointer=saver)
        for thread, history in expected.items():
            assert _history(graph, thread) == history, thread
        out = graph.invoke(Command(resume="ok"), config("waiting"))
        assert out["log"] == ["bot", "ask:ok"]
        out = graph.invoke(_say("more", 2), config("done"))
        assert [m.id for m in out["messages"]][-2:] == ["h-2", "ai-3"]
        assert graph.get_state(config("answered")).next == ()
    _mongodbsaver_reads(client, legacy_db, expected)  # still MongoDBSaver's, unchanged


def test_threads_migrated_into_another_database_are_still_refused_beside_their_source(
    client: MongoClient, mongo_uri: str, legacy_db: str
) -> None:
    expected = _write_mongodbsaver_threads(client, legacy_db)
    target = legacy_db + "_to"
    try:
        done = CliRunner().invoke(cli, ["checkpoints", "migrate", "--db", legacy_db,
                                        "--to-db", target, "--uri", mongo_uri])  # fmt: skip
        assert done.exit_code == 0, done.output
        assert f"recorded as migrated into {target}" in done.stdout
        assert f"a saver set up on {legacy_db} still refuses them" in done.stdout
        with pytest.raises(ForeignDataError, match=f"migrated into database '{target}'"):
            AccordSaver(client, db_name=legacy_db).setup()  # would start them over empty
        saver = AccordSaver(client, db_name=target)
        saver.setup()
        graph = _graph().compile(checkpointer=saver)
        for thread, history in expected.items():
            assert _history(graph, thread) == history, thread
        # migrated here as well: the source database's savers continue them too, also
        # after yet another copy elsewhere
        assert MongoDBSaverMigration(client, legacy_db).run().recorded
        AccordSaver(client, db_name=legacy_db).setup()
        assert MongoDBSaverMigration(client, legacy_db, target_db=target + "2").run().recorded
        AccordSaver(client, db_name=legacy_db).setup()
    finally:
        client.drop_database(target)
        client.drop_database(target + "2")


def test_a_migration_of_nothing_is_refused_and_writes_nothing(client: MongoClient) -> None:
    """A typo in --db "migrated 0 threads", created accord's collections in that
    database and recorded it as migrated; '$x' as a collection left a running record."""
    from accord.errors import InvalidInputError

    missing = "nothere_" + uuid.uuid4().hex[:8]
    with pytest.raises(InvalidInputError, match="does not exist: nothing to migrate"):
        MongoDBSaverMigration(client, missing).run()
    assert missing not in client.list_database_names()
    with pytest.raises(InvalidInputError, match="is not a collection name"):
        MongoDBSaverMigration(client, missing, checkpoint_collection_name="$x")
    # accord's own collection as MongoDBSaver's: refused by the library, not only the CLI
    with pytest.raises(InvalidInputError, match="is accord's own 'queued_run' collection"):
        MongoDBSaverMigration(client, missing, checkpoint_collection_name="accord_run_queue")
    with pytest.raises(InvalidInputError, match="is accord's own 'checkpoint_write' collection"):
        MongoDBSaverMigration(client, missing, writes_collection_name="accord_checkpoint_writes")


def test_an_interrupted_migration_resumes(client: MongoClient, legacy_db: str) -> None:
    expected = _write_mongodbsaver_threads(client, legacy_db)
    seen: list[int] = []

    def stop_after_one(progress: Any) -> None:
        seen.append(progress.done)
        if progress.done == 1:
            raise KeyboardInterrupt  # Ctrl-C after the first thread

    with pytest.raises(KeyboardInterrupt):
        MongoDBSaverMigration(client, legacy_db).run(on_progress=stop_after_one)
    # not recorded as migrated: a saver still refuses the database
    with pytest.raises(ForeignDataError, match="not migrated"):
        AccordSaver(client, db_name=legacy_db).setup()
    report = MongoDBSaverMigration(client, legacy_db).run()
    assert (report.migrated, report.skipped) == (2, 1)
    saver = AccordSaver(client, db_name=legacy_db)
    saver.setup()
    graph = _graph().compile(checkpointer=saver)
    for thread, history in expected.items():
        assert _history(graph, thread) == history, thread


def test_a_thread_that_went_on_in_accord_is_not_overwritten_by_a_later_migration(
    client: MongoClient, legacy_db: str
) -> None:
    """MongoDBSaver wrote a thread again after accord went on with it: a re-run of the
    migration leaves accord's thread as it is and names it (it copied MongoDBSaver's
    newer checkpoint, which became the thread's latest: accord's turn was lost)."""
    _write_mongodbsaver_threads(client, legacy_db)
    MongoDBSaverMigration(client, legacy_db).run()
    graph = _graph().compile(checkpointer=AccordSaver(client, db_name=legacy_db))
    graph.invoke(_say("in accord", 7), config("done"))
    ours = _history(graph, "done")
    legacy = _graph().compile(checkpointer=MongoDBSaver(client, db_name=legacy_db))
    legacy.invoke(_say("in MongoDBSaver", 8), config("done"))  # a forgotten old worker
    legacy.invoke(_say("in MongoDBSaver", 8), config("waiting"))
    report = MongoDBSaverMigration(client, legacy_db).run()
    assert report.diverged == ["done"] and report.migrated_threads == ["waiting"]
    assert _history(graph, "done") == ours
    assert "in MongoDBSaver" in [m.content for m in
                                 graph.get_state(config("waiting")).values["messages"]]  # fmt: skip


def test_the_command_killed_half_way_and_run_again_migrates_everything(
    client: MongoClient, mongo_uri: str, legacy_db: str, tmp_path: Path
) -> None:
    """``accord checkpoints migrate`` SIGKILLed while it copies 40 threads, then run again:
    every thread is in accord exactly as MongoDBSaver has it."""
    legacy = _graph().compile(checkpointer=MongoDBSaver(client, db_name=legacy_db))
    threads = [f"t{i:02}" for i in range(40)]
    for t in threads:
        legacy.invoke(_say(f"hi {t}", 0), config(t))
        legacy.invoke(Command(resume=t), config(t))
    expected = {t: _history(legacy, t) for t in threads}
    command = [sys.executable, "-m", "accord.platform.cli", "checkpoints", "migrate",
               "--uri", mongo_uri, "--db", legacy_db]  # fmt: skip
    env = {**os.environ, "COLUMNS": "100"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    coll = client[legacy_db]["accord_checkpoints"]
    deadline = time.monotonic() + 60
    while coll.estimated_document_count() < 20 and time.monotonic() < deadline:
        time.sleep(0.02)  # killed once it has copied a few threads, in the middle of one
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    partial = {d["thread_id"] for d in coll.find({}, {"thread_id": 1})}
    assert partial and len(partial) < len(threads), "the kill did not land mid-migration"

    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "40 threads:" in done.stdout and "already in accord" in done.stdout
    assert f"{legacy_db}.checkpoints is recorded as migrated" in done.stdout
    saver = AccordSaver(client, db_name=legacy_db)
    saver.setup()
    graph = _graph().compile(checkpointer=saver)
    for t in threads:
        assert _history(graph, t) == expected[t], t


def test_a_database_of_an_earlier_accord_keeps_its_collections(
    client: MongoClient, db_name: str
) -> None:
    """A database set up by an accord before the checkpoint collections were prefixed
    (``checkpoints``, ``checkpoint_blobs``, ``checkpoint_writes`` in its catalog) keeps
    working with a saver on the default names: same threads, no new collections."""
    old = AccordSaver(client, db_name=db_name, collections=LEGACY)
    old.setup()
    graph = _graph().compile(checkpointer=old)
    graph.invoke(_say("hi", 0), config("t"))
    saver = AccordSaver(client, db_name=db_name)  # reads before any setup, too
    graph = _graph().compile(checkpointer=saver)
    assert graph.get_state(config("t")).next == ("ask",)
    graph.invoke(Command(resume="yes"), config("t"))
    assert saver.collections.checkpoints == "checkpoints"
    assert graph.get_state(config("t")).values["log"] == ["bot", "ask:yes"]
    names = set(client[db_name].list_collection_names())
    assert not names & {"accord_checkpoints", "accord_checkpoint_blobs", "accord_checkpoint_writes"}


def test_a_database_an_earlier_accord_wrote_beside_mongodbsaver_is_repaired(
    client: MongoClient, legacy_db: str
) -> None:
    """An earlier accord swapped in naively wrote into MongoDBSaver's ``checkpoints``
    (the damage of issue 21). A saver now refuses that collection until its MongoDBSaver
    threads are migrated; then both sets of threads read."""
    old = AccordSaver(client, db_name=legacy_db, collections=LEGACY)
    old.setup()
    _graph().compile(checkpointer=old).invoke(_say("mine", 0), config("accord-thread"))
    # then MongoDBSaver wrote into the same collections (the other order of the damage)
    expected = _write_mongodbsaver_threads(client, legacy_db)
    with pytest.raises(ForeignDataError, match="holds MongoDBSaver's checkpoints"):
        AccordSaver(client, db_name=legacy_db).setup()
    report = MongoDBSaverMigration(client, legacy_db).run()
    assert report.migrated == 3
    saver = AccordSaver(client, db_name=legacy_db)
    saver.setup()
    graph = _graph().compile(checkpointer=saver)
    for thread, history in expected.items():
        assert _history(graph, thread) == history, thread
    assert graph.get_state(config("accord-thread")).next == ("ask",)
