"""Artifacts by pointer: stored in GridFS's layout before the step, referenced from state by
id and digest, committed by the task's transaction, collected when their step never
committed, deleted with their thread, readable by pymongo's ``gridfs``."""

from __future__ import annotations

import operator
import os
import signal
import subprocess
import sys
import textwrap
from typing import Annotated, Any, TypedDict

import gridfs
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from pymongo import MongoClient

from accord.checkpointers import business
from accord.errors import (
    ArtifactCorrupted,
    ArtifactNotFound,
    ArtifactPending,
    ConfigurationError,
    InvalidInputError,
)
from accord.platform import gridfs_layout as gl
from accord.platform.gridfs_layout import ArtifactRef
from tests.checkpointers.conftest import config

BIG = os.urandom(gl.CHUNK_SIZE * 2 + 1000)  # three chunks


class State(TypedDict):
    refs: Annotated[list[Any], operator.add]


def _graph(saver: Any, data: bytes, *, fail: bool = False) -> Any:
    def store(state: State, config: RunnableConfig) -> dict[str, Any]:
        ref = saver.put_artifact(config, data, content_type="application/pdf",
                                 filename="report.pdf", metadata={"pages": 3})  # fmt: skip
        if fail:
            raise RuntimeError("the tool broke after storing its output")
        return {"refs": [ref.as_dict()]}

    g = StateGraph(State)
    g.add_node("store", store)
    g.add_edge(START, "store")
    return g.compile(checkpointer=saver)


def _files(client: MongoClient, db_name: str) -> list[dict[str, Any]]:
    return list(client[db_name][gl.FILES].find())


def test_round_trip_through_a_step(client: MongoClient, saver: Any, db_name: str) -> None:
    """A node stores three chunks' worth of bytes; state keeps the reference; the step's
    transaction committed it; reading it back gives the same bytes."""
    out = _graph(saver, BIG).invoke({"refs": []}, config("t1"))
    ref = gl.ref_of(out["refs"][0])
    assert ref.length == len(BIG) and ref.content_type == "application/pdf"
    assert saver.get_artifact(ref) == BIG
    assert saver.get_artifact(out["refs"][0]) == BIG  # the dict form too
    (doc,) = _files(client, db_name)
    assert doc["status"] == gl.COMMITTED and doc["thread_id"] == "t1"
    assert doc["task_id"] and doc["checkpoint_id"] and doc["metadata"] == {"pages": 3}
    assert client[db_name][gl.CHUNKS].count_documents({"files_id": ref.id}) == 3


def test_empty_and_outside_a_node(saver: Any) -> None:
    """Empty data has no chunks; an artifact stored with a plain thread config (not in a
    node) is the thread's at once."""
    ref = saver.put_artifact(config("t2"), b"", content_type="text/plain")
    assert ref.length == 0 and saver.get_artifact(ref) == b""
    assert saver.gc_artifacts(grace=0) == 0  # committed: not an orphan


def test_digest_is_checked(client: MongoClient, saver: Any, db_name: str) -> None:
    ref = saver.put_artifact(config("t3"), b"hello world")
    client[db_name][gl.CHUNKS].update_one({"files_id": ref.id}, {"$set": {"data": b"hello w0rld"}})
    with pytest.raises(ArtifactCorrupted, match="digest"):
        saver.get_artifact(ref)
    forged = ArtifactRef(ref.id, "0" * 64, ref.length, ref.content_type)
    with pytest.raises(ArtifactCorrupted):
        saver.get_artifact(forged)
    client[db_name][gl.CHUNKS].delete_many({"files_id": ref.id})
    with pytest.raises(ArtifactCorrupted, match="chunks"):
        saver.get_artifact(ref)
    with pytest.raises(ArtifactNotFound):
        saver.get_artifact(ArtifactRef(gl.new_id(), "0" * 64, 1, "x/y"))


def test_a_failed_task_leaves_an_orphan_that_is_collected(
    client: MongoClient, saver: Any, db_name: str
) -> None:
    graph = _graph(saver, b"partial output", fail=True)
    with pytest.raises(RuntimeError):
        graph.invoke({"refs": []}, config("t4"))
    (doc,) = _files(client, db_name)
    assert doc["status"] == gl.PENDING
    ref = ArtifactRef(doc["_id"], doc["sha256"], doc["length"], doc["contentType"])
    with pytest.raises(ArtifactPending, match="pending.*has not committed"):
        saver.get_artifact(ref)  # before 2026-12-07: its bytes, until collected
    assert saver.gc_artifacts(grace=3600) == 0  # within its grace: kept
    assert saver.gc_artifacts(grace=0) == 1
    assert _files(client, db_name) == []
    assert client[db_name][gl.CHUNKS].count_documents({}) == 0


def test_other_tenants_cannot_read(saver: Any) -> None:
    ref = saver.put_artifact(config("t5"), b"secret")
    with pytest.raises(ArtifactNotFound):
        saver.get_artifact(ref, tenant_id="other")


