"""Crypto-shredding, continued (docs/governance.md, "Crypto-shredding"): the keys an
erasure must destroy although no document finds them any more.

Fixtures and the graph are those of ``test_encryption.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from pymongo import MongoClient

from accord import runtime
from accord.errors import KeyDestroyed, SubjectHeld
from accord.governance.crypto import MasterKey
from accord.governance.holding import place, release
from accord.governance.holds import Hold
from accord.platform.context import Principal
from accord.runtime import Accord
from tests.governance.test_encryption import SECRET_A, A, B, _graph, db_name, master

__all__ = ["db_name", "master"]  # the fixtures, imported for pytest


def _config(thread: str, user: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "user_id": user}}


def test_erasing_a_subject_destroys_the_key_of_its_thread_deleted_before(
    client: MongoClient, db_name: str, master: MasterKey
) -> None:
    """A thread deleted before the erasure (``delete_thread``, the retention sweep) is no
    longer found by any document, and its key was left: a backup taken before the
    deletion still read the subject's words after the erasure. The thread's key records
    the subjects its writes named, and the erasure destroys it by them."""
    root = Accord(client=client, db_name=db_name)
    saver = root.checkpointer()
    graph = _graph(saver, root.store())
    graph.invoke({"messages": [HumanMessage(f"old {SECRET_A}", id="h1")]}, _config("old", A))
    graph.invoke({"messages": [HumanMessage(f"new {SECRET_A}", id="h2")]}, _config("new", A))
    graph.invoke({"messages": [HumanMessage("mine", id="h3")]}, _config("b-old", B))
    live = client[db_name]
    backup = {n: list(live[n].find()) for n in live.list_collection_names() if n != "accord_keys"}
    saver.delete_thread("old")
    saver.delete_thread("b-old")

    report = runtime.erase_subject_data(client, A, db_name, compact=False)
    assert report.threads == 1 and report.keys_destroyed == 2  # "new", and "old"
    left = list(live["accord_keys"].find())
    assert [k["thread_id"] for k in left] == ["b-old"]  # another subject's is kept
    assert A.encode() not in b"".join(str(k).encode() for k in left)

    restored = client[db_name + "_restored"]
    for name, docs in backup.items():
        if docs:
            restored[name].insert_many(docs)
    restored["accord_keys"].insert_many(left)
    old = _graph(Accord(client=client, db_name=restored.name).checkpointer(), None)
    for thread in ("old", "new"):
        with pytest.raises(KeyDestroyed):
            old.get_state({"configurable": {"thread_id": thread}})
    assert old.get_state({"configurable": {"thread_id": "b-old"}}).values["messages"]


def test_a_thread_key_records_each_subject_that_writes_the_thread(
    client: MongoClient, db_name: str, master: MasterKey
) -> None:
    """A thread two subjects write: its key names both (added once, not per write), so
    erasing either destroys it; another thread's key is untouched."""
    root = Accord(client=client, db_name=db_name)
    graph = _graph(root.checkpointer(), root.store())
    for user, n in ((A, 1), (B, 2), (A, 3), (B, 4)):
        graph.invoke({"messages": [HumanMessage(f"turn {n}", id=f"h{n}")]}, _config("both", user))
    graph.invoke({"messages": [HumanMessage("alone", id="h9")]}, _config("solo", B))
    keys = {k["thread_id"]: k for k in client[db_name]["accord_keys"].find()}
    assert sorted(keys["both"]["subjects"]) == [A, B]
    assert keys["solo"]["subjects"] == [B]
    saver = root.checkpointer()
    saver.delete_thread("both")
    report = runtime.erase_subject_data(client, A, db_name, compact=False)
    assert report.threads == 0 and report.keys_destroyed == 1
    assert [k["thread_id"] for k in client[db_name]["accord_keys"].find()] == ["solo"]


def test_a_hold_on_a_thread_deleted_before_keeps_its_key(
    client: MongoClient, db_name: str, master: MasterKey
) -> None:
    """A legal hold placed on a thread already deleted keeps what is left of it, its
    data key (backups of the thread stay readable for the case): an erasure of the
    subject, which would destroy that key by the subjects it names, is refused naming
    the hold, and nothing is erased; so is one that would destroy the key of a deleted
    thread another held subject was in. Before 2026-12-07 the erasure destroyed it."""
    root = Accord(client=client, db_name=db_name)
    saver = root.checkpointer()
    graph = _graph(saver, root.store())
    graph.invoke({"messages": [HumanMessage(f"old {SECRET_A}", id="h1")]}, _config("old", A))
    graph.invoke({"messages": [HumanMessage(f"new {SECRET_A}", id="h2")]}, _config("new", A))
    for user, n in ((A, 3), (B, 4)):
        graph.invoke({"messages": [HumanMessage(f"turn {n}", id=f"h{n}")]}, _config("both", user))
    saver.delete_thread("old")
    saver.delete_thread("both")
    live = client[db_name]
    admin = runtime.kernel(client, principal=Principal.os_user())
    policy = runtime.effective_policy(admin, db_name)

    def unchanged(hold: Hold, match: str) -> None:
        place(admin, db_name, hold, policy)
        keys = sorted(k["_id"] for k in live["accord_keys"].find())
        checkpoints = live["accord_checkpoints"].count_documents({})
        with pytest.raises(SubjectHeld, match=match):
            runtime.erase_subject_data(client, A, db_name, compact=False)
        assert sorted(k["_id"] for k in live["accord_keys"].find()) == keys
        assert live["accord_checkpoints"].count_documents({}) == checkpoints
        release(admin, db_name, hold, policy)

    kept = "keeps the data key of a thread deleted before"
    unchanged(Hold("thread", "old", tenant_id="default", reason="case 9"),
              rf"thread 'old' of tenant 'default' \(reason 'case 9'\).*{kept}")  # fmt: skip
    unchanged(Hold("subject", B, reason="case 10"), rf"subject '{B}'.*case 10.*{kept}")
    # a hold on a thread of nobody's erasure does not refuse it
    place(admin, db_name, Hold("thread", "elsewhere", tenant_id="default"), policy)
    report = runtime.erase_subject_data(client, A, db_name, compact=False)
    assert report.threads == 1 and report.keys_destroyed == 3  # "new", "old", "both"
