"""Threads under retention (issue 23): recorded calls go with their thread, deleting a
held thread is refused with ``LegalHoldError`` (saver and ``accord threads delete``),
subject holds reach the threads whose checkpoints name the subject, and the sweep deletes
in bounded, paced batches without touching what a kept checkpoint needs."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

import pytest
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from pymongo import MongoClient
from typer.testing import CliRunner

from accord import runtime
from accord.checkpointers import AccordSaver
from accord.checkpointers.recorded import recorded
from accord.errors import InvalidInputError, LegalHoldError
from accord.governance.apply import apply, plan
from accord.governance.holding import place, release
from accord.governance.holds import Hold
from accord.governance.loading import default_policy, parse_policy
from accord.platform.cli import app as cli
from accord.platform.context import Principal
from tests.test_kernel_doors import _graph

CALLS = "accord_recorded_calls"
THREAD_COLLECTIONS = (
    "accord_checkpoints", "accord_checkpoint_blobs", "accord_checkpoint_writes",
    "short_term_memory", CALLS, "accord_business_undo", "accord_artifacts.files",
    "accord_artifacts.chunks",
)  # fmt: skip
EXPIRING = '[classes.checkpoint]\nretention = { expire_after = "1s", after = "last_activity" }\n'
LASTING = '[classes.checkpoint]\nretention = { expire_after = "1h", after = "last_activity" }\n'


class State(TypedDict, total=False):
    out: list[Any]


@pytest.fixture(autouse=True)
def _fast_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCORD_POLICY", raising=False)
    monkeypatch.setenv("ACCORD_POLICY_REFRESH", "0.2")


def _apply(client: MongoClient, db: str, text: str) -> None:
    admin = runtime.kernel(client, principal=Principal.os_user(), policy=default_policy())
    apply(admin, plan(admin, db, parse_policy(text, f"{db}.toml")))


def _admin(client: MongoClient) -> Any:
    return runtime.kernel(client, principal=Principal.os_user())


def _config(thread: str, **extra: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, **extra}


def _turns(graph: Any, thread: str, n: int, user: str | None = None) -> None:
    for i in range(n):
        config = _config(thread, metadata={"user_id": user}) if user else _config(thread)
        graph.invoke({"messages": [HumanMessage(f"turn {i}", id=uuid.uuid4().hex)], "log": []},
                     config)  # fmt: skip


def _count(client: MongoClient, db: str, thread: str) -> dict[str, int]:
    return {c: client[db][c].count_documents({"thread_id": thread}) for c in THREAD_COLLECTIONS}


def _calling_graph(saver: AccordSaver) -> Any:
    tool = recorded(name="fake.tool", idempotent=True)(lambda x: f"done {x}")

    def work(state: State) -> State:
        return {"out": [tool("a"), tool("b")]}

    g = StateGraph(State)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g.compile(checkpointer=saver)


def _uri(client: MongoClient) -> str:
    host, port = client.address  # type: ignore[misc]
    return f"mongodb://{host}:{port}/?directConnection=true"


# --- recorded calls go with their thread -----------------------------------------------


def test_delete_thread_deletes_its_recorded_calls(client: MongoClient, db_name: str) -> None:
    saver = AccordSaver(client, db_name=db_name)
    graph = _calling_graph(saver)
    graph.invoke({"out": []}, _config("t-calls"))
    graph.invoke({"out": []}, _config("t-other"))
    assert client[db_name][CALLS].count_documents({"thread_id": "t-calls"}) == 2
    saver.delete_thread("t-calls")
    assert sum(_count(client, db_name, "t-calls").values()) == 0
    assert client[db_name][CALLS].count_documents({"thread_id": "t-other"}) == 2  # untouched
    assert graph.get_state(_config("t-other")).values["out"] == ["done a", "done b"]


def test_the_sweep_of_an_expired_thread_deletes_its_recorded_calls(
    client: MongoClient, db_name: str
) -> None:
    _apply(client, db_name, EXPIRING)
    saver = AccordSaver(client, db_name=db_name)
    graph = _calling_graph(saver)
    for thread in ("old-1", "old-2", "old-3"):
        graph.invoke({"out": []}, _config(thread))
    assert client[db_name][CALLS].count_documents({}) == 6
    time.sleep(1.2)
    report = runtime.sweep(client, db_name, batch=1000)
    assert report.expired_threads == 3 and report.documents > 6
    for thread in ("old-1", "old-2", "old-3"):
        assert sum(_count(client, db_name, thread).values()) == 0


# --- legal holds stop deletion -----------------------------------------------------------


@pytest.mark.parametrize("by", ["thread", "tenant", "class"])
def test_delete_thread_of_a_held_thread_raises_and_deletes_nothing(
    client: MongoClient, db_name: str, by: str
) -> None:
    saver = AccordSaver(client, db_name=db_name)
    graph = _calling_graph(saver)
    graph.invoke({"out": []}, _config("t-held"))
    before = _count(client, db_name, "t-held")
    hold = {
        "thread": Hold("thread", "t-held", "default", reason="case 17"),
        "tenant": Hold("tenant", "default"),
        "class": Hold("class", "checkpoint"),
    }[by]
    admin = _admin(client)
    place(admin, db_name, hold, runtime.effective_policy(admin, db_name))
    with pytest.raises(LegalHoldError) as refused:
        saver.delete_thread("t-held")  # at once: the guard reads the holds in its transaction
    assert refused.value.hold_id == hold.id
    assert hold.describe() in str(refused.value) and "nothing was deleted" in str(refused.value)
    assert _count(client, db_name, "t-held") == before
    assert graph.get_state(_config("t-held")).values["out"] == ["done a", "done b"]
    release(admin, db_name, hold, runtime.effective_policy(admin, db_name))
    saver.delete_thread("t-held")
    assert sum(_count(client, db_name, "t-held").values()) == 0


def test_prune_of_a_held_thread_raises(client: MongoClient, db_name: str) -> None:
    saver = AccordSaver(client, db_name=db_name)
    graph = _graph(saver)
    _turns(graph, "t-held", 3)
    before = _count(client, db_name, "t-held")
    admin = _admin(client)
    place(admin, db_name, Hold("thread", "t-held", "default"), default_policy())
    with pytest.raises(LegalHoldError):
        saver.prune(["t-held"], keep=1)
    assert _count(client, db_name, "t-held") == before


def test_a_subject_hold_reaches_the_threads_whose_checkpoints_name_the_subject(
    client: MongoClient, db_name: str
) -> None:
    _apply(client, db_name, EXPIRING)
    saver = AccordSaver(client, db_name=db_name)
    graph = _graph(saver)
    _turns(graph, "t-u7", 1, user="u-7")
    _turns(graph, "t-u8", 1, user="u-8")
    _turns(graph, "t-anon", 1)
    admin = _admin(client)
    policy = runtime.effective_policy(admin, db_name)
    hold = Hold("subject", "u-7", reason="subject access request")
    place(admin, db_name, hold, policy)
    # the run-registry document of the subject's thread lost its expiry
    runs = {d["thread_id"]: d for d in client[db_name].runs.find()}
    assert "expire_at" not in runs["t-u7"] and "held_expire_at" in runs["t-u7"]
    assert "expire_at" in runs["t-u8"]
    with pytest.raises(LegalHoldError) as refused:
        saver.delete_thread("t-u7")
    assert "subject 'u-7'" in str(refused.value)
    time.sleep(1.2)
    report = runtime.sweep(client, db_name)
    assert report.expired_threads == 2  # t-u8 and t-anon
    assert _count(client, db_name, "t-u7")["accord_checkpoints"] > 0
    # a commit of the held subject's thread sets no expiry again
    time.sleep(1.0)  # the process's view of the holds is refreshed (every 0.2 s; margin for load)
    _turns(graph, "t-u7", 1, user="u-7")
    assert "expire_at" not in client[db_name].runs.find_one({"thread_id": "t-u7"})
    release(admin, db_name, hold, policy)
    assert "expire_at" in client[db_name].runs.find_one({"thread_id": "t-u7"})
    time.sleep(1.2)
    assert runtime.sweep(client, db_name).expired_threads == 1
    assert sum(_count(client, db_name, "t-u7").values()) == 0


def test_a_commit_without_a_checkpoint_gives_a_subject_held_thread_no_expiry(
    client: MongoClient, db_name: str
) -> None:
    """Task writes alone (or the first plan of a batch, which leads with the thread's
    guard, before the put that names the user) cannot tell whose thread it is: while a
    subject hold exists they leave the thread's expiry as it is (before, they stamped it
    again, so the test above failed when the saver's batches fell that way)."""
    _apply(client, db_name, EXPIRING)
    saver = AccordSaver(client, db_name=db_name)
    graph = _graph(saver)
    _turns(graph, "t-u7", 1, user="u-7")
    _turns(graph, "t-u8", 1, user="u-8")
    admin = _admin(client)
    place(admin, db_name, Hold("subject", "u-7"), runtime.effective_policy(admin, db_name))
    time.sleep(0.5)  # the saver's view of the holds is refreshed (every 0.2 s)
    for thread in ("t-u7", "t-u8"):
        latest = saver.get_tuple(_config(thread))
        assert latest is not None
        saver.put_writes(latest.config, [("log", ["a pending write"])], task_id="t-1")
    runs = {d["thread_id"]: d for d in client[db_name].runs.find()}
    assert "expire_at" not in runs["t-u7"] and "held_expire_at" in runs["t-u7"]
    assert "expire_at" in runs["t-u8"]  # kept as it was: no subject visible, no new stamp


