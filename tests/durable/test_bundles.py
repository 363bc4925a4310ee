"""Acceptance: a run paused on bundle v1 is refused on v2 with a clear message, resumes
after a migration is registered, and resumes unchanged on v1 (issue 25, item 3); plus
overrides (recorded), the graph fingerprint and the pure rules."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from pymongo import AsyncMongoClient, MongoClient

from accord.checkpointers import AsyncAccordSaver
from accord.checkpointers.bundles import PinnedGraph, fingerprint
from accord.checkpointers.recorded import recorded
from accord.errors import BundleMismatch, ConcurrentRunError, ConfigurationError
from accord.platform.bundles import Bundle, Migrations, Override, changes, text_digest
from tests.checkpointers.conftest import make_saver


class State(TypedDict, total=False):
    name: str
    greeting: str
    sent: str


def draft(state: State) -> State:
    return {"greeting": f"Hello {state['name']}"}


def send(state: State) -> State:
    return {"sent": f"{state['greeting']} ({state.get('name', '?')})"}


def build(saver: Any) -> Any:
    g = StateGraph(State)
    g.add_node("draft", draft)
    g.add_node("send", send)
    g.add_edge(START, "draft")
    g.add_edge("draft", "send")
    g.add_edge("send", END)
    return g.compile(checkpointer=saver, interrupt_before=["send"])


V1 = Bundle("v1", code="code-1", prompts={"system": "Be brief."}, models={"chat": "model-a"})
V2 = Bundle("v2", code="code-2", prompts={"system": "Be warm."}, models={"chat": "model-b"})


@pytest.fixture()
def db_name(client: MongoClient) -> Any:
    name = "bd_" + uuid.uuid4().hex[:12]
    try:
        yield name
    finally:
        client.drop_database(name)


@pytest.fixture()
def saver(mongo_uri: str, db_name: str) -> Any:
    with make_saver("sync", mongo_uri, db_name) as s:
        yield s


def cfg(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


def checkpoints(client: MongoClient, db_name: str, thread: str) -> int:
    return client[db_name]["accord_checkpoints"].count_documents({"thread_id": thread})


def test_a_paused_run_is_refused_on_another_bundle_and_resumes_on_its_own(
    saver: Any, client: MongoClient, db_name: str
) -> None:
    graph = build(saver)
    on_v1 = PinnedGraph(graph, V1)
    on_v1.invoke({"name": "Ada"}, cfg("a"))
    assert graph.get_state(cfg("a")).next == ("send",)  # paused before "send"
    saved = checkpoints(client, db_name, "a")

    with pytest.raises(BundleMismatch) as refused:
        PinnedGraph(graph, V2).invoke(None, cfg("a"))
    message = str(refused.value)
    assert "pinned to bundle 'v1'" in message and "on bundle 'v2'" in message
    for part in ("code", "prompt:system", "model:chat", "version"):
        assert part in refused.value.changes, part
    assert refused.value.changes["model:chat"] == ("model-a", "model-b")
    assert "'model-a' -> 'model-b'" in message and "register a migration" in message
    assert checkpoints(client, db_name, "a") == saved  # nothing ran, nothing was written
    assert graph.get_state(cfg("a")).next == ("send",)

    result = on_v1.invoke(None, cfg("a"))  # unchanged on its own bundle
    assert result["sent"] == "Hello Ada (Ada)"
    assert [e["kind"] for e in on_v1.history(cfg("a"))] == ["pinned"]


def test_a_copy_of_a_paused_thread_keeps_its_pin(saver: Any) -> None:
    """A fork's thread is a copy of the source's: it does not wake on another bundle
    (before, the copy had no pin and the first bundle to run it took it)."""
    graph = build(saver)
    PinnedGraph(graph, V1).invoke({"name": "Ada"}, cfg("paused"))
    saver.copy_thread("paused", "forked")
    with pytest.raises(BundleMismatch, match="pinned to bundle 'v1'"):
        PinnedGraph(graph, V2).invoke(None, cfg("forked"))
    assert PinnedGraph(graph, V1).invoke(None, cfg("forked"))["sent"] == "Hello Ada (Ada)"
    entries = PinnedGraph(graph, V1).history(cfg("forked"))
    assert [e["kind"] for e in entries] == ["pinned"] and "copied from" in entries[0]["reason"]


def test_a_registered_migration_transforms_the_state_and_moves_the_pin(
    saver: Any, client: MongoClient, db_name: str
) -> None:
    graph = build(saver)
    PinnedGraph(graph, V1).invoke({"name": "Ada Lovelace"}, cfg("b"))
    with pytest.raises(BundleMismatch):
        PinnedGraph(graph, V2).invoke(None, cfg("b"))

    migrations = Migrations()

    @migrations.register("v1", "v2")
    def formal(values: dict[str, Any]) -> dict[str, Any]:
        return {"greeting": values["greeting"].replace("Hello", "Dear")}

    on_v2 = PinnedGraph(graph, V2, migrations=migrations)
    result = on_v2.invoke(None, cfg("b"))
    assert result["sent"] == "Dear Ada Lovelace (Ada Lovelace)"
    history = on_v2.history(cfg("b"))
    assert [e["kind"] for e in history] == ["pinned", "migrated"]
    assert history[1]["from"] == "v1" and history[1]["to"] == "v2"
    assert history[1]["steps"] == ["v1->v2"]
    # now pinned to v2: v1 is the stranger
    with pytest.raises(BundleMismatch, match="pinned to bundle 'v2'"):
        PinnedGraph(graph, V1).invoke(None, cfg("b"))


def test_migrations_chain_and_an_override_is_recorded(saver: Any) -> None:
    graph = build(saver)
    PinnedGraph(graph, V1).invoke({"name": "Bo"}, cfg("c"))
    v3 = Bundle("v3", code="code-3")
    migrations = Migrations()
    migrations.register("v1", "v2")(lambda v: {"greeting": v["greeting"] + "!"})
    migrations.register("v2", "v3")(lambda v: {"greeting": v["greeting"] + "?"})
    assert [(a, b) for a, b, _ in migrations.path("v1", "v3")] == [("v1", "v2"), ("v2", "v3")]
    assert PinnedGraph(graph, v3, migrations=migrations).invoke(None, cfg("c"))["sent"] == (
        "Hello Bo!? (Bo)"
    )

    PinnedGraph(graph, V1).invoke({"name": "Cy"}, cfg("d"))
    fixed = PinnedGraph(graph, V2)
    result = fixed.invoke(None, cfg("d"), override=Override("CVE-2026-1 fix", by="user:sec"))
    assert result["sent"] == "Hello Cy (Cy)"
    last = fixed.history(cfg("d"))[-1]
    assert (last["kind"], last["by"], last["reason"]) == ("override", "user:sec", "CVE-2026-1 fix")
    with pytest.raises(ConfigurationError):
        Override(" ", by="x")


def test_a_pin_moved_by_another_process_is_not_overwritten(saver: Any) -> None:
    graph = build(saver)
    pinned = PinnedGraph(graph, V1)
    pinned.invoke({"name": "Di"}, cfg("e"))
    tenant = saver.tenant_id
    entry = {"kind": "test"}
    with pytest.raises(ConcurrentRunError, match="changed while it was being moved"):
        pinned.pins.pin(tenant, "e", V2, entry, expected=V2.digest)  # it is V1's


def test_an_async_saver_pins_too(mongo_uri: str, db_name: str) -> None:
    async def scenario() -> None:
        aclient: AsyncMongoClient[Any] = AsyncMongoClient(mongo_uri)
        try:
            async_saver = AsyncAccordSaver(aclient, db_name=db_name)
            await async_saver.setup()
            graph = build(async_saver)
            await PinnedGraph(graph, V1).ainvoke({"name": "Ed"}, cfg("f"))
            with pytest.raises(BundleMismatch):
                await PinnedGraph(graph, V2).ainvoke(None, cfg("f"))
            result = await PinnedGraph(graph, V1).ainvoke(None, cfg("f"))
            assert result["sent"] == "Hello Ed (Ed)"
        finally:
            await aclient.close()

    asyncio.run(scenario())


def test_the_fingerprint_follows_the_graphs_code(saver: Any) -> None:
    assert fingerprint(build(saver)) == fingerprint(build(saver))

    def send(state: State) -> State:  # another body under the same name
        return {"sent": state["greeting"].upper()}

    g = StateGraph(State)
    g.add_node("draft", draft)
    g.add_node("send", send)
    g.add_edge(START, "draft")
    g.add_edge("draft", "send")
    g.add_edge("send", END)
    assert fingerprint(g.compile()) != fingerprint(build(saver))

    h = StateGraph(State)
    h.add_node("draft", draft)
    h.add_node("send", globals()["send"])
    h.add_edge(START, "draft")
    h.add_edge("draft", END)  # an edge changed
    h.add_edge("send", END)
    assert fingerprint(h.compile()) != fingerprint(build(saver))
    assert fingerprint(build(saver)).startswith("graph:")


def test_bundle_rules() -> None:
    assert V1.prompts["system"] == text_digest("Be brief.")
    assert Bundle("v1", prompts={"system": text_digest("Be brief.")}).prompts == {
        "system": text_digest("Be brief.")
    }
    assert changes(V1, V1) == {}
    assert set(changes(V1, Bundle("v1", code="code-1", prompts={"system": "Be brief."}))) == {
        "model:chat"
    }
    assert Bundle.of_document(V2.document()) == V2 and V2.digest != V1.digest
    with pytest.raises(ConfigurationError):
        Bundle("")


def test_a_migration_under_a_paused_task_keeps_its_recorded_calls(
    saver: Any, client: MongoClient, db_name: str
) -> None:
    """The migration writes a new checkpoint under a task paused by interrupt(): LangGraph
    runs the task again under a new id, and its calls made before the pause are carried
    over to it, so they are replayed, not made again."""
    charges: list[int] = []

    @recorded(name="fake.charge")
    def charge(cents: int) -> str:
        charges.append(cents)
        return f"receipt-{len(charges)}"

    def pay(state: State) -> State:
        receipt = charge(500)
        answer = interrupt("approve?")
        return {"sent": f"{receipt} {answer} {state.get('greeting', '')}"}

    g = StateGraph(State)
    g.add_node("pay", pay)
    g.add_edge(START, "pay")
    g.add_edge("pay", END)
    graph = g.compile(checkpointer=saver)
    PinnedGraph(graph, V1).invoke({"name": "Fay"}, cfg("g"))
    assert charges == [500]
    migrations = Migrations()
    migrations.register("v1", "v2")(lambda values: {"greeting": "migrated"})
    result = PinnedGraph(graph, V2, migrations=migrations).invoke(Command(resume="yes"), cfg("g"))
    assert charges == [500]  # replayed under the task's new id
    assert result["sent"] == "receipt-1 yes migrated"
    docs = list(client[db_name]["accord_recorded_calls"].find({"name": "fake.charge"}))
    assert len(docs) == 2 and {d["idempotency_key"] for d in docs if "carried_from" in d} == {
        d["_id"] for d in docs if "carried_from" not in d
    }


class Crash(Exception):
    """A process dying at a point of a migration (raised once by a patched step)."""


V3 = Bundle("v3", code="code-3", prompts={"system": "Be brief."}, models={"chat": "model-c"})


def _paying_graph(saver: Any, charges: list[int]) -> Any:
    """``pay``: one recorded call (not idempotent), then ``interrupt()``."""

    @recorded(name="fake.charge")
    def charge(cents: int) -> str:
        charges.append(cents)
        return f"receipt-{len(charges)}"

    def pay(state: State) -> State:
        receipt = charge(500)
        answer = interrupt("approve?")
        return {"sent": f"{receipt} {answer} {state.get('greeting', '')} {state.get('name', '')}"}

    g = StateGraph(State)
    g.add_node("pay", pay)
    g.add_edge(START, "pay")
    g.add_edge("pay", END)
    return g.compile(checkpointer=saver)


def _chain() -> tuple[Migrations, list[int]]:
    """v1 -> v2 -> v3, idempotent; the v2 -> v3 step raises Crash at its first call
    when the returned list is given ``[1]``."""
    migrations = Migrations()
    fail_once: list[int] = []
    migrations.register("v1", "v2")(lambda values: {"greeting": "migrated"})

    def to_v3(values: dict[str, Any]) -> dict[str, Any]:
        if fail_once:
            fail_once.clear()
            raise Crash("killed between two of the migration's state updates")
        return {"name": "three"}

    migrations.register("v2", "v3")(to_v3)
    return migrations, fail_once


def _crash_once(monkeypatch: pytest.MonkeyPatch, owner: Any, method: str, when: Any) -> None:
    """Make ``owner.method`` raise Crash once, at its first call for which ``when(args)``."""
    real = getattr(owner, method)
    armed = [True]

    def patched(*args: Any, **kwargs: Any) -> Any:
        if armed[0] and when(args, kwargs):
            armed[0] = False
            raise Crash(f"killed at {method}")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, method, patched)


@pytest.mark.parametrize("crash", ["carry", "between_updates", "pin"])
@pytest.mark.parametrize("then", ["v3", "v1", "override"])
def test_a_migration_killed_at_any_point_still_replays_the_paused_tasks_calls(
    saver: Any,
    client: MongoClient,
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
    crash: str,
    then: str,
) -> None:
    """The process dies during a migration under a task paused after a recorded call:
    after its state update(s) and before the carry-over of the calls was committed
    (``carry``), between two updates of a chained migration (``between_updates``), or
    after the carry and before the pin moved (``pin``). Whatever runs the thread next (a
    worker on the new bundle, which migrates again; one on the old bundle, still pinned;
    an override), the call recorded before the migration is replayed, not made again
    (before 2026-12-07, ``carry`` and ``between_updates`` charged twice)."""
    from accord.platform.synchronous.bundle_pins import BundlePins
    from accord.platform.synchronous.call_log import CallLog

    charges: list[int] = []
    graph = _paying_graph(saver, charges)
    thread = f"crash-{crash}-{then}"
    PinnedGraph(graph, V1).invoke({"name": "Gus"}, cfg(thread))
    assert charges == [500]
    migrations, fail_once = _chain()
    if crash == "carry":
        _crash_once(monkeypatch, CallLog, "carry", lambda a, k: True)
    elif crash == "between_updates":
        fail_once.append(1)
    else:
        _crash_once(monkeypatch, BundlePins, "pin",
                    lambda a, k: a[4].get("kind") == "migrated")  # fmt: skip
    with pytest.raises(Crash):
        PinnedGraph(graph, V3, migrations=migrations).invoke(Command(resume="yes"), cfg(thread))
    monkeypatch.undo()
    assert charges == [500]
    assert PinnedGraph(graph, V1).history(cfg(thread))[-1]["kind"] == "pinned"  # not moved

    if then == "v3":
        result = PinnedGraph(graph, V3, migrations=migrations).invoke(
            Command(resume="yes"), cfg(thread)
        )
        assert result["sent"] == "receipt-1 yes migrated three"
    elif then == "v1":  # still pinned to v1: its worker runs the (migrated) thread
        result = PinnedGraph(graph, V1).invoke(Command(resume="yes"), cfg(thread))
        assert result["sent"].startswith("receipt-1 yes migrated")
    else:
        result = PinnedGraph(graph, V3).invoke(
            Command(resume="yes"), cfg(thread), override=Override("stuck", by="user:ops")
        )
        assert result["sent"].startswith("receipt-1 yes migrated")
    assert charges == [500]  # replayed, never made again
    docs = list(client[db_name]["accord_recorded_calls"].find({"name": "fake.charge"}))
    original = [d for d in docs if "carried_from" not in d]
    assert len(original) == 1
    assert {d["idempotency_key"] for d in docs if "carried_from" in d} == {original[0]["_id"]}


@pytest.mark.parametrize("then", ["v3", "v1"])
def test_an_async_migration_killed_before_its_carry_still_replays(
    mongo_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """The same crash (after the updates, before the carry) with AsyncAccordSaver."""
    from accord.platform.asynchronous.call_log import AsyncCallLog

    charges: list[int] = []

    @recorded(name="fake.charge")
    async def charge(cents: int) -> str:
        charges.append(cents)
        return f"receipt-{len(charges)}"

    async def pay(state: State) -> State:
        receipt = await charge(500)
        answer = interrupt("approve?")
        return {"sent": f"{receipt} {answer} {state.get('greeting', '')}"}

    async def scenario() -> None:
        aclient: AsyncMongoClient[Any] = AsyncMongoClient(mongo_uri)
        try:
            async_saver = AsyncAccordSaver(aclient, db_name=db_name)
            await async_saver.setup()
            g = StateGraph(State)
            g.add_node("pay", pay)
            g.add_edge(START, "pay")
            g.add_edge("pay", END)
            graph = g.compile(checkpointer=async_saver)
            await PinnedGraph(graph, V1).ainvoke({"name": "Hal"}, cfg("h"))
            assert charges == [500]
            migrations, _ = _chain()
            _crash_once(monkeypatch, AsyncCallLog, "carry", lambda a, k: True)
            with pytest.raises(Crash):
                await PinnedGraph(graph, V3, migrations=migrations).ainvoke(
                    Command(resume="yes"), cfg("h")
                )
            monkeypatch.undo()
            bundle, extra = (V3, migrations) if then == "v3" else (V1, None)
            result = await PinnedGraph(graph, bundle, migrations=extra).ainvoke(
                Command(resume="yes"), cfg("h")
            )
            assert result["sent"] == "receipt-1 yes migrated"
            assert charges == [500]
        finally:
            await aclient.close()

    asyncio.run(scenario())
