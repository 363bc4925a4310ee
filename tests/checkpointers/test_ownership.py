"""Single writer per thread: the loser of a race gets ConcurrentRunError, nothing half-written."""

from __future__ import annotations

import threading
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from langgraph.graph import START, StateGraph
from pymongo import MongoClient

from accord.checkpointers import AccordSaver
from accord.checkpointers.ownership import BRANCH_MARKER
from accord.errors import ConcurrentRunError
from tests.checkpointers.conftest import config


def _counts(client: MongoClient, db_name: str) -> dict[str, int]:
    db = client[db_name]
    return {name: db[name].count_documents({}) for name in db.list_collection_names()}


def _put(
    saver: AccordSaver, thread: str, parent: str | None, value: str, **md: Any
) -> dict[str, Any]:
    cp = generate_checkpoint(
        channel_values={"v": value}, channel_versions={"v": saver.get_next_version(None, None)}
    )
    meta = generate_metadata(**md)
    return saver.put(config(thread, parent), cp, meta, cp["channel_versions"])


def test_second_writer_from_same_head_loses(client: MongoClient, saver: AccordSaver) -> None:
    other = AccordSaver(client, db_name=saver.db_name)  # a second worker
    head = _put(saver, "t", None, "root", source="input", step=-1)["configurable"]["checkpoint_id"]
    # both workers loaded the head; the first to commit wins
    won = _put(saver, "t", head, "a", step=0)["configurable"]["checkpoint_id"]
    before = _counts(client, saver.db_name)
    with pytest.raises(ConcurrentRunError, match="advanced by another writer"):
        _put(other, "t", head, "b", step=0)
    assert _counts(client, saver.db_name) == before  # nothing of the loser was written
    # the loser's task writes against its stale checkpoint are refused too
    with pytest.raises(ConcurrentRunError):
        other.put_writes(config("t", head), [("v", "late")], "task-b")
    assert _counts(client, saver.db_name) == before
    # the winner keeps going
    _put(saver, "t", won, "a2", step=1)
    assert [t.checkpoint["channel_values"]["v"] for t in saver.list(config("t"))] == [
        "a2",
        "a",
        "root",
    ]


def test_two_workers_starting_a_new_thread(client: MongoClient, saver: AccordSaver) -> None:
    other = AccordSaver(client, db_name=saver.db_name)
    _put(saver, "fresh", None, "first", source="input", step=-1)
    with pytest.raises(ConcurrentRunError, match="started it as a new thread"):
        _put(other, "fresh", None, "second", source="input", step=-1)
    assert len(list(saver.list(config("fresh")))) == 1


def test_explicit_forks_are_allowed(saver: AccordSaver) -> None:
    c0 = _put(saver, "f", None, "0", source="input", step=-1)["configurable"]["checkpoint_id"]
    c1 = _put(saver, "f", c0, "1", step=0)["configurable"]["checkpoint_id"]
    _put(saver, "f", c1, "2", step=1)
    # a stale parent without intent is refused...
    with pytest.raises(ConcurrentRunError):
        _put(saver, "f", c0, "stale", step=1)
    # ...but LangGraph's fork/update checkpoints and addressed reads branch on purpose
    _put(saver, "f", c0, "fork", source="fork", step=1)
    addressed = saver.get_tuple(config("f", c1))
    assert addressed is not None and addressed.config["configurable"][BRANCH_MARKER] == c1
    cp = generate_checkpoint(channel_values={"v": "from-c1"}, channel_versions={"v": "9"})
    saver.put(addressed.config, cp, generate_metadata(step=2), {"v": "9"})
    latest = saver.get_tuple(config("f"))
    assert latest is not None and latest.checkpoint["channel_values"]["v"] == "from-c1"
    assert latest.config["configurable"][BRANCH_MARKER] is None


class S(TypedDict):
    n: int