def test_the_sweep_skips_a_subject_held_thread_even_when_its_expiry_came_back(
    client: MongoClient, db_name: str
) -> None:
    """A thread stamped again some other way (here by hand: a process that had not
    seen the hold yet) is still left by the sweep, which finds the subject in its
    checkpoints."""
    _apply(client, db_name, EXPIRING)
    saver = AccordSaver(client, db_name=db_name)
    graph = _graph(saver)
    _turns(graph, "t-u7", 1, user="u-7")
    admin = _admin(client)
    place(admin, db_name, Hold("subject", "u-7"), runtime.effective_policy(admin, db_name))
    past = client[db_name].runs.find_one({"thread_id": "t-u7"})["held_expire_at"]
    client[db_name].runs.update_one({"thread_id": "t-u7"}, {"$set": {"expire_at": past}})
    time.sleep(1.2)
    report = runtime.sweep(client, db_name)
    assert report.expired_threads == 0 and report.held_skipped == 1
    assert _count(client, db_name, "t-u7")["accord_checkpoints"] > 0


# --- accord threads delete -----------------------------------------------------------


def test_threads_delete_cli(client: MongoClient, db_name: str) -> None:
    saver = AccordSaver(client, db_name=db_name)
    graph = _calling_graph(saver)
    graph.invoke({"out": []}, _config("t-1"))
    graph.invoke({"out": []}, _config("t-2"))
    env = {"MONGODB_URI": _uri(client)}
    runner = CliRunner()
    admin = _admin(client)
    place(admin, db_name, Hold("thread", "t-1", "default", reason="case 9"), default_policy())
    held = runner.invoke(cli, ["threads", "delete", "t-1", "--db", db_name, "--yes"], env=env)
    assert held.exit_code == 1
    assert "legal hold" in held.output and "thread:default:t-1" in held.output
    assert _count(client, db_name, "t-1")["accord_checkpoints"] > 0
    asked = runner.invoke(cli, ["threads", "delete", "t-2", "--db", db_name], input="n\n", env=env)
    assert asked.exit_code == 1 and "nothing deleted" in asked.output
    assert _count(client, db_name, "t-2")["accord_checkpoints"] > 0
    done = runner.invoke(cli, ["threads", "delete", "t-2", "--db", db_name, "--tenant", "default",
                               "--keep-memories", "--yes"], env=env)  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "deleted thread 't-2'" in done.output and "memories are kept" in done.output
    assert sum(_count(client, db_name, "t-2").values()) == 0
    bad = runner.invoke(cli, ["threads", "delete", "", "--db", db_name, "--yes"], env=env)
    assert bad.exit_code == 2 and "non-empty" in bad.output


