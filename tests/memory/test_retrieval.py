"""Retrieval quality: recall@5 and top-1 accuracy on the test set, with the default
(hashing) embedder and, when the ``accord[local]`` extra is installed, the local model.

Printed (run with ``-s`` to see them) and held above floors so a regression in an embedder
or the search path fails; the figures are in docs/memory.md. ``QUESTIONS`` share words
with the memories they should find; ``PARAPHRASES`` ask the same in other words (what only
a semantic model can answer).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from accord.memory.synchronous.service import MemoryService
from tests.memory.retrieval_set import MEMORIES, PARAPHRASES, QUESTIONS

RECALL_FLOOR = 0.7


def measure(client: Any, embedder: Any, questions: list[Any]) -> tuple[float, float, list[Any]]:
    """recall@5, top-1 accuracy and the misses of ``questions`` over ``MEMORIES``."""
    db = "recall_" + uuid.uuid4().hex[:8]
    svc = MemoryService(client, tenant_id="demo", db_name=db, embedder=embedder)
    svc.setup()
    try:
        for user, key, text in MEMORIES:
            svc.put(("users", user, "memories"), key, {"text": text}, text=text, kind="fact")
        found = first = 0
        misses = []
        for user, question, keys in questions:
            hits = svc.search(("users", user), query=question, limit=5)
            assert all(h.namespace == ("users", user, "memories") for h in hits)
            top = [h.key for h in hits]
            got = sum(k in top for k in keys)
            found += got
            first += top[:1] == keys[:1]
            if got < len(keys):
                misses.append((user, question, keys, top))
        return found / sum(len(k) for _, _, k in questions), first / len(questions), misses
    finally:
        client.drop_database(db)


def report(capsys: Any, name: str, figures: dict[str, tuple[float, float, list[Any]]]) -> None:
    with capsys.disabled():
        for label, (recall, top1, misses) in figures.items():
            print(f"\n{name}, {label}: recall@5 {recall:.3f}; top-1 accuracy {top1:.3f}")
            for miss in misses:
                print("  missed:", miss)


def test_recall_with_the_default_embedder(client, capsys):
    figures = {
        f"{len(QUESTIONS)} questions": measure(client, None, QUESTIONS),
        f"{len(PARAPHRASES)} paraphrases": measure(client, None, PARAPHRASES),
    }
    report(capsys, f"hashing embedder ({len(MEMORIES)} memories, ~10 per user)", figures)
    recall, _, misses = figures[f"{len(QUESTIONS)} questions"]
    assert recall >= RECALL_FLOOR, misses


@pytest.mark.local_model
def test_recall_with_the_local_model(client, capsys, local_embedder):
    figures = {
        f"{len(QUESTIONS)} questions": measure(client, local_embedder, QUESTIONS),
        f"{len(PARAPHRASES)} paraphrases": measure(client, local_embedder, PARAPHRASES),
    }
    report(capsys, f"local all-MiniLM-L6-v2 ({len(MEMORIES)} memories)", figures)
    for recall, _, misses in figures.values():
        assert recall >= RECALL_FLOOR, misses