def test_two_graph_runs_on_one_thread(client: MongoClient, saver: AccordSaver) -> None:
    """Two workers drive the same thread at once: one wins, the history stays one chain."""
    barrier = threading.Barrier(2, timeout=10)

    class Worker(AccordSaver):
        def get_tuple(self, config: Any) -> Any:
            tup = super().get_tuple(config)
            if "checkpoint_id" not in config["configurable"]:
                barrier.wait()  # both runs loaded the same head before either writes
            return tup

    g = StateGraph(S)
    g.add_node("step", lambda s: {"n": s["n"] + 1})
    g.add_edge(START, "step")
    cfg = {"configurable": {"thread_id": "race"}}
    g.compile(checkpointer=saver).invoke({"n": 0}, cfg)
    results: list[Any] = []

    def run(durability: str) -> None:
        worker = Worker(client, db_name=saver.db_name)
        try:
            results.append(
                g.compile(checkpointer=worker).invoke({"n": 10}, cfg, durability=durability)
            )
        except Exception as exc:  # noqa: BLE001
            results.append(exc)

    threads = [threading.Thread(target=run, args=(d,)) for d in ("sync", "async")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 1 and isinstance(errors[0], ConcurrentRunError), results
    assert [r for r in results if not isinstance(r, Exception)] == [{"n": 11}]
    # one chain: every checkpoint's parent is the next older one
    history = list(saver.list(cfg))
    assert len(history) == 6  # three per run: input, __start__, step
    for newer, older in zip(history, history[1:], strict=False):
        assert newer.parent_config is not None
        assert (
            newer.parent_config["configurable"]["checkpoint_id"]
            == older.config["configurable"]["checkpoint_id"]
        )


# --- every ConcurrentRunError says what happened and what to do -----------------------------


def _says_what_and_what_to_do(exc: BaseException, thread: str, *checkpoints: str) -> None:
    message = str(exc)
    assert repr(thread) in message, message
    for cid in checkpoints:
        assert repr(cid) in message, (cid, message)
    assert "reload the thread's latest state" in message and "retry" in message, message
    assert "Only one worker may advance a thread at a time" in message, message


def test_every_concurrent_run_error_says_what_happened_and_what_to_do(
    client: MongoClient, saver: AccordSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = AccordSaver(client, db_name=saver.db_name)
    c0 = _put(saver, "m", None, "0", source="input", step=-1)["configurable"]["checkpoint_id"]
    c1 = _put(other, "m", c0, "1", step=0)["configurable"]["checkpoint_id"]
    before = _counts(client, saver.db_name)

    # 1. a stale parent: the thread was advanced by another writer (put)
    cp = generate_checkpoint(channel_values={"v": "x"}, channel_versions={"v": "1"})
    with pytest.raises(ConcurrentRunError) as info:
        saver.put(config("m", c0), cp, generate_metadata(step=0), {"v": "1"})
    _says_what_and_what_to_do(info.value, "m", c1, c0, cp["id"])

    # 2. two workers start the same new thread
    cp = generate_checkpoint(channel_values={"v": "x"}, channel_versions={"v": "1"})
    with pytest.raises(ConcurrentRunError) as info:
        saver.put(config("m"), cp, generate_metadata(source="input", step=-1), {"v": "1"})
    _says_what_and_what_to_do(info.value, "m", c1, cp["id"])

    # 3. task writes of a checkpoint the thread moved past (another worker's head)
    with pytest.raises(ConcurrentRunError) as info:
        saver.put_writes(config("m", c0), [("v", "late")], "task-1")
    _says_what_and_what_to_do(info.value, "m", c0, c1)

    # 4. task writes of a checkpoint that was never saved
    monkeypatch.setattr("accord.checkpointers.saver._IDLE_GRACE_SECONDS", 0.05)
    with pytest.raises(ConcurrentRunError) as info:
        saver.put_writes(config("m", "never-saved"), [("v", "late")], "task-2")
    _says_what_and_what_to_do(info.value, "m", "never-saved")

    # 5. the head keeps moving at every attempt
    monkeypatch.setattr(AccordSaver, "_head_ok", staticmethod(lambda plan, counts: False))
    cp = generate_checkpoint(channel_values={"v": "x"}, channel_versions={"v": "2"})
    with pytest.raises(ConcurrentRunError) as info:
        other.put(config("m", c1), cp, generate_metadata(step=1), {"v": "2"})
    _says_what_and_what_to_do(info.value, "m", cp["id"])
    assert "kept moving" in str(info.value)

    assert _counts(client, saver.db_name) == before  # none of them wrote anything


def test_concurrent_run_errors_are_built_in_one_place() -> None:
    """Every ConcurrentRunError of the checkpointer comes from ownership.py's builders (whose
    messages the test above checks) or repeats one of their messages."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "accord" / "checkpointers"
    sites = {
        p.name: p.read_text().count("ConcurrentRunError(")
        for p in root.glob("*.py")
        if "ConcurrentRunError(" in p.read_text()
    }
    assert sites == {"ownership.py": 5, "base.py": 1}, sites