# --- the sweep: bounded, paced batches ---------------------------------------------------


def test_the_sweep_deletes_in_bounded_batches_and_keeps_the_rest(
    client: MongoClient, db_name: str
) -> None:
    _apply(client, db_name, LASTING)
    saver = AccordSaver(client, db_name=db_name)
    graph = _graph(saver)
    for i in range(6):
        _turns(graph, f"old-{i}", 1)
    per_thread = sum(_count(client, db_name, "old-0").values())
    _turns(graph, "live", 2)
    # an hour passes for the old threads (not a timer: however slow the sweeps are on a
    # loaded machine, the live thread stays an hour from its end)
    past = datetime.now(UTC) - timedelta(minutes=1)
    old = [f"old-{i}" for i in range(6)]
    client[db_name].runs.update_many({"thread_id": {"$in": old}}, {"$set": {"expire_at": past}})
    first = runtime.sweep(client, db_name, limit=4, batch=2 * per_thread, pause=0.05)
    assert first.expired_threads == 4 and first.documents == 4 * per_thread
    assert first.seconds >= 0.05  # at least one pause between the two transactions
    second = runtime.sweep(client, db_name, limit=4, batch=1)  # a thread alone, in batches
    assert second.expired_threads == 2
    for i in range(6):
        assert sum(_count(client, db_name, f"old-{i}").values()) == 0
    assert len(graph.get_state(_config("live")).values["messages"]) == 4


