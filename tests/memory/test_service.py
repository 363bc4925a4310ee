"""The memory service: tenant isolation, validation, history, TTL, dimensions, recency."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest

from accord.errors import EmbeddingDimensionError, InvalidInputError
from accord.memory import model
from accord.memory.embedders import HashingEmbedder
from accord.memory.synchronous.service import MemoryService
from accord.memory.synchronous.store import AccordStore
from accord.memory.validation import InvalidField


@pytest.fixture()
def svc(client):
    db = "mem_" + uuid.uuid4().hex[:10]
    s = MemoryService(client, tenant_id="A", db_name=db, embedder=HashingEmbedder(64))
    s.setup()
    yield s
    client.drop_database(db)


def test_put_get_search_with_provenance(svc):
    prov = model.Provenance(source="aggregator", tenant_id="A", thread_id="t1",
                            checkpoint_id="c1", message_ids=("m1", "m2"))  # fmt: skip
    svc.put(("users", "u1"), "pref", {"text": "I like green tea"}, text="I like green tea",
            kind="preference", provenance=prov)  # fmt: skip
    got = svc.get(("users", "u1"), "pref")
    assert got is not None and got.value == {"text": "I like green tea"}
    assert got.provenance["message_ids"] == ["m1", "m2"] and got.kind == "preference"
    hits = svc.search(("users",), query="green tea")
    assert hits[0].key == "pref" and 0 < hits[0].score <= 1
    assert hits[0].created_at.tzinfo is not None


def test_tenants_never_see_each_other(svc):
    other = svc.for_tenant("B")
    svc.put(("users", "u1"), "k", {"text": "alpha secret"})
    other.put(("users", "u1"), "k", {"text": "beta secret"})
    assert svc.get(("users", "u1"), "k").value == {"text": "alpha secret"}
    assert other.get(("users", "u1"), "k").value == {"text": "beta secret"}
    for s, mine in ((svc, "alpha"), (other, "beta")):
        for hit in s.search((), query="secret", limit=50):
            assert mine in hit.value["text"]
        assert [h.value["text"].split()[0] for h in s.search(())] == [mine]
        assert s.list_namespaces() == [("users", "u1")]
    svc.delete(("users", "u1"), "k")
    assert svc.get(("users", "u1"), "k") is None
    assert other.get(("users", "u1"), "k") is not None


@pytest.mark.parametrize("bad", [
    {"$where": "1"}, {"$or": [{"a": 1}]}, {"tenant_id": {"$regex": "."}},
    {"a": {"$exists": True}}, {"a": {"$nin": [1]}}, "tenant_id == B", {"": 1},
])  # fmt: skip
def test_filters_that_could_widen_scope_are_refused(svc, bad):
    with pytest.raises(InvalidInputError):
        svc.search(("users",), filter=bad)


@pytest.mark.parametrize("ns", [("a.b",), ("",), ("a", "\x00"), (1,), "users", ()])
def test_bad_namespaces_are_refused(svc, ns):
    with pytest.raises(InvalidInputError):
        svc.put(ns, "k", {"v": 1})


def test_bad_tenant_is_refused(client):
    for tenant in ("", "$x", None, "a\x00"):
        with pytest.raises(InvalidInputError):
            MemoryService(client, tenant_id=tenant, embedder=HashingEmbedder(64))


def test_history_keeps_every_previous_version(svc):
    for i in range(3):
        svc.put(("n",), "k", {"v": i})
    svc.delete(("n",), "k")
    history = svc.history(("n",), "k")
    assert [(h["version"], h["value"], h["change"]) for h in history] == [
        (1, {"v": 0}, "update"), (2, {"v": 1}, "update"), (3, {"v": 2}, "delete")
    ]  # fmt: skip
    assert svc.for_tenant("B").history(("n",), "k") == []


def test_history_pages_serve_every_version_once_in_order(svc):
    # Deleted and made again, the memory's versions start at 1 again: the page key is
    # (replaced_at, version, _id), not the version alone.
    for i in range(4):
        svc.put(("n",), "k", {"v": i})
    svc.delete(("n",), "k")
    for i in range(4, 7):
        svc.put(("n",), "k", {"v": i})
    whole = svc.history(("n",), "k")
    assert [h["value"]["v"] for h in whole] == [0, 1, 2, 3, 4, 5]
    assert [h["version"] for h in whole] == [1, 2, 3, 4, 1, 2]
    served, after, pages = [], None, 0
    while True:
        page = svc.history_page(("n",), "k", limit=4, after=after)
        served += page.items
        pages += 1
        if page.next is None:
            break
        after = page.next
        svc.put(("n",), "k", {"v": 100 + pages})  # {"v": 6} replaced while paging
    assert [h["value"]["v"] for h in served] == [0, 1, 2, 3, 4, 5, 6]
    assert pages == 2 and all("_id" not in h for h in served)
    # another tenant's cursor position reaches nothing of this tenant's, and vice versa
    assert svc.for_tenant("B").history_page(("n",), "k", after=after).items == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"limit": 0}, "limit"), ({"limit": 101}, "limit"), ({"limit": "5"}, "limit"),
        ({"after": ""}, "after"), ({"after": "not-a-cursor"}, "after"), ({"after": 5}, "after"),
        ({"after": "x" * 97}, "after"), ({"after": '{"$gt": ""}'}, "after"),
    ],
)  # fmt: skip
def test_a_bad_history_page_is_refused_naming_the_field(svc, kwargs, field):
    with pytest.raises(InvalidField) as refused:
        svc.history_page(("n",), "k", **kwargs)
    assert refused.value.field == field


def test_ttl_expiry_refresh_and_sweep(svc):
    svc.put(("n",), "short", {"v": 1}, ttl_minutes=0.02)  # 1.2 s
    svc.put(("n",), "keep", {"v": 2})
    assert svc.get(("n",), "short") is not None
    time.sleep(1.5)
    assert svc.get(("n",), "short") is None  # expired: omitted before any sweep
    assert [h.key for h in svc.search(("n",))] == ["keep"]
    # The sweeper or the TTL index (the engine's monitor runs every second) removes it.
    assert svc.sweep_expired() in (0, 1)
    assert svc.memories.count_documents({"key": "short"}) == 0
    svc.put(("n",), "refresh", {"v": 3}, ttl_minutes=1)
    before = svc.memories.find_one({"key": "refresh"})["expires_at"]
    time.sleep(0.05)
    svc.get(("n",), "refresh", refresh_ttl=True)
    assert svc.memories.find_one({"key": "refresh"})["expires_at"] > before


def test_store_ttl_contract(client):
    db = "mem_" + uuid.uuid4().hex[:10]
    store = AccordStore(client, db_name=db, ttl={"default_ttl": 0.02, "refresh_on_read": False})
    store.setup()
    store.put(("n",), "k", {"v": 1})
    assert store.get(("n",), "k") is not None
    time.sleep(1.5)
    assert store.get(("n",), "k") is None
    assert store.sweep_ttl() in (0, 1)  # or the TTL index got there first
    assert store.service.memories.count_documents({}) == 0
    client.drop_database(db)


def test_dimension_mismatch_is_a_clear_error(client, svc):
    with pytest.raises(EmbeddingDimensionError, match="indexed with 64 dimensions") as wrong:
        MemoryService(client, tenant_id="A", db_name=svc.db_name,
                      embedder=HashingEmbedder(128)).setup()  # fmt: skip
    # names the embedder (it said "embedder a 128-dimension vector makes ...")
    assert str(wrong.value).startswith("embedder hashing-128 makes 128-dimension vectors")
    with pytest.raises(EmbeddingDimensionError):
        MemoryService(client, embedder=HashingEmbedder(64), dims=32)


def test_recency_weighting_prefers_newer_memories(svc):
    svc.put(("n",), "old", {"text": "coffee order"})
    svc.put(("n",), "new", {"text": "coffee order"})
    svc.memories.update_one({"key": "old"},
                            {"$set": {"updated_at": model.utcnow() - timedelta(days=60)}})  # fmt: skip
    plain = svc.search(("n",), query="coffee order")
    assert plain[0].score == pytest.approx(plain[1].score)
    weighted = svc.search(("n",), query="coffee order", recency_weight=0.5, half_life_days=30)
    assert weighted[0].key == "new" and weighted[0].score > weighted[1].score


def test_post_filter_widens_until_enough_results(svc):
    for i in range(60):
        svc.put(("n",), f"k{i}", {"text": f"note number {i}", "even": i % 2 == 0, "i": i})
    hits = svc.search(("n",), query="note", filter={"i": {"$gte": 50}}, limit=10)
    assert sorted(h.value["i"] for h in hits) == list(range(50, 60))
    hits = svc.search(("n",), query="note", filter={"even": True}, limit=5, offset=20)
    assert len(hits) == 5 and all(h.value["even"] for h in hits)
