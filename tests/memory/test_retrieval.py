"""Retrieval quality with the default (hashing) embedder: recall@5 on the test set.

Printed (run with ``-s`` to see it) and held above a floor so a regression in the embedder
or the search path fails; the figure is in docs/memory.md.
"""

from __future__ import annotations

import uuid

from accord.memory.synchronous.service import MemoryService
from tests.memory.retrieval_set import MEMORIES, QUESTIONS

RECALL_FLOOR = 0.7


def test_recall_at_5_with_the_default_embedder(client, capsys):
    db = "recall_" + uuid.uuid4().hex[:8]
    svc = MemoryService(client, tenant_id="demo", db_name=db)  # no embedder: hashing default
    svc.setup()
    try:
        for user, key, text in MEMORIES:
            svc.put(("users", user, "memories"), key, {"text": text}, text=text, kind="fact")
        found = first = 0
        misses = []
        for user, question, keys in QUESTIONS:
            hits = svc.search(("users", user), query=question, limit=5)
            assert all(h.namespace == ("users", user, "memories") for h in hits)
            top = [h.key for h in hits]
            got = sum(k in top for k in keys)
            found += got
            first += top[:1] == keys[:1]
            if got < len(keys):
                misses.append((user, question, keys, top))
        total = sum(len(k) for _, _, k in QUESTIONS)
        recall = found / total
        with capsys.disabled():
            print(f"\nrecall@5 (hashing embedder, {len(QUESTIONS)} questions, "
                  f"{len(MEMORIES)} memories, ~10 per user): {recall:.3f}; "
                  f"top-1 accuracy: {first / len(QUESTIONS):.3f}")  # fmt: skip
            for miss in misses:
                print("  missed:", miss)
        assert recall >= RECALL_FLOOR, misses
    finally:
        client.drop_database(db)
