"""The aggregator against a server: steps in, memories out, exactly once.

Crashes (SIGKILL) are in test_aggregator_crash.py; this file covers what one or two
workers do in process: memories with history and provenance, retries and dead letters,
a lost lease, two workers racing on near-duplicates, tenants, backlog and lag, the
background runner, the LLM extractor, and the real checkpointer as the producer.

Every test that runs an aggregator runs twice (the ``twins`` fixture): on the sync
``Aggregator``, and on ``AsyncAggregator`` running on an event loop of its own
(tests/memory/twins.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from accord.errors import ConfigurationError
from accord.memory.aggregator import (
    Aggregator,
    AggregatorConfig,
    AsyncAggregator,
    label_value,
    percentile,
)
from accord.memory.extraction import Change, Conversation, RuleExtractor
from accord.memory.llm_extractor import LLMExtractor
from accord.memory.synchronous.service import MemoryService
from accord.platform import outbox
from accord.platform.synchronous.unit_of_work import UnitOfWork
from tests.memory.fakes import FakeChatModel
from tests.memory.steps import commit_step
from tests.memory.twins import Twins


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "agg_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


@pytest.fixture()
def uow(client: MongoClient) -> UnitOfWork:
    return UnitOfWork(client)


def memories(client: MongoClient, db: str, **filt: Any) -> dict[str, dict[str, Any]]:
    return {d["key"]: d for d in client[db].long_term_memory.find(filt, {"embedding": 0})}


def test_steps_become_memories_with_history_and_provenance(
    client: MongoClient, db_name: str, uow: UnitOfWork, make: Callable[..., Any]
) -> None:
    agg = make(db_name)
    commit_step(
        uow,
        db_name,
        "acme",
        "t1",
        "c1",
        [("human", "Hi! My name is Alice. I prefer window seats."), ("ai", "Hello Alice.")],
    )
    commit_step(uow, db_name, "acme", "t2", "c1", [("human", "Actually, my name is Alicia.")])
    assert agg.drain() == 2
    mem = memories(client, db_name)
    assert set(mem) == {"profile:name", next(k for k in mem if k.startswith("preference:")),
                        "episode:t1", "episode:t2"}  # fmt: skip
    name = mem["profile:name"]
    assert name["text"] == "User's name is Alicia" and name["version"] == 2
    assert name["namespace"] == ["memories"] and name["tenant_id"] == "acme"
    assert name["provenance"] == {"source": "aggregator:rules", "tenant_id": "acme",
                                  "thread_id": "t2", "checkpoint_id": "c1",
                                  "message_ids": ["t2/c1/0"]}  # fmt: skip
    (old,) = client[db_name].memory_history.find({"key": "profile:name"})
    assert old["text"] == "User's name is Alice" and old["version"] == 1
    assert old["change"] == "update" and old["provenance"]["thread_id"] == "t1"
    assert mem["episode:t1"]["namespace"] == ["episodes", "t1"]
    assert "window seats" in mem["episode:t1"]["text"]
    events = list(client[db_name].outbox.find())
    assert {e["status"] for e in events} == {"done"} and all(e["expire_at"] for e in events)
    # the memories are searchable through the service (the same collection and index)
    found = MemoryService(client, db_name=db_name, tenant_id="acme").search(
        ("memories",), query="which seat does the user like", limit=1
    )
    assert found[0].text == "User prefers window seats"


def test_events_without_messages_are_completed(
    client: MongoClient, db_name: str, uow: UnitOfWork, make: Callable[..., Any]
) -> None:
    agg = make(db_name)
    commit_step(uow, db_name, "acme", "t1", "c1", [], kind="writes")
    commit_step(uow, db_name, "acme", "t1", "c2", [])
    commit_step(uow, db_name, "acme", "t1", "c3", [], kind="other")
    assert agg.drain() == 2
    status = {e["kind"]: e["status"] for e in client[db_name].outbox.find()}
    assert status == {"writes": "done", "checkpoint": "done", "other": "pending"}
    assert memories(client, db_name) == {}


@pytest.mark.embedded_only  # MongoDB's TTL monitor runs every 60 s
def test_done_events_are_removed_by_retention(
    client: MongoClient, db_name: str, uow: UnitOfWork, make: Callable[..., Any]
) -> None:
    """The outbox's TTL index deletes done events once their retention has passed (the
    test engine's TTL monitor runs every second)."""
    import time

    agg = make(db_name, retention=1 / 86400)  # one second
    commit_step(uow, db_name, "acme", "t1", "c1", [("human", "I like tea.")])
    commit_step(uow, db_name, "acme", "t1", "c2", [], kind="writes")
    assert agg.drain() == 2
    deadline = time.monotonic() + 20
    while client[db_name].outbox.count_documents({}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client[db_name].outbox.count_documents({}) == 0
    assert memories(client, db_name)  # the memories stay


def test_replayed_statements_make_no_new_version(
    client: MongoClient, db_name: str, uow: UnitOfWork, make: Callable[..., Any]
) -> None:
    agg = make(db_name)
    for step in ("c1", "c2", "c3"):  # one thread saying it again, or a step replayed
        commit_step(uow, db_name, "acme", "t0", step, [("human", "I prefer aisle seats.")])
    agg.drain()
    prefs = [m for k, m in memories(client, db_name).items() if k.startswith("preference:")]
    assert len(prefs) == 1 and prefs[0]["version"] == 1
    assert client[db_name].memory_history.count_documents({"key": prefs[0]["key"]}) == 0
    # another thread stating it: the same memory, a version of its own (from that
    # thread), so that deleting the first thread keeps what the second states too
    commit_step(uow, db_name, "acme", "t1", "c1", [("human", "I prefer aisle seats.")])
    agg.drain()
    (pref,) = [m for k, m in memories(client, db_name).items() if k.startswith("preference:")]
    assert pref["version"] == 2 and pref["provenance"]["thread_id"] == "t1"
    assert pref["text"] == prefs[0]["text"]


def test_failures_back_off_then_dead_letter(
    client: MongoClient, db_name: str, uow: UnitOfWork, make: Callable[..., Any]
) -> None:
    class Broken:
        name = "broken"

        def extract(self, conversation: Conversation, recall: Any) -> list:
            raise RuntimeError("model unavailable")

    agg = make(db_name, extractor=Broken(), max_attempts=3)
    commit_step(uow, db_name, "acme", "t1", "c1", [("human", "I prefer tea.")])
    outbox_ = client[db_name].outbox
    outcomes = []
    for attempt in range(1, 4):
        outcome = agg.run_once()
        assert outcome is not None
        outcomes.append(outcome.status)
        event = outbox_.find_one()
        kept = attempt if attempt < 3 else 2  # (below)
        assert event["attempts"] == kept and "model unavailable" in event["error"]
        if attempt < 3:
            assert event["status"] == "pending" and agg.run_once() is None  # backing off
            delay = (event["available_at"] - event["failed_at"]).total_seconds()
            assert delay == pytest.approx(2 ** (attempt - 1))
            outbox_.update_one({}, {"$set": {"available_at": event["failed_at"]}})
    # tried 3 times within seconds: an outage of the model, not a poison event; retried,
    # its count one short of the limit (before, an outage of 15 s dead-lettered a backlog)
    assert outcomes == ["retry", "retry", "retry"]
    event = outbox_.find_one()
    assert event["status"] == "pending" and event["attempts"] == 2
    # failing for longer than MIN_FAILING: the next failure dead-letters it
    since = event["failing_since"] - outbox.MIN_FAILING
    outbox_.update_one({}, {"$set": {"available_at": event["failed_at"], "failing_since": since}})
    assert agg.run_once().status == "dead"  # type: ignore[union-attr]
    assert client[db_name].outbox.find_one()["status"] == "dead"
    assert memories(client, db_name) == {}
    assert agg.stats().dead == 1


def test_a_worker_that_lost_its_lease_writes_nothing(
    client: MongoClient, db_name: str, uow: UnitOfWork, make: Callable[..., Any]
) -> None:
    import time

    slow = make(db_name, lease=0.05)
    fast = make(db_name)
    commit_step(uow, db_name, "acme", "t1", "c1", [("human", "I prefer tea. I like jazz.")])
    claimed = slow.claim()
    assert claimed is not None
    time.sleep(0.1)
    assert fast.run_once().status == "done"  # type: ignore[union-attr]
    before = memories(client, db_name)
    outcome = slow.process(claimed)
    assert outcome.status == "lost" and "another worker claimed it" in (outcome.error or "")
    assert memories(client, db_name) == before and len(before) == 3


def test_two_workers_racing_on_near_duplicates_merge_them(
    client: MongoClient, db_name: str, uow: UnitOfWork, make: Callable[..., Any]
) -> None:
    """Worker A decides "new memory" and, before it commits, worker B commits a
    near-duplicate in the same namespace: A's commit fails on the namespace's head and A
    decides again, merging into B's memory."""
    b = make(db_name)
    raced: list[bool] = []

    def race(stage: str, event: Any) -> None:
        if stage == "commit" and not raced:
            raced.append(True)
            assert b.run_once().status == "done"  # type: ignore[union-attr]

    a = make(db_name, on_stage=race)
    commit_step(uow, db_name, "acme", "t1", "c1", [("human", "I prefer window seats.")])
    commit_step(uow, db_name, "acme", "t2", "c1", [("human", "I prefer the window seats.")])
    assert a.run_once().status == "done"  # type: ignore[union-attr]
    prefs = [m for k, m in memories(client, db_name).items() if k.startswith("preference:")]
    assert len(prefs) == 1 and prefs[0]["version"] == 2
    assert prefs[0]["text"] == "User prefers window seats"  # A's statement, merged into B's
    (old,) = client[db_name].memory_history.find({"key": prefs[0]["key"]})
    assert old["change"] == "merge" and old["text"] == "User prefers the window seats"


def test_tenants_never_mix(
    client: MongoClient, db_name: str, uow: UnitOfWork, make: Callable[..., Any]
) -> None:
    agg = make(db_name)
    commit_step(uow, db_name, "acme", "t1", "c1", [("human", "My name is Ann. I prefer tea.")])
    commit_step(uow, db_name, "globex", "t1", "c1", [("human", "My name is Bob. I prefer tea.")])
    agg.drain()
    for tenant, name in (("acme", "Ann"), ("globex", "Bob")):
        mine = memories(client, db_name, tenant_id=tenant)
        assert mine["profile:name"]["text"] == f"User's name is {name}"
        assert mine["profile:name"]["version"] == 1  # never merged across tenants
        assert all(m["provenance"]["tenant_id"] == tenant for m in mine.values())
    assert client[db_name].memory_history.count_documents({}) == 0


def test_stats_show_backlog_and_lag(
    client: MongoClient, db_name: str, uow: UnitOfWork, make: Callable[..., Any]
) -> None:
    agg = make(db_name)
    for i in range(4):
        commit_step(uow, db_name, "acme", "t1", f"c{i}", [("human", f"step {i}")])
    stats = agg.stats()
    assert (stats.backlog, stats.pending, stats.lag_samples) == (4, 4, 0)
    assert stats.oldest_pending_age is not None and stats.oldest_pending_age >= 0
    agg.drain()
    stats = agg.stats()
    assert stats.backlog == 0 and stats.lag_samples == 4
    assert 0 < stats.lag_p50 <= stats.lag_p95 <= stats.lag_max < 30  # type: ignore[operator]
    assert agg.stats(tenant_id="other").lag_samples == 0
    assert percentile([1, 2, 3, 4], 0.5) == 2 and percentile([], 0.5) is None


def test_background_aggregator(
    client: MongoClient, db_name: str, uow: UnitOfWork, make: Callable[..., Any], twins: Twins
) -> None:
    agg = make(db_name, poll_interval=0.02)
    with twins.background(agg) as bg:
        commit_step(uow, db_name, "acme", "t1", "c1", [("human", "I like hiking.")])
        assert bg.wait_idle(20)
    assert "User likes hiking" in {m["text"] for m in memories(client, db_name).values()}
    assert [o.status for o in bg.outcomes] == ["done"]


def test_llm_extractor_updates_and_deletes_through_the_aggregator(
    client: MongoClient, db_name: str, uow: UnitOfWork, make: Callable[..., Any]
) -> None:
    agg = make(db_name, extractor=LLMExtractor(FakeChatModel()))
    commit_step(uow, db_name, "acme", "t1", "c1", [("human", "My city is Oslo. I like trains.")])
    agg.drain()
    assert {m["text"] for m in memories(client, db_name).values()} == {
        "User's city is Oslo", "User likes trains"}  # fmt: skip
    commit_step(uow, db_name, "acme", "t2", "c1",
                [("human", "My city is Bergen now. I no longer like trains.")])  # fmt: skip
    agg.drain()
    (city,) = memories(client, db_name).values()
    assert city["text"] == "User's city is Bergen now" and city["version"] == 2
    changes = sorted(h["change"] for h in client[db_name].memory_history.find())
    assert changes == ["delete", "update"]


def test_namespaces_are_configurable(
    client: MongoClient, db_name: str, uow: UnitOfWork, make: Callable[..., Any]
) -> None:
    agg = make(db_name, namespaces={"*": ("users", "{tenant_id}", "{kind}"),
                                            "episode": ("threads", "{thread_id}")})  # fmt: skip
    commit_step(uow, db_name, "a.b", "th.1", "c1", [("human", "I like tea.")])
    agg.drain()
    spaces = {tuple(m["namespace"]) for m in memories(client, db_name).values()}
    assert spaces == {("users", "a%2Eb", "preference"), ("threads", "th%2E1")}
    assert label_value("50%.x") == "50%25%2Ex"


def test_configuration_is_validated() -> None:
    with pytest.raises(ConfigurationError, match="max_attempts"):
        AggregatorConfig(max_attempts=0)
    with pytest.raises(ConfigurationError, match="threshold"):
        AggregatorConfig(threshold=1.5)
    with pytest.raises(ConfigurationError, match="'\\*' entry"):
        AggregatorConfig(namespaces={"fact": ("x",)})
    with pytest.raises(Exception, match="may not contain"):
        AggregatorConfig(namespaces={"*": ("a.b",)})
    with pytest.raises(ConfigurationError, match="collection"):
        AggregatorConfig(outbox="$bad")
    # each was accepted: drain() never returned (a NaN lease), every event went dead (a
    # NaN retention), a string of kinds consumed nothing
    for bad in ({"lease": float("nan")}, {"lease": float("inf")}, {"lease": 1e12},
                {"retention": float("nan")}, {"retention": 1e9}, {"poll_interval": float("nan")},
                {"failing_for": -1}, {"kinds": "checkpoint"}, {"lease": True}):  # fmt: skip
        with pytest.raises(ConfigurationError, match=next(iter(bad))):
            AggregatorConfig(**bad)  # type: ignore[arg-type]


def test_rule_extractor_is_the_default(client: MongoClient, db_name: str) -> None:
    agg = Aggregator(client, config=AggregatorConfig(db_name=db_name))
    assert isinstance(agg.extractor, RuleExtractor)


def test_the_checkpointers_steps_are_aggregated(
    client: MongoClient, db_name: str, make: Callable[..., Any]
) -> None:
    """The real producer: a LangGraph graph on AccordSaver; its step transactions write
    the messages and outbox events the aggregator consumes."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import START, MessagesState, StateGraph

    from accord.checkpointers import AccordSaver

    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"Noted ({len(state['messages'])} messages).")]}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    agg = make(db_name)  # set up first: the saver writes events for a registered consumer
    saver = AccordSaver(client, db_name=db_name, tenant_id="acme")
    saver.setup()
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "chat-1"}}
    graph.invoke({"messages": [HumanMessage("Hi, my name is Dana. I prefer trains.")]}, config)
    graph.invoke({"messages": [HumanMessage("Remember that I am vegetarian.")]}, config)
    agg.drain()
    assert agg.stats().backlog == 0 and agg.stats().dead == 0
    mem = memories(client, db_name, tenant_id="acme")
    texts = {m["text"] for m in mem.values()}
    assert {"User's name is Dana", "User prefers trains", "I am vegetarian"} <= texts
    episode = mem["episode:chat-1"]["value"]["turns"]
    assert [t["role"] for t in episode] == ["human", "ai", "human", "ai"]
    human_ids = {m.id for m in graph.get_state(config).values["messages"] if m.type == "human"}
    assert set(mem["profile:name"]["provenance"]["message_ids"]) <= human_ids


class SlowSyncExtractor:
    """A sync extractor that blocks its thread (a model call) and recalls memories."""

    name = "slow"

    def __init__(self) -> None:
        self.recalled: list[list[Any]] = []
        self.thread: str | None = None
        self.blocked: list[float] = []  # when its thread was blocked: from, to

    def extract(self, conversation: Conversation, recall: Any) -> list[Change]:
        import threading
        import time

        self.thread = threading.current_thread().name
        self.recalled.append(recall("tea", limit=3))  # served on the aggregator's loop
        self.blocked = [time.monotonic()]
        time.sleep(1.0)
        self.blocked.append(time.monotonic())
        return [Change("add", "User prefers green tea", "preference")]


class AwaitingExtractor:
    """An async-native extractor: the async aggregator awaits its ``aextract``."""

    name = "awaiting"

    def __init__(self) -> None:
        self.recalled: list[list[Any]] = []

    def extract(self, conversation: Conversation, recall: Any) -> list[Change]:
        raise AssertionError("the async aggregator must await aextract")

    async def aextract(self, conversation: Conversation, recall: Any) -> list[Change]:
        self.recalled.append(await recall("tea", limit=3))
        return [Change("add", "User prefers oolong tea", "preference")]


@pytest.mark.asyncio
async def test_the_async_aggregator_never_blocks_its_loop(
    mongo_uri: str, client: MongoClient, db_name: str, uow: UnitOfWork
) -> None:
    """A sync extractor runs in a worker thread (its recall served on the loop), the
    hashing embedder hashes in one too: a ticker on the same loop keeps ticking while an
    event whose extraction blocks for 1 s is processed (on the loop, one gap would be
    over 1 s)."""
    import asyncio
    import time

    from pymongo import AsyncMongoClient

    aclient: AsyncMongoClient = AsyncMongoClient(mongo_uri)
    try:
        MemoryService(client, db_name=db_name, tenant_id="acme").put(
            ("memories",), "tea", {"content": "User likes tea"}, text="User likes tea"
        )
        slow = SlowSyncExtractor()
        agg = AsyncAggregator(aclient, config=AggregatorConfig(db_name=db_name), extractor=slow)
        await agg.setup()
        commit_step(uow, db_name, "acme", "t1", "c1", [("human", "Some words.")])
        ticks: list[float] = []

        async def tick() -> None:
            while True:
                await asyncio.sleep(0.01)
                ticks.append(time.monotonic())

        ticker = asyncio.create_task(tick())
        outcome = await agg.run_once()
        ticker.cancel()
        assert outcome is not None and outcome.status == "done", outcome
        assert slow.thread != "MainThread" and [m.text for m in slow.recalled[0]] == [
            "User likes tea"
        ]
        # the loop kept ticking while the extractor's thread was blocked (told by the
        # ticks inside that second, not by a bound on the gaps a loaded machine can pass)
        start, end = slow.blocked
        assert sum(start < t < end for t in ticks) >= 5, (len(ticks), slow.blocked)
        awaiting = AwaitingExtractor()
        agg = AsyncAggregator(aclient, config=AggregatorConfig(db_name=db_name), extractor=awaiting)
        commit_step(uow, db_name, "acme", "t1", "c2", [("human", "More words.")])
        assert (await agg.drain()) == 1
        assert [m.text for m in awaiting.recalled[0]][:1] == ["User likes tea"]
        texts = {m["text"] for m in memories(client, db_name).values()}
        assert {"User prefers green tea", "User prefers oolong tea"} <= texts
    finally:
        await aclient.close()
