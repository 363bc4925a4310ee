"""``copy_thread`` (and so a queued run's fork) copies the committed artifacts of the
source thread, each to a copy of its own on the target thread: the copied state's
references read the copy (found by the id they name), and deleting either thread leaves
the other's artifacts whole."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from pymongo import MongoClient

from accord.errors import ArtifactNotFound
from accord.platform import gridfs_layout as gl
from tests.checkpointers.conftest import config

BIG = bytes(range(256)) * (gl.CHUNK_SIZE * 2 // 256) + b"tail"  # three chunks


class State(TypedDict):
    refs: Annotated[list[Any], operator.add]


def _graph(saver: Any, data: bytes, *, fail: bool = False) -> Any:
    def store(state: State, config: RunnableConfig) -> dict[str, Any]:
        ref = saver.put_artifact(config, data, content_type="application/pdf")
        if fail:
            raise RuntimeError("the tool broke after storing its output")
        return {"refs": [ref.as_dict()]}

    g = StateGraph(State)
    g.add_node("store", store)
    g.add_edge(START, "store")
    return g.compile(checkpointer=saver)


def _files(client: MongoClient, db_name: str, thread: str) -> list[dict[str, Any]]:
    return list(client[db_name][gl.FILES].find({"thread_id": thread}).sort("uploadDate", 1))


def _source(saver: Any) -> list[Any]:
    """Thread ``src`` with two committed artifacts (three chunks, one) and an orphan."""
    _graph(saver, BIG).invoke({"refs": []}, config("src"))
    out = _graph(saver, b"small").invoke({"refs": []}, config("src"))
    with pytest.raises(RuntimeError):
        _graph(saver, b"orphan", fail=True).invoke({"refs": []}, config("src"))
    return out["refs"]


@pytest.mark.parametrize("deleted", ["src", "dst"])
def test_copied_artifacts_survive_the_deletion_of_either_thread(
    client: MongoClient, saver: Any, db_name: str, deleted: str
) -> None:
    refs = _source(saver)
    assert len(refs) == 2
    saver.copy_thread("src", "dst")
    copies = _files(client, db_name, "dst")
    originals = {d["_id"]: d for d in _files(client, db_name, "src")}
    assert len(originals) == 3  # two committed, one pending (the failed step's)
    assert [c["alias_of"] for c in copies] == [r["id"] for r in refs]  # the orphan is not
    for copy in copies:
        assert copy["status"] == gl.COMMITTED and copy["_id"] not in originals
        source = originals[copy["alias_of"]]
        assert (copy["sha256"], copy["checkpoint_id"]) == (
            source["sha256"],
            source["checkpoint_id"],
        )
    chunks = client[db_name][gl.CHUNKS]
    assert chunks.count_documents({"thread_id": "dst"}) == 4
    assert chunks.count_documents({"files_id": copies[0]["_id"]}) == 3
    state = saver.get_tuple(config("dst")).checkpoint["channel_values"]["refs"]
    assert state == refs  # the copy's state names the originals' ids
    saver.delete_thread(deleted)
    kept = "dst" if deleted == "src" else "src"
    assert len(_files(client, db_name, deleted)) == 0
    assert chunks.count_documents({"thread_id": deleted}) == 0
    assert saver.get_artifact(refs[0]) == BIG  # by the id the state names: the copy
    assert saver.get_artifact(refs[1]) == b"small"
    if kept == "dst":  # the copy goes on: a new step stores an artifact of its own
        out = _graph(saver, b"more").invoke({"refs": []}, config("dst"))
        assert [saver.get_artifact(r) for r in out["refs"]] == [BIG, b"small", b"more"]
    saver.delete_thread(kept)
    with pytest.raises(ArtifactNotFound):
        saver.get_artifact(refs[0])
    assert client[db_name][gl.FILES].count_documents({}) == 0


def test_a_copy_of_a_copy_and_other_tenants(client: MongoClient, saver: Any, db_name: str) -> None:
    refs = _source(saver)
    saver.copy_thread("src", "one")
    saver.copy_thread("one", "two")
    assert [d["alias_of"] for d in _files(client, db_name, "two")] == [r["id"] for r in refs]
    saver.delete_thread("src")
    saver.delete_thread("one")
    assert saver.get_artifact(refs[0]) == BIG
    with pytest.raises(ArtifactNotFound):
        saver.get_artifact(refs[0], tenant_id="other")


def test_copying_again_after_a_crash_writes_the_same_copies(
    client: MongoClient, saver: Any, db_name: str
) -> None:
    """A fork whose worker died after copying the artifacts (pending) and before the
    checkpoints copies again: the same documents, committed."""
    _source(saver)
    saver.copy_thread("src", "dst")
    db = client[db_name]
    first = {d["_id"]: d for d in db[gl.CHUNKS].find({"thread_id": "dst"})}
    # the crash: the checkpoints not copied yet, the last copy not committed yet
    for name in db.list_collection_names():
        if name.startswith("accord_checkpoint"):
            db[name].delete_many({"thread_id": "dst"})
    db[gl.FILES].update_one({"thread_id": "dst"}, {"$set": {"status": gl.PENDING}})
    saver.copy_thread("src", "dst")
    assert {d["_id"]: d for d in db[gl.CHUNKS].find({"thread_id": "dst"})} == first
    assert [d["status"] for d in _files(client, db_name, "dst")] == [gl.COMMITTED] * 2
    assert saver.get_tuple(config("dst")) is not None
