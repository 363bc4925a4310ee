"""Erasure at scale and its report (docs/governance.md, "Erasure"): no command of an
erasure grows with the subject's size, and ``ErasureReport.deleted`` counts what the
deletes deleted.

Fixtures and the graph are those of ``test_subjects.py``. A page of 2 stands for the
1,000 of production: the subject's 5 threads are then more threads, memories and ids
than one list may hold, as 10^5 threads are against MongoDB's 16 MB command limit.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from pymongo import MongoClient

from accord import runtime
from accord.governance import erasure, shredding, subjects
from accord.platform.context import Principal
from accord.platform.plan import Plan
from accord.runtime import Accord
from tests.governance.test_subjects import (
    OTHER,
    SECRET,
    SUBJECT,
    _counts,
    _graph,
    _mentions,
    policy_file,
)

__all__ = ["policy_file"]  # the fixture, imported for pytest

THREADS = 5


def _populate(client: MongoClient, db_name: str) -> None:
    """``SUBJECT`` on :data:`THREADS` threads, ``OTHER`` on one, memories derived by the
    aggregator, and a store memory each."""
    root = Accord(client=client, db_name=db_name)
    graph = _graph(root.checkpointer())
    chats = [(SUBJECT, f"chat-{n}", f"I live in {SECRET} {n}.") for n in range(THREADS)]
    with root.background_aggregator() as worker:
        for user, thread, words in [*chats, (OTHER, "chat-b", "I live in Oslo.")]:
            config = {"configurable": {"thread_id": thread, "user_id": user}}
            graph.invoke({"messages": [HumanMessage(words, id=f"h-{thread}")]}, config)
        assert worker.wait_idle(timeout=60)
    store = root.store()
    store.put(("memories", SUBJECT), "diet", {"text": f"eats {SECRET} pepper"})
    store.put(("memories", OTHER), "diet", {"text": "eats Oslo pepper"})


def _in_lists(value: Any) -> Iterator[int]:
    """The length of every ``$in`` list in ``value`` (a filter, a pipeline, a plan)."""
    if isinstance(value, Plan):
        for group in value.groups:
            for op in group.ops:
                yield from _in_lists(op.filter)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key == "$in" and isinstance(item, list):
                yield len(item)
            yield from _in_lists(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _in_lists(item)


class _Watched:
    """A kernel that notes the longest ``$in`` list of every read and plan it is given,
    and can run something just before the first plan that has a group named ``before``."""

    def __init__(self, uow: Any, before: str | None = None, then: Any = None) -> None:
        self._uow, self._before, self._then = uow, before, then
        self.longest = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._uow, name)
        if not callable(method):
            return method

        def watched(*args: Any, **kwargs: Any) -> Any:
            self.longest = max([self.longest, *_in_lists([args, list(kwargs.values())])])
            return method(*args, **kwargs)

        return watched

    def execute(self, plan: Plan, **kwargs: Any) -> Any:
        self.longest = max([self.longest, *_in_lists(plan)])
        if self._then is not None and any(g.name == self._before for g in plan.groups):
            self._then()
            self._then = None
        return self._uow.execute(plan, **kwargs)


def _erase(uow: Any, db_name: str) -> erasure.ErasureReport:
    return erasure.erase_subject(uow, db_name, runtime.effective_policy(uow, db_name), SUBJECT)


def test_no_command_of_an_erasure_lists_more_than_a_page(
    client: MongoClient, db_name: str, policy_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every list of threads, memories or ids in a filter of the erasure (its reads,
    its deletes, its audit-image and key passes) holds at most a page; the erasure
    still deletes everything across the pages. Before 2026-12-07 ``find_subject`` read
    the outbox and the memories with every thread of the subject in one ``$in``."""
    for module in (subjects, erasure, shredding):
        monkeypatch.setattr(module, "PAGE", 2, raising=False)
    _populate(client, db_name)
    assert client[db_name].long_term_memory.count_documents({}) > 2 * 2
    before = _counts(client, db_name)
    watched = _Watched(runtime.kernel(client, principal=Principal.os_user()))
    report = _erase(watched, db_name)
    assert watched.longest <= 2, watched.longest
    assert report.threads == THREADS
    assert _mentions(client, db_name, SECRET) == {}
    assert _mentions(client, db_name, SUBJECT) == {}
    assert client[db_name].accord_checkpoints.count_documents({"thread_id": "chat-b"}) > 0
    # what the report says was deleted is what is gone
    after = _counts(client, db_name)
    gone = {n: before[n] - after.get(n, 0) for n in before if before[n] > after.get(n, 0)}
    assert sum(report.deleted.values()) == sum(gone.values()), (report.deleted, gone)
    # an export pages the same way
    watched.longest = 0
    subjects.export_subject(watched, db_name, runtime.effective_policy(watched, db_name),
                            OTHER, Path(policy_file).parent / "export")  # fmt: skip
    assert watched.longest <= 2, watched.longest


def test_the_report_counts_what_the_deletes_deleted(
    client: MongoClient, db_name: str, policy_file: Path
) -> None:
    """A document found, then deleted by someone else before the erasure's delete of it
    (here one of the subject's orders), is not counted: the report sums the kernel's
    counts of each delete. Before 2026-12-07 it counted what was found."""
    _populate(client, db_name)
    orders = client[db_name].orders
    mine = orders.count_documents({"user_id": SUBJECT})
    assert mine == THREADS

    def someone_else_deletes_one() -> None:
        assert orders.delete_one({"user_id": SUBJECT}).deleted_count == 1

    uow = runtime.kernel(client, principal=Principal.os_user())
    report = _erase(_Watched(uow, "erase:business:orders", someone_else_deletes_one), db_name)
    assert report.deleted["business:orders"] == mine - 1
    assert orders.count_documents({"user_id": SUBJECT}) == 0