def test_keep_latest_in_batches_keeps_what_a_kept_checkpoint_needs(
    client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accord.checkpointers import maintenance

    monkeypatch.setattr(maintenance, "BATCH", 2)  # many transactions for one thread
    _apply(client, db_name, "[classes.checkpoint]\nretention = { keep_latest = 2 }\n")
    saver = AccordSaver(client, db_name=db_name)
    graph = _graph(saver)
    _turns(graph, "t-1", 5)
    kept = {
        s.config["configurable"]["checkpoint_id"]: s.values
        for s in list(graph.get_state_history(_config("t-1")))[:2]
    }
    report = runtime.sweep(client, db_name, batch=2)
    assert report.pruned_threads == 1
    history = list(graph.get_state_history(_config("t-1")))
    assert {s.config["configurable"]["checkpoint_id"]: s.values for s in history} == kept
    assert len(graph.get_state(_config("t-1")).values["messages"]) == 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"limit": 0}, "limit must be a whole number"),
        ({"batch": -1}, "batch must be a whole number"),
        ({"batch": True}, "batch must be a whole number"),
        ({"pause": -0.5}, "pause must be 0 to 3600"),
        ({"pause": "1"}, "pause must be 0 to 3600"),
    ],
)
def test_the_sweep_refuses_bad_bounds(
    client: MongoClient, db_name: str, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        runtime.sweep(client, db_name, **kwargs)


@pytest.mark.parametrize(
    ("threads", "message"),
    [
        ("t-1", "list of \\(tenant, thread\\) pairs"),
        ([("default",)], "must be a \\(tenant, thread\\) pair"),
        ([("default", "")], "thread_id must be a non-empty string"),
        ([(None, "t-1")], "tenant_id must be a string"),
    ],
)
def test_delete_expired_refuses_bad_input(
    client: MongoClient, db_name: str, threads: Any, message: str
) -> None:
    saver = AccordSaver(client, db_name=db_name)
    with pytest.raises(InvalidInputError, match=message):
        saver.delete_expired(threads)


def test_the_sweep_cli_takes_batch_and_pause(client: MongoClient, db_name: str) -> None:
    _apply(client, db_name, EXPIRING)
    graph = _graph(AccordSaver(client, db_name=db_name))
    _turns(graph, "old", 1)
    time.sleep(1.2)
    env = {"MONGODB_URI": _uri(client)}
    runner = CliRunner()
    bad = runner.invoke(cli, ["governance", "sweep", "--db", db_name, "--batch", "0"], env=env)
    assert bad.exit_code == 2
    done = runner.invoke(cli, ["governance", "sweep", "--db", db_name, "--batch", "5",
                               "--pause", "0.01", "--limit", "10"], env=env)  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "deleted 1 expired threads" in done.output


def test_keep_latest_deletes_the_recorded_calls_of_pruned_checkpoints_only(
    client: MongoClient, db_name: str
) -> None:
    made: list[str] = []
    crash = [False]

    def call(x: str) -> str:
        made.append(x)
        return f"done {x}"

    tool = recorded(name="counted.tool", idempotent=True)(call)

    def work(state: State) -> State:
        out = [tool("a"), tool("b")]
        if crash[0]:  # the task dies after its calls, before its writes are saved
            raise RuntimeError("crashed after the calls")
        return {"out": out}

    g = StateGraph(State)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    saver = AccordSaver(client, db_name=db_name)
    graph = g.compile(checkpointer=saver)
    for _ in range(2):
        graph.invoke({"out": []}, _config("t-calls"))
    crash[0] = True
    with pytest.raises(RuntimeError):
        graph.invoke({"out": []}, _config("t-calls"))
    calls = client[db_name][CALLS]
    assert calls.count_documents({"thread_id": "t-calls"}) == 6 and len(made) == 6
    history = list(graph.get_state_history(_config("t-calls")))
    kept = {s.config["configurable"]["checkpoint_id"] for s in history[:2]}
    # the newest checkpoint has "work" pending: the calls its re-run replays stay
    assert history[0].next == ("work",)
    pending_id = history[0].config["configurable"]["checkpoint_id"]
    assert calls.count_documents({"thread_id": "t-calls", "checkpoint_id": pending_id}) == 2
    # an unsettled call of a checkpoint about to go (an intent without a result) stays
    old = history[-2].config["configurable"]["checkpoint_id"]
    calls.insert_one({"_id": "unsettled", "tenant_id": "default", "thread_id": "t-calls",
                      "checkpoint_ns": "work:x", "checkpoint_id": old, "task_id": "x",
                      "position": 0, "status": "intent"})  # fmt: skip
    saver.prune(["t-calls"], keep=2)
    left = {d["_id"]: d["checkpoint_id"] for d in calls.find({"thread_id": "t-calls"})}
    assert left.pop("unsettled") == old
    assert set(left.values()) == {pending_id} and len(left) == 2, left
    assert {*kept} == {s.config["configurable"]["checkpoint_id"]
                       for s in graph.get_state_history(_config("t-calls"))}  # fmt: skip
    # the kept checkpoint's pending task runs again: its calls are replayed, not made
    crash[0] = False
    again = graph.invoke(None, _config("t-calls"))
    assert again["out"][-2:] == ["done a", "done b"] and len(made) == 6


# --- holds and policy changes keep expiries right (2026-12-07) -------------------------


def test_a_thread_used_during_its_hold_expires_from_its_last_commit_after_the_release(
    client: MongoClient, db_name: str
) -> None:
    """A commit during the hold stamped nothing, and the release gave back the expiry
    from before the hold: the next sweep deleted a thread written a moment before."""
    _apply(client, db_name, EXPIRING.replace('"1s"', '"3s"'))
    saver = AccordSaver(client, db_name=db_name)
    graph = _graph(saver)
    _turns(graph, "t1", 1)
    admin = _admin(client)
    policy = runtime.effective_policy(admin, db_name)
    hold = Hold("thread", "t1", tenant_id="default")
    place(admin, db_name, hold, policy)
    time.sleep(3.2)  # the expiry from before the hold has passed
    _turns(graph, "t1", 1)  # written during the hold
    release(admin, db_name, hold, policy)
    report = runtime.sweep(client, db_name)
    assert report.expired_threads == 0
    assert _count(client, db_name, "t1")["accord_checkpoints"] > 0
    time.sleep(3.2)
    assert runtime.sweep(client, db_name).expired_threads == 1  # from the last commit


def test_threads_that_start_expiring_under_a_new_policy_are_swept(
    client: MongoClient, db_name: str
) -> None:
    """An idle thread waited for its next commit to be stamped: never, so never swept."""
    kept = "".join(f"[classes.{c}]\nretention = {{}}\n"
                   for c in ("checkpoint", "short_term_memory", "run"))  # fmt: skip
    _apply(client, db_name, kept)  # threads do not expire
    saver = AccordSaver(client, db_name=db_name)
    _turns(_graph(saver), "idle", 1)
    assert client[db_name].runs.find_one({"thread_id": "idle"}).get("expire_at") is None
    _apply(client, db_name, kept.replace("retention = {}", EXPIRING.split("\n")[1], 1))
    assert client[db_name].runs.find_one({"thread_id": "idle"}).get("expire_at") is not None
    time.sleep(1.2)
    assert runtime.sweep(client, db_name).expired_threads == 1


def test_a_class_hold_must_name_a_class(client: MongoClient, db_name: str) -> None:
    """`hold checkpoints --by class` (a typo) was a hold on nothing, listed as held."""
    admin = _admin(client)
    policy = runtime.effective_policy(admin, db_name)
    with pytest.raises(InvalidInputError, match="no artifact class"):
        place(admin, db_name, Hold("class", "checkpoints"), policy)
    place(admin, db_name, Hold("class", "business:orders"), policy)  # any business collection
    result = CliRunner().invoke(cli, ["governance", "hold", "acme", "--by", "tenant",
                                      "--tenant", "other", "--db", db_name,
                                      "--uri", _uri(client)])  # fmt: skip
    assert result.exit_code == 2 and "no --tenant" in result.output, result.output
