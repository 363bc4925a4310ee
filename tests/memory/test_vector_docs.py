"""Memory vectors: one document per memory and field path, written with the memory in the
same transaction (MemoryVectorsHook), searched with best-field scoring."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest

from accord.errors import InvalidInputError, MemoryConflictError
from accord.memory import model, vector_docs
from accord.memory.embedders import HashingEmbedder
from accord.memory.synchronous.service import MemoryService
from accord.memory.synchronous.store import AccordStore
from accord.memory.writepath import LONG_TERM_MEMORY, Expect, Group, Op, Plan, PlanContext
from accord.platform.plan import insert_once


@pytest.fixture()
def svc(client):
    db = "vec_" + uuid.uuid4().hex[:10]
    s = MemoryService(client, tenant_id="A", db_name=db, embedder=HashingEmbedder(64))
    s.setup()
    yield s
    client.drop_database(db)


def _vectors(svc, **filt):
    return sorted(svc.vectors.find(filt), key=lambda d: d["_id"])


def test_put_writes_one_vector_per_field_and_replace_replaces_them(svc):
    store = AccordStore(svc.client, index={"dims": 64, "embed": HashingEmbedder(64).embed_documents,
                                           "fields": ["a", "b[*].c"]}, service=svc)  # fmt: skip
    store.put(("ns",), "k", {"a": "first", "b": [{"c": "x1"}, {"c": "x2"}], "d": "not indexed"})
    mid = model.memory_id("A", ("ns",), "k")
    vecs = _vectors(svc, memory_id=mid)
    assert [v["path"] for v in vecs] == ["a", "b[*].c.0", "b[*].c.1"]
    assert all(v["tenant_id"] == "A" and v["ns_prefixes"] == ["ns"] for v in vecs)
    store.put(("ns",), "k", {"a": "second"})
    assert [v["path"] for v in _vectors(svc, memory_id=mid)] == ["a"]
    store.put(("ns",), "k", {"a": "third"}, index=False)
    assert _vectors(svc, memory_id=mid) == []
    store.put(("ns",), "k", {"a": "fourth"})
    store.delete(("ns",), "k")
    assert svc.vectors.count_documents({}) == 0


def test_item_scores_by_its_best_field(svc):
    emb = HashingEmbedder(64)
    store = AccordStore(svc.client, index={"dims": 64, "embed": emb.embed_documents,
                                           "fields": ["title", "tags[*]"]}, service=svc)  # fmt: skip
    store.put(("docs",), "one", {"title": "green tea ceremony", "tags": ["kyoto"]})
    store.put(("docs",), "two", {"title": "mountain bikes", "tags": ["gear", "green tea ceremony"]})
    hits = store.search(("docs",), query="green tea ceremony")
    assert {h.key for h in hits} == {"one", "two"}
    assert hits[0].score == pytest.approx(hits[1].score, abs=1e-6)  # same best field text
    hits = store.search(("docs",), query="mountain bikes")
    assert hits[0].key == "two" and hits[0].score > hits[1].score


def test_vectors_follow_ttl_refresh_and_sweep(svc):
    svc.put(("ns",), "k", {"text": "short lived"}, ttl_minutes=10)
    mem = svc.memories.find_one({})
    (vec,) = _vectors(svc)
    assert vec["expires_at"] == mem["expires_at"]
    svc.get(("ns",), "k", refresh_ttl=True)
    mem = svc.memories.find_one({})
    (vec,) = _vectors(svc)
    assert vec["expires_at"] == mem["expires_at"]
    svc.memories.database.command(  # expire it now, then sweep: the vectors go with it
        "update", svc.memory_collection,
        updates=[{"q": {}, "u": {"$set": {"expires_at": model.utcnow() - timedelta(minutes=1)}}}],
    )  # fmt: skip
    assert svc.sweep_expired() == 1
    # (the test engine's TTL monitor, every second, may delete the memory between the
    # sweep's read and its transaction: its vectors then go at the monitor's next pass)
    deadline = time.monotonic() + 10
    while svc.vectors.count_documents({}) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert svc.vectors.count_documents({}) == 0


def test_a_failed_guard_writes_no_vector(svc):
    """The memory and its vectors commit or abort together."""
    svc.put(("ns",), "k", {"text": "v1"})
    doc = svc.memories.find_one({})
    before = _vectors(svc)
    new = model.new_document("A", model.PutRequest(("ns",), "k", {"text": "v2"}, text="v2",
                                                   embedding=[1.0] * 64), model.utcnow(), doc)  # fmt: skip
    stale = Group("replace", svc.db_name, svc.memory_collection, LONG_TERM_MEMORY,
                  [Op("replace", {"_id": doc["_id"], "version": 99}, new)],
                  expect=Expect(matched=1, error=lambda c: MemoryConflictError("stale")))  # fmt: skip
    with pytest.raises(MemoryConflictError):
        svc.uow.execute(Plan(PlanContext("A"), [stale]))
    assert _vectors(svc) == before


def test_plans_built_elsewhere_get_their_vectors(svc):
    """A plan that inserts memory documents itself (as the aggregator does, with
    insert_once and a precomputed embedding) gets the vectors through the hook."""
    req = model.PutRequest(("users", "u1"), "fact", {"content": "likes jazz"}, text="likes jazz",
                           embedding=HashingEmbedder(64).embed_query("likes jazz"), kind="fact")  # fmt: skip
    doc = model.new_document("A", req, model.utcnow(), None)
    group = Group("memory:insert", svc.db_name, svc.memory_collection, LONG_TERM_MEMORY,
                  [insert_once(doc)])  # fmt: skip
    svc.uow.execute(Plan(PlanContext("A"), [group]))
    svc.uow.execute(Plan(PlanContext("A"), [Group("again", svc.db_name, svc.memory_collection,
                                                  LONG_TERM_MEMORY, [insert_once(doc)])]))  # fmt: skip
    assert [v["path"] for v in _vectors(svc)] == [model.TEXT_PATH]
    hits = svc.search(("users",), query="likes jazz", kinds=["fact"])
    assert [h.key for h in hits] == ["fact"]
    assert [d["key"] for d, _ in svc.nearest(("users", "u1"), doc["embedding"].as_vector().data,
                                             kinds=["fact"], projection=None)] == ["fact"]  # fmt: skip


def test_vector_search_is_scoped_before_ranking(svc):
    other = svc.for_tenant("B")
    for i in range(30):  # B's memories are all closer to the query than A's one
        other.put(("users", "u1"), f"b{i}", {"text": "the secret code"}, text="the secret code")
    svc.put(("users", "u1"), "a", {"text": "a code"}, text="a code")
    svc.put(("users", "u2"), "a2", {"text": "the secret code"}, text="the secret code")
    hits = svc.search(("users", "u1"), query="the secret code", limit=1)
    assert [h.key for h in hits] == ["a"]


@pytest.mark.parametrize("op", [
    Op("update", {"_id": "x"}, {"$set": {"embedding": [1.0]}}),
    Op("update", {"_id": "x"}, {"$set": {"ns_prefixes": ["evil"]}}),
    Op("update", {"_id": "x"}, {"$inc": {"expires_at": 1}}),
    Op("update", {"_id": "x"}, [{"$set": {"kind": "x"}}]),
    Op("update_many", {"key": "k"}, {"$set": {"kind": "fact"}}),
    Op("delete_many", {"version": 3}),
    Op("delete_many", {}),
    Op("delete", {"_id": "x", "version": 3}),  # no guard on the group
    Op("update", {"_id": "x"}, {"$set": {"value": 1}}, upsert=True),
])  # fmt: skip
def test_writes_the_vectors_cannot_follow_are_refused(op):
    hook = vector_docs.MemoryVectorsHook()
    hook.watch("db", "long_term_memory", "memory_vectors")
    plan = Plan(PlanContext("A"), [Group("g", "db", "long_term_memory", LONG_TERM_MEMORY, [op])])
    with pytest.raises(InvalidInputError):
        hook.derive(plan)


def test_hook_mirrors_what_it_can_and_ignores_other_collections():
    hook = vector_docs.MemoryVectorsHook()
    hook.watch("db", "long_term_memory", "memory_vectors")
    plan = Plan(PlanContext("A"), [
        Group("g", "db", "long_term_memory", LONG_TERM_MEMORY, [
            Op("update_many", {"_id": {"$in": ["x"]}, "tenant_id": "A"},
               {"$set": {"expires_at": None, "value.a": 1}}),
            Op("update", {"_id": "x"}, {"$set": {"value": {}}}),
            Op("delete_many", {"tenant_id": "A"}),
        ]),
        Group("heads", "db", "memory_heads", LONG_TERM_MEMORY, [Op("delete_many", {})]),
        Group("other_db", "db2", "long_term_memory", LONG_TERM_MEMORY, [Op("delete_many", {})]),
    ])  # fmt: skip
    hook.derive(plan)
    added = plan.groups[3:]
    assert [(g.collection, [(o.kind, o.filter, o.doc) for o in g.ops]) for g in added] == [
        ("memory_vectors", [
            ("update_many", {"memory_id": {"$in": ["x"]}, "tenant_id": "A"},
             {"$set": {"expires_at": None}}),
            ("delete_many", {"tenant_id": "A"}, None),
        ])
    ]  # fmt: skip
    with pytest.raises(InvalidInputError):
        hook.watch("db", "long_term_memory", "elsewhere")