def test_deleted_with_their_thread(client: MongoClient, saver: Any, db_name: str) -> None:
    kept = _graph(saver, b"keep me").invoke({"refs": []}, config("keep"))
    _graph(saver, BIG).invoke({"refs": []}, config("doomed"))
    saver.delete_thread("doomed")
    assert [d["thread_id"] for d in _files(client, db_name)] == ["keep"]
    assert client[db_name][gl.CHUNKS].count_documents({"thread_id": "doomed"}) == 0
    assert saver.get_artifact(kept["refs"][0]) == b"keep me"


def test_readable_by_pymongo_gridfs(client: MongoClient, saver: Any, db_name: str) -> None:
    out = _graph(saver, BIG).invoke({"refs": []}, config("t6"))
    ref = gl.ref_of(out["refs"][0])
    bucket = gridfs.GridFSBucket(client[db_name], bucket_name=gl.BUCKET)
    stream = bucket.open_download_stream(ref.id)
    assert stream.read() == BIG
    assert stream.filename == "report.pdf" and stream.length == len(BIG)


def test_bad_input(saver: Any) -> None:
    cfg = config("t7")
    for data in ("text", None, 42, ["b"]):
        with pytest.raises(InvalidInputError, match="bytes"):
            saver.put_artifact(cfg, data)
    for kwargs in ({"content_type": ""}, {"content_type": 3}, {"filename": "a\x00b"},
                   {"metadata": "x"}, {"metadata": {"$where": 1}},
                   {"metadata": {"big": "x" * 70_000}}):  # fmt: skip
        with pytest.raises(InvalidInputError):
            saver.put_artifact(cfg, b"x", **kwargs)
    with pytest.raises(InvalidInputError):
        saver.put_artifact({"configurable": {}}, b"x")  # no thread
    for ref in ("art_x", {"id": {"$ne": None}, "digest": "0" * 64, "length": 1,
                           "content_type": "a"},
                {"id": gl.new_id(), "digest": "zz", "length": 1, "content_type": "a"},
                {"id": gl.new_id(), "digest": "0" * 64, "length": -1, "content_type": "a"}):  # fmt: skip
        with pytest.raises(InvalidInputError):
            saver.get_artifact(ref)
    for grace in (-1, "1", True, None):
        with pytest.raises(InvalidInputError):
            saver.gc_artifacts(grace=grace)


def test_durability_exit_is_refused(saver: Any) -> None:
    graph = _graph(saver, b"x")
    with pytest.raises(ConfigurationError, match="exit"):
        graph.invoke({"refs": []}, config("t8"), durability="exit")


