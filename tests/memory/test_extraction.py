"""Extractors without a database: the deterministic rules, episodes, and the LLM
extractor's add / update / delete decisions with a FAKE chat model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from accord.errors import ConfigurationError, ExtractionError
from accord.memory.extraction import (
    EPISODE,
    FACT,
    PREFERENCE,
    Change,
    Conversation,
    Existing,
    RuleExtractor,
    Turn,
    content_key,
    episode_change,
    merge_episode,
    statements,
)
from accord.memory.llm_extractor import LLMExtractor
from tests.memory.fakes import FakeChatModel

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def conv(*turns: tuple[str, str], thread: str = "t1", at: datetime = T0) -> Conversation:
    return Conversation(
        "acme", thread,
        [Turn(f"m{i}-{thread}-{at.timestamp():.0f}", role, text, at) for i, (role, text) in enumerate(turns)],
    )  # fmt: skip


def no_recall(text: str, *, kinds: object = None, limit: int = 5) -> list[Existing]:
    return []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I prefer window seats.", [(PREFERENCE, "User prefers window seats", None)]),
        ("Actually, my name is Alicia!", [(FACT, "User's name is Alicia", "profile:name")]),
        ("call me Al", [(FACT, "User's name is Al", "profile:name")]),
        ("Please remember that the wifi password is hunter2.",
         [(FACT, "The wifi password is hunter2", None)]),
        ("I live in Lyon. I work at Acme Corp.",
         [(FACT, "User lives in Lyon", "profile:location"),
          (FACT, "User works at Acme Corp", "profile:employer")]),
        ("My favorite color is teal",
         [(PREFERENCE, "User's favorite color is teal", "favorite:color")]),
        ("my dog is called Rex", [(FACT, "User's dog is called Rex", "profile:dog")]),
        ("I don't like olives; I love capers",
         [(PREFERENCE, "User does not like olives", None), (PREFERENCE, "User likes capers", None)]),
        ("Oh and I'm allergic to peanuts", [(FACT, "User is allergic to peanuts", None)]),
    ],
)  # fmt: skip
def test_statements_the_rules_recognise(text: str, expected: list[tuple]) -> None:
    assert statements(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Do I prefer window seats?",  # a question states nothing
        "What is my name?",
        "My question is whether it rains.",  # 'my question is' is not a fact about the user
        "The weather is nice today.",
        "",
    ],
)
def test_what_the_rules_ignore(text: str) -> None:
    assert statements(text) == []


def test_only_the_users_statements_become_memories() -> None:
    changes = RuleExtractor(episodes=False).extract(
        conv(("ai", "I prefer tea, personally."), ("human", "I prefer coffee.")), no_recall
    )
    assert [(c.text, c.message_ids) for c in changes] == [
        ("User prefers coffee", ("m1-t1-1767225600",))
    ]


def test_rule_extractor_is_deterministic_and_keys_by_content() -> None:
    c = conv(("human", "I prefer window seats. My name is Bo."), ("ai", "Noted, Bo."))
    first = RuleExtractor().extract(c, no_recall)
    assert first == RuleExtractor().extract(c, no_recall)
    kinds = [(ch.kind, ch.key) for ch in first]
    assert kinds == [(PREFERENCE, None), (FACT, "profile:name"), (EPISODE, "episode:t1")]
    assert content_key(PREFERENCE, "User prefers window seats") == content_key(
        PREFERENCE, "  user prefers WINDOW seats. "
    )


def test_unreadable_messages_are_skipped() -> None:
    c = Conversation("acme", "t1", [Turn("m1", "human", None, T0)])
    assert RuleExtractor().extract(c, no_recall) == []


def test_episode_turns_merge_in_any_order() -> None:
    step1 = episode_change(conv(("human", "Plan a trip to Oslo"), ("ai", "Sure"), at=T0))
    later = T0 + timedelta(minutes=1)
    step2 = episode_change(conv(("human", "Book the train"), ("ai", "Done"), at=later))
    assert step1 is not None and step2 is not None
    a = merge_episode(merge_episode(None, step1.value), step2.value)  # type: ignore[arg-type]
    b = merge_episode(merge_episode(None, step2.value), step1.value)  # type: ignore[arg-type]
    assert a == b
    assert [t["gist"] for t in a["turns"]] == [
        "Plan a trip to Oslo",
        "Sure",
        "Book the train",
        "Done",
    ]
    again = merge_episode(a, step2.value)  # type: ignore[arg-type]
    assert again == a  # a replayed step adds nothing


def test_episode_steps_in_one_millisecond_keep_their_checkpoint_order() -> None:
    """BSON dates keep milliseconds only: two steps saved in the same millisecond (queued
    saves sharing a transaction) are ordered by their checkpoint ids, not by message id."""

    def step(checkpoint_id: str, *turns: tuple[str, str, str]) -> dict[str, object]:
        c = Conversation(
            "acme", "t1", [Turn(mid, role, text, T0) for mid, role, text in turns],
            checkpoint_id=checkpoint_id,
        )  # fmt: skip
        change = episode_change(c)
        assert change is not None
        return dict(change.value)

    # Message ids sort against the steps' order, as random uuids often do.
    first = step("1f0a0000-0000-6000-8000-000000000001", ("z-human", "human", "Hi, I am Dana"))
    second = step("1f0a0000-0000-6000-8000-000000000002", ("y-ai", "ai", "Hello Dana"))
    third = step("1f0a0000-0000-6000-8000-000000000003", ("b-human", "human", "I am vegetarian"))
    fourth = step("1f0a0000-0000-6000-8000-000000000004", ("a-ai", "ai", "Noted"))
    episode = None
    for value in (third, first, fourth, second):
        episode = merge_episode(episode, value)
    assert episode is not None
    assert [t["message_id"] for t in episode["turns"]] == ["z-human", "y-ai", "b-human", "a-ai"]


def test_change_validation() -> None:
    with pytest.raises(ValueError, match="non-empty text"):
        Change("add", "  ")
    with pytest.raises(ValueError, match="names the memory"):
        Change("delete")
    with pytest.raises(ValueError, match="'add', 'update' or 'delete'"):
        Change("merge", "x")  # type: ignore[arg-type]


# -- the LLM extractor with a FAKE chat model -------------------------------------------------


def test_llm_extractor_adds_new_facts() -> None:
    model = FakeChatModel()
    changes = LLMExtractor(model).extract(
        conv(("human", "Hi, my city is Oslo. I like trains."), ("ai", "Cool!")), no_recall
    )
    assert [(c.action, c.text, c.kind) for c in changes] == [
        ("add", "User's city is Oslo", FACT),
        ("add", "User likes trains", PREFERENCE),
    ]
    assert model.calls == [FACT_PROMPT_HEAD, DECIDE_PROMPT_HEAD]


FACT_PROMPT_HEAD = "You extract long-ter"
DECIDE_PROMPT_HEAD = "You maintain a user'"


def test_llm_extractor_updates_and_deletes_what_recall_offers() -> None:
    existing = [
        Existing(("memories",), "k-city", "User's city is Oslo", FACT, 0.9),
        Existing(("memories",), "k-trains", "User likes trains", PREFERENCE, 0.8),
    ]
    offered: list[str] = []

    def recall(text: str, *, kinds: object = None, limit: int = 5) -> list[Existing]:
        offered.append(text)
        return existing

    changes = LLMExtractor(FakeChatModel()).extract(
        conv(("human", "My city is Bergen."), ("human", "I no longer like trains.")), recall
    )
    assert [(c.action, c.key, c.text) for c in changes] == [
        ("update", "k-city", "User's city is Bergen"),
        ("delete", "k-trains", ""),
    ]
    assert offered == ["User's city is Bergen", "User no longer likes trains"]
    assert all(c.message_ids == ("m0-t1-1767225600", "m1-t1-1767225600") for c in changes)


def test_llm_extractor_known_fact_is_none() -> None:
    existing = [Existing(("memories",), "k", "User likes trains", PREFERENCE, 1.0)]
    changes = LLMExtractor(FakeChatModel()).extract(
        conv(("human", "I like trains")), lambda text, kinds=None, limit=5: existing
    )
    assert changes == []


def test_llm_extractor_calls_no_model_without_user_messages() -> None:
    model = FakeChatModel()
    assert LLMExtractor(model).extract(conv(("ai", "I like trains")), no_recall) == []
    assert model.calls == []


def test_llm_extractor_refuses_prose_and_invented_ids() -> None:
    with pytest.raises(ExtractionError, match="did not reply with JSON"):
        LLMExtractor(FakeChatModel(mode="prose")).extract(conv(("human", "I like x")), no_recall)
    existing = [Existing(("memories",), "k", "User's city is Oslo", FACT, 0.9)]
    with pytest.raises(ExtractionError, match="id '99', which was not offered"):
        LLMExtractor(FakeChatModel(mode="invent")).extract(
            conv(("human", "my city is Rome")), lambda text, kinds=None, limit=5: existing
        )


def test_llm_extractor_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="chat model"):
        LLMExtractor(object())
    with pytest.raises(ConfigurationError, match="similar"):
        LLMExtractor(FakeChatModel(), similar=0)
