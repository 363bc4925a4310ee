"""Consolidation without a database: slots, repeated statements, near-duplicates (with
the deterministic hashing embedder), episodes, deletes, and one version per event."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from accord.memory import model
from accord.memory.consolidation import Decisions, Prepared, cosine, stored_vector
from accord.memory.embedders import HashingEmbedder
from accord.memory.extraction import EPISODE, FACT, PREFERENCE, Change
from accord.memory.synchronous.consolidation import Consolidator

NOW = datetime(2026, 1, 1, tzinfo=UTC)
NS = ("memories",)
EMB = HashingEmbedder()


class World:
    """Memories of one tenant in a dict; ``similar`` is an exact scan."""

    def __init__(self) -> None:
        self.docs: dict[str, dict[str, Any]] = {}
        self.embedded: list[str] = []

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.embedded += list(texts)
        return EMB.embed_documents(texts)

    def similar(
        self, ns: tuple[str, ...], kind: str, vector: Sequence[float], k: int
    ) -> list[dict]:
        hits = [d for d in self.docs.values() if d["kind"] == kind and tuple(d["namespace"]) == ns]
        hits.sort(key=lambda d: -cosine(vector, stored_vector(d) or []))
        return hits[:k]

    def decide(self, *changes: Change, threshold: float = 0.85) -> Decisions:
        c = Consolidator(
            "acme", load=lambda ids: {i: self.docs[i] for i in ids if i in self.docs},
            similar=self.similar, embed=self.embed, threshold=threshold, now=NOW,
            provenance=lambda ch: model.Provenance("aggregator:test", "acme", "t1", "c1",
                                                   ch.message_ids),
        )  # fmt: skip
        decisions = c.decide([Prepared(ch, ch.namespace or NS, ch.key) for ch in changes])
        for i in decisions.changed():  # "commit"
            after = decisions.after[i]
            if after is None:
                self.docs.pop(i, None)
            else:
                self.docs[i] = after
        return decisions

    def texts(self) -> list[str]:
        return sorted(d["text"] for d in self.docs.values())


def add(text: str, kind: str = PREFERENCE, **kw: Any) -> Change:
    return Change("add", text, kind, message_ids=("m1",), **kw)


def test_new_memories_then_the_same_statement_again_changes_nothing() -> None:
    w = World()
    d = w.decide(add("User prefers window seats"), add("User likes jazz"))
    assert sorted(d.label.values()) == ["add", "add"] and len(w.docs) == 2
    again = w.decide(add("user prefers window seats."))
    assert again.changed() == [] and len(w.docs) == 2


def test_a_near_duplicate_merges_into_the_existing_memory_keeping_its_id() -> None:
    w = World()
    w.decide(add("User prefers window seats"))
    (first_id,) = w.docs
    d = w.decide(add("User prefers a window seat"))
    assert d.changed() == [first_id] and d.label[first_id] == "merge"
    doc = w.docs[first_id]
    assert doc["text"] == "User prefers a window seat" and doc["version"] == 2
    assert d.before[first_id]["text"] == "User prefers window seats"  # goes to history


def test_different_statements_and_other_kinds_do_not_merge() -> None:
    w = World()
    w.decide(add("User prefers coffee"))
    w.decide(add("User prefers tea"))
    w.decide(add("User prefers tea", kind=FACT))  # same text, other kind
    assert len(w.docs) == 3


def test_threshold_decides() -> None:
    w = World()
    w.decide(add("User likes jazz music"))
    w.decide(add("User likes jazz"), threshold=0.99)
    assert len(w.docs) == 2
    w2 = World()
    w2.decide(add("User likes jazz music"))
    w2.decide(add("User likes jazz"), threshold=0.8)
    assert len(w2.docs) == 1


def test_near_duplicates_within_one_event_are_one_memory() -> None:
    w = World()
    d = w.decide(add("User prefers window seats"), add("User prefers the window seats"))
    assert len(d.changed()) == 1 and len(w.docs) == 1
    (doc,) = w.docs.values()
    assert doc["version"] == 1 and doc["text"] == "User prefers the window seats"


def test_a_slot_replaces_its_value_with_one_version_per_event() -> None:
    w = World()
    w.decide(add("User's name is Bo", FACT, key="profile:name"))
    d = w.decide(add("User's name is Al", FACT, key="profile:name"),
                 add("User's name is Alma", FACT, key="profile:name"))  # fmt: skip
    (doc,) = w.docs.values()
    assert doc["text"] == "User's name is Alma" and doc["version"] == 2
    assert [d.label[i] for i in d.changed()] == ["update"]


def test_delete_and_update_name_their_memory() -> None:
    w = World()
    w.decide(add("User likes trains"))
    (i,) = w.docs
    key = w.docs[i]["key"]
    d = w.decide(Change("update", "User likes night trains", PREFERENCE, namespace=NS, key=key))
    assert w.docs[i]["text"] == "User likes night trains" and d.label[i] == "update"
    d = w.decide(Change("delete", namespace=NS, key=key))
    assert w.docs == {} and d.label[i] == "delete"
    assert w.decide(Change("delete", namespace=NS, key=key)).changed() == []


def test_episodes_accumulate_turns_and_embed_the_merged_summary() -> None:
    w = World()
    turn = {"message_id": "a", "role": "human", "gist": "Plan a trip", "at": NOW, "n": 0}
    w.decide(add("Conversation t1: Plan a trip", EPISODE, key="episode:t1", merge=False,
                 value={"thread_id": "t1", "turns": [turn]}))  # fmt: skip
    turn2 = {**turn, "message_id": "b", "gist": "to Oslo", "n": 1}
    w.decide(add("Conversation t1: to Oslo", EPISODE, key="episode:t1", merge=False,
                 value={"thread_id": "t1", "turns": [turn2]}))  # fmt: skip
    (doc,) = w.docs.values()
    assert doc["text"] == "Conversation t1: Plan a trip | to Oslo" and doc["version"] == 2
    assert [t["message_id"] for t in doc["value"]["turns"]] == ["a", "b"]
    assert np.allclose(stored_vector(doc), EMB.embed_documents([doc["text"]])[0], atol=1e-6)
    assert "Conversation t1: Plan a trip | to Oslo" in w.embedded


def test_unchanged_text_is_not_embedded_again() -> None:
    w = World()
    w.decide(add("User's name is Bo", FACT, key="profile:name", value={"content": "Bo"}))
    w.embedded.clear()
    w.decide(add("User's name is Bo", FACT, key="profile:name", value={"content": "Bo!"}))
    assert w.embedded == []