def test_business_writes_may_not_target_artifacts(saver: Any) -> None:
    def node(state: State) -> dict[str, Any]:
        business.insert_one(gl.FILES, {"_id": "forged"})
        return {"refs": []}

    g = StateGraph(State)
    g.add_node("n", node)
    g.add_edge(START, "n")
    with pytest.raises(InvalidInputError, match="accord's own"):
        g.compile(checkpointer=saver).invoke({"refs": []}, config("t9"))


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from typing import Annotated, Any, TypedDict
    import operator
    from langgraph.graph import START, StateGraph
    from pymongo import MongoClient
    from accord.checkpointers import AccordSaver

    class State(TypedDict):
        refs: Annotated[list[Any], operator.add]

    uri, db_name = sys.argv[1], sys.argv[2]
    saver = AccordSaver(MongoClient(uri), db_name=db_name, lease_seconds=1)

    def store(state, config):
        ref = saver.put_artifact(config, b"x" * 300_000)
        print(ref.id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # dies before the step commits
        return {"refs": [ref.as_dict()]}

    g = StateGraph(State)
    g.add_node("store", store)
    g.add_edge(START, "store")
    # durability="sync": the input checkpoint is committed before the node runs, so the
    # kill finds no transaction open (one left open would hold thread k's documents until
    # the server aborts it, 60 s: docs/checkpointer.md, "paused or killed in a commit")
    g.compile(checkpointer=saver).invoke({"refs": []}, {"configurable": {"thread_id": "k"}},
                                         durability="sync")
    """
)


@pytest.mark.slow
def test_the_artifact_of_a_killed_step_is_collected(
    mongo_uri: str, client: MongoClient, db_name: str
) -> None:
    """A worker stores an artifact and is SIGKILLed before its step commits: the artifact
    stays pending, ``gc_artifacts`` collects it (and only it); resuming the thread runs
    the step again and commits a new artifact."""
    from accord.checkpointers import AccordSaver

    saver = AccordSaver(MongoClient(mongo_uri), db_name=db_name)
    saver.setup()
    committed = saver.put_artifact(config("other"), b"committed")
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, mongo_uri, db_name], capture_output=True, text=True,
        timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr
    orphan_id = child.stdout.split()[0]
    orphan = client[db_name][gl.FILES].find_one({"_id": orphan_id})
    assert orphan is not None and orphan["status"] == gl.PENDING
    assert saver.gc_artifacts(grace=0) == 1
    assert client[db_name][gl.FILES].find_one({"_id": orphan_id}) is None
    assert client[db_name][gl.CHUNKS].count_documents({"files_id": orphan_id}) == 0
    assert saver.get_artifact(committed) == b"committed"
    out = _graph(saver, b"second try").invoke(None, config("k"))
    assert saver.get_artifact(out["refs"][0]) == b"second try"
    assert client[db_name][gl.FILES].find_one({"_id": out["refs"][0]["id"]})["status"] == (
        gl.COMMITTED
    )


def test_the_cli_collects_orphans(
    client: MongoClient, mongo_uri: str, saver: Any, db_name: str
) -> None:
    from typer.testing import CliRunner

    from accord.platform.cli import app as cli

    with pytest.raises(RuntimeError):
        _graph(saver, b"orphan", fail=True).invoke({"refs": []}, config("t10"))
    env = {"MONGODB_URI": mongo_uri}
    args = ["threads", "gc-artifacts", "--db", db_name]
    kept = CliRunner().invoke(cli, [*args, "--grace", "3600"], env=env)
    assert kept.exit_code == 0 and "0 orphaned" in kept.output, kept.output
    done = CliRunner().invoke(cli, [*args, "--grace", "0"], env=env)
    assert done.exit_code == 0 and "1 orphaned" in done.output, done.output
    assert _files(client, db_name) == []
    for grace in ("-1", "inf", "nan"):  # usage errors (inf overflowed, nan passed `< 0`)
        bad = CliRunner().invoke(cli, [*args, "--grace", grace], env=env)
        assert bad.exit_code == 2 and "grace" in bad.output, bad.output
    with pytest.raises(InvalidInputError, match="grace must be"):
        saver.gc_artifacts(grace=float("inf"))


def test_async_node_and_saver(mongo_uri: str, client: MongoClient, db_name: str) -> None:
    """``aput_artifact`` in an async node of a graph run with ``ainvoke`` on
    ``AsyncAccordSaver``; ``aget_artifact`` reads it back."""
    import asyncio

    from pymongo import AsyncMongoClient

    from accord.checkpointers import AsyncAccordSaver

    async def main() -> bytes:
        aclient: AsyncMongoClient[Any] = AsyncMongoClient(mongo_uri)
        try:
            saver = AsyncAccordSaver(aclient, db_name=db_name)
            await saver.setup()

            async def store(state: State, config: RunnableConfig) -> dict[str, Any]:
                ref = await saver.aput_artifact(config, BIG, content_type="x/y")
                return {"refs": [ref.as_dict()]}

            g = StateGraph(State)
            g.add_node("store", store)
            g.add_edge(START, "store")
            out = await g.compile(checkpointer=saver).ainvoke({"refs": []}, config("a1"))
            assert await saver.agc_artifacts(grace=0) == 0
            return await saver.aget_artifact(out["refs"][0])
        finally:
            await aclient.close()

    assert asyncio.run(main()) == BIG
    assert _files(client, db_name)[0]["status"] == gl.COMMITTED


class Chain(TypedDict):
    refs: Annotated[list[Any], operator.add]
    read: Annotated[list[Any], operator.add]


def test_a_later_node_reads_what_an_earlier_one_stored(saver: Any) -> None:
    """Under "async" durability (LangGraph's default) the next node runs while the task
    that stored the artifact is still being committed: its read waits for that commit
    rather than being refused as pending (or, before 2026-12-07, reading bytes no step
    had committed)."""

    def store(state: Chain, config: RunnableConfig) -> dict[str, Any]:
        return {"refs": [saver.put_artifact(config, b"report").as_dict()]}

    def read(state: Chain) -> dict[str, Any]:
        return {"read": [saver.get_artifact(state["refs"][-1])]}

    g = StateGraph(Chain)
    g.add_node("store", store)
    g.add_node("read", read)
    g.add_edge(START, "store")
    g.add_edge("store", "read")
    graph: Any = g.compile(checkpointer=saver)
    for i in range(10):
        out = graph.invoke({"refs": [], "read": []}, config(f"chain{i}"), durability="async")
        assert out["read"] == [b"report"]


def test_a_node_cannot_read_back_its_own_pending_artifact(saver: Any) -> None:
    """The task that stored an artifact reads it as pending (at once: its writes come
    only after it returns); nothing of a step is visible before the step commits."""
    seen: list[str] = []

    def store(state: State, config: RunnableConfig) -> dict[str, Any]:
        ref = saver.put_artifact(config, b"mine")
        try:
            saver.get_artifact(ref)
        except ArtifactPending as exc:
            seen.append(type(exc).__name__)
        return {"refs": [ref.as_dict()]}

    g = StateGraph(State)
    g.add_node("store", store)
    g.add_edge(START, "store")
    graph: Any = g.compile(checkpointer=saver)
    out = graph.invoke({"refs": []}, config("own"))
    assert seen == ["ArtifactPending"]
    assert saver.get_artifact(out["refs"][0]) == b"mine"  # committed with its step
