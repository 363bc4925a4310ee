"""Legal holds at scale (docs/governance.md, "Legal holds"): no command of placing or
releasing a subject hold, or of ``apply``'s expiry recompute while one is in force, lists
more than a page of threads, memories or ids, the hold still reaches every document it
covers, and a release stopped anywhere is finished by running it again.

Population and the watching kernel are those of ``test_erasure_limits.py``; a page of 2
stands for the 1,000 of production: the subject's 5 threads and 6 memories are more
than one list may hold, as 10^5 are against MongoDB's 16 MB command limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from pymongo import MongoClient

from accord import runtime
from accord.errors import InvalidInputError
from accord.governance import subjects
from accord.governance.apply import apply, plan
from accord.governance.holding import place, release, subject_held_threads
from accord.governance.holds import Hold, Holds
from accord.governance.loading import parse_policy
from accord.governance.retention import EXPIRE_AT, HELD_EXPIRE_AT
from accord.platform.context import Principal
from accord.runtime import Accord
from tests.governance.test_erasure_limits import THREADS, _in_lists, _populate, _Watched
from tests.governance.test_subjects import OTHER, POLICY, SUBJECT, _DiesAfter, _graph, _Killed

#: threads expire a day after their last commit (their run-registry documents carry
#: ``expire_at``), memories (and their vectors) 30 days after they are written
EXPIRING = (
    POLICY
    + '[classes.checkpoint]\nretention = { expire_after = "1d", after = "last_activity" }\n'
    + '[classes.long_term_memory]\nretention = { expire_after = "30d" }\n'
)
PAGE = 2
#: the subject's threads; ``chat-0`` is shared with ``OTHER``
MINE = [("default", f"chat-{n}") for n in range(THREADS)]
SHARED, THEIRS = ("default", "chat-0"), ("default", "chat-b")


@pytest.fixture()
def expiring_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(EXPIRING)
    monkeypatch.setenv("ACCORD_POLICY", str(path))
    monkeypatch.setenv(runtime.AUDIT_ENV, "full")
    monkeypatch.setattr(subjects, "PAGE", PAGE)
    return path


def _populate_more(client: MongoClient, db_name: str) -> None:
    """:func:`_populate`, more memories of the subject than a page, and ``OTHER`` in the
    subject's thread ``chat-0`` too (a thread both subjects' holds cover)."""
    _populate(client, db_name)
    root = Accord(client=client, db_name=db_name)
    store = root.store()
    for n in range(PAGE * 2):
        store.put(("memories", SUBJECT), f"fact-{n}", {"text": f"fact {n}"})
    shared = {"configurable": {"thread_id": SHARED[1], "user_id": OTHER}}
    _graph(root.checkpointer()).invoke({"messages": [HumanMessage("Me too.", id="h3")]}, shared)


def _state(client: MongoClient, db_name: str) -> dict[str, dict[Any, str]]:
    """Per collection the hold moves, each document's expiry: ``expire_at``,
    ``held_expire_at`` or ``none`` (keyed by thread or memory namespace's subject)."""
    db = client[db_name]

    def expiry(doc: dict[str, Any]) -> str:
        if EXPIRE_AT in doc and HELD_EXPIRE_AT not in doc:
            return EXPIRE_AT
        return HELD_EXPIRE_AT if HELD_EXPIRE_AT in doc and EXPIRE_AT not in doc else "none"

    memories = {d["_id"]: d for d in db.long_term_memory.find()}
    whose = {i: "+".join(sorted({SUBJECT, OTHER} & set(d["namespace"])))
             for i, d in memories.items()}  # fmt: skip
    return {
        "runs": {(d["tenant_id"], d["thread_id"]): expiry(d) for d in db.runs.find()},
        "memories": {(whose[i], str(i)): expiry(d) for i, d in memories.items()},
        "vectors": {
            (whose[d["memory_id"]], str(d["_id"])): expiry(d) for d in db.memory_vectors.find()
        },  # fmt: skip
    }


def _held(state: dict[str, dict[Any, str]], threads: set[tuple[str, str]],
          subjects_: set[str]) -> dict[str, dict[Any, str]]:  # fmt: skip
    """``state`` as it is with exactly ``threads`` and the memories of ``subjects_`` held."""
    return {
        "runs": {k: HELD_EXPIRE_AT if k in threads else EXPIRE_AT for k in state["runs"]},
        **{name: {k: HELD_EXPIRE_AT if k[0] in subjects_ else EXPIRE_AT for k in state[name]}
           for name in ("memories", "vectors")},
    }  # fmt: skip


def test_no_command_of_a_subject_hold_lists_more_than_a_page(
    client: MongoClient, db_name: str, expiring_policy: Path
) -> None:
    """Placing and releasing a hold on a subject with more threads and memories than a
    page: every ``$in`` of every read and plan holds at most a page, and the hold moves
    the expiry of every run-registry document of its threads and of every memory and
    vector of its own; releasing it gives back what no other hold (here one on
    ``OTHER``, who shares ``chat-0``) still covers. Before 2026-12-07 one ``$in`` listed
    all the subject's run-registry ids, memory ids and a batch's ids."""
    _populate_more(client, db_name)
    admin = runtime.kernel(client, principal=Principal.os_user())
    policy = runtime.effective_policy(admin, db_name)
    state = _state(client, db_name)
    assert set(state["runs"].values()) == {EXPIRE_AT} and len(state["runs"]) > PAGE
    assert sum(k[0] == SUBJECT for k in state["memories"]) > PAGE
    assert sum(k[0] == SUBJECT for k in state["vectors"]) > PAGE
    watched = _Watched(admin)
    mine, theirs = Hold("subject", SUBJECT), Hold("subject", OTHER)
    place(watched, db_name, theirs, policy)
    assert place(watched, db_name, mine, policy) > 3 * PAGE
    assert _state(client, db_name) == _held(state, {*MINE, THEIRS}, {SUBJECT, OTHER})
    # the sweep's question, for more threads than a page
    held = subject_held_threads(watched, db_name, policy, Holds.of([mine]), [*MINE, THEIRS])
    assert held == set(MINE)
    assert watched.longest <= PAGE, watched.longest
    release(watched, db_name, mine, policy)
    assert _state(client, db_name) == _held(state, {SHARED, THEIRS}, {OTHER})
    release(watched, db_name, theirs, policy)
    assert _state(client, db_name) == _held(state, set(), set())
    assert watched.longest <= PAGE, watched.longest


def test_a_release_interrupted_anywhere_is_finished_by_a_rerun(
    client: MongoClient, db_name: str, expiring_policy: Path
) -> None:
    """The hold's document goes in the release's first transaction, the expiries come
    back in batches after it: stopped between any two, running ``release`` again (the
    hold is gone) gives every document its expiry back, and leaves what another hold
    covers. Before 2026-12-07 the rerun refused ("no hold"), and the documents stayed
    held for good. A hold that never was is still refused."""
    _populate_more(client, db_name)
    admin = runtime.kernel(client, principal=Principal.os_user())
    policy = runtime.effective_policy(admin, db_name)
    state = _state(client, db_name)
    mine, theirs = Hold("subject", SUBJECT), Hold("subject", OTHER)
    place(admin, db_name, theirs, policy)
    place(admin, db_name, mine, policy)
    counting = _DiesAfter(admin, 10**6)
    release(counting, db_name, mine, policy)
    total = 10**6 - counting.left
    assert total > 3
    for plans in range(1, total):
        place(admin, db_name, mine, policy)
        assert _state(client, db_name) == _held(state, {*MINE, THEIRS}, {SUBJECT, OTHER})
        with pytest.raises(_Killed):
            release(_DiesAfter(admin, plans), db_name, mine, policy)
        assert release(admin, db_name, mine, policy) > 0, plans
        assert _state(client, db_name) == _held(state, {SHARED, THEIRS}, {OTHER}), plans
    with pytest.raises(InvalidInputError, match="no hold"):
        release(admin, db_name, mine, policy)


class _Reads(_Watched):
    """:class:`_Watched`, and the most values the ``$in`` lists of one read's filter hold
    together (:attr:`widest`): an ``$nor`` of many lists of a page each still grows with
    the subject."""

    def __init__(self, uow: Any) -> None:
        super().__init__(uow)
        self.widest = 0

    def find(self, *args: Any, **kwargs: Any) -> Any:
        self.widest = max(self.widest, sum(_in_lists(args)))
        return super().__getattr__("find")(*args, **kwargs)


def test_a_recompute_leaves_a_held_subject_out_a_page_at_a_time(
    client: MongoClient, db_name: str, expiring_policy: Path
) -> None:
    """Written under a policy that stamps nothing, then held (the subject), then applied
    with threads and memories expiring: ``apply``'s recompute stamps ``expire_at`` on every
    document no hold covers and leaves the held ones as they are (stamped at the release),
    and no ``$in`` of its reads and plans lists more than a page. Before 2026-12-07 the
    recompute left them out by one ``$nor`` of every run-registry id of the subject's
    threads and every memory id of its vectors (page-sized lists, but as many as the subject
    needs), and updated a batch's ids in one ``$in``."""
    kept = POLICY + "".join(f"[classes.{c}]\nretention = {{}}\n"
                            for c in ("checkpoint", "short_term_memory", "run"))  # fmt: skip
    expiring_policy.write_text(kept)  # threads do not expire, nor memories
    admin = runtime.kernel(client, principal=Principal.os_user())
    apply(admin, plan(admin, db_name, parse_policy(kept, f"{db_name}.toml")))
    _populate_more(client, db_name)
    state = _state(client, db_name)
    assert set(state["runs"].values()) == {"none"} and len(state["runs"]) > PAGE
    mine = Hold("subject", SUBJECT)
    place(admin, db_name, mine, runtime.effective_policy(admin, db_name))
    expiring_policy.write_text(EXPIRING)
    watched = _Reads(admin)
    apply(watched, plan(watched, db_name, parse_policy(EXPIRING, f"{db_name}.toml")), batch=3)
    assert watched.longest <= PAGE, watched.longest
    assert watched.widest <= PAGE, watched.widest
    held = _held(state, set(MINE), {SUBJECT})
    assert _state(client, db_name) == {
        name: {k: "none" if v == HELD_EXPIRE_AT else v for k, v in kinds.items()}
        for name, kinds in held.items()
    }  # fmt: skip
    # the release stamps them from now (a new kernel: this one may still enforce v1)
    fresh = runtime.kernel(client, principal=Principal.os_user())
    release(fresh, db_name, mine, runtime.effective_policy(fresh, db_name))
    assert _state(client, db_name) == _held(state, set(), set())
